"""optgym-cc / optgym-c++ in real builds: clang's own behaviour, a policy's decisions, safe fallbacks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest

from optgym.policies import SUGGESTED_GUARD_BELOW
from optgym.policies.mlp import MLPPolicy
from optgym.problems.inputs import CXX_INPUT, RESIDUAL_EXTRAS
from optgym.problems.normalize import Vocab
from optgym.rollout.rollout import DecisionPoint
from optgym.serve.guard import Guard
from optgym.serve.server import Server, _memoizable
from optgym.toolchain import object_sizes
from optgym.toolchain.interactive import InteractiveCompile

BIN = Path(sys.executable).parent
CC, CXX = str(BIN / "optgym-cc"), str(BIN / "optgym-c++")

LIB_C = "int twice(int x) { return 2 * x; }\nint apply(int (*f)(int), int x) { return f(x) + twice(x); }\n"
MAIN_CPP = r"""
#include <iostream>
#include <map>
#include <string>
#include <vector>
extern "C" int apply(int (*f)(int), int x);
static int inc(int x) { return x + 1; }
int main() {
  std::map<std::string, std::vector<int>> m;
  for (int i = 0; i < 5; ++i) m["k" + std::to_string(i % 2)].push_back(apply(inc, i));
  for (const auto &[k, v] : m) { int s = 0; for (int x : v) s += x; std::cout << k << '=' << s << '\n'; }
  return 0;
}
"""
CMAKE = """cmake_minimum_required(VERSION 3.16)
project(tiny C CXX)
add_executable(tiny main.cpp lib.c)
"""


@pytest.fixture(autouse=True)
def server_env(monkeypatch):
    monkeypatch.setenv("OPTGYM_SERVER_IDLE", "5")
    monkeypatch.delenv("OPTGYM_STRICT", raising=False)
    yield
    root = Path(os.environ["XDG_RUNTIME_DIR"]) / "optgym"
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if "optgym.serve.server" in cmd and str(root) in cmd:
            proc.kill()


def run(cmd, cwd, **env):
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300, env={**os.environ, **env})


def cmake_build(src: Path, build: Path, policy: str) -> subprocess.CompletedProcess:
    env = {"CC": CC, "CXX": CXX, "OPTGYM_POLICY": policy}
    configure = run(["cmake", "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=MinSizeRel"], src, **env)
    assert configure.returncode == 0, configure.stderr
    return run(["cmake", "--build", str(build), "-j", "2"], src, **env)


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is installed by `make setup`")
def test_cmake_project_builds_with_a_policy_and_runs(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(CMAKE)
    (src / "main.cpp").write_text(MAIN_CPP)
    (src / "lib.c").write_text(LIB_C)
    sizes = {}
    for policy in ("heuristic", "never"):
        build = cmake_build(src, tmp_path / policy, policy)
        assert build.returncode == 0, build.stdout + build.stderr
        assert "optgym-cc: warning" not in build.stdout + build.stderr
        out = subprocess.run([tmp_path / policy / "tiny"], capture_output=True, text=True, timeout=30)
        assert out.stdout == "k0=21\nk1=14\n"
        sizes[policy] = object_sizes(tmp_path / policy / "tiny").dottext_bytes
    assert sizes["never"] > sizes["heuristic"]  # the policy really decided (-Os is served)


def test_syntax_error_gives_clangs_own_error_and_exit_code(tmp_path):
    (tmp_path / "bad.c").write_text("int main( { return 0; }\n")
    ours = run([CC, "-Oz", "-c", "bad.c", "-o", "bad.o"], tmp_path, OPTGYM_POLICY="never")
    theirs = run(["/usr/lib/llvm-22/bin/clang", "-Oz", "-c", "bad.c", "-o", "bad.o"], tmp_path)
    assert ours.returncode == theirs.returncode != 0
    assert ours.stderr == theirs.stderr and "expected" in ours.stderr
    assert not (tmp_path / "bad.o").exists()


def test_served_compile_matches_an_interactive_never_inline(tmp_path, corpus):
    (tmp_path / "lib.c").write_text(LIB_C + "int main(void) { return apply(twice, 3); }\n")
    served = run([CC, "-Oz", "-c", "lib.c", "-o", "served.o"], tmp_path, OPTGYM_POLICY="never")
    plain = run(["/usr/lib/llvm-22/bin/clang", "-Oz", "-c", "lib.c", "-o", "plain.o"], tmp_path)
    assert served.returncode == plain.returncode == 0 and served.stderr == "", served.stderr
    assert object_sizes(tmp_path / "served.o").text_bytes > object_sizes(tmp_path / "plain.o").text_bytes


@pytest.mark.parametrize(
    "args",
    [["--version"], ["-O2", "-c", "x.c", "-o", "x.o"], ["-E", "x.c"], ["-Oz", "-flto=thin", "-c", "x.c", "-o", "x.o"]],
)
def test_everything_else_passes_straight_through(tmp_path, args):
    (tmp_path / "x.c").write_text(LIB_C + "int g(int a) { return apply(twice, a); }\n")
    output = tmp_path / "x.o"
    ours = run([CC, *args], tmp_path, OPTGYM_POLICY="never")
    ours_bytes = output.read_bytes() if output.exists() else None
    theirs = run(["/usr/lib/llvm-22/bin/clang", *args], tmp_path)
    assert (ours.returncode, ours.stdout, ours.stderr) == (theirs.returncode, theirs.stdout, theirs.stderr)
    assert ours_bytes == (output.read_bytes() if output.exists() else None)  # never-inline did not decide


def test_lto_compile_steps_are_served_on_request(tmp_path):
    """``OPTGYM_SERVE_LTO=1``: the policy decides an LTO step's inlining (never-inline: a different bitcode)."""
    (tmp_path / "x.c").write_text(LIB_C + "int g(int a) { return apply(twice, a); }\n")
    args = ["-Oz", "-flto=thin", "-c", "x.c", "-o", "x.o"]
    served = run([CC, *args], tmp_path, OPTGYM_POLICY="never", OPTGYM_SERVE_LTO="1", OPTGYM_STRICT="1")
    assert served.returncode == 0 and served.stderr == "", served.stderr
    ours = (tmp_path / "x.o").read_bytes()
    assert run(["/usr/lib/llvm-22/bin/clang", *args], tmp_path).returncode == 0
    assert ours[:4] == b"BC\xc0\xde" and ours != (tmp_path / "x.o").read_bytes()


def _servers(runtime: Path) -> list[psutil.Process]:
    commands = ((p, " ".join(p.info["cmdline"] or [])) for p in psutil.process_iter(["cmdline"]))
    return [p for p, cmd in commands if "optgym.serve.server" in cmd and str(runtime) in cmd]


def test_simultaneous_compiles_start_one_server_for_cc_and_cxx(tmp_path):
    """A parallel build's first compiles arrive together: one server starts (the launcher's lock), and
    C and C++ compiles share it — each further server would load the policy on the build's critical path."""
    runtime = tmp_path / "r"
    runtime.mkdir()
    (tmp_path / "lib.c").write_text(LIB_C)
    (tmp_path / "main.cpp").write_text(MAIN_CPP)
    env = {**os.environ, "OPTGYM_POLICY": "never", "OPTGYM_STRICT": "1", "XDG_RUNTIME_DIR": str(runtime)}
    jobs = [subprocess.Popen([CC if src.endswith(".c") else CXX, "-Oz", "-c", src, "-o", f"{i}.o"], cwd=tmp_path,
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for i, src in enumerate(["lib.c", "main.cpp"] * 3)]  # fmt: skip
    for job in jobs:
        _, err = job.communicate(timeout=300)
        assert job.returncode == 0 and err == "", err
    servers = _servers(runtime)
    assert len(servers) == 1
    assert len(list((runtime / "optgym").glob("serve-*.sock"))) == 1
    servers[0].kill()


def test_a_server_of_other_code_gets_no_compile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An upgrade replaces the launcher's and the server's files: a server still running the old code (up to its
    idle time) has another socket, so no compile is sent to it. An untouched install keeps its server."""
    import optgym_cc

    runtime = tmp_path / "r"
    runtime.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    code = tmp_path / "server.py"
    code.write_text("# one version\n")
    monkeypatch.setattr(optgym_cc, "SERVED_BY", (str(code),))
    policies, clang = [("inline-size", "never")], "/usr/lib/llvm-22/bin/clang"
    before = optgym_cc._server_socket(policies, clang)
    assert optgym_cc._server_socket(policies, clang) == before
    upgraded = tmp_path / "server.py.new"
    upgraded.write_text("# another version\n")
    upgraded.replace(code)  # as pip installs a file: a new one in its place
    assert optgym_cc._server_socket(policies, clang) != before


class _Point:
    """What MLPPolicy may read of a decision point; anything else it starts reading fails here loudly."""

    def __init__(self, vector: np.ndarray, heuristic: int, index: int, language: str) -> None:
        self._v, self.heuristic, self.index, self.language = vector, heuristic, index, language

    def vector(self) -> np.ndarray:
        return self._v


def test_the_servers_memo_keys_on_everything_a_policy_reads(vocab_path):
    """The server remembers a greedy MLPPolicy's answer per (view, observation bytes, heuristic, language):
    exact only while those are all a decision depends on."""
    # ``problem`` is the channel's own (one memo per served problem), so it is in the key already; ``linkage``
    # enters the key as the decision's ``callee_survives`` bit (Decider.decide)
    assert DecisionPoint.__slots__ == ("_obs", "_view", "heuristic", "index", "language", "linkage", "problem"), (
        "DecisionPoint has a new input: add it to the memo key in optgym/rollout/decider.py (Decider.decide)"
    )
    policy = MLPPolicy.initial(Vocab.load(vocab_path), extras=(*RESIDUAL_EXTRAS, CXX_INPUT), seed=3)
    policy.weights = [(w * 50, b) for w, b in policy.weights]  # decisions that vary
    rng = np.random.default_rng(0)
    for _ in range(50):
        v = rng.integers(0, 1 << 10, len(policy.feature_names)).astype(np.float32)
        h, lang = int(rng.integers(0, 2)), str(rng.choice(["c", "c++"]))
        assert policy(_Point(v, h, 0, lang)) == policy(_Point(v, h, int(rng.integers(1, 999)), lang))
    assert _memoizable(policy) and not _memoizable(policy.stochastic(1))


def test_memoized_answers_compile_the_same_object(vocab_path, tmp_path):
    policy = MLPPolicy.initial(Vocab.load(vocab_path), extras=RESIDUAL_EXTRAS, seed=5)
    policy.weights = [(w * 50, b) for w, b in policy.weights]
    policy.save(tmp_path / "coin")
    server = Server(str(tmp_path / "coin"), "inline-size")
    (tmp_path / "x.c").write_text(LIB_C + "int g(int y) { return apply(twice, y) + twice(y + 1); }\n")
    flags = server.problem.compile_flags()

    def compile_(name: str) -> bytes:
        argv = ["/usr/lib/llvm-22/bin/clang", "-Oz", "-c", "x.c", "-o", name]
        compile_ = InteractiveCompile(lambda base: [*argv, *flags, *server.problem.channel_flags(base)], cwd=tmp_path)
        with compile_:
            reply = server._drive(compile_, "c")
        assert reply["returncode"] == 0 and reply["decisions"] > 0
        return (tmp_path / name).read_bytes()

    cold = compile_("cold.o")
    remembered = len(server.served[0].memo or {})
    assert remembered > 0
    warm = compile_("warm.o")
    assert len(server.served[0].memo or {}) == remembered  # every answer came from the memo
    server.served[0].memo = None
    assert compile_("plain.o") == cold == warm


def test_corrupt_policy_falls_back_with_one_warning(tmp_path):
    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "policy.json").write_text("{ not json")
    (policy / "weights.npz").write_bytes(b"garbage")
    (tmp_path / "x.c").write_text(LIB_C)
    ours = run([CC, "-Oz", "-c", "x.c", "-o", "ours.o"], tmp_path, OPTGYM_POLICY=str(policy))
    assert ours.returncode == 0
    lines = ours.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("optgym-cc: warning:") and "without optgym" in lines[0]
    plain = run(["/usr/lib/llvm-22/bin/clang", "-Oz", "-c", "x.c", "-o", "plain.o"], tmp_path)
    assert plain.returncode == 0
    assert (tmp_path / "ours.o").read_bytes() == (tmp_path / "plain.o").read_bytes()

    strict = run([CC, "-Oz", "-c", "x.c", "-o", "strict.o"], tmp_path, OPTGYM_POLICY=str(policy), OPTGYM_STRICT="1")
    assert strict.returncode != 0 and "optgym-cc: error:" in strict.stderr


def test_compare_sizes(tmp_path):
    for name, body in (("a", "return 1;"), ("b", "volatile int x = 0; for (int i = 0; i < 9; i++) x += i; return x;")):
        (tmp_path / name).mkdir()
        (tmp_path / f"{name}.c").write_text(f"int main(void) {{ {body} }}\n")
        subprocess.run(["/usr/lib/llvm-22/bin/clang", "-Oz", f"{name}.c", "-o", str(tmp_path / name / "prog")],
                       check=True, cwd=tmp_path)  # fmt: skip
    out = subprocess.run([sys.executable, "-m", "optgym.cli", "compare-sizes", str(tmp_path / "a"), str(tmp_path / "b"),
                          "--field", "code", "--json"], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    import json

    report = json.loads(out.stdout)
    (row,) = report["rows"]
    assert row["path"] == "prog" and row["b"] > row["a"] > 0 and report["ratio"] > 1


def test_without_optgym_policy_the_shipped_policy_decides(tmp_path, corpus, toolchain, monkeypatch):
    """optgym-c++'s default is ``pretrained``, the policies inside the package: with ``OPTGYM_POLICY`` and
    ``OPTGYM_EVICT_POLICY`` unset (and strict, so a fallback would fail), a C++ compile gives the object the
    shipped inliner and eviction scorer give together in a rollout of the same source — not clang's own."""
    from conftest import CXX_SOURCE

    from optgym.policies import PRETRAINED, pretrained_path, resolve_policy
    from optgym.problems import get_problem
    from optgym.rollout import rollout

    assert PRETRAINED.is_file(), "the package ships a pretrained policy"
    assert pretrained_path("regalloc-evict").suffix == ".onnx", "and a pretrained eviction scorer, as ONNX"
    monkeypatch.delenv("OPTGYM_POLICY", raising=False)
    monkeypatch.delenv("OPTGYM_EVICT_POLICY", raising=False)
    (tmp_path / "zoo.cpp").write_text(CXX_SOURCE)
    served = run([CXX, "-Oz", "-c", "zoo.cpp", "-o", "served.o"], tmp_path, OPTGYM_STRICT="1")
    plain = run(["/usr/lib/llvm-22/bin/clang++", "-Oz", "-c", "zoo.cpp", "-o", "plain.o"], tmp_path)
    assert served.returncode == plain.returncode == 0, served.stderr
    evict = (get_problem("regalloc-evict"), resolve_policy("pretrained", "regalloc-evict").build())
    shipped = rollout(get_problem("inline-size"), corpus["zoo"], toolchain, resolve_policy("pretrained").build(),
                      companions=[evict])  # fmt: skip
    assert shipped.result.ok
    assert object_sizes(tmp_path / "served.o").text_bytes == shipped.result.metrics["text_bytes"]
    assert object_sizes(tmp_path / "served.o").text_bytes != object_sizes(tmp_path / "plain.o").text_bytes


def test_guard_keeps_the_smaller_of_the_policys_object_and_clangs(tmp_path):
    from conftest import FANOUT_SOURCE  # inlining every call ("always") beats -Oz: 148 against 177 B

    (tmp_path / "lib.c").write_text(LIB_C + "int main(void) { return apply(twice, 3); }\n")
    (tmp_path / "fanout.c").write_text(FANOUT_SOURCE)
    out = tmp_path / "out"
    out.mkdir()
    compile_ = ["-Oz", "-c", "-MD"]
    # never-inline loses on lib.c: the guarded object is clang's own, byte for byte
    assert run([CC, *compile_, "lib.c", "-o", "out/never.o"], tmp_path, OPTGYM_POLICY="never").returncode == 0
    guarded = run([CC, *compile_, "lib.c", "-o", "out/guarded.o"], tmp_path, OPTGYM_POLICY="never", OPTGYM_GUARD="1")
    assert guarded.returncode == 0 and guarded.stderr == "", guarded.stderr
    plain = run(["/usr/lib/llvm-22/bin/clang", "-Oz", "-c", "lib.c", "-o", "plain.o"], tmp_path)
    assert plain.returncode == 0
    assert (out / "guarded.o").read_bytes() == (tmp_path / "plain.o").read_bytes()
    assert object_sizes(out / "never.o").text_bytes > object_sizes(out / "guarded.o").text_bytes
    # inlining every call wins on fanout.c: the guard keeps the policy's object
    guarded = run([CC, *compile_, "../fanout.c"], out, OPTGYM_POLICY="always", OPTGYM_GUARD="1")
    assert guarded.returncode == 0, guarded.stderr
    assert run(["/usr/lib/llvm-22/bin/clang", "-Oz", "-c", "../fanout.c", "-o", "plain.o"], out).returncode == 0
    assert object_sizes(out / "fanout.o").text_bytes < object_sizes(out / "plain.o").text_bytes
    # the dependency files are the build's own (named and targeted after the real object); nothing else is left
    assert (out / "guarded.d").read_text().startswith("out/guarded.o:")
    assert (out / "fanout.d").read_text().startswith("fanout.o:")
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["never.o", "never.d", "guarded.o", "guarded.d", "fanout.o", "fanout.d", "plain.o"]
    )


def test_guard_below_compiles_clangs_object_only_for_a_small_one(tmp_path):
    """``OPTGYM_GUARD_BELOW=N``: never-inline loses on lib.c; with a bound above its object clang's object is
    kept, with the bound at its size (not under it) or 0 (off) the policy's stays; a bound that is not a byte
    count is named on stderr and the compile is clang's plain one. Nothing is left beside the objects."""
    (tmp_path / "lib.c").write_text(LIB_C + "int main(void) { return apply(twice, 3); }\n")
    compile_ = ["-Oz", "-c", "lib.c", "-o"]
    assert run(["/usr/lib/llvm-22/bin/clang", *compile_, "plain.o"], tmp_path).returncode == 0
    assert run([CC, *compile_, "never.o"], tmp_path, OPTGYM_POLICY="never").returncode == 0
    size = object_sizes(tmp_path / "never.o").text_bytes
    assert size > object_sizes(tmp_path / "plain.o").text_bytes
    cases = (("above", size + 1, "plain.o"), ("at", size, "never.o"), ("off", 0, "never.o"), ("bad", "2k", "plain.o"))
    for name, bound, kept in cases:
        out = run([CC, *compile_, f"{name}.o"], tmp_path, OPTGYM_POLICY="never", OPTGYM_GUARD_BELOW=str(bound))
        assert out.returncode == 0, out.stderr
        assert (tmp_path / f"{name}.o").read_bytes() == (tmp_path / kept).read_bytes(), name
        assert ("OPTGYM_GUARD_BELOW='2k' is not a number of bytes" in out.stderr) == (name == "bad")
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["above.o", "at.o", "bad.o", "lib.c", "never.o", "off.o", "plain.o"]


def test_by_default_no_object_is_compiled_twice_and_the_suggested_bound_guards(tmp_path, monkeypatch):
    """Without ``OPTGYM_GUARD_BELOW`` a served compile is one compile: never-inline's lib.cpp keeps never-inline's
    larger object. A build that asks for the suggested bound (2 kB) gets clang's own object for it, byte for byte
    — so the bound, not the policy, made it clang's."""
    monkeypatch.delenv("OPTGYM_GUARD_BELOW")
    source = LIB_C + "int main(void) { return apply(twice, 3); }\n"
    (tmp_path / "lib.cpp").write_text(source)
    clang = "/usr/lib/llvm-22/bin/clang++"
    assert run([clang, "-Oz", "-c", "lib.cpp", "-o", "plain.o"], tmp_path).returncode == 0
    default = run([CXX, "-Oz", "-c", "lib.cpp", "-o", "default.o"], tmp_path, OPTGYM_POLICY="never", OPTGYM_STRICT="1")
    assert default.returncode == 0, default.stderr
    assert object_sizes(tmp_path / "default.o").text_bytes > object_sizes(tmp_path / "plain.o").text_bytes
    asked = run([CXX, "-Oz", "-c", "lib.cpp", "-o", "asked.o"], tmp_path, OPTGYM_POLICY="never", OPTGYM_STRICT="1",
                OPTGYM_GUARD_BELOW=str(SUGGESTED_GUARD_BELOW))  # fmt: skip
    assert asked.returncode == 0, asked.stderr
    assert (tmp_path / "asked.o").read_bytes() == (tmp_path / "plain.o").read_bytes()


def test_guard_compiles_clangs_object_only_where_the_policy_departs_from_it(tmp_path):
    """A compile whose every answer is clang's own is clang's object already: the shipped policy leaves C to
    clang, so a guarded C compile runs no reference; never-inline departs, and clang's object wins."""
    (tmp_path / "x.c").write_text(LIB_C + "int main(void) { return apply(twice, 3); }\n")
    clang = "/usr/lib/llvm-22/bin/clang"
    assert run([clang, "-Oz", "-c", "x.c", "-o", "plain.o"], tmp_path).returncode == 0
    for spec, kept in (("pretrained", "policy"), ("heuristic", "policy"), ("never", "clang")):
        server = Server(spec, "inline-size")
        argv = [clang, "-Oz", "-c", "x.c", "-o", f"{spec}.o"]
        flags = [*argv, *server.problem.compile_flags()]
        guard = Guard(argv, str(tmp_path), dict(os.environ))
        with InteractiveCompile(
            lambda base, f=flags, s=server: [*f, *s.problem.channel_flags(base)], cwd=tmp_path
        ) as c:
            reply = server._drive(c, "c", guard)
        reply |= guard.finish(reply["returncode"], 60)
        guard.close()
        assert reply["returncode"] == 0 and reply["decisions"] > 0 and reply["guard"] == kept, reply
        assert (guard.proc is None) == (spec != "never"), spec
        assert (tmp_path / f"{spec}.o").read_bytes() == (tmp_path / "plain.o").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["heuristic.o", "never.o", "plain.o", "pretrained.o", "x.c"]


def test_guard_leaves_no_file_when_the_compile_fails(tmp_path):
    (tmp_path / "bad.c").write_text("int main( { return 0; }\n")
    ours = run([CC, "-Oz", "-c", "bad.c", "-o", "bad.o"], tmp_path, OPTGYM_POLICY="never", OPTGYM_GUARD="1")
    theirs = run(["/usr/lib/llvm-22/bin/clang", "-Oz", "-c", "bad.c", "-o", "bad.o"], tmp_path)
    assert ours.returncode == theirs.returncode != 0 and ours.stderr == theirs.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.c"]


@pytest.mark.parametrize(
    ("args", "reference", "why"),
    [
        (["-Oz", "-c", "a.c", "-o", "a.o", "-MD", "-MF", "a.d", "-MT", "t"], ["-Oz", "-c", "a.c"], None),
        (["-Oz", "-c", "a.c", "-oa.o", "-Wp,-MD,a.d", "-MMD", "-MP"], ["-Oz", "-c", "a.c"], None),
        (["-Oz", "-c", "a.c", "-gsplit-dwarf"], None, "-gsplit-dwarf"),
        (["-Oz", "-c", "a.c", "-Wp,-DX"], None, "-Wp,-DX"),
        (["-Oz", "-flto", "-c", "a.c", "-flto=thin"], None, "-flto=thin writes bitcode"),
        (["-Oz", "-flto=thin", "-c", "a.c", "-fno-lto"], ["-Oz", "-flto=thin", "-c", "a.c", "-fno-lto"], None),
    ],
)
def test_guard_reference_writes_only_its_object(args, reference, why):
    from optgym.serve.guard import output_path, reference_args, unguardable

    reason = unguardable(args)
    assert (reason is None) if why is None else (why in reason)
    if reference is not None:
        assert reference_args(args, "/o/.a.o.x") == [*reference, "-o", "/o/.a.o.x"]
        assert output_path(args, "/w") == "/w/a.o"


def test_guard_closed_mid_compile_kills_clangs_compile_and_removes_its_file(tmp_path):
    """What the server does when the launcher goes away or the policy's compile fails first."""
    from conftest import CXX_SOURCE  # iostream and friends: a compile that takes most of a second

    (tmp_path / "zoo.cpp").write_text(CXX_SOURCE)
    argv = ["/usr/lib/llvm-22/bin/clang++", "-Oz", "-c", "zoo.cpp", "-o", "zoo.o"]
    guard = Guard(argv, str(tmp_path), dict(os.environ))
    guard.start()
    assert guard.proc is not None and guard.proc.poll() is None, "clang's compile runs"
    assert guard.reference is not None and Path(guard.reference).parent == tmp_path
    guard.close()
    assert guard.proc.returncode is not None and not psutil.pid_exists(guard.proc.pid)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["zoo.cpp"]
    guard.close()  # twice is fine


def test_guard_removes_the_files_of_a_server_killed_mid_compile(tmp_path):
    """SIGKILL runs no cleanup: the next guarded compile of that object removes a dead server's file, and
    only that — a live server's file and another object's stay."""
    from optgym.serve.guard import SUFFIX

    (tmp_path / "zoo.c").write_text(LIB_C)
    dead = subprocess.Popen(["true"])
    dead.wait()
    alive = subprocess.Popen(["sleep", "60"])
    try:
        stale, live = tmp_path / f".zoo.o.{dead.pid}.a1{SUFFIX}", tmp_path / f".zoo.o.{alive.pid}.b2{SUFFIX}"
        other = tmp_path / f".lib.o.{dead.pid}.c3{SUFFIX}"
        for path in (stale, live, other):
            path.write_bytes(b"partial object")
        guard = Guard(["/usr/lib/llvm-22/bin/clang", "-Oz", "-c", "zoo.c", "-o", "zoo.o"], str(tmp_path), {})
        guard.start()
        assert guard.reference is not None and f".zoo.o.{os.getpid()}." in guard.reference
        guard.close()
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["zoo.c", live.name, other.name])
    finally:
        alive.kill()
