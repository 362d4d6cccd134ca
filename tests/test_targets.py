"""Other targets on real clang-22: every problem on AArch64 (Linux) and a Cortex-M4 (bare metal) as on x86-64,
corpora that record their target, optgym-cc choosing its policy by the compile's target, and cross builds
through optgym-cc (CMake with qemu-user running the tests; a firmware image linked by ld.lld)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import C_SOURCE, FANOUT_SOURCE
from test_regalloc_evict import PRESSURE_SOURCE
from test_regalloc_priority import FLAT, LIGHTEST, MAIN_SOURCE

import optgym_cc
from optgym.corpus.embedded import corpus_from_sources
from optgym.corpus.info import corpus_info
from optgym.corpus.target import Target, bare_metal_runtime, module_triple
from optgym.policies import resolve_policy
from optgym.policies.portfolio import FORMAT, load_portfolio
from optgym.policies.scorer import CandidateScorer
from optgym.problems import get_problem
from optgym.problems.regalloc_evict import CANDIDATES, NOTHING
from optgym.rollout import plain_compile, rollout
from optgym.rollout.rollout import DecisionPoint
from optgym.toolchain import object_sizes

BIN = Path(sys.executable).parent
CC = str(BIN / "optgym-cc")
PICOLIBC = Path("/usr/lib/picolibc/arm-none-eabi/include")
AARCH64_ROOT = Path("/usr/aarch64-linux-gnu")
INLINE, EVICT, PRIORITY = get_problem("inline-size"), get_problem("regalloc-evict"), get_problem("regalloc-priority")
EVICT_START, PRIORITY_START = CandidateScorer.initial("regalloc-evict"), CandidateScorer.initial("regalloc-priority")
EM_X86_64, EM_AARCH64, EM_ARM = 62, 183, 40


@dataclass(frozen=True)
class Case:
    """One target the tests compile for: its driver options, what clang records and writes, what it needs."""

    name: str
    triple: str | None  # None: this machine's (x86-64)
    flags: tuple[str, ...]
    cc1_arch: str  # the -cc1 -triple's architecture
    machine: int  # the ELF e_machine of its objects
    #: The allocation-order columns a general-purpose register can take: the rest of the 32 stay masked. Thumb-2
    #: allocates r0–r12 and lr: 14 registers; x86-64's 16 GPRs fill 15 columns at most (rsp is never allocated).
    columns: int
    needs: Path | None  # a file its cross package installs (its headers), else None
    package: str = ""

    def skip_reason(self) -> str | None:
        if self.needs is not None and not self.needs.exists():
            return f"{self.name}: {self.needs} is missing; `apt-get install {self.package}` (make setup installs it)"
        return None


CASES = [
    Case("x86-64", None, (), "x86_64", EM_X86_64, 16, None),
    Case("aarch64", "aarch64-linux-gnu", (), "aarch64", EM_AARCH64, 32, AARCH64_ROOT / "include" / "stdio.h",
         "libc6-dev-arm64-cross"),
    Case("cortex-m4", "thumbv7em-none-eabi", ("-mcpu=cortex-m4", "-mthumb", "-isystem", str(PICOLIBC)), "thumbv7em",
         EM_ARM, 14, PICOLIBC / "stdio.h", "picolibc-arm-none-eabi"),
]  # fmt: skip
BY_NAME = {case.name: case for case in CASES}
#: A target optgym ships no policy of any kind for (clang-22 builds its objects; no headers needed for FANOUT_SOURCE).
NO_POLICY_TRIPLE = "riscv64-linux-gnu"


def e_machine(path: Path) -> int:
    """An ELF file's e_machine (little-endian, as all three targets are)."""
    head = path.read_bytes()[:20]
    assert head[:4] == b"\x7fELF", path
    return struct.unpack_from("<H", head, 18)[0]


@pytest.fixture(scope="module", params=CASES, ids=[c.name for c in CASES])
def target_corpus(request, toolchain, tmp_path_factory):
    """A C module with libc headers, one whose inlining pays only when all three calls inline, and one the
    register allocator runs out of registers on — compiled at -Oz for the case's target."""
    case: Case = request.param
    if reason := case.skip_reason():
        pytest.skip(reason)
    root = tmp_path_factory.mktemp(f"target-{case.name}")
    paths = {}
    for name, text in {"tree": C_SOURCE, "fanout": FANOUT_SOURCE, "pressure": PRESSURE_SOURCE}.items():
        paths[name] = root / f"{name}.c"
        paths[name].write_text(text)
    corpus = corpus_from_sources(toolchain, paths, root / "corpus", ("-Oz",), case.triple, case.flags)
    return case, corpus


def _project(tmp_path: Path, cmake: str) -> Path:
    """A source tree of the test program's pieces with ``cmake`` as its CMakeLists.txt."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(cmake)
    for file, text in PIECES.items():
        (src / file).write_text(text)
    return src


def test_modules_record_their_target_and_corpus_info_counts_them(target_corpus):
    case, corpus = target_corpus
    triples = {module_triple(m.cc1_args) for m in corpus}
    assert len(triples) == 1 and triples.pop().split("-")[0] == case.cc1_arch
    info = corpus_info(corpus.root, sizes=False)
    ((triple, count),) = info["targets"].items()
    assert triple.startswith(case.cc1_arch) and count == 3 == len(info["module_targets"])
    provenance = corpus.description["optgym"].get("provenance", {})
    assert provenance.get("target") == case.triple and provenance.get("target_flags", []) == list(case.flags)


@pytest.mark.parametrize(("module", "contrary"), [("tree", "never"), ("fanout", "always")])
def test_inlining_replayed_from_the_stream_is_clangs_own_object(target_corpus, toolchain, tmp_path, module, contrary):
    """The inliner's stream carries clang's own answer: sending it back gives the plain compile's bytes, on
    every target, and a contrary policy gives another object (the lever is there on each)."""
    case, corpus = target_corpus
    heuristic, never = resolve_policy("heuristic").build(), resolve_policy(contrary).build()
    plain, replay, other = tmp_path / "plain.o", tmp_path / "replay.o", tmp_path / "other.o"
    assert plain_compile(INLINE, corpus[module], toolchain, keep_object=plain).ok
    out = rollout(INLINE, corpus[module], toolchain, heuristic, keep_object=replay)
    assert out.result.ok and out.result.decisions > 0
    assert replay.read_bytes() == plain.read_bytes() and e_machine(plain) == case.machine
    assert rollout(INLINE, corpus[module], toolchain, never, keep_object=other).result.ok
    assert other.read_bytes() != plain.read_bytes()


def test_eviction_stream_shape_and_masks(target_corpus, toolchain):
    """The eviction stream has the same shape on every target — 32 allocation-order columns and column 32, the
    register being allocated — however many registers the target has: a smaller register file leaves its last
    columns masked. Every decision offers a legal answer; the stream carries no default one."""
    case, corpus = target_corpus
    masks: list[np.ndarray] = []
    shapes: set[tuple[str, tuple[int, ...]]] = set()

    def record(point: DecisionPoint) -> int:
        features = point.features()
        shapes.update((name, value.shape) for name, value in features.items())
        masks.append(features["mask"].ravel() != 0)
        return EVICT_START(point)[0]

    out = rollout(EVICT, corpus["pressure"], toolchain, record)
    assert out.result.ok and out.result.decisions == len(masks) > 0, out.result.detail
    expected = {(spec.name, spec.shape) for spec in EVICT.expected_features()}
    assert shapes == expected and ("mask", (1, CANDIDATES)) in shapes
    stacked = np.array(masks)
    assert stacked.any(axis=1).all()  # a legal answer at every decision
    assert stacked[:, :NOTHING].any()  # some decisions offer a register to evict
    assert not stacked[:, case.columns : NOTHING].any()  # no register beyond the target's own
    assert (out.trajectory.heuristic == -1).all()


def test_eviction_policies_choosing_valid_candidates_compile(target_corpus, toolchain, tmp_path):
    """Column 32 evicts nothing: a policy taking it whenever the mask allows (else the first legal register), and
    one evicting the first legal register whenever there is one, both give a correct compile — on every target,
    and not clang's default advisor's object."""
    case, corpus = target_corpus
    chosen: dict[str, list[int]] = {"nothing": [], "evict": []}

    def nothing_first(point: DecisionPoint) -> int:
        mask = point.features()["mask"].ravel() != 0
        chosen["nothing"].append(NOTHING if mask[NOTHING] else int(np.flatnonzero(mask)[0]))
        return chosen["nothing"][-1]

    def evict_first(point: DecisionPoint) -> int:
        registers = np.flatnonzero(point.features()["mask"].ravel()[:NOTHING] != 0)
        chosen["evict"].append(int(registers[0]) if registers.size else NOTHING)
        return chosen["evict"][-1]

    objects = {}
    for name, policy in {"nothing": nothing_first, "evict": evict_first}.items():
        out = rollout(EVICT, corpus["pressure"], toolchain, policy, keep_object=tmp_path / f"{name}.o")
        assert out.result.ok and out.result.metrics["text_bytes"] > 0, out.result.detail
        assert e_machine(tmp_path / f"{name}.o") == case.machine
        objects[name] = (tmp_path / f"{name}.o").read_bytes()
    assert NOTHING in chosen["nothing"] and any(a < NOTHING for a in chosen["evict"])
    assert plain_compile(EVICT, corpus["pressure"], toolchain, keep_object=tmp_path / "clang.o").ok
    assert len({*objects.values(), (tmp_path / "clang.o").read_bytes()}) >= 2


def test_a_masked_eviction_is_refused_before_clang_sees_it(target_corpus, toolchain, no_leftovers):
    """clang crashes on an index its mask rules out; the episode stops the compile first, on every target."""
    _, corpus = target_corpus

    def masked(point: DecisionPoint) -> int:
        return int(np.flatnonzero(point.features()["mask"].ravel() == 0)[0])

    out = rollout(EVICT, corpus["pressure"], toolchain, masked)
    assert out.result.status == "invalid_action" and "not valid at this decision" in out.result.detail
    assert out.result.decisions == 0


def test_priority_stream_and_any_order_compiles(target_corpus, toolchain, tmp_path):
    """Three scalar features per live range on every target; the start rule's, the flat and the lightest-first
    orders each compile, to other code than one another."""
    case, corpus = target_corpus
    seen: list[tuple[int, int, float]] = []

    def start(point: DecisionPoint) -> tuple[float, float]:
        f = point.features()
        assert f["li_size"].shape == f["stage"].shape == f["weight"].shape == (1,)
        seen.append((int(f["li_size"][0]), int(f["stage"][0]), float(f["weight"][0])))
        return PRIORITY_START(point)[0], 0.0

    out = rollout(PRIORITY, corpus["pressure"], toolchain, start, keep_object=tmp_path / "start.o")
    assert out.result.ok and out.result.decisions == len(seen) > 10
    assert all(size >= 0 and stage >= 1 for size, stage, _ in seen) and any(stage > 1 for _, stage, _ in seen)
    assert (out.trajectory.heuristic == -1).all()
    objects = {(tmp_path / "start.o").read_bytes()}
    for name, policy in {"flat": FLAT, "lightest": LIGHTEST}.items():
        assert rollout(PRIORITY, corpus["pressure"], toolchain, policy, keep_object=tmp_path / f"{name}.o").result.ok
        assert e_machine(tmp_path / f"{name}.o") == case.machine
        objects.add((tmp_path / f"{name}.o").read_bytes())
    assert len(objects) == 3


@pytest.mark.skipif(shutil.which("qemu-aarch64") is None, reason="qemu-user is installed by `make setup`")
def test_aarch64_programs_allocated_in_any_order_run_the_same_under_qemu(toolchain, tmp_path):
    """Each allocation order's AArch64 object, linked with a driver by lld and run under qemu-user, prints what
    clang's own does."""
    case = BY_NAME["aarch64"]
    if reason := case.skip_reason():
        pytest.skip(reason)
    (tmp_path / "pressure.c").write_text(PRESSURE_SOURCE)
    (tmp_path / "main.c").write_text(MAIN_SOURCE)
    corpus = corpus_from_sources(toolchain, {"pressure": tmp_path / "pressure.c"}, tmp_path / "corpus",
                                 target=case.triple)  # fmt: skip
    module = corpus["pressure"]
    for name, policy in {"start": PRIORITY_START, "flat": FLAT, "lightest": LIGHTEST}.items():
        assert rollout(PRIORITY, module, toolchain, policy, keep_object=tmp_path / f"{name}.o").result.ok
    assert plain_compile(PRIORITY, module, toolchain, keep_object=tmp_path / "clang.o").ok
    printed = set()
    for name in ("start", "flat", "lightest", "clang"):
        exe = tmp_path / f"{name}.exe"
        subprocess.run([str(toolchain.clang), f"--target={case.triple}", "-fuse-ld=lld", "-O0",
                        str(tmp_path / "main.c"), str(tmp_path / f"{name}.o"), "-o", str(exe)], check=True)  # fmt: skip
        assert e_machine(exe) == EM_AARCH64
        run = subprocess.run(["qemu-aarch64", "-L", str(AARCH64_ROOT), str(exe)], capture_output=True, text=True,
                             timeout=60, check=True)  # fmt: skip
        printed.add(run.stdout)
    assert len(printed) == 1 and printed.pop().strip() != ""


# -- corpus builds for a target --------------------------------------------------------------------------------

CMAKE_LIB = """cmake_minimum_required(VERSION 3.16)
project(pieces C)
add_library(pieces STATIC a.c b.c)
add_library(pieces_shared SHARED a.c b.c)
set_target_properties(pieces_shared PROPERTIES OUTPUT_NAME pieces)
add_executable(tool main.c)
target_link_libraries(tool pieces)
"""  # a shared and a static library of one name: on bare metal CMake would make both libpieces.a
PIECES = {
    "a.c": "static int sq(int x) { return x * x; }\nint sum_sq(const int *v, int n) { int s = 0; "
    "for (int i = 0; i < n; i++) s += sq(v[i]); return s; }\n",
    "b.c": "#include <string.h>\nint count(const char *s, char c) { int n = 0; for (; *s; s++) n += *s == c; "
    "return n + (int)strlen(s); }\n",
    "main.c": "int sum_sq(const int *, int);\nint count(const char *, char);\nint main(void) { int v[3] = {1, 2, 3}; "
    "return sum_sq(v, 3) - 14 + count(\"aba\", 'a') - 2; }\n",
}


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is installed by `make setup`")
@pytest.mark.parametrize("name", ["aarch64", "cortex-m4"])
def test_corpus_build_for_a_target(name, tmp_path):
    """``optgym corpus build --target``: a CMake tree built for AArch64 links (lld) and gives every object; for a
    Cortex-M4 the executable links against picolibc with optgym's linker script (without picolibc, the compiler
    checks pass as a static library and the executable cannot link), and the objects are the corpus — the shared
    library, which cannot link without an OS, kept apart from the static one of the same name. Each module
    records its target; the corpus's provenance records target and flags."""
    from typer.testing import CliRunner

    from optgym.cli import app

    case = BY_NAME[name]
    if reason := case.skip_reason():
        pytest.skip(reason)
    src = _project(tmp_path, CMAKE_LIB)
    flags = [f"--target-flag={flag}" for flag in case.flags if flag not in ("-isystem", str(PICOLIBC))]
    flags += [f"--target-flag=-isystem {PICOLIBC}"] if "-isystem" in case.flags else []  # one flag with its value
    out = tmp_path / "corpus"
    result = CliRunner().invoke(app, ["corpus", "build", str(src), "-o", str(out), "-j", "2", "--target",
                                      str(case.triple), *flags])  # fmt: skip
    assert result.exit_code == 0, result.output
    info = corpus_info(out, sizes=False)
    # CMake's Generic platform (no OS) names objects .obj
    assert sorted(n.removesuffix("bj") for n in info["module_targets"]) == [
        "CMakeFiles/pieces.dir/a.c.o", "CMakeFiles/pieces.dir/b.c.o", "CMakeFiles/tool.dir/main.c.o"]  # fmt: skip
    assert [t.split("-")[0] for t in info["targets"]] == [case.cc1_arch]
    provenance = info["provenance"]
    assert provenance["target"] == case.triple and provenance["target_flags"] == list(case.flags)
    tool = out / ".optgym-work" / "build" / "tool"
    if Target(str(case.triple)).bare_metal:
        # the shared library's link fails (none without an OS); the program links against picolibc when it is here
        assert provenance["partial"] and "has no OS" in result.output
        if bare_metal_runtime(Target(str(case.triple), case.flags)):
            assert e_machine(tool) == case.machine
        else:
            assert not tool.exists()
    else:
        assert not provenance["partial"] and e_machine(tool) == case.machine
    listed = CliRunner().invoke(app, ["corpus", "info", str(out), "--no-sizes", "--modules"])
    assert listed.exit_code == 0 and f"targets {next(iter(info['targets']))} 3" in listed.output
    assert listed.output.count(case.cc1_arch) >= 4  # the count line and each module's row


def test_target_flags_without_a_target_are_refused(tmp_path):
    from typer.testing import CliRunner

    from optgym.cli import app

    result = CliRunner().invoke(app, ["corpus", "build", str(tmp_path), "-o", str(tmp_path / "c"), "--target-flag",
                                      "-mthumb"])  # fmt: skip
    assert result.exit_code == 1 and "needs --target" in result.output
    assert Target.of("thumbv7em-none-eabi", ["-isystem /x/include", "-mthumb"]).flags == ("-isystem", "/x/include",
                                                                                          "-mthumb")  # fmt: skip
    assert Target("thumbv7em-none-eabi").bare_metal and not Target("aarch64-linux-gnu").bare_metal
    assert Target("thumbv7em-none-eabi").autotools_host() == "--host=arm-none-eabi"


# -- optgym-cc: the policy of the compile's target ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "program", "expected"),
    [
        ([], "optgym-cc", (os.uname().machine, optgym_cc.arch_family(os.uname().machine))),
        (["--target=aarch64-linux-gnu", "-c", "x.c"], "optgym-cc", ("aarch64-linux-gnu", "aarch64")),
        (["-target", "thumbv7em-none-eabi", "-c", "x.c"], "optgym-cc", ("thumbv7em-none-eabi", "arm")),
        (["-c", "x.c"], "/opt/bin/aarch64-linux-gnu-optgym-c++", ("aarch64-linux-gnu", "aarch64")),
        (["--target=arm64-apple-macos"], "optgym-cc", ("arm64-apple-macos", "aarch64")),
        (["--target=x86_64-linux-gnu", "-m32"], "optgym-cc", ("x86_64-linux-gnu", "x86")),
        (["--target=i686-linux-gnu", "-m64"], "optgym-cc", ("i686-linux-gnu", "x86_64")),
        # the command line's target wins over the driver's name, and the last one over the others
        (["--target=x86_64-linux-gnu", "-target", "aarch64-linux-gnu"], "riscv64-linux-gnu-optgym-cc",
         ("aarch64-linux-gnu", "aarch64")),
    ],
)  # fmt: skip
def test_the_launcher_reads_the_compiles_target(args, program, expected):
    assert optgym_cc.compile_target(args, program) == expected


def test_a_targets_policy_is_a_file_dropped_in(tmp_path, monkeypatch):
    """The lookup: PRETRAINED_DIR/<arch>/, then /<family>/, and x86-64's own files in PRETRAINED_DIR itself; a
    target without its file keeps clang's decisions (and says which); a spec the build names is served as named."""
    for variable in ("OPTGYM_POLICY", "OPTGYM_EVICT_POLICY", "OPTGYM_PRIORITY_POLICY"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(optgym_cc, "PRETRAINED_DIR", str(tmp_path))
    (tmp_path / "inline-size.onnx").write_bytes(b"x86-64")
    aarch64, m4 = ("aarch64-linux-gnu", "aarch64"), ("thumbv7em-none-eabi", "arm")
    assert optgym_cc.target_policies(aarch64) == ([], ["inline-size", "regalloc-evict", "regalloc-priority"])
    (tmp_path / "aarch64").mkdir()
    (tmp_path / "aarch64" / "inline-size.onnx").write_bytes(b"aarch64")
    policies, missing = optgym_cc.target_policies(aarch64)
    assert policies == [("inline-size", str(tmp_path / "aarch64" / "inline-size.onnx"))]
    assert missing == ["regalloc-evict", "regalloc-priority"]
    (tmp_path / "arm").mkdir()
    (tmp_path / "arm" / "inline-size.onnx").write_bytes(b"arm")
    assert optgym_cc.shipped_policy("inline-size.onnx", m4) == str(tmp_path / "arm" / "inline-size.onnx")
    (tmp_path / "thumbv7em").mkdir()
    (tmp_path / "thumbv7em" / "inline-size.onnx").write_bytes(b"m4")
    assert optgym_cc.shipped_policy("inline-size.onnx", m4) == str(tmp_path / "thumbv7em" / "inline-size.onnx")
    assert optgym_cc.shipped_policy("inline-size.onnx", ("x86_64-linux-gnu", "x86_64")) == str(
        tmp_path / "inline-size.onnx"
    )
    assert optgym_cc.shipped_policy("inline-size.onnx", ("x86_64-linux-gnu", "x86")) is None  # -m32
    monkeypatch.setenv("OPTGYM_POLICY", "never")
    monkeypatch.setenv("OPTGYM_EVICT_POLICY", "heuristic")
    assert optgym_cc.target_policies(m4) == ([("inline-size", "never")], ["regalloc-priority"])
    # a ThinLTO link's backends: the link's target's policy too, never x86-64's for another target
    from optgym_cc import thinlto

    monkeypatch.delenv("OPTGYM_LTO_POLICY", raising=False)
    (tmp_path / "inline-size-thinlto.onnx").write_bytes(b"x86-64 thinlto")
    assert thinlto.lto_policy(["--target=x86_64-linux-gnu"]) == str(tmp_path / "inline-size-thinlto.onnx")
    assert thinlto.lto_policy(["--target=aarch64-linux-gnu", "-flto=thin"]) == "heuristic"
    # the allocator's ThinLTO policies: eviction by default where its scorer ships, priority when asked for; the
    # same way, served where shipped, each channel left closed where not
    for variable in ("OPTGYM_LTO_EVICT_POLICY", "OPTGYM_LTO_PRIORITY_POLICY"):
        monkeypatch.delenv(variable, raising=False)
    (tmp_path / "regalloc-priority-thinlto.onnx").write_bytes(b"x86-64 thinlto priority")
    assert [p for p, _ in thinlto.lto_policies(["--target=x86_64-linux-gnu"])] == ["inline-size"]
    (tmp_path / "regalloc-evict-thinlto.onnx").write_bytes(b"x86-64 thinlto eviction")
    assert [p for p, _ in thinlto.lto_policies(["--target=x86_64-linux-gnu"])] == ["inline-size", "regalloc-evict"]
    assert thinlto.lto_policies(["--target=aarch64-linux-gnu"]) == []
    (tmp_path / "regalloc-priority-thinlto.onnx").unlink()
    monkeypatch.setenv("OPTGYM_LTO_EVICT_POLICY", "pretrained")
    monkeypatch.setenv("OPTGYM_LTO_PRIORITY_POLICY", "pretrained")
    assert thinlto.lto_policies(["--target=x86_64-linux-gnu"]) == [
        ("inline-size", str(tmp_path / "inline-size-thinlto.onnx")),
        ("regalloc-evict", str(tmp_path / "regalloc-evict-thinlto.onnx")),
    ]
    assert thinlto.lto_policies(["--target=aarch64-linux-gnu"]) == []
    monkeypatch.setenv("OPTGYM_LTO_POLICY", "heuristic")
    monkeypatch.setenv("OPTGYM_LTO_PRIORITY_POLICY", "never")
    assert thinlto.lto_policies(["--target=aarch64-linux-gnu"]) == [("regalloc-priority", "never")]
    monkeypatch.delenv("OPTGYM_LTO_POLICY")
    monkeypatch.delenv("OPTGYM_LTO_PRIORITY_POLICY")
    # and the link's ThinLTO plan: x86-64's is not another target's
    monkeypatch.delenv("OPTGYM_LTO_PLAN", raising=False)
    plan = {"format": thinlto.PLAN_FORMAT, "link_flags": ["--icf=safe"], "llvm_options": []}
    (tmp_path / thinlto.PLAN).write_text(json.dumps(plan))
    assert thinlto.lto_plan(["--target=x86_64-linux-gnu"]) == plan
    assert thinlto.lto_plan(["--target=aarch64-linux-gnu", "-flto=thin"]) == {}
    a64_plan = plan | {"llvm_options": ["-disable-lsr"]}  # a target's own plan, found as its policies are
    (tmp_path / "aarch64" / thinlto.PLAN).write_text(json.dumps(a64_plan))
    assert thinlto.lto_plan(["--target=aarch64-linux-gnu", "-flto=thin"]) == a64_plan
    assert thinlto.lto_plan(["--target=x86_64-linux-gnu"]) == plan
    for other_linker in ("x86_64-apple-darwin", "x86_64-w64-mingw32", "x86_64-pc-windows-msvc"):
        assert thinlto.lto_plan([f"--target={other_linker}"]) == {}  # ELF lld's options only


def test_a_links_plan_options_are_read_once_per_version_of_the_file(tmp_path, monkeypatch):
    """What a link takes from its plan (the lld flags and LLVM options) is kept in optgym's cache after the first
    read, so a later link need not import ``json``; an edited plan is read again, and a broken one still raises."""
    from optgym_cc import thinlto

    monkeypatch.setenv("OPTGYM_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "plan.json"
    monkeypatch.setenv("OPTGYM_LTO_PLAN", str(path))
    plan = {"format": thinlto.PLAN_FORMAT, "link_flags": ["--icf=safe", "--gc-sections"], "llvm_options": ["-a=1"]}
    path.write_text(json.dumps(plan))
    args = ["-flto=thin", "-fuse-ld=lld", "a.o"]
    assert thinlto.plan_options(args) == (plan["link_flags"], plan["llvm_options"])
    assert len(list((tmp_path / "cache" / "thinlto-plans").iterdir())) == 1
    # a fresh launcher process reads the kept options, without json
    probe = ("import sys, optgym_cc.thinlto as t; o = t.plan_options(sys.argv[1:]); "
             "print(o, 'json' in sys.modules)")  # fmt: skip
    env = {**os.environ, "OPTGYM_CACHE_DIR": str(tmp_path / "cache"), "OPTGYM_LTO_PLAN": str(path)}
    fresh = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, env=env)
    assert fresh.returncode == 0, fresh.stderr
    assert fresh.stdout.strip() == f"{(plan['link_flags'], plan['llvm_options'])} False"
    edited = plan | {"link_flags": ["--icf=all"], "llvm_options": []}
    path.write_text(json.dumps(edited) + " ")  # another size: another version of the file
    assert thinlto.plan_options(args) == (["--icf=all"], [])
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        thinlto.plan_options(args)
    monkeypatch.setenv("OPTGYM_LTO_PLAN", "none")
    assert thinlto.plan_options(args) is None


@pytest.mark.parametrize(
    ("args", "driver", "expected"),
    [
        (["-Oz", "-c", "a.c"], "clang", True),
        (["-Oz", "-c", "a.c", "b.c"], "clang", True),
        (["-Oz", "-c", "a.cpp"], "clang", False),  # clang's C driver on C++ still compiles C++
        (["-Oz", "-c", "a.c"], "clang++", False),
        (["-x", "c", "-Oz", "-c", "a.inc"], "clang", True),
        (["-xc++", "-Oz", "-c", "a.c"], "clang", False),
        (["-x", "c++", "-x", "c", "-c", "a.h"], "clang", True),  # the last -x wins
        (["-Oz", "-E", "-"], "clang", False),  # no source file named: not known to be C
    ],
)  # fmt: skip
def test_the_launcher_knows_a_c_compile(args, driver, expected):
    assert optgym_cc.compiles_c(args, driver) is expected


def test_a_targets_portfolio_is_a_file_dropped_in(tmp_path, monkeypatch):
    """A target's portfolio serves its C compiles: the build's (``OPTGYM_PORTFOLIO``), else the target's file, found
    as its policies are (arch, then family); never for the host family (the server's default), nor for C++, nor when
    the build asks for none."""
    for variable in ("OPTGYM_PORTFOLIO", "OPTGYM_CANDIDATES"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(optgym_cc, "PRETRAINED_DIR", str(tmp_path))
    m4, c = ("thumbv7em-none-eabi", "arm"), ["-Oz", "-c", "a.c"]
    assert optgym_cc.target_portfolio(m4, c, "clang") is None
    (tmp_path / "thumbv7em").mkdir()
    (tmp_path / "thumbv7em" / optgym_cc.PORTFOLIO).write_text("{}")
    (tmp_path / optgym_cc.PORTFOLIO).write_text("{}")
    assert optgym_cc.target_portfolio(m4, c, "clang") == str(tmp_path / "thumbv7em" / optgym_cc.PORTFOLIO)
    assert optgym_cc.target_portfolio(("thumbv6m-none-eabi", "arm"), c, "clang") is None  # Cortex-M0: not its file
    assert optgym_cc.target_portfolio(("x86_64-linux-gnu", "x86_64"), c, "clang") is None
    assert optgym_cc.target_portfolio(m4, ["-Oz", "-c", "a.cc"], "clang") is None
    monkeypatch.setenv("OPTGYM_CANDIDATES", "0")
    assert optgym_cc.target_portfolio(m4, c, "clang") is None
    monkeypatch.setenv("OPTGYM_CANDIDATES", "1")
    monkeypatch.setenv("OPTGYM_PORTFOLIO", "/elsewhere.json")
    assert optgym_cc.target_portfolio(m4, c, "clang") == "/elsewhere.json"


def test_a_targets_c_portfolio_stays_beside_a_policy_shipped_for_it(tmp_path, monkeypatch):
    """A target shipping both an inline policy and a C portfolio: its C compiles are the portfolio's (clang's
    inlining, as the portfolio was chosen), its C++ compiles the policy's; a policy the build names takes C too."""
    for variable in ("OPTGYM_PORTFOLIO", "OPTGYM_CANDIDATES", "OPTGYM_POLICY", "OPTGYM_EVICT_POLICY",
                     "OPTGYM_PRIORITY_POLICY"):  # fmt: skip
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(optgym_cc, "PRETRAINED_DIR", str(tmp_path))
    (tmp_path / "aarch64").mkdir()
    policy = tmp_path / "aarch64" / "inline-size.onnx"
    policy.write_bytes(b"")
    (tmp_path / "aarch64" / optgym_cc.PORTFOLIO).write_text("{}")
    a64 = ("aarch64-linux-gnu", "aarch64")
    c, cxx = ["-Oz", "-c", "a.c"], ["-Oz", "-c", "a.cc"]

    def plan(args: list[str], driver: str) -> tuple:
        return optgym_cc.compile_plan(a64, args, driver, *optgym_cc.target_policies(a64))

    assert optgym_cc.target_policies(a64) == ([("inline-size", str(policy))], ["regalloc-evict", "regalloc-priority"])
    assert plan(c, "clang") == ([("inline-size", "heuristic")], [], str(tmp_path / "aarch64" / optgym_cc.PORTFOLIO))
    assert plan(cxx, "clang++") == ([("inline-size", str(policy))], ["regalloc-evict", "regalloc-priority"], None)
    monkeypatch.setenv("OPTGYM_POLICY", "never")
    assert plan(c, "clang")[2] is None and plan(c, "clang")[0][0] == ("inline-size", "never")


def compile_env(runtime: Path) -> dict[str, str]:
    """The environment of a build with the shipped policies (none of them chosen otherwise) and its own runtime
    directory: a fresh one is a new build, as far as optgym-cc's note is concerned."""
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    for variable in ("OPTGYM_POLICY", "OPTGYM_EVICT_POLICY", "OPTGYM_PRIORITY_POLICY", "OPTGYM_VERBOSE"):
        env.pop(variable, None)
    return env


def test_a_compile_for_a_target_with_no_policy_is_clangs_with_one_note_per_build(toolchain, tmp_path):
    """No policy ships for RISC-V: optgym-cc compiles exactly clang's object, starts no server, and says so once —
    the next compiles of the build are silent, ``OPTGYM_VERBOSE=1`` says it every time, and a compile that is not
    served says nothing."""
    (tmp_path / "tree.c").write_text(FANOUT_SOURCE)
    runtime = tmp_path / "run"
    runtime.mkdir()
    env = compile_env(runtime)
    flags = [f"--target={NO_POLICY_TRIPLE}", "-Oz", "-c", "tree.c"]
    clang = subprocess.run([str(toolchain.clang), *flags, "-o", "clang.o"], cwd=tmp_path, capture_output=True,
                           text=True, env=env)  # fmt: skip
    assert clang.returncode == 0 and clang.stderr == ""
    stderrs = []
    for i, extra in enumerate([{}, {}, {"OPTGYM_VERBOSE": "1"}]):
        served = subprocess.run([CC, *flags, "-o", f"cc{i}.o"], cwd=tmp_path, capture_output=True, text=True,
                                env={**env, **extra})  # fmt: skip
        assert served.returncode == 0, served.stderr
        assert (tmp_path / f"cc{i}.o").read_bytes() == (tmp_path / "clang.o").read_bytes()
        stderrs.append(served.stderr)
    note = optgym_cc.NO_POLICY_NOTE.format(what="", family="riscv64", target=NO_POLICY_TRIPLE)
    assert stderrs == [note, "", note]
    assert "ships no policy for riscv64" in note and note.count("\n") == 1
    assert not list((runtime / "optgym").glob("serve-*.sock"))  # clang's own compile: no server was started
    # a compile that is not served (here -O2) says nothing even at the start of a build
    quiet = subprocess.run([CC, f"--target={NO_POLICY_TRIPLE}", "-O2", "-c", "tree.c", "-o", "o2.o"], cwd=tmp_path,
                           capture_output=True, text=True, env=compile_env(tmp_path / "other"))  # fmt: skip
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_a_configure_check_leaves_the_note_to_the_build(tmp_path):
    """A build system's check (a CMake try-compile, autoconf's conftest.c) says nothing — its stderr is a log nobody
    reads, or a flag check's verdict — and the build's first real compile still gets the note."""
    probe = tmp_path / "build" / "CMakeFiles" / "CMakeScratch" / "TryCompile-abc"
    probe.mkdir(parents=True)
    (probe / "src.c").write_text(FANOUT_SOURCE)
    (tmp_path / "conftest.c").write_text(FANOUT_SOURCE)
    (tmp_path / "real.c").write_text(FANOUT_SOURCE)
    env = compile_env(tmp_path / "run")
    flags = [f"--target={NO_POLICY_TRIPLE}", "-Oz", "-c"]
    note = optgym_cc.NO_POLICY_NOTE.format(what="", family="riscv64", target=NO_POLICY_TRIPLE)
    steps = [(probe, "src.c", ""), (tmp_path, "conftest.c", ""), (tmp_path, "real.c", note), (tmp_path, "real.c", "")]
    for cwd, source, expected in steps:
        done = subprocess.run([CC, *flags, source], cwd=cwd, capture_output=True, text=True, env=env)
        assert done.returncode == 0 and done.stderr == expected, (source, done.stderr)
    assert optgym_cc.configure_probe(["-c", "conftest.c"]) and optgym_cc.configure_probe(["-c", "x/meson-private/t.c"])
    assert not optgym_cc.configure_probe(["-c", "src/real.c", "-o", "CMakeFiles/tool.dir/real.c.o"])


def test_a_triple_prefixed_optgym_cc_compiles_for_its_target(toolchain, tmp_path):
    """``aarch64-linux-gnu-optgym-cc``, like clang's prefixed drivers, compiles for the triple in its name."""
    case = BY_NAME["aarch64"]
    if reason := case.skip_reason():
        pytest.skip(reason)
    prefixed = tmp_path / f"{case.triple}-optgym-cc"
    prefixed.symlink_to(CC)
    (tmp_path / "fanout.c").write_text(FANOUT_SOURCE)
    env = compile_env(tmp_path / "run")
    done = subprocess.run([str(prefixed), "-Oz", "-c", "fanout.c", "-o", "p.o"], cwd=tmp_path, capture_output=True,
                          text=True, env=env)  # fmt: skip
    # AArch64 ships an inliner (C++ only) and no allocator scorers: the note names what it lacks, for its family
    assert done.returncode == 0 and "ships no regalloc-evict/regalloc-priority policy for aarch64" in done.stderr
    subprocess.run([str(toolchain.clang), f"--target={case.triple}", "-Oz", "-c", "fanout.c", "-o", "c.o"],
                   cwd=tmp_path, check=True)  # fmt: skip
    assert e_machine(tmp_path / "p.o") == EM_AARCH64
    assert (tmp_path / "p.o").read_bytes() == (tmp_path / "c.o").read_bytes()


def test_a_c_compile_for_a_target_with_a_portfolio_is_the_portfolios(toolchain, tmp_path):
    """A Cortex-M4 C compile through optgym-cc, its target shipping no policy but a portfolio (here the build's,
    ``OPTGYM_PORTFOLIO``): one candidate gives exactly clang's object with the first candidate's flags; two keep
    clang's own where it is smaller (the flags here only pad functions to 64 bytes); nothing is said. A C++
    compile of the same target is no portfolio's: clang's own object, with the note."""
    case = BY_NAME["cortex-m4"]
    if reason := case.skip_reason():
        pytest.skip(reason)
    padding = ["-mllvm", "-align-all-functions=6"]
    portfolio = tmp_path / "portfolio-c.json"
    candidates = [{"name": "padded", "flags": padding}, {"name": "clang"}]
    portfolio.write_text(
        json.dumps({"format": FORMAT, "family": "C", "candidates": candidates, "default_candidates": 2})
    )
    (tmp_path / "fanout.c").write_text(FANOUT_SOURCE)
    (tmp_path / "fanout.cc").write_text(FANOUT_SOURCE)
    env = {**compile_env(tmp_path / "run"), "OPTGYM_PORTFOLIO": str(portfolio), "OPTGYM_SERVER_IDLE": "2"}
    flags = [f"--target={case.triple}", *case.flags, "-Oz", "-c"]
    for name, extra in (("clang", []), ("padded", padding)):
        subprocess.run([str(toolchain.clang), *flags, *extra, "fanout.c", "-o", f"{name}.o"], cwd=tmp_path, check=True)
    assert (tmp_path / "padded.o").stat().st_size > (tmp_path / "clang.o").stat().st_size
    for candidates, expected in (("1", "padded.o"), ("2", "clang.o")):
        done = subprocess.run([CC, *flags, "fanout.c", "-o", f"cc{candidates}.o"], cwd=tmp_path, text=True,
                              capture_output=True, env={**env, "OPTGYM_CANDIDATES": candidates})  # fmt: skip
        assert done.returncode == 0 and done.stderr == "", done.stderr
        assert (tmp_path / f"cc{candidates}.o").read_bytes() == (tmp_path / expected).read_bytes()
    cxx = subprocess.run([CC.replace("optgym-cc", "optgym-c++"), *flags, "fanout.cc", "-o", "cxx.o"], cwd=tmp_path,
                         text=True, capture_output=True, env=env)  # fmt: skip
    assert cxx.returncode == 0 and "ships no policy for arm" in cxx.stderr
    subprocess.run([str(toolchain.clang).replace("clang", "clang++"), *flags, "fanout.cc", "-o", "plain.o"],
                   cwd=tmp_path, check=True)  # fmt: skip
    assert (tmp_path / "cxx.o").read_bytes() == (tmp_path / "plain.o").read_bytes()


@pytest.mark.parametrize("name", ["aarch64", "cortex-m4"])
def test_a_targets_shipped_portfolio_serves_its_c_compiles_by_default(name, toolchain, tmp_path):
    """The portfolio shipped for AArch64 and for Cortex-M4 has its measured figures and is what a default build (no
    ``OPTGYM_CANDIDATES``) compiles a C file of that target with: its first candidate (clang with pass options, and
    on Cortex-M4 the target's own allocator scorers, served without a warning), then clang's own compile, the
    smaller object kept. Only the first candidate may name policies: its object is optgym-cc's with one candidate."""
    case = BY_NAME[name]
    if reason := case.skip_reason():
        pytest.skip(reason)
    target = (case.triple, optgym_cc.arch_family(case.triple.split("-")[0]))
    path = optgym_cc.shipped_policy(optgym_cc.PORTFOLIO, target)
    assert path is not None
    portfolio = load_portfolio(path)
    assert portfolio.family == "C" and all(Path(spec).is_file() for c in portfolio.candidates for _, spec in c.policies)
    assert portfolio.applies_to([("inline-size", "heuristic")]) and json.loads(Path(path).read_text())["measured"]
    (tmp_path / "tree.c").write_text(C_SOURCE)  # enough register pressure for a scorer to decide otherwise
    env = {**compile_env(tmp_path / "run"), "OPTGYM_SERVER_IDLE": "2"}
    env.pop("OPTGYM_CANDIDATES")
    flags = [f"--target={case.triple}", *case.flags, "-Oz", "-c", "tree.c"]
    done = subprocess.run([CC, *flags, "-o", "cc.o"], cwd=tmp_path, text=True, capture_output=True, env=env)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    objects = []
    for i, candidate in enumerate(portfolio.first(portfolio.default_count)):
        subprocess.run([str(toolchain.clang), *flags, *candidate.flags, "-o", f"{i}.flags.o"], cwd=tmp_path, check=True)
        if candidate.policies:  # served: what optgym-cc compiles with this candidate alone
            assert i == 0, "only the first candidate can be compiled alone"
            alone = subprocess.run([CC, *flags, "-o", f"{i}.o"], cwd=tmp_path, text=True, capture_output=True,
                                   env={**env, "OPTGYM_CANDIDATES": "1"})  # fmt: skip
            assert alone.returncode == 0 and alone.stderr == "", alone.stderr
            # its scorers decided: not the object of its pass options with clang's allocator
            assert (tmp_path / f"{i}.o").read_bytes() != (tmp_path / f"{i}.flags.o").read_bytes()
        else:
            (tmp_path / f"{i}.flags.o").rename(tmp_path / f"{i}.o")
        objects.append((object_sizes(tmp_path / f"{i}.o").image_bytes, i))  # kept by text + data, as optgym-cc does
    assert (tmp_path / "cc.o").read_bytes() == (tmp_path / f"{min(objects)[1]}.o").read_bytes()


# -- cross builds through optgym-cc ------------------------------------------------------------------------------

TOOLCHAIN_FILE = """set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER {cc})
set(CMAKE_C_COMPILER_TARGET aarch64-linux-gnu)
set(CMAKE_AR {ar})
set(CMAKE_RANLIB {ranlib})
set(CMAKE_EXE_LINKER_FLAGS_INIT -fuse-ld=lld)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64;-L;/usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
"""
CROSS_PROJECT = """cmake_minimum_required(VERSION 3.16)
project(cross C)
enable_testing()
add_library(pieces STATIC a.c b.c)
add_executable(tool main.c)
target_link_libraries(tool pieces)
add_test(NAME tool_runs COMMAND tool)
"""


@pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("qemu-aarch64") is None,
                    reason="cmake and qemu-user are installed by `make setup`")  # fmt: skip
def test_cmake_cross_build_through_optgym_cc_runs_its_tests_under_qemu(toolchain, tmp_path):
    """A CMake toolchain file naming optgym-cc and an AArch64 target: the compiler checks, the build and ctest —
    its test run by qemu-user — pass, the program is AArch64, and the build log has optgym's note once."""
    case = BY_NAME["aarch64"]
    if reason := case.skip_reason():
        pytest.skip(reason)
    src, build = tmp_path / "src", tmp_path / "build"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(CROSS_PROJECT)
    for file, text in PIECES.items():
        (src / file).write_text(text)
    (tmp_path / "aarch64.cmake").write_text(TOOLCHAIN_FILE.format(cc=CC, ar=toolchain.tool("llvm-ar"),
                                                                  ranlib=toolchain.tool("llvm-ranlib")))  # fmt: skip
    env = compile_env(tmp_path / "run")
    steps = [
        ["cmake", "-S", str(src), "-B", str(build), f"-DCMAKE_TOOLCHAIN_FILE={tmp_path / 'aarch64.cmake'}",
         "-DCMAKE_BUILD_TYPE=MinSizeRel"],
        ["cmake", "--build", str(build), "-j", "2"],
        ["ctest", "--test-dir", str(build), "--output-on-failure"],
    ]  # fmt: skip
    output = ""
    for argv in steps:
        done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        output += done.stdout + done.stderr
    assert "100% tests passed" in output and e_machine(build / "tool") == EM_AARCH64
    assert output.count("optgym-cc: note:") == 1 and "ships no regalloc-evict/regalloc-priority policy for aarch64" in (
        output
    )


FIRMWARE_STARTUP = r"""
#include <stdint.h>
extern uint32_t _estack, _sidata, _sdata, _edata, _sbss, _ebss;
int main(void);
void Reset_Handler(void) {
  uint32_t *src = &_sidata, *dst = &_sdata;
  while (dst < &_edata) *dst++ = *src++;
  for (dst = &_sbss; dst < &_ebss;) *dst++ = 0;
  main();
  for (;;) {}
}
void Default_Handler(void) { for (;;) {} }
__attribute__((section(".isr_vector"), used)) void (*const vectors[])(void) = {
  (void (*)(void))&_estack, Reset_Handler, Default_Handler, Default_Handler, Default_Handler,
};
"""
FIRMWARE_MAIN = r"""
#include <stdint.h>
static uint32_t ticks;
static const uint8_t table[16] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3};
volatile uint32_t *const LED = (uint32_t *)0x40020014u;
static uint32_t mix(uint32_t x) { return (x << 3) ^ (x >> 5) ^ table[x & 15]; }
uint32_t never_called(uint32_t x) { return mix(x) * 7u + table[3]; }
int main(void) {
  for (uint32_t i = 0;; i++) { ticks = mix(ticks + i); *LED = ticks & 1u; }
}
"""
LINKER_SCRIPT = """MEMORY {
  FLASH (rx) : ORIGIN = 0x08000000, LENGTH = 256K
  RAM (rwx) : ORIGIN = 0x20000000, LENGTH = 64K
}
_estack = ORIGIN(RAM) + LENGTH(RAM);
ENTRY(Reset_Handler)
SECTIONS {
  .isr_vector : { KEEP(*(.isr_vector)) } > FLASH
  .text : { *(.text*) *(.rodata*) } > FLASH
  _sidata = LOADADDR(.data);
  .data : { _sdata = .; *(.data*) _edata = .; } > RAM AT > FLASH
  .bss (NOLOAD) : { _sbss = .; *(.bss*) *(COMMON) _ebss = .; } > RAM
}
"""


def test_cortex_m4_firmware_links_with_a_linker_script(toolchain, tmp_path):
    """Firmware-style: objects for a Cortex-M4 compiled through optgym-cc (freestanding: no C library at all), linked
    by ld.lld with a linker script, ``--gc-sections`` and ``-nostdlib``: the vector table opens flash, its reset
    entry is the Thumb address of the reset handler, and the unused function is gone."""
    case = BY_NAME["cortex-m4"]
    (tmp_path / "startup.c").write_text(FIRMWARE_STARTUP)
    (tmp_path / "main.c").write_text(FIRMWARE_MAIN)
    (tmp_path / "fw.ld").write_text(LINKER_SCRIPT)
    flags = [f"--target={case.triple}", "-mcpu=cortex-m4", "-mthumb", "-Oz", "-ffreestanding", "-ffunction-sections",
             "-fdata-sections"]  # fmt: skip
    env = compile_env(tmp_path / "run")
    for name in ("startup", "main"):
        done = subprocess.run([CC, *flags, "-c", f"{name}.c", "-o", f"{name}.o"], cwd=tmp_path, capture_output=True,
                              text=True, env=env)  # fmt: skip
        assert done.returncode == 0, done.stderr
        plain = subprocess.run([str(toolchain.clang), *flags, "-c", f"{name}.c", "-o", f"{name}.clang.o"],
                               cwd=tmp_path, capture_output=True, text=True)  # fmt: skip
        assert plain.returncode == 0
        assert (tmp_path / f"{name}.o").read_bytes() == (tmp_path / f"{name}.clang.o").read_bytes()
    link = subprocess.run([str(toolchain.tool("ld.lld")), "-T", "fw.ld", "--gc-sections", "-nostdlib", "startup.o",
                           "main.o", "-o", "fw.elf"], cwd=tmp_path, capture_output=True, text=True)  # fmt: skip
    assert link.returncode == 0, link.stderr
    assert e_machine(tmp_path / "fw.elf") == EM_ARM
    nm = subprocess.run([str(toolchain.tool("llvm-nm")), str(tmp_path / "fw.elf")], capture_output=True, text=True,
                        check=True).stdout  # fmt: skip
    symbols = {line.split()[-1]: int(line.split()[0], 16) for line in nm.splitlines() if len(line.split()) == 3}
    assert "never_called" not in symbols and "main" in symbols and "Reset_Handler" in symbols
    assert symbols["vectors"] == 0x08000000
    image = subprocess.run([str(toolchain.tool("llvm-objcopy")), "-O", "binary", "--only-section=.isr_vector",
                            str(tmp_path / "fw.elf"), "-"], capture_output=True, check=True).stdout  # fmt: skip
    stack, reset = struct.unpack_from("<II", image)
    assert stack == 0x20000000 + 64 * 1024 and reset == symbols["Reset_Handler"] | 1


# -- optgym compare-build for a target ----------------------------------------------------------------------------


def test_compare_build_gives_both_builds_the_target(tmp_path):
    """Both builds get the same target: CMake as its own COMPILER_TARGET (in its checks too), every other build
    system in CFLAGS and LDFLAGS; links for another target use lld."""
    from optgym.evaluate.build_compare import CompareOptions, Tools, build_commands

    opts = CompareOptions(source=tmp_path, outdir=tmp_path / "out", target="aarch64-linux-gnu")
    tools = Tools("cc", "c++", "ar", "ranlib")
    assert "-fuse-ld=lld" in opts.ldflags() and "--target=aarch64-linux-gnu" in opts.ldflags()
    (_, configure), _ = build_commands("cmake", opts, tools, tmp_path / "b")
    assert "-DCMAKE_C_COMPILER_TARGET=aarch64-linux-gnu" in configure
    assert "-DCMAKE_CXX_COMPILER_TARGET=aarch64-linux-gnu" in configure
    assert "-DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld" in configure
    assert not any("--target=" in arg for arg in configure)
    assert "-DCMAKE_SYSTEM_NAME=Linux" in configure and "-DCMAKE_SYSTEM_PROCESSOR=aarch64" in configure
    ((_, make),) = build_commands("make", opts, tools, tmp_path)
    assert "CFLAGS=-Oz --target=aarch64-linux-gnu" in make and "LDFLAGS=-fuse-ld=lld --target=aarch64-linux-gnu" in make
    (tmp_path / "configure").write_text("")
    (_, autotools), _ = build_commands("autotools", opts, tools, tmp_path)
    assert "--host=aarch64-linux-gnu" in autotools  # configure then neither runs what it builds nor guesses
    (_, meson), _ = build_commands("meson", opts, tools, tmp_path / "m")
    (cross,) = [a.removeprefix("--cross-file=") for a in meson if a.startswith("--cross-file=")]
    assert "cpu_family = 'aarch64'" in Path(cross).read_text()


def test_a_linux_target_runs_under_qemu_user_and_others_do_not():
    """What runs a target's programs here: qemu-user with Debian's cross root for another Linux architecture —
    handed to CMake (``CMAKE_CROSSCOMPILING_EMULATOR``) and Meson (``exe_wrapper``) — nothing for this machine's
    own architecture, nor for bare metal whose programs do not link (no picolibc multilib: a RISC-V) or that no
    emulated board runs; a Cortex-M's board is :mod:`optgym.corpus.qemu_system`'s (tests/test_baremetal_link.py)."""
    from optgym.corpus.target import Target

    qemu = shutil.which("qemu-aarch64")
    aarch64 = Target("aarch64-linux-gnu")
    if qemu is None:
        assert aarch64.emulator() is None
    else:
        assert aarch64.emulator() == [qemu, "-L", "/usr/aarch64-linux-gnu"]
        assert f"-DCMAKE_CROSSCOMPILING_EMULATOR={qemu};-L;/usr/aarch64-linux-gnu" in aarch64.cmake_args()
    assert Target("x86_64-linux-gnu").emulator() is None
    assert Target("riscv32-unknown-elf").emulator() is None
    assert not any("EMULATOR" in a for a in Target("riscv32-unknown-elf").cmake_args())
    cortex_m4 = Target("thumbv7em-none-eabi", ("-mcpu=cortex-m4", "-mthumb"))
    if cortex_m4.emulator() is not None:  # picolibc and qemu-system-arm installed (make setup)
        board = ";".join(cortex_m4.emulator())
        assert "optgym.corpus.qemu_system" in board
        assert f"-DCMAKE_CROSSCOMPILING_EMULATOR={board}" in cortex_m4.cmake_args()


@pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("qemu-aarch64") is None,
                    reason="cmake and qemu-user are installed by `make setup`")  # fmt: skip
def test_compare_build_for_aarch64_runs_both_test_suites_under_qemu(tmp_path):
    """``optgym compare-build --target aarch64-linux-gnu``, nothing else: both builds link (lld), both test suites
    pass under qemu-user (CMake's emulator, set by compare-build), and a policy the build names
    (``OPTGYM_POLICY=never``) is served for the AArch64 compiles — the allocator's shipped x86-64 policies are
    not, with optgym's note."""
    if reason := BY_NAME["aarch64"].skip_reason():
        pytest.skip(reason)
    src = _project(tmp_path, CROSS_PROJECT)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "optgym.cli", "compare-build", str(src), "-o", str(out), "--jobs", "2",
               "--target", "aarch64-linux-gnu", "--test"]  # fmt: skip
    env = {**compile_env(tmp_path / "run"), "OPTGYM_POLICY": "never"}
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["options"]["target"] == "aarch64-linux-gnu"
    for variant in ("plain", "optgym"):
        assert report["tests"][variant]["status"] == "passed", report["tests"][variant]
    (tool,) = [row for row in report["outputs"] if row["path"].endswith("tool")]
    assert not tool["identical"]  # never-inline decided the AArch64 compiles
    log = (out / "optgym.log").read_text()
    assert log.count("optgym-cc: note:") == 1 and "ships no regalloc-evict/regalloc-priority policy for aarch64" in log
    assert "optgym-cc: note:" not in (out / "plain.log").read_text()


def test_an_aarch64_cxx_compile_is_decided_by_the_inliner_shipped_for_aarch64(toolchain, tmp_path):
    """AArch64 ships its own C++ inliner (pretrained/aarch64/inline-size.onnx, trained on AArch64 code): a default
    AArch64 C++ compile is served by that file, not x86-64's, and deletes the static function clang keeps."""
    case = BY_NAME["aarch64"]
    if reason := case.skip_reason():
        pytest.skip(reason)
    shipped = Path(optgym_cc.PRETRAINED_DIR) / "aarch64" / "inline-size.onnx"
    policies, missing = optgym_cc.target_policies((case.triple, "aarch64"))
    assert policies == [("inline-size", str(shipped))] and missing == ["regalloc-evict", "regalloc-priority"]
    (tmp_path / "fanout.cpp").write_text(FANOUT_SOURCE.replace("extern void sink", 'extern "C" void sink'))
    env = compile_env(tmp_path / "run")
    flags = [f"--target={case.triple}", "-Oz", "-c", "fanout.cpp"]
    cxx = str(BIN / "optgym-c++")
    for name, extra in (("default.o", {}), ("named.o", {"OPTGYM_POLICY": str(shipped)})):
        done = subprocess.run([cxx, *flags, "-o", name], cwd=tmp_path, capture_output=True, text=True,
                              env={**env, **extra})  # fmt: skip
        assert done.returncode == 0, done.stderr
    subprocess.run([str(toolchain.clang), *flags, "-o", "clang.o"], cwd=tmp_path, check=True)  # C++ by the suffix
    assert (tmp_path / "default.o").read_bytes() == (tmp_path / "named.o").read_bytes()
    assert object_sizes(tmp_path / "default.o").text_bytes < object_sizes(tmp_path / "clang.o").text_bytes


def test_evaluate_measures_pretrained_with_the_file_a_build_of_the_corpus_target_gets(toolchain, tmp_path):
    """`optgym evaluate --policy pretrained` on an AArch64 corpus measured x86-64's inliner, where optgym-cc serves
    AArch64's own: it must measure the target's file, and for a target that ships none clang's own decisions, which
    are what its build gets, with a note saying so."""
    from typer.testing import CliRunner

    from optgym.cli import app

    case = BY_NAME["aarch64"]
    if reason := case.skip_reason():
        pytest.skip(reason)
    source = tmp_path / "fanout.cpp"
    source.write_text(FANOUT_SOURCE.replace("extern void sink", 'extern "C" void sink'))
    shipped = Path(optgym_cc.PRETRAINED_DIR) / "aarch64" / "inline-size.onnx"
    for triple, expected in ((case.triple, str(shipped)), (NO_POLICY_TRIPLE, "heuristic")):
        corpus = corpus_from_sources(toolchain, {"fanout": source}, tmp_path / triple, ("-Oz",), triple)
        args = ["evaluate", "--corpus", str(corpus.root), "--policy", "pretrained", "-o", str(tmp_path / f"r-{triple}"),
                "--json", "-j", "1"]  # fmt: skip
        done = CliRunner().invoke(app, args)
        assert done.exit_code == 0, done.output
        report = json.loads((tmp_path / f"r-{triple}" / "report.json").read_text())
        assert report["policy_identity"] == resolve_policy(expected).identity and report["policy_file"] == expected
        if expected == "heuristic":
            assert "ships no inline-size.onnx for riscv64" in done.output
            assert report["policy_text_bytes"] == report["heuristic_text_bytes"]
        else:
            assert report["policy_text_bytes"] < report["heuristic_text_bytes"], "AArch64's inliner deletes the callee"


#: A GNU configure script that must canonicalize its host (AC_CANONICAL_HOST runs config.sub), and a Makefile that
#: builds in its own tree only (no VPATH), as many of Debian's packages' do.
AUTOCONF_PROJECT = {
    "configure.ac": "AC_INIT([pieces], [1])\nAC_CONFIG_AUX_DIR([build-aux])\nAC_CANONICAL_HOST\nAC_PROG_CC\n"
    "AC_CONFIG_FILES([Makefile])\nAC_OUTPUT\n",
    "Makefile.in": "CC = @CC@\nCFLAGS = @CFLAGS@\nLDFLAGS = @LDFLAGS@\nall: tool\n"
    "tool: main.o libpieces.a\n\t$(CC) $(CFLAGS) $(LDFLAGS) main.o libpieces.a -o $@\n"
    "libpieces.a: a.o b.o\n\t$(AR) rc $@ a.o b.o\n%.o: %.c\n\t$(CC) $(CFLAGS) -c $< -o $@\n",
}
#: What a config.sub from before AArch64 answers (autoconf's own text for a machine it does not know).
OLD_CONFIG_SUB_HEAD = ("#!/bin/sh\ncase $1 in aarch64*) echo \"Invalid configuration \\`$1': machine \\`aarch64' not "
                       "recognized\" >&2; exit 1;; esac\n")  # fmt: skip


@pytest.mark.skipif(shutil.which("autoreconf") is None, reason="autoconf is installed by `make setup`")
def test_an_autotools_tree_older_than_the_target_builds_in_its_copy_with_debians_config_sub(tmp_path):
    """A tree whose config.sub predates AArch64 stopped its cross build at configure ("machine `aarch64' not
    recognized"), about one failed package in four of the AArch64 draws. Debian's build copies its current
    config.sub and config.guess over a package's; the corpus build and compare-build do so too, in their copies.
    The Makefile builds in its own tree only, which the corpus build's out-of-tree build of autotools got wrong.
    The old script here stands in for a 2012 tree's: the configure script, compiler and build are real."""
    from typer.testing import CliRunner

    from optgym.cli import app
    from optgym.corpus.build import CURRENT_CONFIG_SCRIPTS, stale_config_scripts

    case = BY_NAME["aarch64"]
    if reason := case.skip_reason():
        pytest.skip(reason)
    src = tmp_path / "src"
    (src / "build-aux").mkdir(parents=True)
    for name, text in {**AUTOCONF_PROJECT, **PIECES}.items():
        (src / name).write_text(text)
    for name in ("config.sub", "config.guess"):
        shutil.copyfile(CURRENT_CONFIG_SCRIPTS / name, src / "build-aux" / name)
    subprocess.run(["autoconf"], cwd=src, check=True, capture_output=True)
    old = src / "build-aux" / "config.sub"
    old.write_text(OLD_CONFIG_SUB_HEAD + old.read_text().split("\n", 1)[1])
    assert stale_config_scripts(src, case.triple) == [src / "build-aux"]

    out = tmp_path / "corpus"
    built = CliRunner().invoke(app, ["corpus", "build", str(src), "-o", str(out), "-j", "2", "--target", case.triple])
    assert built.exit_code == 0, built.output
    info = corpus_info(out, sizes=False)
    assert sorted(info["module_targets"]) == ["a.o", "b.o", "main.o"]
    assert [t.split("-")[0] for t in info["targets"]] == ["aarch64"]
    assert "config.sub and config.guess refreshed for aarch64-linux-gnu" in built.output
    assert old.read_text().startswith(OLD_CONFIG_SUB_HEAD), "the source tree itself is left as it was"
    work = out / ".optgym-work"
    assert (work / "src" / "config.status").exists() and not (work / "build").exists(), "one tree: the mirror"

    compared = CliRunner().invoke(app, ["compare-build", str(src), "--target", case.triple, "-o",
                                        str(tmp_path / "cb"), "-j", "2"])  # fmt: skip
    report = json.loads((tmp_path / "cb" / "report.json").read_text())
    assert compared.exit_code == 0, compared.output
    assert all(report["builds"][v]["ok"] and report["builds"][v]["config_scripts_refreshed"] == 1
               for v in ("plain", "optgym"))  # fmt: skip


def test_a_linux_targets_debian_architecture_and_its_multiarch_libraries_for_cmake(tmp_path):
    """A Linux target's libraries come from Debian's packages of its architecture (``apt-get build-dep -a arm64``),
    installed in ``/usr/lib/TRIPLE``: CMake searches there (by the target's library architecture) only when the
    whole system is one of its find roots, and reads their ``.pc`` files through the target's pkg-config."""
    assert [Target(t).debian_arch for t in ("aarch64-linux-gnu", "arm-linux-gnueabihf", "arm-linux-gnueabi",
                                            "i686-linux-gnu", "riscv64-linux-gnu", "thumbv7em-none-eabi")] == [
        "arm64", "armhf", "armel", "i386", "riscv64", None]  # fmt: skip
    target = Target("aarch64-linux-gnu")
    if target.cross_root is None:
        pytest.skip("libc6-dev-arm64-cross is installed by `make setup`")
    (roots,) = [a.removeprefix("-DCMAKE_FIND_ROOT_PATH=") for a in target.cmake_args() if "FIND_ROOT_PATH=" in a]
    multiarch = Path("/usr/lib/aarch64-linux-gnu").is_dir()
    assert roots.split(";") == ([str(target.cross_root), "/"] if multiarch else [str(target.cross_root)])
    assert target.multiarch_libdir == (Path("/usr/lib/aarch64-linux-gnu") if multiarch else None)
