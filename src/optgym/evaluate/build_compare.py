"""``optgym compare-build``: a user's own project built twice — clang-22, then ``optgym-cc``/``optgym-c++`` —
with the same flags, and the linked outputs compared.

Per-object figures (``optgym evaluate``) over-count template code the linker deduplicates and cannot see
what an LTO link does; the executables and shared libraries a build links are what a user ships. So this
builds the real project with its own build system (CMake, meson, autotools or a plain Makefile), finds
every linked ELF output in both trees, pairs them by path and compares them with the size helpers of
:mod:`optgym.evaluate.elf_sizes` — the same figures as ``optgym compare-sizes`` — and, with ``--test``, runs
the project's own test suite in both builds: a test that fails only in the optgym build is a miscompile.

Both builds get LLVM-22's ``llvm-ar``/``llvm-ranlib`` explicitly: an LTO static library holds LLVM-22
bitcode, which an older archiver on ``PATH`` (Debian's default is LLVM 14) cannot index.

Build times count every process of the build. optgym-cc's compiles run in a policy server the build's
first compile starts (in its own session, outliving the compile that started it), so CPU seconds of the
build's children alone would leave out every served compile. Each step therefore runs under a small
*reaper* (:data:`_REAPER`) that makes itself the child subreaper: the server, orphaned when its launcher
exits, becomes the reaper's child; when the step ends the reaper stops it (``SIGTERM``) and reaps it, so
its CPU — and that of the clang processes it ran — is counted (the server's own, read just before it is
stopped, is the step's ``server_cpu_s``). The optgym build gets a private
``XDG_RUNTIME_DIR`` so that it starts its own server rather than reuse one another build left idling.

A bare-metal target's programs link against its runtime (picolibc, a linker script:
:func:`optgym.corpus.target.bare_metal_runtime`) in both builds, through a small link wrapper around each
build's compiler: :func:`program_link_wrappers`.
"""

from __future__ import annotations

import filecmp
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from optgym.corpus.build import install_wrapper, refresh_config_scripts, wrapper_script
from optgym.corpus.info import opt_level
from optgym.corpus.target import Target
from optgym.errors import OptgymError
from optgym.evaluate.elf_sizes import (
    ARCHIVE_MAGIC,
    THIN_ARCHIVE_MAGIC,
    archive_sizes,
    linked_elf_files,
    static_archives,
)
from optgym.toolchain.llvm import find_toolchain
from optgym.toolchain.sizes import ElfError, object_sizes

BUILD_SYSTEMS = ("cmake", "meson", "autotools", "make")
VARIANTS = ("plain", "optgym")
#: Each variant's build directory under OUTDIR: names of one length, since a build embeds its own paths (a CMake
#: build's RUNPATH, ``__FILE__`` in a copied source tree) in read-only sections that count as Berkeley text, and
#: ``plain`` and ``optgym`` would differ there by a byte per path.
TREES = {variant: variant.ljust(max(map(len, VARIANTS)), "_") for variant in VARIANTS}
LTO_MODES = ("thin", "full")
FORMAT_VERSION = 1
#: Marks a directory this command made, so that a second run may remove it — and never removes anything else.
MARKER = ".optgym-compare-build"
#: Seconds the reaper waits, once a step is over and the policy servers are stopped, for other processes the
#: build left behind (a daemon some build systems start); after that it leaves them running, uncounted.
LINGER_SECONDS = 20.0

# The reaper: run the step, then stop the policy servers it adopted and reap every descendant (see the module
# docstring). Written as a separate interpreter so that only the step, not this command, is a subreaper.
_REAPER = r"""
import ctypes, json, os, signal, subprocess, sys, time
try:
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
except (AttributeError, OSError):
    pass
result, linger, command = sys.argv[1], float(sys.argv[2]), sys.argv[3:]

def adopted():
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                if int(f.read().rsplit(b")", 1)[1].split()[1]) != os.getpid():
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                yield int(entry), f.read()
        except (OSError, ValueError, IndexError):
            continue

start = time.monotonic()
try:
    returncode = subprocess.call(command)
except OSError as e:
    print(f"compare-build: cannot run {command[0]}: {e}", file=sys.stderr)
    returncode = 127
wall = time.monotonic() - start
server_cpu, tick = 0.0, os.sysconf("SC_CLK_TCK")
for pid, cmdline in adopted():
    if b"optgym.serve.server" in cmdline:
        try:  # the server's own utime + stime, without the compiles it ran (those are counted when reaped)
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            server_cpu += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, ValueError, IndexError):
            pass
        os.kill(pid, signal.SIGTERM)
deadline, lingering = time.monotonic() + linger, []
while True:
    try:
        pid, _ = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        break
    if pid == 0 and time.monotonic() > deadline:
        lingering = [pid for pid, _ in adopted()]
        break
    if pid == 0:
        time.sleep(0.02)
with open(result, "w") as f:
    json.dump({"returncode": returncode, "wall": wall, "lingering": lingering, "server_cpu": server_cpu}, f)
"""


class BuildCompareError(OptgymError):
    """The comparison cannot start: no build system found, a bad option, an output directory not ours."""


@dataclass(frozen=True)
class CompareOptions:
    """What ``optgym compare-build`` was asked to do; both builds get exactly the same flags."""

    source: Path
    outdir: Path
    build_system: str = "auto"
    lto: str | None = None
    target: str | None = None
    #: the target's own flags (``--target-flag``, split like a shell line: each one argument)
    target_flags: tuple[str, ...] = ()
    opt: str = "-Oz"
    configure_args: tuple[str, ...] = ()
    jobs: int = 2
    test: bool = False
    allow_fallback: bool = False

    def cflags(self) -> list[str]:
        """CFLAGS/CXXFLAGS of both builds: the optimization level, LTO, the target and its flags."""
        return [self.opt, *([f"-flto={self.lto}"] if self.lto else []), *self.target_args()]

    def ldflags(self) -> list[str]:
        """LDFLAGS of both builds: an LTO link needs lld (clang's LTO goes through the linker's plugin
        interface, and the system ``ld`` has none for LLVM-22 bitcode), and so does a link for another target
        (the system ``ld`` links for this machine only: "unrecognised emulation mode: aarch64linux")."""
        lld = ["-fuse-ld=lld"] if self.lto or self.target else []
        return [*lld, *([f"-flto={self.lto}"] if self.lto else []), *self.target_args()]

    def target_args(self) -> list[str]:
        """``--target=TRIPLE`` and the target's flags."""
        return [f"--target={self.target}", *self.target_flags] if self.target else []

    def target_spec(self) -> Target | None:
        """The :class:`~optgym.corpus.target.Target` of ``--target``/``--target-flag``."""
        return Target(self.target, self.target_flags) if self.target else None


@dataclass(frozen=True)
class Tools:
    """The compilers and archiver one variant builds with."""

    cc: str
    cxx: str
    ar: str
    ranlib: str


def variant_tools(variant: str) -> Tools:
    """``plain``: clang-22 itself; ``optgym``: the launchers installed beside this interpreter (the venv's
    ``bin``, not ``PATH``: the optgym that runs this command is the one measured). Both archive with LLVM-22."""
    toolchain = find_toolchain()
    ar, ranlib = str(toolchain.tool("llvm-ar")), str(toolchain.tool("llvm-ranlib"))
    if variant == "plain":
        clang = toolchain.bin_dir / "clang"
        return Tools(str(clang if clang.exists() else toolchain.clang), str(toolchain.bin_dir / "clang++"), ar, ranlib)
    bin_dir = Path(sys.executable).parent
    cc, cxx = bin_dir / "optgym-cc", bin_dir / "optgym-c++"
    for launcher in (cc, cxx):
        if not os.access(launcher, os.X_OK):
            raise BuildCompareError(f"{launcher} not found: install optgym into this environment (pip install -e .)")
    return Tools(str(cc), str(cxx), ar, ranlib)


def program_link_wrappers(opts: CompareOptions, tools: dict[str, Tools]) -> tuple[dict[str, Tools], tuple[str, ...]]:
    """Both variants' compilers wrapped so that each link of a program gets a bare-metal target's runtime, and
    the runtime's flags (:attr:`optgym.corpus.target.Target.program_link_flags`: picolibc's ``crt0.o`` and
    libraries, libgcc, optgym's linker script); for any other target, the tools unchanged and ``()``.

    The runtime belongs on program links only — not on compiles, ``-shared`` or ``-r`` links — and LDFLAGS
    reach every link: libtool refuses ``crt0.o`` in a shared library's link ("cannot build libtool library …
    from non-libtool objects") and CMake would hand it to its shared-library links too. Only the compiler a
    build runs sees every link, so each variant's compiler is wrapped by a ``/bin/sh`` script in
    ``OUTDIR/wrappers/VARIANT/``, named like it, that execs it with the build's own arguments and, on a program
    link only, the runtime's flags last: the corpus build's rule, from the same code
    (:func:`optgym.corpus.build.wrapper_script`). Both builds get the same wrapper, so they still differ in the
    compiler alone; the target and its flags stay in CFLAGS/LDFLAGS as for any target."""
    target = opts.target_spec()
    flags = target.program_link_flags if target else ()
    if not flags:
        return tools, ()
    wrapped = {}
    for variant, real in tools.items():
        directory = opts.outdir / "wrappers" / TREES[variant]
        cc, cxx = (install_wrapper(directory / Path(compiler).name,
                                   wrapper_script(compiler, program_link_flags=flags,
                                                  comment="optgym compare-build: a program's link also gets the "
                                                  "target's runtime"))
                   for compiler in (real.cc, real.cxx))  # fmt: skip
        wrapped[variant] = replace(real, cc=cc, cxx=cxx)
    return wrapped, flags


def detect_build_system(source: Path) -> str:
    """The project's build system, by the files at the top of its tree (CMake first: projects that ship
    several build systems, as zlib does, most often keep the CMake one current)."""
    has = lambda *names: any((source / name).is_file() for name in names)  # noqa: E731
    if has("CMakeLists.txt"):
        return "cmake"
    if has("meson.build"):
        return "meson"
    if has("configure", "configure.ac", "configure.in", "autogen.sh"):
        return "autotools"
    if has("Makefile", "makefile", "GNUmakefile"):
        return "make"
    raise BuildCompareError(
        f"{source}: no CMakeLists.txt, meson.build, configure(.ac), autogen.sh or Makefile at the top: "
        "which build system? (--build-system)"
    )


@dataclass
class Step:
    """One command of a build (configure, build, test), timed with everything it started."""

    name: str
    command: list[str]
    returncode: int
    wall_s: float
    cpu_s: float
    lingering: list[int] = field(default_factory=list)
    server_cpu_s: float = 0.0  # of ``cpu_s``, the policy servers' own (features, decisions), without their compiles


def run_step(name: str, command: list[str], cwd: Path, env: dict[str, str], log: Path) -> Step:
    """Run ``command`` under the reaper, its output appended to ``log``. Wall seconds are the command's own;
    CPU seconds are every descendant's (``os.times`` children deltas: the reaper has reaped them all)."""
    result = log.with_name(f".{log.name}.{name}.json")
    with log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        before = os.times()
        subprocess.run([sys.executable, "-c", _REAPER, str(result), str(LINGER_SECONDS), *command],
                       cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip
        after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    try:
        outcome = json.loads(result.read_text())
        result.unlink()
    except (OSError, ValueError):
        outcome = {"returncode": -1, "wall": 0.0, "lingering": [], "server_cpu": 0.0}
    return Step(name, command, outcome["returncode"], round(outcome["wall"], 3), round(cpu, 3), outcome["lingering"],
                round(outcome["server_cpu"], 3))  # fmt: skip


# -- building -------------------------------------------------------------------------------------------


def _is_build_output(path: Path) -> bool:
    """An ELF file (object, executable, library) or a static archive: what a build writes."""
    try:
        with path.open("rb") as f:
            head = f.read(8)
    except OSError:
        return False
    return head[:4] == b"\x7fELF" or head in (ARCHIVE_MAGIC, THIN_ARCHIVE_MAGIC)


def copy_tree(source: Path, dest: Path, outdir: Path) -> int:
    """Copy the source tree for an in-tree build (make, autotools), leaving out ``.git``, this command's
    output directory, and build outputs of an earlier in-tree build: copied with their times kept, ``make``
    would find them up to date and both variants would report the same stale binaries. Returns how many
    build outputs were left out."""
    skipped = 0
    out = outdir.resolve()

    def ignore(directory: str, names: list[str]) -> set[str]:
        nonlocal skipped
        left_out = set()
        for name in names:
            path = Path(directory) / name
            if name == ".git" or (path.is_dir() and path.resolve() == out):
                left_out.add(name)
            elif not path.is_symlink() and path.is_file() and _is_build_output(path):
                left_out.add(name)
                skipped += 1
        return left_out

    shutil.copytree(source, dest, symlinks=True, ignore=ignore)
    return skipped


def fresh_dir(path: Path, source: Path) -> None:
    """Empty ``path`` for a build — only if this command made it (its marker), never the source tree."""
    real, src = path.resolve(), source.resolve()
    if real == src or src.is_relative_to(real):
        raise BuildCompareError(f"{path} holds the source tree {source}: choose another -o")
    if path.exists():
        if not (path / MARKER).exists():
            raise BuildCompareError(f"{path} exists and was not made by optgym compare-build: choose another -o")
        shutil.rmtree(path)


def build_commands(system: str, opts: CompareOptions, tools: Tools, tree: Path) -> list[tuple[str, list[str]]]:
    """The (name, command) steps that configure and build ``tree`` (the build directory for CMake and meson,
    the copied source tree otherwise)."""
    cflags, ldflags = " ".join(opts.cflags()), " ".join(opts.ldflags())
    jobs = str(opts.jobs)
    target = opts.target_spec()
    if system == "cmake":
        configure = ["cmake", "-S", str(opts.source), "-B", str(tree)]
        configure += ["-G", "Ninja"] if shutil.which("ninja") else []
        # MinSizeRel for -DNDEBUG; its own -Os would follow CMAKE_<LANG>_FLAGS and win, so it is replaced
        configure += ["-DCMAKE_BUILD_TYPE=MinSizeRel", f"-DCMAKE_C_COMPILER={tools.cc}",
                      f"-DCMAKE_CXX_COMPILER={tools.cxx}", f"-DCMAKE_AR={tools.ar}",
                      f"-DCMAKE_RANLIB={tools.ranlib}",
                      "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON"]  # fmt: skip  # for compile_levels
        # the target as CMake's own settings: its compiler checks and every compile and link line get it, it
        # knows it cross-compiles, and ctest runs the tests under qemu-user (Target.cmake_args); the target's
        # flags stay in CMAKE_<LANG>_FLAGS, which CMake's link lines and checks use too
        untargeted = [f for f in opts.cflags() if f != f"--target={opts.target}"]
        for lang in ("C", "CXX"):
            configure += [f"-DCMAKE_{lang}_FLAGS={' '.join(untargeted)}", f"-DCMAKE_{lang}_FLAGS_MINSIZEREL=-DNDEBUG"]
        # a bare-metal target with a runtime: compare_build gives both builds' program links that runtime
        # (program_link_wrappers), so CMake's checks link programs, as in a corpus build
        configure += target.cmake_args(links_programs=True) if target else []
        link = " ".join(f for f in opts.ldflags() if f not in opts.target_args())
        for kind in ("EXE", "SHARED", "MODULE"):
            configure.append(f"-DCMAKE_{kind}_LINKER_FLAGS={link}")
        return [
            ("configure", [*configure, *opts.configure_args]),
            ("build", ["cmake", "--build", str(tree), "-j", jobs]),
        ]
    if system == "meson":
        # buildtype=plain adds no -O of its own: CFLAGS' level is the only one
        configure = ["meson", "setup", "--buildtype=plain", "-Db_ndebug=true", *opts.configure_args]
        if target:  # meson runs nothing it builds for another machine but through the cross file's exe_wrapper
            cross = target.meson_cross_file(tree.with_name(tree.name + "-cross.ini"), tools.cc, tools.cxx, tools.ar)
            configure.append(f"--cross-file={cross}")
        return [("configure", [*configure, str(tree), str(opts.source)]),
                ("build", ["meson", "compile", "-C", str(tree), "-j", jobs])]  # fmt: skip
    variables = [f"AR={tools.ar}", f"RANLIB={tools.ranlib}"]
    if system == "make":  # on make's command line: a Makefile's own CC = gcc would otherwise win
        compilers = [f"CC={tools.cc}", f"CXX={tools.cxx}", f"CFLAGS={cflags}", f"CXXFLAGS={cflags}",
                     f"LDFLAGS={ldflags}"]  # fmt: skip
        return [("build", ["make", "-j", jobs, *compilers, *variables, *opts.configure_args])]
    steps: list[tuple[str, list[str]]] = []
    if not (tree / "configure").exists():
        if (tree / "configure.ac").exists() or (tree / "configure.in").exists():
            steps.append(("autoreconf", ["autoreconf", "-fi"]))
        else:
            steps.append(("autogen", ["env", "NOCONFIGURE=1", "sh", "autogen.sh"]))
    configure = ["./configure", *([target.autotools_host()] if target else []), f"CC={tools.cc}", f"CXX={tools.cxx}",
                 f"CFLAGS={cflags}", f"CXXFLAGS={cflags}", f"LDFLAGS={ldflags}", *variables,
                 *opts.configure_args]  # fmt: skip
    return [*steps, ("configure", configure), ("build", ["make", "-j", jobs, *variables])]


def variant_env(opts: CompareOptions, variant: str, tools: Tools, runtime_dir: Path | None) -> dict[str, str]:
    """The caller's environment (their ``OPTGYM_POLICY`` and the rest reach the launchers), plus the build's
    tools and flags for the build systems that read them from the environment (meson, configure), plus for
    optgym ``OPTGYM_STRICT=1`` (a compile that falls back to clang fails the build instead of hiding in it)."""
    env = dict(os.environ)
    cflags, ldflags = " ".join(opts.cflags()), " ".join(opts.ldflags())
    env |= {"CC": tools.cc, "CXX": tools.cxx, "AR": tools.ar, "RANLIB": tools.ranlib,
            "CFLAGS": cflags, "CXXFLAGS": cflags, "LDFLAGS": ldflags}  # fmt: skip
    if variant == "optgym":
        if opts.allow_fallback:
            env.pop("OPTGYM_STRICT", None)
        else:
            env["OPTGYM_STRICT"] = "1"
        if runtime_dir is not None:
            env["XDG_RUNTIME_DIR"] = str(runtime_dir)
    return env


def suite_command(system: str, tools: Tools, opts: CompareOptions, tree: Path, target: str = "check") -> list[str]:
    """The project's test suite (``make check``/``test`` gets the build's variables: it may build test programs;
    a cross build's also gets :func:`test_runner` as Automake's ``LOG_COMPILER``)."""
    if system == "cmake":
        return ["ctest", "--output-on-failure", "-j", str(opts.jobs)]
    if system == "meson":
        return ["meson", "test", "-C", str(tree), "--print-errorlogs", "--num-processes", str(opts.jobs)]
    build = build_commands(system, opts, tools, tree)[-1][1]  # make -j N VARIABLES…
    runner = test_runner(opts)
    return [*build[:3], target, *build[3:], *([f"LOG_COMPILER={runner}"] if runner else [])]


def test_runner(opts: CompareOptions) -> str | None:
    """For a cross build whose target this machine emulates (:meth:`optgym.corpus.target.Target.emulator`): a
    ``/bin/sh`` script, ``OUTDIR/wrappers/run-test``, that runs a test program of the target under the emulator
    and anything else (a test script) as it is; ``None`` otherwise.

    Why: CMake and Meson hand their tests to the emulator themselves; Automake's test harness runs each test as
    ``$(LOG_COMPILER) ./test``, so ``make check`` gets this script as ``LOG_COMPILER`` and a compiled test runs
    where it could not start before (a container has no binfmt handler; a bare-metal program has no OS). A test
    script that starts the target's programs itself still cannot, nor can a libtool wrapper script."""
    target = opts.target_spec()
    emulator = target.emulator() if target else None
    if not emulator:
        return None
    text = ("#!/bin/sh\n# optgym compare-build: a test program of the target runs under its emulator, a script as "
            "it is\n"
            f"case \"$(head -c 4 \"$1\" 2>/dev/null)\" in \"$(printf '\\177ELF')\") exec {shlex.join(emulator)} "
            "\"$@\" ;; esac\nexec \"$@\"\n")  # fmt: skip
    return install_wrapper(opts.outdir / "wrappers" / "run-test", text)


# -- reading test results ---------------------------------------------------------------------------------

NO_RULE = re.compile(r"No rule to make target .check'")


def parse_tests(system: str, output: str) -> dict[str, Any]:
    """Passed/failed counts and the names of failed tests, where the harness prints them (ctest, meson,
    automake's parallel and serial harnesses); ``None`` where it does not (a hand-written ``make test``)."""
    passed = failed = None
    names: list[str] | None = None
    if system == "cmake":
        if m := re.search(r"(\d+)% tests passed, (\d+) tests? failed out of (\d+)", output):
            failed, total = int(m[2]), int(m[3])
            passed = total - failed
            names = re.findall(r"^\s*\d+ - (.+?) \([^)]*\)\s*$", output.split("The following tests FAILED:")[-1], re.M)
            names = names if failed else []
        elif "No tests were found" in output:
            passed, failed, names = 0, 0, []
    elif system == "meson":
        counts = {k: int(v) for k, v in re.findall(r"^(Ok|Expected Fail|Fail|Unexpected Pass|Timeout):\s+(\d+)\s*$",
                                                   output, re.M)}  # fmt: skip
        if counts:
            passed = counts.get("Ok", 0) + counts.get("Expected Fail", 0)
            failed = counts.get("Fail", 0) + counts.get("Unexpected Pass", 0) + counts.get("Timeout", 0)
            names = re.findall(r"^\s*\d+/\d+\s+(.+?)\s+(?:FAIL|TIMEOUT|UNEXPECTEDPASS|ERROR)\s", output, re.M)
        elif "No tests defined." in output:
            passed, failed, names = 0, 0, []
    else:
        counts = {k: int(v) for k, v in re.findall(r"^# (PASS|XFAIL|FAIL|XPASS|ERROR):\s+(\d+)\s*$", output, re.M)}
        if counts:
            passed = counts.get("PASS", 0) + counts.get("XFAIL", 0)
            failed = counts.get("FAIL", 0) + counts.get("XPASS", 0) + counts.get("ERROR", 0)
            names = re.findall(r"^(?:FAIL|XPASS|ERROR): (\S+)", output, re.M)
        elif m := re.search(r"All (\d+) tests passed", output):
            passed, failed, names = int(m[1]), 0, []
        elif m := re.search(r"(\d+) of (\d+) tests failed", output):
            failed, passed = int(m[1]), int(m[2]) - int(m[1])
    return {"passed": passed, "failed": failed, "failed_names": sorted(set(names)) if names is not None else None}


def failing_only_in_optgym(plain: dict[str, Any], optgym: dict[str, Any]) -> list[str]:
    """What fails in the optgym build and not in the plain one — a miscompile (or a test that depends on code
    size). By name where both harnesses named their failures; else by exit status, then by count."""
    if plain.get("failed_names") is not None and optgym.get("failed_names") is not None:
        only = sorted(set(optgym["failed_names"]) - set(plain["failed_names"]))
        if only:
            return only
    if optgym["returncode"] != 0 and plain["returncode"] == 0:
        return [f"the test suite (exit status {optgym['returncode']}; plain: 0)"]
    if plain.get("failed") is not None and optgym.get("failed") is not None and optgym["failed"] > plain["failed"]:
        return [f"{optgym['failed'] - plain['failed']} more failing tests ({optgym['failed']} vs {plain['failed']})"]
    return []


def run_tests(system: str, opts: CompareOptions, tools: Tools, tree: Path, env: dict[str, str], log: Path) -> dict:
    """Run the suite; ``make check`` falls back to ``make test`` when the project has no ``check`` target."""
    log.write_text("")
    cwd = tree
    step = run_step("test", suite_command(system, tools, opts, tree), cwd, env, log)
    if system in ("make", "autotools") and step.returncode != 0 and NO_RULE.search(log.read_text(errors="replace")):
        log.write_text("")
        step = run_step("test", suite_command(system, tools, opts, tree, "test"), cwd, env, log)
        if step.returncode != 0 and re.search(r"No rule to make target .test'", log.read_text(errors="replace")):
            return {"command": step.command, "returncode": None, "status": "no check or test target", "passed": None,
                    "failed": None, "failed_names": None, "wall_s": step.wall_s, "log": str(log)}  # fmt: skip
    counts = parse_tests(system, log.read_text(errors="replace"))
    return {"command": step.command, "returncode": step.returncode, "status": suite_status(step.returncode, counts),
            **counts, "wall_s": step.wall_s, "log": str(log)}  # fmt: skip


def suite_status(returncode: int, counts: dict[str, Any]) -> str:
    """``passed``, ``failed``, or ``no tests``: a harness that ran and counted none (ctest's "No tests were
    found", meson's "No tests defined.", automake's zero totals) exits 0, and calling that "passed" would let a
    report say a build's tests pass when it has none."""
    if returncode != 0:
        return "failed"
    return "no tests" if counts["passed"] == 0 and counts["failed"] == 0 else "passed"


# -- sizes ------------------------------------------------------------------------------------------------

#: Each linked output's figures: Berkeley text and data (data too, because an option can move constants from one
#: to the other: optgym.toolchain.sizes), ``.text*``, and the file's bytes.
SIZE_FIELDS = ("text", "data", "dottext", "file")
SIZE_LABELS = {"dottext": ".text"}  # a field's column name where it is not the field's own


def _elf_figures(path: Path) -> dict[str, int]:
    sizes = object_sizes(path)
    return {"text": sizes.text_bytes, "data": sizes.data_bytes, "dottext": sizes.dottext_bytes,
            "file": path.stat().st_size}  # fmt: skip


def _archive_figures(path: Path) -> dict[str, int]:
    sizes = archive_sizes(path)
    kept = {k: v for k, v in asdict(sizes).items() if k not in ("text_bytes", "dottext_bytes", "data_bytes")}
    return {**kept, "text": sizes.text_bytes, "data": sizes.data_bytes, "dottext": sizes.dottext_bytes,
            "file": path.stat().st_size}  # fmt: skip


def _pair(plain: dict[str, Path], optgym: dict[str, Path], figures: Callable[[Path], dict[str, int]]) -> list[dict]:
    rows = []
    for rel in sorted(set(plain) | set(optgym)):
        try:
            row: dict[str, Any] = {"path": rel, **{v: figures(files[rel]) if rel in files else None
                                   for v, files in (("plain", plain), ("optgym", optgym))}}  # fmt: skip
        except ElfError:
            continue
        if rel in plain and rel in optgym:
            row["identical"] = filecmp.cmp(plain[rel], optgym[rel], shallow=False)
        rows.append(row)
    return rows


def _totals(rows: list[dict]) -> dict[str, Any]:
    both = [r for r in rows if r["plain"] is not None and r["optgym"] is not None]
    totals: dict[str, Any] = {"paired": len(both)}
    for variant in VARIANTS:
        totals[variant] = {f: sum(r[variant][f] for r in both) for f in SIZE_FIELDS}
    totals["ratio"] = {
        f: (totals["optgym"][f] / totals["plain"][f] if totals["plain"][f] else None) for f in SIZE_FIELDS
    }
    return totals


def compare_outputs(plain_tree: Path, optgym_tree: Path) -> dict[str, Any]:
    """Linked outputs (executables, shared libraries) and static archives of both trees, paired by path."""
    outputs = _pair(linked_elf_files(plain_tree), linked_elf_files(optgym_tree), _elf_figures)
    archives = _pair(static_archives(plain_tree), static_archives(optgym_tree), _archive_figures)
    return {"outputs": outputs, "totals": _totals(outputs), "archives": archives, "archive_totals": _totals(archives),
            "only_in_plain": [r["path"] for r in outputs if r["optgym"] is None],
            "only_in_optgym": [r["path"] for r in outputs if r["plain"] is None]}  # fmt: skip


def compile_levels(database: Path, levels: tuple[str, ...]) -> dict[str, Any] | None:
    """What the compiles of a CMake build's ``compile_commands.json`` ran at: how many there were, how many at a
    level optgym-cc serves (``levels``: ``OPTGYM_SERVE_OPT``'s, ``z`` and ``s`` unless set), and each level's
    count (read by :func:`~optgym.corpus.info.opt_level`, as a corpus's modules are). Why: a project that sets its
    own level after the flags it was given (jsonnet adds ``-O3``) builds the same in both, and the tables alone
    would read as a policy that changed nothing. ``None`` without a database (other build systems)."""
    if not database.is_file():
        return None
    entries = json.loads(database.read_text())
    by_level = Counter(opt_level(entry.get("arguments") or shlex.split(entry["command"])) for entry in entries)
    at_served = sum(n for level, n in by_level.items() if level[2:] in levels)
    return {"listed": len(entries), "served": at_served, "levels": dict(sorted(by_level.items()))}


# -- the whole comparison -----------------------------------------------------------------------------------


def _build_variant(system: str, opts: CompareOptions, variant: str, tools: Tools, env: dict[str, str],
                   progress: Callable[[str], None]) -> tuple[dict[str, Any], Path]:  # fmt: skip
    """Configure and build one variant; returns its record and the tree to scan for outputs."""
    tree = opts.outdir / TREES[variant]
    log = opts.outdir / f"{variant}.log"
    fresh_dir(tree, opts.source)
    record: dict[str, Any] = {"tree": str(tree), "log": str(log), "steps": []}
    if system in ("make", "autotools"):
        record["build_outputs_not_copied"] = copy_tree(opts.source, tree, opts.outdir)
        if (target := opts.target_spec()) and system == "autotools":  # as the corpus build does, for both builds
            record["config_scripts_refreshed"] = len(refresh_config_scripts(tree, target.autotools_triple))
        cwd = tree
    else:
        tree.mkdir(parents=True)
        cwd = tree
    (tree / MARKER).touch()
    log.write_text("")
    for name, command in build_commands(system, opts, tools, tree):
        progress(f"{variant}: {name}: {' '.join(command)}")
        step = run_step(name, command, cwd, env, log)
        record["steps"].append(asdict(step))
        if step.returncode != 0:
            break
    record["ok"] = all(s["returncode"] == 0 for s in record["steps"])
    record["wall_s"] = round(sum(s["wall_s"] for s in record["steps"]), 3)
    record["cpu_s"] = round(sum(s["cpu_s"] for s in record["steps"]), 3)
    text = log.read_text(errors="replace")
    if variant == "optgym":
        record["fallback_warnings"] = len(re.findall(r"^optgym-cc: (?:warning|error):", text, re.M))
        record["notes"] = sorted(set(re.findall(r"^optgym-cc: note: (.*)$", text, re.M)))[:5]
        record["first_error"] = next(iter(re.findall(r"^optgym-cc: error: (.*)$", text, re.M)), None)
    if not record["ok"]:
        record["log_tail"] = text.splitlines()[-15:]
    progress(f"{variant}: {'built' if record['ok'] else 'FAILED'} in {record['wall_s']:.1f} s "
             f"(CPU {record['cpu_s']:.1f} s); log {log}")  # fmt: skip
    return record, tree


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(b / a, 4) if a and b is not None else None


def shipped_policies() -> dict[str, str]:
    """The content hash of every policy file the package ships, by its path under ``pretrained/``: what a build
    that serves ``pretrained`` (the default) ran with, so a figure of this report can be tied to one shipped file
    (``maintainer.ship_pretrained --linked`` refuses a report of another)."""
    from optgym.policies import PRETRAINED_DIR, file_identity

    files = sorted(p for p in PRETRAINED_DIR.rglob("*") if p.is_file() and not p.name.endswith(".provenance.json"))
    return {p.relative_to(PRETRAINED_DIR).as_posix(): file_identity(p) for p in files}


def compare_build(opts: CompareOptions, progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Build ``opts.source`` twice, compare the linked outputs, run the tests if asked; the report's
    ``problems`` name whatever should fail the command (a build that failed, a test failing only in optgym)."""
    from optgym import __version__

    source = opts.source.resolve()
    if not source.is_dir():
        raise BuildCompareError(f"{opts.source} is not a directory")
    if opts.outdir.resolve() == source:
        raise BuildCompareError(f"-o {opts.outdir} is the source tree: choose a directory of its own")
    system = detect_build_system(source) if opts.build_system == "auto" else opts.build_system
    if system not in BUILD_SYSTEMS:
        raise BuildCompareError(f"--build-system {system!r}: one of auto, {', '.join(BUILD_SYSTEMS)}")
    if opts.lto not in (None, *LTO_MODES):
        raise BuildCompareError(f"--lto {opts.lto!r}: thin or full")
    if opts.target_flags and not opts.target:
        raise BuildCompareError(f"--target-flag {' '.join(opts.target_flags)} needs --target TRIPLE")
    if not re.fullmatch(r"-O[0-3sz]?|-Ofast|-Og", opts.opt):
        raise BuildCompareError(f"--opt {opts.opt!r}: an optimization level such as -Oz")
    opts = replace(opts, source=source, outdir=opts.outdir.resolve())
    opts.outdir.mkdir(parents=True, exist_ok=True)
    compilers = {v: variant_tools(v) for v in VARIANTS}
    tools, runtime = program_link_wrappers(opts, compilers)
    report: dict[str, Any] = {
        "format_version": FORMAT_VERSION, "source": str(source), "name": source.name, "build_system": system,
        "outdir": str(opts.outdir), "optgym_version": __version__, "clang": find_toolchain().banner,
        "options": {"opt": opts.opt, "lto": opts.lto, "target": opts.target, "target_flags": list(opts.target_flags),
                    "jobs": opts.jobs, "test": opts.test,
                    "configure_args": list(opts.configure_args), "allow_fallback": opts.allow_fallback},
        "flags": {"cflags": opts.cflags(), "ldflags": opts.ldflags()},
        "compilers": {v: asdict(t) for v, t in compilers.items()},
        "builds": {}, "problems": [],
    }  # fmt: skip
    if runtime:
        report["program_link"] = {"flags": list(runtime), "wrappers": {v: [t.cc, t.cxx] for v, t in tools.items()}}
    trees: dict[str, Path] = {}
    envs: dict[str, dict[str, str]] = {}
    runtime_dir = Path(tempfile.mkdtemp(prefix="optgym-cb-"))  # short: a socket path holds at most 107 bytes
    try:
        for variant in VARIANTS:
            envs[variant] = variant_env(opts, variant, tools[variant], runtime_dir if variant == "optgym" else None)
            if variant == "optgym":
                report["optgym_environment"] = {
                    k: v for k, v in sorted(envs[variant].items()) if k.startswith("OPTGYM_")
                }
                report["shipped_policies"] = shipped_policies()
            report["builds"][variant], trees[variant] = _build_variant(system, opts, variant, tools[variant],
                                                                       envs[variant], progress)  # fmt: skip
            if not report["builds"][variant]["ok"]:
                break  # the plain build failing: the project does not build with clang-22 and these flags
        plain, optgym = report["builds"]["plain"], report["builds"].get("optgym", {"ok": False, "steps": []})
        if not plain["ok"]:
            report["problems"].append(f"the plain clang build failed (see {plain['log']}): nothing to compare")
        elif not optgym["ok"]:
            first = f"; first: optgym-cc: error: {optgym['first_error']}" if optgym.get("first_error") else ""
            report["problems"].append(
                f"THE OPTGYM BUILD FAILED where plain clang built (see {optgym['log']}): a compile fell back "
                f"(OPTGYM_STRICT=1; --allow-fallback lets it through) or the compiler crashed{first}"
            )
        report["build_ratio"] = {
            "wall": _ratio(_step(plain, "build", "wall_s"), _step(optgym, "build", "wall_s")),
            "cpu": _ratio(_step(plain, "build", "cpu_s"), _step(optgym, "build", "cpu_s")),
        }
        if plain["ok"] and optgym["ok"]:
            report |= compare_outputs(trees["plain"], trees["optgym"])
            levels = tuple(envs["optgym"].get("OPTGYM_SERVE_OPT", "z,s").split(","))
            if (compiles := compile_levels(trees["optgym"] / "compile_commands.json", levels)) is not None:
                report["compiles"] = compiles
            if not report["outputs"]:
                report["problems"].append("no linked executable or shared library in either build")
            if opts.test:
                report["tests"] = {}
                for variant in VARIANTS:
                    progress(f"{variant}: running the tests")
                    log = opts.outdir / f"{variant}.test.log"
                    report["tests"][variant] = run_tests(
                        system, opts, tools[variant], trees[variant], envs[variant], log
                    )
                    progress(f"{variant}: tests {report['tests'][variant]['status']}")
                only = failing_only_in_optgym(report["tests"]["plain"], report["tests"]["optgym"])
                report["tests"]["fail_only_in_optgym"] = only
                if only:
                    report["problems"].append(
                        f"TESTS FAIL ONLY IN THE OPTGYM BUILD: {', '.join(only)} — a miscompile to report "
                        f"(see {report['tests']['optgym']['log']})"
                    )
    finally:
        shutil.rmtree(runtime_dir, ignore_errors=True)
    return report


def _step(build: dict[str, Any], name: str, key: str) -> float | None:
    return next((s[key] for s in build["steps"] if s["name"] == name and s["returncode"] == 0), None)


# -- the report -----------------------------------------------------------------------------------------------


def _cell(value: int | float | None) -> str:
    return "—" if value is None else str(value)


def _ratio_cell(a: float | None, b: float | None) -> str:
    return f"{b / a:.4f}" if a and b is not None else "—"


def _size_table(rows: list[dict], totals: dict[str, Any], what: str) -> list[str]:
    labels = [SIZE_LABELS.get(f, f) for f in SIZE_FIELDS]
    head = f"| {what} | " + " | ".join(f"{label} plain | {label} optgym | ratio" for label in labels)
    lines = [head + " |", "|" + "---|" * (1 + 3 * len(SIZE_FIELDS))]
    for r in rows:
        cells = []
        for f in SIZE_FIELDS:
            a = r["plain"][f] if r["plain"] else None
            b = r["optgym"][f] if r["optgym"] else None
            cells += [_cell(a), _cell(b), _ratio_cell(a, b)]
        lines.append(f"| {r['path']} | " + " | ".join(cells) + " |")
    cells = []
    for f in SIZE_FIELDS:
        a, b = totals["plain"][f], totals["optgym"][f]
        cells += [f"**{a}**", f"**{b}**", f"**{_ratio_cell(a, b)}**"]
    lines.append(f"| **total ({totals['paired']} paired)** | " + " | ".join(cells) + " |")
    return lines


def render_markdown(report: dict[str, Any]) -> str:
    """``report.md``: the tables a person reads; every figure is also in ``report.json``."""
    opts = report["options"]
    lines = [f"# optgym compare-build: {report['name']} ({report['build_system']})", ""]
    flags = " ".join(report["flags"]["cflags"])
    ldflags = " ".join(report["flags"]["ldflags"]) or "—"
    lines += [f"- source: `{report['source']}`",
              f"- plain: `{report['compilers']['plain']['cc']}` / `{report['compilers']['plain']['cxx']}` "
              f"({report['clang']})",
              f"- optgym: `{report['compilers']['optgym']['cc']}` / `{report['compilers']['optgym']['cxx']}`, "
              + (", ".join(f"{k}={v}" for k, v in report.get("optgym_environment", {}).items()) or "defaults"),
              f"- flags (both): CFLAGS/CXXFLAGS `{flags}`, LDFLAGS `{ldflags}`; "
              f"AR `{report['compilers']['plain']['ar']}`",
              *([f"- program links (both, not -shared or -r links): `{' '.join(report['program_link']['flags'])}` "
                 f"last, through link wrappers in `{report['outdir']}/wrappers/`"] if "program_link" in report else []),
              ""]  # fmt: skip
    for problem in report["problems"]:
        lines += [f"**{problem}**", ""]
    if "outputs" in report:
        lines += ["These are LINKED sizes: the executables and shared libraries the build linked (after the linker "
                  "dropped duplicate template code" + (" and the LTO link optimized the whole program" if opts["lto"]
                  else "") + "), not sums over objects. text is Berkeley text (`.text*`, `.rodata*`, `.eh_frame*`, "
                  "`.gcc_except_table*`: what `llvm-size` prints), data is Berkeley data (`.data*`, `.data.rel.ro*`: a "
                  "constant an option moved out of text shows here), .text is `.text*` alone, file is bytes on "
                  "disk; ratios are optgym / plain.", ""]  # fmt: skip
        lines += [*_size_table(report["outputs"], report["totals"], "output"), ""]
        compiles = report.get("compiles")
        if compiles and compiles["served"] < compiles["listed"]:
            counts = ", ".join(f"{level} {n}" for level, n in compiles["levels"].items())
            lines += [f"{compiles['served']} of {compiles['listed']} compiles ran at a level optgym-cc serves "
                      f"(by the last -O of each: {counts}); the project's own flags set the others, and clang "
                      "decided them in both builds.", ""]  # fmt: skip
        identical = [r["path"] for r in report["outputs"] if r.get("identical")]
        if identical:
            why = (" (Under --lto, optgym-cc passes the -flto compile steps through unless OPTGYM_SERVE_LTO=1; a "
                   "ThinLTO link's backends are served by OPTGYM_LTO_POLICY, OPTGYM_LTO_EVICT_POLICY and "
                   "OPTGYM_LTO_PRIORITY_POLICY.)") if opts["lto"] else ""  # fmt: skip
            paired = report["totals"]["paired"]
            lines += [f"{len(identical)} of {paired} outputs are byte-identical in both builds: "
                      f"{', '.join(identical)}.{why}", ""]  # fmt: skip
        for side in ("plain", "optgym"):
            if report[f"only_in_{side}"]:
                lines += [f"Only in the {side} build: {', '.join(report[f'only_in_{side}'])}", ""]
        if report["archives"]:
            lines += ["Static archives (the sum of their members' sizes; not linked, so duplicates still counted):",
                      ""]  # fmt: skip
            lines += [*_size_table(report["archives"], report["archive_totals"], "archive"), ""]
            bitcode = sum((r["plain"] or {}).get("bitcode_members", 0) for r in report["archives"])
            if bitcode:
                lines += [f"(archive members that are LTO bitcode, {bitcode} in the plain build, have no code size "
                          "before the link: they count 0 above.)", ""]  # fmt: skip
    lines += ["## Build times", "",
              "| step | plain wall s | optgym wall s | ratio | plain CPU s | optgym CPU s | ratio |",
              "|---|---|---|---|---|---|---|"]  # fmt: skip
    plain, optgym = report["builds"]["plain"], report["builds"].get("optgym", {"steps": []})
    for step in [s["name"] for s in plain["steps"]]:
        pw, ow = _step(plain, step, "wall_s"), _step(optgym, step, "wall_s")
        pc, oc = _step(plain, step, "cpu_s"), _step(optgym, step, "cpu_s")
        lines.append(f"| {step} | {_cell(pw)} | {_cell(ow)} | {_ratio_cell(pw, ow)} | {_cell(pc)} | {_cell(oc)} "
                     f"| {_ratio_cell(pc, oc)} |")  # fmt: skip
    lines.append("")
    lines.append("CPU seconds count every process of the step, the policy server and the compiles it ran included.")
    if optgym.get("fallback_warnings"):
        lines.append(f"optgym-cc warned {optgym['fallback_warnings']} times (compiles fell back to clang: see "
                     f"{optgym['log']}).")  # fmt: skip
    for note in optgym.get("notes", []):
        lines.append(f"optgym-cc: note: {note}")
    lines.append("")
    if "tests" in report:
        lines += ["## Tests", "", "| | plain | optgym |", "|---|---|---|"]
        t = report["tests"]
        for key in ("status", "returncode", "passed", "failed"):
            lines.append(f"| {key} | {_cell(t['plain'][key])} | {_cell(t['optgym'][key])} |")
        lines.append("")
        if t["fail_only_in_optgym"]:
            lines += [f"**FAILING ONLY IN THE OPTGYM BUILD: {', '.join(t['fail_only_in_optgym'])}**", ""]
        else:
            lines += ["No test fails only in the optgym build.", ""]
    return "\n".join(lines)


def write_report(report: dict[str, Any], outdir: Path) -> str:
    """Write ``report.json`` and ``report.md`` into ``outdir``; returns the markdown."""
    markdown = render_markdown(report)
    (outdir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (outdir / "report.md").write_text(markdown + "\n")
    return markdown
