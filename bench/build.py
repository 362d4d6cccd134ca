#!/usr/bin/env python3
"""A real CMake project from the training list, built 4 (or 5) ways at -Oz: build time, linked code size, tests.

Release mode's promise is that a policy can be dropped into anybody's build; this measures what that
costs and checks that it changes nothing but code size. The project (graphite2 by default, or cmark)
comes from ``apt-get source`` (Debian's patched upstream tree) and is configured with
``CMAKE_BUILD_TYPE=MinSizeRel`` and its flags set to ``-Oz -DNDEBUG`` (MinSizeRel's own are ``-Os
-DNDEBUG``), Ninja, ``-j JOBS``:

(1) plain       clang-22 / clang++-22 themselves.
(2) C host      a CC/CXX wrapper (``sh``) that, for a ``-Oz`` compile, makes the two FIFOs, starts
                bench/minimal_host.c — the C program of bench/host_overhead.py (b), which answers every
                decision with clang's own — and runs clang with the channel flags: the floor for any
                host, over a whole build. Its binaries must equal (1)'s code byte for byte in size.
(3) heuristic   ``optgym-cc``/``optgym-c++`` with every policy ``heuristic`` (``OPTGYM_POLICY``,
                ``OPTGYM_EVICT_POLICY``, ``OPTGYM_PRIORITY_POLICY``): the launcher only, which hands every
                compile straight to clang.
(4) policy      ``optgym-cc``/``optgym-c++`` with a trained inliner (``--policy``) and the shipped
                allocator scorers (in C compiles); a run or policy directory given as ``--policy`` is
                exported to ONNX first, so the shipped format is what is measured. Without
                ``--policy`` a quick behavioral-cloning policy is trained on the demo corpus (``optgym
                corpus debian --preset demo`` → trace → vocab → ``train bc`` → ``export``), trained once
                in the work directory and exported again on every run (the export format is part of what
                is measured); if that is impossible the variant runs ``never`` and says so. It runs
                with ``OPTGYM_STRICT=1``: a fallback to clang's heuristic would fail the build instead of
                quietly timing something else.
(5) guarded     with ``--guard``: (4) plus ``OPTGYM_GUARD=1``, clang's own compile beside every policy
                compile and the smaller object kept — what never growing an object costs in time.
(6) guarded below N   with ``--guard-below N`` (repeatable, one variant each): (4) plus
                ``OPTGYM_GUARD_BELOW=N``, clang's own compile after the policy's only where that object has
                under N bytes of text — ``optgym-cc``'s default (2048) for every served compile, so (4) is
                guarded that way and ``--guard-below 0`` is (4) without it.
(7) candidates N   with ``--candidates N`` (repeatable): (4) with ``OPTGYM_CANDIDATES=N``, each C object
                compiled the shipped portfolio's first N ways — what buying bytes with compiles costs. (4)
                itself pins ``OPTGYM_CANDIDATES=1`` (one compile an object: the host's cost, which the target
                is about); a default build compiles the portfolio's ``default_candidates``.
(8) default     with ``--default``: (4) without the pin — ``optgym-cc`` as a user's build gets it.

Each round cleans and rebuilds every variant, the variants' order rotated from round to round so a
noisy moment hits them alike; the table shows the median wall time of the rounds and the ratio to
(2) — the target is (4) ≤ 1.05× (2) — and to (1), and the build's CPU time (every process of the
build, including the policy server and the compiles it runs: each build runs under ``optgym
compare-build``'s reaper, which adopts the server, stops it at the end and reaps it; its own share is
read before), which says more than wall time on a shared machine. Then the linked executables and shared libraries
are compared with (1) (``optgym.evaluate.elf_sizes.compare_builds``, field ``code``: the ``.text*`` sections),
and the project's own test suite runs on every build with ``ctest``: a failure where (1) passes means
an inlining decision changed behaviour — a compiler bug to report — and is printed loudly and makes
the exit status 1.

    nice -n 10 .venv/bin/python bench/build.py                       # graphite2, a quick BC policy, 3 rounds
    .venv/bin/python bench/build.py --policy RUN_OR_POLICY --repeat 5 --json out.json
    .venv/bin/python bench/build.py --project cmark --corpus demo-out/corpus   # train on an existing corpus
    .venv/bin/python bench/build.py --project cmark --policy pretrained --default --target aarch64-linux-gnu
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host_overhead import build_c_host  # bench/ is not a package: the shared C host's builder

from optgym.corpus.debian import enable_deb_src
from optgym.corpus.target import Target
from optgym.errors import OptgymError
from optgym.evaluate.build_compare import run_step
from optgym.evaluate.elf_sizes import compare_builds
from optgym.policies.mlp import is_policy_dir
from optgym.problems import get_problem
from optgym.toolchain.llvm import Toolchain, find_toolchain
from optgym_cc import CHANNELS

TARGET = 1.05
PROJECTS = ("graphite2", "cmark")
BIN = Path(sys.executable).parent
DEFAULT_WORK = Path(os.environ.get("OPTGYM_CACHE_DIR", Path.home() / ".cache" / "optgym")) / "bench-build"

#: Every policy variable of the launcher: (3) sets them all to ``heuristic`` — clang's own decisions everywhere
#: (left unset, the allocator's would be the shipped scorers).
CHANNEL_VARIABLES = tuple(variable for _, variable, _ in CHANNELS)


class BenchError(Exception):
    """A step of the bench that cannot go on (fetching, configuring, building)."""


@dataclass
class Variant:
    name: str
    label: str
    cc: str
    cxx: str
    env: dict[str, str] = field(default_factory=dict)
    walls: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)
    server_cpus: list[float] = field(default_factory=list)  # the policy server's own, without its compiles
    ctest: dict | None = None

    @property
    def served(self) -> bool:
        """Whether compiles go to an optgym policy server (whose CPU time the build does not wait for)."""
        return self.name == "policy"


def say(console: Console, text: str) -> None:
    console.print(text, highlight=False, soft_wrap=True)


def run_logged(argv: list[str], log: Path, *, cwd: Path | None = None, env: dict[str, str] | None = None) -> int:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as out:
        out.write(f"$ {shlex.join(argv)}\n")
        out.flush()
        return subprocess.run(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL).returncode  # fmt: skip


def tail(log: Path, lines: int = 15) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


# -- the project ----------------------------------------------------------------------------------


def fetch_project(name: str, work: Path, console: Console) -> Path:
    """The project's Debian source tree (``apt-get source``, deb-src enabled when missing); cached."""
    root = work / "src" / name
    trees = sorted(p.parent for p in root.glob("*/CMakeLists.txt")) if root.is_dir() else []
    if trees:
        return trees[0]
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    log = work / "logs" / f"fetch-{name}.log"
    try:
        if enable_deb_src(log):
            say(console, "enabled Debian's deb-src entries (apt-get update)")
    except OptgymError as e:
        raise BenchError(str(e)) from None
    if run_logged(["apt-get", "source", "-q", name], log, cwd=root):
        raise BenchError(f"apt-get source {name} failed:\n{tail(log)}")
    trees = sorted(p.parent for p in root.glob("*/CMakeLists.txt"))
    if not trees:
        raise BenchError(f"apt-get source {name} gave no CMake tree in {root}")
    return trees[0]


# -- the four compilers -----------------------------------------------------------------------------

WRAPPER = """#!/bin/sh
# bench/build.py's C-host compiler: a -Oz compile of one source is answered by bench/minimal_host.c.
clang={clang}
served=no
opt=
for arg in "$@"; do
  case $arg in
    -c) served=yes ;;
    -O*) opt=$arg ;;
    -E|-S|-M|-MM|-fsyntax-only|-emit-llvm|-flto*|-'###'|--version|-) exec "$clang" "$@" ;;
  esac
done
if [ "$served" != yes ] || [ "$opt" != -Oz ]; then exec "$clang" "$@"; fi
dir=$(mktemp -d "${{TMPDIR:-/tmp}}/chost.XXXXXX") || exit 1
base=$dir/channel
mkfifo "$base.in" "$base.out" || exit 1
{host} "$base" >/dev/null &
host=$!
"$clang" "$@" {flags}
status=$?
[ $status -eq 0 ] || kill $host 2>/dev/null
wait $host
host_status=$?
rm -rf "$dir"
if [ $status -eq 0 ] && [ $host_status -ne 0 ]; then
  echo "chost-cc: the minimal host failed (exit $host_status)" >&2
  exit 1
fi
exit $status
"""


def write_wrappers(toolchain: Toolchain, host: Path, bin_dir: Path) -> tuple[Path, Path]:
    """``chost-cc`` / ``chost-c++``: the same channel flags optgym's server adds (problem flags, then the
    channel's), and the same choice of what is served (``-c`` at ``-Oz``; preprocessing, ``-###``… pass)."""
    problem = get_problem("inline-size")
    marker = "\x00"
    flags = " ".join(
        f'"{f.replace(marker, "$base")}"' if marker in f else shlex.quote(f)
        for f in (*problem.compile_flags(), *problem.channel_flags(marker))
    )
    bin_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, driver in (("chost-cc", "clang"), ("chost-c++", "clang++")):
        path = bin_dir / name
        path.write_text(WRAPPER.format(clang=shlex.quote(str(toolchain.bin_dir / driver)),
                                       host=shlex.quote(str(host)), flags=flags))  # fmt: skip
        path.chmod(0o755)
        paths.append(path)
    return paths[0], paths[1]


# -- the trained policy -----------------------------------------------------------------------------


def optgym(args: list[str], log: Path, jobs: int) -> None:
    argv = [str(BIN / "optgym"), *args]
    if args[0] in ("corpus", "trace", "train"):
        argv += ["-j", str(jobs)]
    if run_logged(argv, log):
        raise BenchError(f"`optgym {' '.join(args)}` failed:\n{tail(log)}")


def prepare_policy(spec: str | None, corpus: Path | None, work: Path, jobs: int, console: Console) -> tuple[str, str]:
    """``(OPTGYM_POLICY value, label)``. Run and policy directories are exported to ONNX first."""
    train = work / "train"
    log = work / "logs" / "policy.log"
    if spec is not None:
        path = Path(spec)
        if path.is_dir():
            out = train / f"{path.resolve().name}.onnx"
            optgym(["export", str(path), "-o", str(out)], log, jobs)
            return str(out), f"{spec} (exported to ONNX)"
        return spec, spec
    out = train / "bc.onnx"
    if is_policy_dir(train / "bc" / "policy"):  # trained before: export again, so what runs is today's format
        optgym(["export", str(train / "bc"), "-o", str(out)], log, jobs)
        return str(out), f"BC policy on the demo corpus, ONNX (trained before: {train / 'bc'})"
    t0 = time.perf_counter()
    try:
        if corpus is None:
            corpus = work / "corpus"
            say(console, f"[dim]training a quick policy: the demo corpus (zlib, cmark, graphite2) in {corpus}…[/]")
            optgym(["corpus", "debian", "--preset", "demo", "-o", str(corpus)], log, jobs)
        say(console, "[dim]training a quick policy: trace → vocab → train bc → export…[/]")
        shutil.rmtree(train, ignore_errors=True)
        optgym(["trace", "--corpus", str(corpus), "-o", str(train / "trace")], log, jobs)
        optgym(["vocab", str(train / "trace"), "-o", str(train / "vocab.json")], log, jobs)
        optgym(["train", "bc", "--trace", str(train / "trace"), "--vocab", str(train / "vocab.json"),
                "-o", str(train / "bc"), "--no-evaluate"], log, jobs)  # fmt: skip
        optgym(["export", str(train / "bc"), "-o", str(out)], log, jobs)
    except BenchError as e:
        say(console, f"[bold yellow]no trained policy ({e}); the policy variant runs `never`[/]")
        return "never", "never (training failed: see " + str(log) + ")"
    say(console, f"[dim]policy trained and exported in {time.perf_counter() - t0:.0f} s: {out}[/]")
    return str(out), "BC policy on the demo corpus, ONNX"


def fresh_bytecode() -> None:
    """Compile optgym's and the launcher's bytecode now. Under ``PYTHONDONTWRITEBYTECODE`` (set in many
    CI and container environments) a stale ``.pyc`` is never rewritten: every launcher — one per
    compile — and every server start would compile the source again, which is not what a user of an
    installed optgym pays (``make setup`` runs the same compileall)."""
    import optgym
    import optgym_cc

    for package in (optgym, optgym_cc):
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(package.__file__).parent)],
                       check=True, stdout=subprocess.DEVNULL)  # fmt: skip


# -- building and timing ----------------------------------------------------------------------------


def variant_env(v: Variant, runtime: Path) -> dict[str, str]:
    env = {k: val for k, val in os.environ.items() if not k.startswith("OPTGYM_")}
    env |= {"CC": v.cc, "CXX": v.cxx, **v.env, "XDG_RUNTIME_DIR": str(runtime)}
    return env


def cross_args(target: Target | None, toolchain: Toolchain) -> list[str]:
    """``--target``: CMake's cross settings for a Linux target (its tests run under qemu-user), lld for its links
    and LLVM's archiver (the system's ``ld`` and ``ar`` know this machine only)."""
    if target is None:
        return []
    links = " ".join(target.link_flags)
    return [*target.cmake_args(), f"-DCMAKE_AR={toolchain.tool('llvm-ar')}",
            f"-DCMAKE_RANLIB={toolchain.tool('llvm-ranlib')}",
            *(f"-DCMAKE_{kind}_LINKER_FLAGS={links}" for kind in ("EXE", "SHARED", "MODULE"))]  # fmt: skip


def configure(v: Variant, src: Path, build: Path, work: Path, cross: list[str]) -> None:
    runtime = work / "run" / f"{v.name}-configure"
    runtime.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(build, ignore_errors=True)
    log = work / "logs" / f"configure-{v.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)
    argv = ["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=MinSizeRel",
            "-DCMAKE_C_FLAGS_MINSIZEREL=-Oz -DNDEBUG", "-DCMAKE_CXX_FLAGS_MINSIZEREL=-Oz -DNDEBUG", *cross]  # fmt: skip
    status = run_step("configure", argv, work, variant_env(v, runtime), log).returncode  # stops its servers
    if status:
        raise BenchError(f"configuring {v.name} failed:\n{tail(log)}")


def timed_build(v: Variant, build: Path, work: Path, jobs: int, label: str) -> tuple[float, float, float]:
    """``(wall seconds, CPU seconds, policy server's own CPU seconds)`` of a clean rebuild."""
    runtime = work / "run" / f"{v.name}-{label}"
    shutil.rmtree(runtime, ignore_errors=True)
    runtime.mkdir(parents=True)
    env = variant_env(v, runtime)
    log = work / "logs" / f"build-{v.name}-{label}.log"
    log.unlink(missing_ok=True)
    if run_logged(["cmake", "--build", str(build), "--target", "clean"], log, env=env):
        raise BenchError(f"cleaning {v.name} failed:\n{tail(log)}")
    # optgym compare-build's reaper: the policy server (orphaned by the launcher that started it) and every
    # compile it ran are reaped with the build, so its CPU is the build's; the server is stopped at the end, so
    # the next build starts its own as a user's build would
    step = run_step("build", ["cmake", "--build", str(build), "-j", str(jobs)], build, env, log)
    status, wall, cpu, server_own = step.returncode, step.wall_s, step.cpu_s, step.server_cpu_s
    if status:
        raise BenchError(f"building {v.name} failed:\n{tail(log)}")
    text = log.read_text(errors="replace")
    if "optgym-cc: warning" in text:
        raise BenchError(
            f"{v.name}: optgym fell back to clang's heuristic: {re.findall(r'optgym-cc: warning.*', text)[0]}"
        )
    return wall, cpu, server_own


def run_ctest(build: Path, work: Path, name: str, jobs: int) -> dict:
    log = work / "logs" / f"ctest-{name}.log"
    log.unlink(missing_ok=True)
    status = run_logged(["ctest", "--test-dir", str(build), "-j", str(jobs), "--output-on-failure", "--timeout", "600"],
                        log)  # fmt: skip
    text = log.read_text(errors="replace")
    m = re.search(r"(\d+)% tests passed, (\d+) tests? failed out of (\d+)", text)
    total, failed = (int(m.group(3)), int(m.group(2))) if m else (0, 0)
    failing = re.findall(r"^\s*\d+ - (\S+) \(", text.split("The following tests FAILED:")[-1], re.M) if failed else []
    ok = status == 0 and m is not None and failed == 0 and total > 0
    return {"ok": ok, "total": total, "failed": failed, "failing": failing, "status": status, "log": str(log)}


# -- the report -------------------------------------------------------------------------------------


def size_totals(a: Path, b: Path, field: str) -> tuple[int, int, int]:
    """``(A bytes, B bytes, files)`` over the linked ELF files present in both builds."""
    rows = [r for r in compare_builds(a, b, field) if r.a is not None and r.b is not None]
    return sum(r.a for r in rows), sum(r.b for r in rows), len(rows)  # type: ignore[misc]


def fmt(x: float | None, digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def report(variants: dict[str, Variant], builds: dict[str, Path], console: Console, title: str) -> dict:
    floor = variants["c_host"]
    med = {n: statistics.median(v.walls) for n, v in variants.items()}
    low = {n: min(v.walls) for n, v in variants.items()}
    cpu = {n: statistics.median(v.cpus) for n, v in variants.items()}
    table = Table(title=title)
    for col in ("variant", "wall s", "÷ C host", "÷ plain", "min wall s", "÷ C host (min)", "CPU s", "÷ C host",
                "÷ plain", "linked .text bytes", "÷ plain", "ctest"):  # fmt: skip
        table.add_column(col, justify="left" if col in ("variant", "ctest") else "right")
    rows = {}
    for n, v in variants.items():
        code_a, code_b, files = size_totals(builds["plain"], builds[n], "code")
        t = v.ctest or {}
        verdict = (f"[green]{t['total']} passed[/]" if t.get("ok")
                   else f"[bold red]{t.get('failed')} of {t.get('total')} FAILED[/]")  # fmt: skip
        rows[n] = {
            "label": v.label,
            "wall_seconds": v.walls,
            "cpu_seconds": v.cpus,
            "wall_median": med[n],
            "wall_over_c_host": med[n] / med["c_host"],
            "wall_over_plain": med[n] / med["plain"],
            "min_wall_over_c_host": low[n] / low["c_host"],
            "cpu_median": cpu[n],
            "cpu_over_c_host": cpu[n] / cpu["c_host"],
            "cpu_over_plain": cpu[n] / cpu["plain"],
            "server_own_cpu_median": statistics.median(v.server_cpus),
            "code_bytes": code_b,
            "code_over_plain": code_b / code_a if code_a else None,
            "linked_files": files,
            "ctest": t,
        }
        r = rows[n]
        table.add_row(v.label, fmt(med[n], 1), fmt(r["wall_over_c_host"]), fmt(r["wall_over_plain"]), fmt(low[n], 1),
                      fmt(r["min_wall_over_c_host"]), fmt(cpu[n], 1), fmt(r["cpu_over_c_host"]),
                      fmt(r["cpu_over_plain"]), str(code_b), fmt(r["code_over_plain"], 4), verdict)  # fmt: skip
    console.print(table)
    p = rows["policy"]
    ok = "[green]ok[/]" if p["wall_over_c_host"] <= TARGET else "[bold red]above target[/]"
    say(console, f"optgym-c++ with the policy ÷ minimal C host, build wall time: {p['wall_over_c_host']:.3f} "
                 f"(target ≤ {TARGET:.2f}) {ok};  from the fastest rounds {p['min_wall_over_c_host']:.3f};  "
                 f"CPU time {p['cpu_over_c_host']:.3f}")  # fmt: skip
    host, c_host = p["server_own_cpu_median"], rows["c_host"]["cpu_median"]
    say(console, f"the policy server's own CPU (features, decisions, answers): {host:.1f} s of the policy build's "
                 f"{p['cpu_median']:.1f} s; the rest, {p['cpu_median'] - host:.1f} s, is clang (on the policy's "
                 f"inlining) and the launchers, against the C host build's {c_host:.1f} s")  # fmt: skip
    say(console, f"[dim]wall: median of {len(floor.walls)} clean rebuilds; CPU: the build's processes, policy "
                 f"server and its compiles included; sizes: the {rows['plain']['linked_files']} linked "
                 f"executables and shared libraries, against the plain build[/]")  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--project", choices=PROJECTS, default="graphite2", help="Debian source package to build")
    parser.add_argument("--policy", help="the trained policy (ONNX file, run or policy dir, or a spec such as never)")
    parser.add_argument("--corpus", type=Path, help="train the quick policy on this corpus, not the demo one")
    parser.add_argument(
        "--guard",
        action="store_true",
        help="a fifth variant: the policy with OPTGYM_GUARD=1 (clang's own compile beside it)",
    )
    parser.add_argument("--guard-below", type=int, metavar="N", action="append", default=[],
                        help="a variant: the policy, OPTGYM_GUARD_BELOW=N (small objects compiled twice); "
                             "repeatable")  # fmt: skip
    parser.add_argument("--candidates", type=int, metavar="N", action="append", default=[],
                        help="a variant: the policy, OPTGYM_CANDIDATES=N (each C object compiled N ways); "
                             "repeatable")  # fmt: skip
    parser.add_argument("--default", action="store_true",
                        help="a variant: the policy with optgym-cc's defaults (OPTGYM_CANDIDATES and "
                             "OPTGYM_GUARD_BELOW unset): what a user's build compiles")  # fmt: skip
    parser.add_argument("--target", metavar="TRIPLE",
                        help="cross-build for a Linux target (aarch64-linux-gnu), tests under qemu-user")  # fmt: skip
    parser.add_argument("--repeat", type=int, default=3, help="timed clean rebuilds per variant (default 3)")
    parser.add_argument("--jobs", "-j", type=int, default=os.cpu_count() or 2, help="parallel compiles")
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORK, help=f"sources, builds, logs ({DEFAULT_WORK})")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write the figures here")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be ≥ 1")
    target = Target.of(args.target)
    if target is not None and not (target.linux and target.emulator()):
        parser.error(f"--target {args.target}: only a Linux target whose programs qemu-user runs here")
    console = Console() if sys.stdout.isatty() else Console(width=180)
    work = args.workdir.resolve()
    for tool in ("cmake", "ninja", "ctest"):
        if shutil.which(tool) is None:
            say(console, f"[bold red]error:[/] {tool} is needed (apt-get install cmake ninja-build)")
            return 1
    try:
        toolchain = find_toolchain((get_problem("inline-size").hook,))
        src = fetch_project(args.project, work, console)
        policy, policy_label = prepare_policy(args.policy, args.corpus, work, args.jobs, console)
        fresh_bytecode()
        host = build_c_host(work)
        chost_cc, chost_cxx = write_wrappers(toolchain, host, work / "bin")
    except (BenchError, OptgymError) as e:
        say(console, f"[bold red]error:[/] {e}")
        return 1
    load_start = os.getloadavg()[0]
    say(console, f"[bold]{args.project}[/] {src.name} from Debian{f' for {target.triple}' if target else ''}; "
                 f"{toolchain.banner}; -j {args.jobs}, "
                 f"{args.repeat} rounds; load average {load_start:.2f} on {os.cpu_count()} CPUs")  # fmt: skip
    clang = toolchain.bin_dir
    variants = {
        "plain": Variant("plain", "(1) clang-22 -Oz", str(clang / "clang"), str(clang / "clang++")),
        "c_host": Variant("c_host", "(2) minimal C host", str(chost_cc), str(chost_cxx)),
        "heuristic": Variant("heuristic", "(3) optgym-c++, heuristic", str(BIN / "optgym-cc"),
                             str(BIN / "optgym-c++"), dict.fromkeys(CHANNEL_VARIABLES, "heuristic")),
        "policy": Variant("policy", f"(4) optgym-c++, {policy_label}", str(BIN / "optgym-cc"),
                          str(BIN / "optgym-c++"), {"OPTGYM_POLICY": policy, "OPTGYM_STRICT": "1",
                                                    "OPTGYM_CANDIDATES": "1"}),
    }  # fmt: skip
    served = variants["policy"]
    if args.guard:
        variants["guarded"] = Variant("guarded", f"(5) optgym-c++, {policy_label}, OPTGYM_GUARD=1", served.cc,
                                      served.cxx, {**served.env, "OPTGYM_GUARD": "1"})  # fmt: skip
    for below in map(str, args.guard_below):
        label = f"(6) optgym-c++, {policy_label}, OPTGYM_GUARD_BELOW={below}"
        variants[f"guarded_below_{below}"] = Variant(f"guarded_below_{below}", label, served.cc, served.cxx,
                                                     {**served.env, "OPTGYM_GUARD_BELOW": below})  # fmt: skip
    for count in map(str, args.candidates):
        label = f"(7) optgym-c++, {policy_label}, OPTGYM_CANDIDATES={count}"
        variants[f"candidates_{count}"] = Variant(f"candidates_{count}", label, served.cc, served.cxx,
                                                  {**served.env, "OPTGYM_CANDIDATES": count})  # fmt: skip
    if args.default:
        env = {k: v for k, v in served.env.items() if k != "OPTGYM_CANDIDATES"}
        variants["default"] = Variant("default", f"(8) optgym-c++, {policy_label}, defaults", served.cc, served.cxx,
                                      env)  # fmt: skip
    names = tuple(variants)
    builds = {n: work / "builds" / (f"{args.project}-{args.target}" if target else args.project) / n for n in names}
    try:
        for n, v in variants.items():
            configure(v, src, builds[n], work, cross_args(target, toolchain))
        wall, _, _ = timed_build(variants["plain"], builds["plain"], work, args.jobs, "warmup")
        say(console, f"[dim]warm-up build (plain, untimed): {wall:.1f} s[/]")
        for r in range(args.repeat):
            order = names[r % len(names) :] + names[: r % len(names)]
            for n in order:
                wall, cpu, server_own = timed_build(variants[n], builds[n], work, args.jobs, f"round{r}")
                variants[n].walls.append(wall)
                variants[n].cpus.append(cpu)
                variants[n].server_cpus.append(server_own)
            say(console, "[dim]round " + f"{r + 1}/{args.repeat}: " + ", ".join(
                f"{n} {variants[n].walls[-1]:.1f} s" for n in names) + "[/]")  # fmt: skip
    except BenchError as e:
        say(console, f"[bold red]error:[/] {e}")
        return 1
    for n, v in variants.items():
        v.ctest = run_ctest(builds[n], work, n, args.jobs)
    rows = report(
        variants, builds, console, f"{args.project} at -Oz, {args.repeat} clean rebuilds each, -j {args.jobs}"
    )
    status = 0
    plain_ok = variants["plain"].ctest["ok"]
    for n, v in variants.items():
        t = v.ctest
        if t["ok"]:
            continue
        status = 1
        if n == "plain":
            blame = "the project's own suite fails with plain clang-22: not optgym's doing, but no baseline either"
        elif not plain_ok:
            blame = "the plain build fails too: compare the failing tests with the plain build's"
        else:
            blame = "inlining decisions changed the program's behaviour: a COMPILER BUG to report"
        console.rule(f"[bold red]TEST FAILURE: {v.label}")
        say(console, f"[bold red]{t['failed']} of {t['total']} tests failed ({', '.join(t['failing']) or 'see log'}): "
                     f"{blame}. Log: {t['log']}[/]")  # fmt: skip
    for n in ("c_host", "heuristic"):
        if rows[n]["code_over_plain"] != 1.0:
            status = 1
            ratio = rows[n]["code_over_plain"]
            say(console, f"[bold red]{variants[n].label}: linked code differs from the plain build ({ratio}); "
                         "replaying clang's decisions must not change it[/]")  # fmt: skip
    load = os.getloadavg()[0]
    if load > (os.cpu_count() or 1) / 2:
        say(console, f"[yellow]load average {load:.2f} at the end: other work shared the machine; expect noise[/]")
    if args.json:
        args.json.write_text(json.dumps({"project": args.project, "target": args.target, "source": src.name,
                                         "compiler": toolchain.banner, "jobs": args.jobs, "repeat": args.repeat,
                                         "policy": policy, "target_policy_over_c_host": TARGET, "variants": rows,
                                         "load_average_start": load_start, "load_average_end": load},
                                        indent=2) + "\n")  # fmt: skip
    return status


if __name__ == "__main__":
    sys.exit(main())
