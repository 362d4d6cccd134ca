"""``optgym corpus csmith``: random C programs from Debian's csmith → a corpus.

csmith's programs are valid, UB-free C that no human would write: long expression chains, deep
pointer games, many small static functions. That makes them good at two things: robustness tests
(every odd corner of the inliner and of optgym's host gets exercised; ``bench/robustness.py``) and
extra training data that no package list can leak into a test split.

Reproducibility. Program ``i`` of ``--seed S`` is csmith's program for the seed
:func:`derive_seed` ``(S, i)``, so a corpus is a pure function of (S, N, csmith version, compiler
flags), and growing N only appends programs. Each program is compiled in a fresh temporary
directory under a fixed file name with ``-ffile-compilation-dir=.``: otherwise the temporary path
lands in the embedded ``-cc1`` command (``-fdebug-compilation-dir=/tmp/…``) and two builds of the
same seed would differ byte for byte. ``-w`` silences csmith's thousands of harmless warnings.

Incremental and atomic. Every finished module is written at once into
``DIR/.optgym-work/csmith/<config>/`` (``<config>`` hashes everything that determines the bytes);
an interrupted run resumes from there. The corpus itself is assembled in a staging directory from
hard links — modules of the existing corpus when it was built with the same configuration, new
ones from the work area — and renamed into place (:mod:`optgym.corpus.staging`). A program that
fails (csmith timing out, clang rejecting it) is reported and recorded in the description, and tried
again on the next run: that costs little, and a failure under load should not become permanent.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optgym.corpus.corpus import Corpus
from optgym.corpus.embedded import extract_object
from optgym.corpus.staging import (
    KEEP,
    LOGS_DIR,
    WORK_DIR,
    link_or_copy,
    now,
    read_description,
    recover,
    staging_dir,
    swap_in,
    write_description,
)
from optgym.errors import CorpusError
from optgym.files import atomic_write_bytes
from optgym.toolchain.llvm import Toolchain
from optgym.toolchain.process import run

#: Options given to every csmith run (recorded in provenance; part of the configuration hash).
CSMITH_OPTIONS: tuple[str, ...] = ()
#: Compile flags besides the opt level: the embedding, warnings off, a path-free compilation dir.
COMPILE_FLAGS: tuple[str, ...] = ("-w", "-ffile-compilation-dir=.", "-Xclang", "-fembed-bitcode=all")
#: csmith occasionally spends minutes on one seed; such a seed is reported, not waited for.
CSMITH_TIMEOUT = 60.0
COMPILE_TIMEOUT = 300.0
INSTALL_HINT = "install Debian's csmith and its headers: `apt-get install csmith libcsmith-dev`"


def derive_seed(seed: int, index: int) -> int:
    """csmith's seed for program ``index`` of a corpus made with ``seed`` (1 … 2³²-1, stable forever).

    A hash rather than ``seed + index``: corpora made with neighbouring seeds must not share programs.
    """
    digest = hashlib.sha256(f"optgym-csmith\0{seed}\0{index}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % (2**32 - 1) + 1


def module_name(seed: int, index: int) -> str:
    """``csmith-s<seed>-<index>``: sorts by index, and tells a crash report how to regenerate it."""
    return f"csmith-s{seed}-{index:06d}"


def find_csmith() -> Path:
    """The csmith program, or a :class:`CorpusError` saying how to install it."""
    path = shutil.which("csmith")
    if not path:
        raise CorpusError(f"csmith not found; {INSTALL_HINT}")
    return Path(path)


def include_dir() -> Path:
    """The directory holding ``csmith.h`` (Debian's libcsmith-dev puts it in /usr/include/csmith)."""
    for candidate in sorted(Path("/usr/include").glob("csmith*")):
        if (candidate / "csmith.h").is_file():
            return candidate
    raise CorpusError(f"csmith.h not found under /usr/include/csmith*; {INSTALL_HINT}")


def csmith_version(csmith: Path | None = None) -> str:
    """``2.3.0 (git 30dccd7)``: what ``csmith --version`` says, for provenance and the config hash."""
    try:  # in a scratch directory: csmith drops a platform.info file into its working directory
        with tempfile.TemporaryDirectory(prefix="optgym-csmith-") as scratch:
            argv = [str(csmith or find_csmith()), "--version"]
            out = subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd=scratch)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CorpusError(f"cannot run csmith --version: {e}") from None
    lines = out.stdout.split("\n")
    version = lines[0].removeprefix("csmith").strip() if lines else ""
    git = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("Git version:")), "")
    if not version:
        raise CorpusError(f"cannot read a version from csmith --version: {out.stdout!r} {out.stderr!r}")
    return f"{version} (git {git})" if git else version


@dataclass(frozen=True)
class CsmithTask:
    """One program: generate, compile, extract into ``work`` (picklable: runs in a worker)."""

    index: int
    seed: int
    name: str
    work: str
    include: str
    opt: str
    logs: str  # where the C source of a program clang fails on is kept
    csmith_timeout: float = CSMITH_TIMEOUT
    compile_timeout: float = COMPILE_TIMEOUT


@dataclass
class ProgramResult:
    """How one program ended: ``ok``, or a failure with a detail.

    Failures: ``csmith_<status>`` (csmith exited non-zero, crashed or timed out), ``compile_error``,
    ``compile_crash``, ``compile_timeout`` (clang on the program), ``extract_failed``, ``error`` (the
    worker raised or died).
    """

    name: str
    index: int
    seed: int
    status: str
    detail: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def make_program(task: CsmithTask) -> ProgramResult:
    """Worker: csmith's program for ``task.seed``, compiled with bitcode embedded, as ``work/<name>.{bc,cmd}``.

    Failures are results, not exceptions: one bad seed must not stop a thousand-program run.
    """
    from optgym.toolchain import find_toolchain

    start = time.perf_counter()
    result = ProgramResult(task.name, task.index, task.seed, "ok")
    with tempfile.TemporaryDirectory(prefix="optgym-csmith-") as tmp:
        source, obj = Path(tmp) / f"{task.name}.c", Path(tmp) / f"{task.name}.o"
        # stdout, not -o: -o would put the path into the program's header comment. process.run, not
        # subprocess: a worker killed mid-run takes its csmith and clang with it (PDEATHSIG).
        with open(source, "wb") as out:
            gen = run([str(find_csmith()), "--seed", str(task.seed), *CSMITH_OPTIONS], task.csmith_timeout,
                      cwd=Path(tmp), stdout=out)  # fmt: skip
        if gen.status != "ok":
            return _failed(result, f"csmith_{gen.status}", f"csmith: {gen.detail}: {gen.stderr_tail[-500:]}", start)
        toolchain = find_toolchain()
        argv = [str(toolchain.clang), task.opt, *COMPILE_FLAGS, f"-I{task.include}", "-c", source.name,
                "-o", obj.name]  # fmt: skip
        cc = run(argv, task.compile_timeout, cwd=Path(tmp))
        if cc.status != "ok":
            # clang failing on a valid csmith program is a compiler bug worth a report: keep the source
            kept = Path(task.logs) / source.name
            kept.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, kept)
            status = "compile_error" if cc.status == "compile_error" else f"compile_{cc.status}"
            detail = f"clang: {cc.detail} (source kept as {kept}): {cc.stderr_tail[-2000:]}"
            return _failed(result, status, detail, start)
        try:
            bitcode, args = extract_object(toolchain, obj)
        except CorpusError as e:
            return _failed(result, "extract_failed", str(e), start)
        work = Path(task.work)
        atomic_write_bytes(work / f"{task.name}.bc", bitcode)
        # the .cmd last: a module counts as done in the work area once both files exist
        atomic_write_bytes(work / f"{task.name}.cmd", b"\0".join(a.encode() for a in args))
    result.seconds = time.perf_counter() - start
    return result


def _failed(result: ProgramResult, status: str, detail: str, start: float) -> ProgramResult:
    result.status, result.detail, result.seconds = status, detail.strip(), time.perf_counter() - start
    return result


@dataclass
class CsmithReport:
    """What a ``corpus csmith`` run did."""

    modules: int = 0
    new: int = 0
    reused: int = 0
    failed: list[ProgramResult] = field(default_factory=list)
    seconds: float = 0.0
    csmith: str = ""


def _config(version: str, opt: str, toolchain: Toolchain, include: Path) -> dict[str, Any]:
    """Everything that determines a program's bytes besides its seed."""
    return {
        "csmith_version": version,
        "csmith_options": list(CSMITH_OPTIONS),
        "opt": opt,
        "flags": [*COMPILE_FLAGS, f"-I{include}"],
        "compiler": toolchain.identity,
    }


def _config_key(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


def build_csmith_corpus(
    toolchain: Toolchain,
    dest: Path,
    *,
    count: int,
    seed: int = 0,
    opt: str = "-Oz",
    workers: int | None = None,
    progress: bool = True,
    status: Callable[[ProgramResult], None] | None = None,
) -> CsmithReport:
    """Make ``dest`` a corpus of csmith programs ``0 … count-1`` of ``seed`` (see the module doc)."""
    if count < 1:
        raise CorpusError(f"-n must be at least 1, not {count}")
    start = time.perf_counter()
    dest = Path(dest).absolute()
    with _exclusive(dest):
        return _build(toolchain, dest, count, seed, opt, workers, progress, status, start)


@contextlib.contextmanager
def _exclusive(dest: Path) -> Iterator[None]:
    """Hold ``.<dest>.lock`` beside ``dest``: a second run on the same corpus would delete the first's work area.

    The lock file stays (removing it would race with a run that just opened it); the kernel drops the
    lock when its holder exits, however it exits.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.with_name(f".{dest.name}.lock"), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CorpusError(f"another `optgym corpus csmith` is writing {dest}; wait for it to finish") from None
        yield


def _build(
    toolchain: Toolchain,
    dest: Path,
    count: int,
    seed: int,
    opt: str,
    workers: int | None,
    progress: bool,
    status: Callable[[ProgramResult], None] | None,
    start: float,
) -> CsmithReport:
    """:func:`build_csmith_corpus` with ``dest`` locked."""
    from optgym.parallel import run_tasks

    version = csmith_version()
    include = include_dir()
    config = _config(version, opt, toolchain, include)
    key = _config_key(config)
    recover(dest)  # a swap that an interrupted run left half done
    description = read_description(dest)
    previous = description.get("optgym", {}).get("csmith")
    if description and not isinstance(previous, dict):
        raise CorpusError(f"{dest} holds a corpus that was not made by `optgym corpus csmith`; choose another -o")
    if not description and dest.is_dir() and any(p.name not in KEEP for p in dest.iterdir()):
        # the swap replaces the whole directory: never do that to something that is not a corpus
        raise CorpusError(f"{dest} exists and is not a corpus; choose another -o (or remove it)")
    same_config = bool(previous) and previous.get("config_key") == key
    existing = set(description.get("modules", [])) if same_config else set()
    work_root, logs = dest / WORK_DIR / "csmith", dest / LOGS_DIR / "csmith"
    work = work_root / key
    work.mkdir(parents=True, exist_ok=True)
    for stale in work_root.iterdir():  # the work of another configuration can never be reused
        if stale != work:
            shutil.rmtree(stale, ignore_errors=True)
    plan = [(i, derive_seed(seed, i), module_name(seed, i)) for i in range(count)]
    sources: dict[str, Path] = {}
    todo: list[CsmithTask] = []
    for i, program_seed, name in plan:
        if name in existing and (dest / f"{name}.bc").exists() and (dest / f"{name}.cmd").exists():
            sources[name] = dest
        elif (work / f"{name}.bc").exists() and (work / f"{name}.cmd").exists():
            sources[name] = work
        else:
            todo.append(CsmithTask(i, program_seed, name, str(work), str(include), opt, str(logs)))
    report = CsmithReport(csmith=version, reused=len(sources))
    if todo:
        for _, result in run_tasks(make_program, todo, workers=workers, description="csmith programs",
                                   progress=progress, on_error=_task_failed):  # fmt: skip
            if status is not None:
                status(result)
            if result.ok:
                sources[result.name] = work
                report.new += 1
            else:
                report.failed.append(result)
    report.failed.sort(key=lambda r: r.index)
    names = [name for _, _, name in plan if name in sources]
    if not names:
        raise CorpusError(f"no csmith program could be built ({len(report.failed)} failed): {_first(report)}")
    with staging_dir(dest) as staging:
        for name in names:
            link_or_copy(sources[name] / f"{name}.bc", staging / f"{name}.bc")
            link_or_copy(sources[name] / f"{name}.cmd", staging / f"{name}.cmd")
        meta: dict[str, Any] = {
            "provenance": {"tool": "optgym corpus csmith", "created": now(), "compiler": toolchain.banner},
            "csmith": {
                "version": version,
                "seed": seed,
                "count": count,
                "seed_derivation": "sha256('optgym-csmith\\0<seed>\\0<index>')[:4] % (2**32-1) + 1",
                "seeds": {name: s for _, s, name in plan if name in sources},
                "failed": {
                    r.name: {"seed": r.seed, "status": r.status, "detail": r.detail[:500]} for r in report.failed
                },
                "config": config,
                "config_key": key,
            },
        }
        write_description(staging, names, meta)
        Corpus(staging)  # validates what is about to be published
        swap_in(staging, dest)
    shutil.rmtree(work_root, ignore_errors=True)  # every module now lives (hard-linked) in the corpus
    with contextlib.suppress(OSError):
        (dest / WORK_DIR).rmdir()  # only if nothing else works there
    report.modules = len(names)
    report.seconds = time.perf_counter() - start
    return report


def _task_failed(task: CsmithTask, failure: Exception) -> ProgramResult:
    """A worker that raised or died: a failed program, so the run still reaches its summary."""
    return ProgramResult(task.name, task.index, task.seed, "error", str(failure)[:2000])


def _first(report: CsmithReport) -> str:
    return f"{report.failed[0].name}: {report.failed[0].status}: {report.failed[0].detail}" if report.failed else ""


__all__ = [
    "CSMITH_OPTIONS",
    "CsmithReport",
    "CsmithTask",
    "ProgramResult",
    "build_csmith_corpus",
    "csmith_version",
    "derive_seed",
    "include_dir",
    "make_program",
    "module_name",
]
