"""``optgym corpus build``: any C/C++ source tree → a bitcode-embedding build → a corpus.

The build system is detected (CMake, Meson, autotools, plain Make, in that order of preference: the
first two write a compile database themselves, the others are recorded with ``bear``). CMake and Meson
build out of tree, into ``DIR/.optgym-work/build``; a plain-Make or autotools tree is first mirrored
there (autotools: into ``DIR/.optgym-work/src``) and built in place, as Debian builds it, so the user's
tree is never written to. Re-running reuses the build tree, so only what changed is
rebuilt.

The compiler is clang-22 with ``-Xclang -fembed-bitcode=all`` and the requested optimization level
in CFLAGS/CXXFLAGS — and, because hand-written Makefiles (plain Make, or under autotools) assign
``CFLAGS`` themselves or put their own ``-O2`` after ours, every build system gets ``CC``/``CXX`` as
two small wrapper scripts (:func:`write_compiler_wrappers`) that run clang with the build's arguments
*followed by* the opt level, the embedding flags and ``-fno-lto``: the last ``-O`` wins in clang, so
every compile is at the requested level, and a build that turns on (Thin)LTO itself (ninja's CMake
enables IPO whenever it is supported) still writes ELF objects with embedded bitcode instead of bare
bitcode files. The module's recorded command is clang's own (``.llvmcmd``), not the wrapper's.

For another target (``target``: :class:`optgym.corpus.target.Target`), ``--target=`` and the target's flags
join that tail, and each build system is told it cross-compiles (see :mod:`optgym.corpus.target`).

Every step's output goes to ``DIR/logs/<step>.log``. The build step keeps going past errors
(``make -k``, ``ninja -k 0``): a package where one test program fails still gives every object that
did compile; such a corpus is marked ``partial`` in its provenance, and ``strict=True`` refuses it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optgym.corpus.extract import ExtractReport, extract
from optgym.corpus.staging import LOGS_DIR, WORK_DIR, recover
from optgym.corpus.target import Target, bare_metal_runtime
from optgym.errors import CorpusError
from optgym.toolchain.llvm import Toolchain

BUILD_SYSTEMS = ("cmake", "meson", "autotools", "make")
EMBED = ("-Xclang", "-fembed-bitcode=all")
#: Appended to every compile: objects, not LTO bitcode files, whatever the build asks for (see the module doc).
NO_LTO = ("-fno-lto",)
#: The wrappers' names: not ones bear takes for a compiler (cc, gcc, clang…), so it records only the clang they run.
WRAPPER_NAMES = ("embed-cc", "embed-c++")
LOG_TAIL_LINES = 25


class BuildStepError(CorpusError):
    """A build step failed: which one, and where its log is."""

    def __init__(self, step: str, returncode: int, log: Path) -> None:
        self.step, self.returncode, self.log = step, returncode, log
        super().__init__(f"build step '{step}' failed (exit {returncode}); its log: {log}\n{log_tail(log)}")


def log_tail(log: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = log.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return ""
    return "\n".join(f"  | {line}" for line in text[-lines:])


def detect_build_systems(src: Path) -> list[str]:
    """The build systems a source tree offers, in order of preference (see the module doc)."""
    src = Path(src)
    found = []
    if (src / "CMakeLists.txt").is_file():
        found.append("cmake")
    if (src / "meson.build").is_file():
        found.append("meson")
    if any((src / f).is_file() for f in ("configure", "configure.ac", "configure.in")):
        found.append("autotools")
    if any((src / f).is_file() for f in ("GNUmakefile", "makefile", "Makefile")):
        found.append("make")
    if not found:
        raise CorpusError(
            f"{src}: no build system found (looked for CMakeLists.txt, meson.build, configure[.ac], Makefile)"
        )
    return found


def detect_build_system(src: Path) -> str:
    """The preferred build system of a source tree."""
    return detect_build_systems(src)[0]


@dataclass
class BuildResult:
    """A finished build and its extraction."""

    build_system: str
    build_dir: Path
    compdb: Path
    build_seconds: float
    partial: bool
    extract: ExtractReport
    notes: list[str] = field(default_factory=list)


def _run_step(
    name: str, argv: Sequence[str], cwd: Path, env: Mapping[str, str], logs: Path, *, check: bool = True
) -> int:
    """Run one step with its output in ``logs/<name>.log``; raise :class:`BuildStepError` if it fails."""
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{name}.log"
    with open(log, "w") as out:
        out.write(f"# cwd: {cwd}\n$ {shlex.join(argv)}\n")
        out.flush()
        try:
            proc = subprocess.run(list(argv), cwd=cwd, env=dict(env), stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL)  # fmt: skip
        except FileNotFoundError as e:
            out.write(f"\n{e}\n")
            raise BuildStepError(name, 127, log) from None
    if check and proc.returncode != 0:
        raise BuildStepError(name, proc.returncode, log)
    return proc.returncode


def _mirror(src: Path, dst: Path) -> None:
    """Copy a source tree, only files that are new or newer (a re-run copies what changed)."""

    def copy_if_newer(s: str, d: str) -> None:
        if not os.path.exists(d) or os.stat(s).st_mtime_ns > os.stat(d).st_mtime_ns:
            shutil.copy2(s, d)

    shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True, copy_function=copy_if_newer,
                    ignore=shutil.ignore_patterns(".git", WORK_DIR))  # fmt: skip


#: Debian's current ``config.sub`` and ``config.guess`` (autotools-dev, which automake brings in): what Debian's own
#: package builds copy over a tree's (dh_update_autotools_config), so a tree older than a target still knows it.
CURRENT_CONFIG_SCRIPTS = Path("/usr/share/misc")


def stale_config_scripts(tree: Path, host: str) -> list[Path]:
    """The directories of ``tree`` whose ``config.sub`` rejects ``host``: a configure script from before AArch64
    stops at once ("machine `aarch64' not recognized"), where Debian's build of the same package goes on."""
    return [sub.parent for sub in sorted(tree.rglob("config.sub")) if sub.is_file() and not _knows(sub, host)]


def _knows(config_sub: Path, host: str) -> bool:
    """Whether ``config_sub`` takes ``host`` (it prints the canonical triple, or fails)."""
    return subprocess.run(["sh", str(config_sub), host], capture_output=True, timeout=60).returncode == 0


def refresh_config_scripts(tree: Path, host: str) -> list[Path]:
    """Copy Debian's current ``config.sub`` and ``config.guess`` over the stale ones of ``tree`` (a copy optgym may
    write) that :func:`stale_config_scripts` finds, as Debian's build does; the directories refreshed. Nothing is
    replaced where Debian's own script does not know ``host`` either, or is not installed."""
    current = CURRENT_CONFIG_SCRIPTS / "config.sub"
    if not current.is_file() or not _knows(current, host):
        return []
    stale = stale_config_scripts(tree, host)
    for directory in stale:
        for name in ("config.sub", "config.guess"):
            if (CURRENT_CONFIG_SCRIPTS / name).is_file():
                shutil.copyfile(CURRENT_CONFIG_SCRIPTS / name, directory / name)
    return stale


#: The ``case`` patterns of a link that makes no program: a shared library or a relocatable object, said to the
#: driver (``-shared``, ``-r``) or straight to the linker (``-Wl,-shared``, ``-Wl,-soname,x,-shared``, ``-Xlinker
#: -r``): libtool and some Makefiles pass it the second way, and a C runtime added there breaks the link.
NOT_A_PROGRAM = "|".join(
    [*(f'*" {flag} "*' for flag in ("-shared", "--shared", "-r")),
     *(f'*",{flag}{end}"*' for flag in ("-shared", "--shared", "-r", "--relocatable") for end in (" ", ",")),
     *(f'*" -Xlinker {flag} "*' for flag in ("-shared", "--shared", "-r", "--relocatable"))]
)  # fmt: skip


def wrapper_script(
    compiler: str,
    tail: Sequence[str] = (),
    link_flags: Sequence[str] = (),
    program_link_flags: Sequence[str] = (),
    *,
    comment: str = "",
) -> str:
    """The ``/bin/sh`` text of one compiler wrapper: ``compiler`` with the caller's arguments, then ``tail``; a
    link (no ``-c``, ``-E``, ``-S``, ``-M``, ``-MM``) also gets ``link_flags``, and a link of a program (not
    ``-shared``, not ``-r``) ``program_link_flags`` after them. ``comment``: the script's second line (the
    corpus build's by default).

    The one rule that tells a program link apart, for the corpus build's wrappers (:func:`write_compiler_wrappers`)
    and ``optgym compare-build``'s (:func:`optgym.evaluate.build_compare.program_link_wrappers`)."""
    cc = shlex.quote(compiler)
    run = lambda *flags: " ".join(["exec", cc, '"$@"', *(f for f in flags if f)])  # noqa: E731
    tail_s, link = shlex.join(tail), shlex.join(link_flags)
    if not link_flags and not program_link_flags:
        return f"#!/bin/sh\n# {comment or 'optgym corpus build: the requested flags last win'}\n{run(tail_s)}\n"
    comment = comment or "optgym corpus build: the requested flags last win; a link also gets the target's"
    text = (f"#!/bin/sh\n# {comment}\n"
            f'case " $* " in *" -c "*|*" -E "*|*" -S "*|*" -M "*|*" -MM "*) {run(tail_s)} ;; esac\n')  # fmt: skip
    if program_link_flags:
        return (text + f'case " $* " in {NOT_A_PROGRAM}) {run(tail_s, link)} ;; esac\n'
                f"{run(tail_s, link, shlex.join(program_link_flags))}\n")  # fmt: skip
    return text + f"{run(tail_s, link)}\n"


def install_wrapper(path: Path, text: str) -> str:
    """Write the wrapper script ``text`` to ``path`` (executable), unless it is already there: an unchanged
    wrapper keeps its time, so ``make`` sees no new compiler. Returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
        path.chmod(0o755)
    return str(path)


def write_compiler_wrappers(
    bin_dir: Path,
    cc: str,
    cxx: str,
    opt: str,
    tail_flags: Sequence[str] = (*EMBED, *NO_LTO),
    link_flags: Sequence[str] = (),
    program_link_flags: Sequence[str] = (),
) -> tuple[str, str]:
    """``bin_dir/embed-cc`` and ``embed-c++``: clang with the caller's arguments, then ``opt`` and ``tail_flags``
    (the embedding flags and ``-fno-lto``) — so they win over whatever a build's own flags say (see the module
    doc). ``link_flags`` (a cross target's ``-fuse-ld=lld``) go to links only: in a compile clang would warn that
    they are unused, and CMake's flag checks take that warning for a refused flag. ``program_link_flags`` (a
    bare-metal target's C runtime and linker script) go, after them, to links of programs only: not to
    ``-shared`` or ``-r`` links (:func:`wrapper_script`)."""
    paths = [install_wrapper(bin_dir / name, wrapper_script(compiler, [opt, *tail_flags], link_flags,
                                                            program_link_flags))
             for name, compiler in zip(WRAPPER_NAMES, (cc, cxx), strict=True)]  # fmt: skip
    return paths[0], paths[1]


def _need(tool: str, package: str) -> str:
    path = shutil.which(tool)
    if not path:
        raise CorpusError(f"{tool} not found; install it with `apt-get install {package}`")
    return path


@dataclass
class _Env:
    """What every step of one build shares."""

    src: Path
    work: Path
    logs: Path
    jobs: str
    cc: str
    cxx: str
    flags: str
    env: dict[str, str]
    configure_args: Sequence[str]
    target: Target | None = None
    #: The wrappers give a bare-metal target's program links their runtime (:attr:`Target.program_link_flags`).
    links_programs: bool = False


def _configure_and_build(system: str, e: _Env, notes: list[str]) -> tuple[Path, Path, int]:
    """Run one build system's steps; (build dir, compile database, exit status of the build step)."""
    build = e.work / "build"
    if system != "autotools":  # autotools builds in its mirror (below), and leaves no empty build directory
        build.mkdir(parents=True, exist_ok=True)
    if system == "cmake":
        _need("cmake", "cmake")
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        if (build / "CMakeCache.txt").exists():
            generator = []  # the cache fixes the generator; naming it again is an error if it differs
        _run_step("configure", [
            "cmake", "-S", str(e.src), "-B", str(build), *generator, "-Wno-dev",
            "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON",
            f"-DCMAKE_C_COMPILER={e.cc}", f"-DCMAKE_CXX_COMPILER={e.cxx}",
            f"-DCMAKE_C_FLAGS={e.flags}", f"-DCMAKE_CXX_FLAGS={e.flags}",
            # a project that defaults to Release would otherwise append -O3 after our level
            "-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_C_FLAGS_RELEASE=-DNDEBUG", "-DCMAKE_CXX_FLAGS_RELEASE=-DNDEBUG",
            "-DBUILD_TESTING=OFF", f"-DCMAKE_AR={e.env['AR']}", f"-DCMAKE_RANLIB={e.env['RANLIB']}",
            *(e.target.cmake_args(links_programs=e.links_programs) + e.target.cmake_project_include(e.work)
              if e.target else ()),
            *e.configure_args,
        ], build, e.env, e.logs)  # fmt: skip
        keep_going = ["--", "-k", "0"] if (build / "build.ninja").exists() else ["--", "-k"]
        argv = ["cmake", "--build", str(build), "--parallel", e.jobs, *keep_going]
        return build, build / "compile_commands.json", _run_step("build", argv, build, e.env, e.logs, check=False)
    if system == "meson":
        _need("meson", "meson")
        ninja = _need("ninja", "ninja-build")
        if not (build / "build.ninja").exists():
            cross: list[str] = []
            if e.target:
                path = e.target.meson_cross_file(e.work / "meson-cross.ini", e.cc, e.cxx, e.env["AR"])
                cross = ["--cross-file", str(path)]
            _run_step("configure", ["meson", "setup", str(build), str(e.src), "--buildtype=plain", *cross,
                                    *e.configure_args], e.src, e.env, e.logs)  # fmt: skip
        argv = [ninja, "-C", str(build), "-k", "0", "-j", e.jobs]
        return build, build / "compile_commands.json", _run_step("build", argv, build, e.env, e.logs, check=False)
    bear = _need("bear", "bear")
    make_vars: list[str] = []
    if system == "autotools":
        # in a mirror of the tree, as Debian builds autotools packages: in their tree, since many Makefiles know
        # no other way (no VPATH: "No rule to make target 'utils.c'"), autoreconf and a refreshed config.sub write
        # into it, and a tree configured in place refuses a second, out-of-tree configuration
        _mirror(e.src, e.work / "src")
        tree = build = e.work / "src"
        host = e.target.autotools_triple if e.target else None
        if not (tree / "configure").exists():
            _need("autoreconf", "autoconf automake libtool")
            _run_step("autoreconf", ["autoreconf", "-fi"], tree, e.env, e.logs)
        if host is not None and (refreshed := refresh_config_scripts(tree, host)):
            notes.append(f"config.sub and config.guess refreshed for {host} in {len(refreshed)} directories")
        # configured already: by this build before (a re-run), or in place by the tree's owner (their config.status)
        configured = build / ".optgym-configured"
        if not configured.exists() and not (e.src / "config.status").exists():
            configure = ["sh", str(tree / "configure")]
            script = (tree / "configure").read_text(errors="replace")[:4000]
            extra: list[str] = []
            if "Generated by GNU Autoconf" in script:  # hand-written ones (zlib's) reject VAR=value
                extra += [f"CC={e.cc}", f"CXX={e.cxx}", f"CFLAGS={e.flags}", f"CXXFLAGS={e.flags}"]
                help_text = subprocess.run([*configure, "--help"], cwd=build, env=e.env, capture_output=True,
                                           text=True).stdout  # fmt: skip
                # one compile per source: libtool otherwise builds every file twice (PIC and not)
                if "--disable-static" in help_text:
                    extra.append("--disable-static")
                if e.target:  # a cross build: configure runs nothing it compiles
                    extra.append(e.target.autotools_host())
            _run_step("configure", [*configure, *extra, *e.configure_args], build, e.env, e.logs)
            configured.touch()
    else:
        _mirror(e.src, build)
        make_vars = [f"CC={e.cc}", f"CXX={e.cxx}", *e.configure_args]
    compdb = build / "compile_commands.json"
    argv = [bear, "--append", "--output", str(compdb), "--", "make", "-k", "-j", e.jobs, *make_vars]
    return build, compdb, _run_step("build", argv, build, e.env, e.logs, check=False)


@dataclass
class FinishedBuild:
    """A source tree's build, before anything is taken from it."""

    build_system: str
    build_dir: Path
    compdb: Path
    build_seconds: float
    returncode: int
    notes: list[str]


#: What a ThinLTO capture build compiles and links with (see :func:`run_build`).
THINLTO_FLAGS = ("-flto=thin", "-fuse-ld=lld", "-Wno-unused-command-line-argument")


def run_build(
    toolchain: Toolchain,
    src: Path,
    dest: Path,
    *,
    opt: str = "-Oz",
    workers: int | None = None,
    build_system: str | None = None,
    configure_args: Sequence[str] = (),
    logs: Path | None = None,
    thinlto_capture: Path | None = None,
    target: Target | None = None,
) -> FinishedBuild:
    """Configure and build ``src`` out of tree under ``dest``'s work directory, every compile at ``opt``.

    By default with bitcode embedded in every object (a per-TU corpus is then extracted from them). With
    ``thinlto_capture``, as a real ``-flto=thin`` build linked by lld instead, through ``optgym-cc`` with clang's
    own decisions: every backend of every link is recorded in that directory as it runs
    (:func:`optgym_cc.thinlto.capture`), which :func:`optgym.corpus.thinlto.corpus_from_capture` makes a corpus.

    Without ``build_system``, a tree that offers several (zlib: CMake and its own configure) falls back to the
    next one when a configure step fails — Debian's repacked sources sometimes drop files that one of them
    needs. The failed attempt's logs stay in ``logs/<system>-failed/``.

    ``target``: compile for another target (see :mod:`optgym.corpus.target`); a bare-metal target's programs link
    against picolibc when it has the target's multilib (:func:`optgym.corpus.target.bare_metal_runtime`), else
    its links fail and its objects are what the build gives.
    """
    src, dest = Path(src).absolute(), Path(dest).absolute()
    if not src.is_dir():
        raise CorpusError(f"{src}: no such source directory")
    systems = [build_system] if build_system else detect_build_systems(src)
    if systems[0] not in BUILD_SYSTEMS:
        raise CorpusError(f"unknown build system {systems[0]!r}; one of {', '.join(BUILD_SYSTEMS)}")
    recover(dest)
    logs = Path(logs) if logs else dest / LOGS_DIR
    capture_env: dict[str, str] = {}
    if thinlto_capture is None:
        flags = shlex.join([*EMBED, opt])
        compilers = (dest / WORK_DIR / "bin", str(toolchain.clang), str(toolchain.tool("clang++")), opt)
        tail: Sequence[str] = (*EMBED, *NO_LTO)
    else:
        flags = shlex.join([opt, *THINLTO_FLAGS])
        launchers = Path(sys.executable).parent
        compilers = (dest / WORK_DIR / "bin", str(launchers / "optgym-cc"), str(launchers / "optgym-c++"), opt)
        tail = THINLTO_FLAGS
        Path(thinlto_capture).mkdir(parents=True, exist_ok=True)
        capture_env = {"OPTGYM_THINLTO_CAPTURE": str(Path(thinlto_capture).absolute()), "OPTGYM_LLVM_DIR":
                       str(toolchain.clang.parent)}  # fmt: skip
        # clang's own decisions everywhere: the compile steps pass straight through, the links run clang's backends
        capture_env |= dict.fromkeys(("OPTGYM_POLICY", "OPTGYM_EVICT_POLICY", "OPTGYM_PRIORITY_POLICY",
                                      "OPTGYM_LTO_POLICY", "OPTGYM_LTO_EVICT_POLICY", "OPTGYM_LTO_PRIORITY_POLICY"),
                                     "heuristic")  # fmt: skip
    link: Sequence[str] = ()
    program_link: Sequence[str] = ()
    if target is not None:
        tail, link = (*target.compile_flags, *tail), target.link_flags
        if thinlto_capture is None:  # a ThinLTO capture build is this machine's only
            program_link = target.program_link_flags
    cc, cxx = write_compiler_wrappers(*compilers, tail, link, program_link)
    e = _Env(
        src=src,
        work=dest / WORK_DIR,
        logs=logs,
        jobs=str(workers or len(os.sched_getaffinity(0))),
        cc=cc,
        cxx=cxx,
        flags=flags,
        # LLVM's own ar/ranlib: the system's binutils load an old LLVM linker plugin that cannot read objects
        # carrying clang-22 bitcode, so static libraries (and what links them) failed to build.
        env={
            **os.environ,
            "CC": cc,
            "CXX": cxx,
            "CFLAGS": flags,
            "CXXFLAGS": flags,
            "LC_ALL": "C",
            "AR": str(toolchain.tool("llvm-ar")),
            "RANLIB": str(toolchain.tool("llvm-ranlib")),
            **capture_env,
        },
        configure_args=configure_args,
        target=target,
        links_programs=bool(program_link),
    )
    notes: list[str] = []
    start = time.perf_counter()
    for i, system in enumerate(systems):
        try:
            build, compdb, returncode = _configure_and_build(system, e, notes)
            break
        except BuildStepError as err:
            if i + 1 == len(systems) or err.step == "build":
                raise
            failed = logs / f"{system}-failed"
            shutil.rmtree(failed, ignore_errors=True)
            failed.mkdir(parents=True)
            for log in logs.glob("*.log"):
                os.replace(log, failed / log.name)
            shutil.rmtree(e.work, ignore_errors=True)
            write_compiler_wrappers(*compilers, tail, link, program_link)  # they lived in the work dir too
            notes.append(f"{system} {err.step} failed (logs in {failed}); used {systems[i + 1]}")
    return FinishedBuild(system, build, compdb, time.perf_counter() - start, returncode, notes)


def build_tree(
    toolchain: Toolchain,
    src: Path,
    dest: Path,
    *,
    opt: str = "-Oz",
    workers: int | None = None,
    build_system: str | None = None,
    configure_args: Sequence[str] = (),
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    keep_variants: bool = False,
    strict: bool = False,
    logs: Path | None = None,
    provenance: Mapping[str, Any] | None = None,
    max_decisions: int | None = None,
    target: Target | None = None,
) -> BuildResult:
    """Build ``src`` with bitcode embedded (:func:`run_build`) and make ``dest`` a corpus of its objects, for
    ``target`` when given (recorded in the provenance)."""
    logs = Path(logs) if logs else Path(dest).absolute() / LOGS_DIR
    done = run_build(toolchain, src, dest, opt=opt, workers=workers, build_system=build_system,
                     configure_args=configure_args, logs=logs, target=target)  # fmt: skip
    if target is not None and target.bare_metal:
        if runtime := bare_metal_runtime(target):
            done.notes.append(f"{target.triple} has no OS: its programs link against picolibc ({runtime.multilib}) "
                              f"with optgym's generic linker script {runtime.script.name}")  # fmt: skip
        else:
            done.notes.append(f"{target.triple} has no OS: the build's links fail without a linker script; its "
                              "objects are the corpus")  # fmt: skip
    build_log = logs / "build.log"
    if done.returncode != 0:
        if strict or not done.compdb.exists():
            raise BuildStepError("build", done.returncode, build_log)
        done.notes.append(f"the build step failed (exit {done.returncode}, log {build_log}); kept the objects that "
                          "were built")  # fmt: skip
    if not done.compdb.exists():
        raise CorpusError(f"the build wrote no compile database at {done.compdb}; see {build_log}")
    report = extract(
        toolchain,
        done.compdb,
        Path(dest).absolute(),
        workers=workers,
        include=include,
        exclude=exclude,
        keep_variants=keep_variants,
        logs=logs,
        max_decisions=max_decisions,
        opt=opt,
        provenance={
            "source_dir": str(Path(src).absolute()),
            "build_system": done.build_system,
            "opt": opt,
            "build_seconds": round(done.build_seconds, 1),
            "partial": done.returncode != 0,
            **(target.provenance() if target else {}),
            **(provenance or {}),
        },
    )
    return BuildResult(done.build_system, done.build_dir, done.compdb, done.build_seconds, done.returncode != 0,
                       report, done.notes)  # fmt: skip
