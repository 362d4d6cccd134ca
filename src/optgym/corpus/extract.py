"""``optgym corpus extract``: a compile database of a bitcode-embedding build → a corpus.

The extraction itself is mlgo-utils' ``extract_ir`` (the field's own tool, pinned in
``pyproject.toml``), run as a program with clang-22's ``llvm-objcopy``. Before it runs, the compile
database is filtered here, because ``extract_ir`` takes every entry with an ``-o`` at face value:

* only single-TU compiles (``-c`` with exactly one C/C++/ObjC source) become modules; a link step
  over bitcode-embedded objects concatenates their ``.llvmbc`` sections into a ``.cmd`` with several
  ``-cc1`` commands, which is not a module;
* ``command`` strings are split with shell rules (``extract_ir`` splits on blanks, which breaks on
  quoted defines) and object paths are made relative to one base directory (an absolute ``-o``
  would make ``extract_ir`` write next to the object instead of into the corpus);
* an object compiled twice (bear's ``--append`` over re-runs) is taken once, and the PIC and
  non-PIC compiles of one source that libtool and CMake's shared+static targets make are taken
  once (they would double-count the same code in training and evaluation).

Every entry left out is reported with its reason, in the summary and in ``logs/extract.log``.
"""

from __future__ import annotations

import fnmatch
import importlib.metadata
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optgym.corpus.corpus import Corpus, Module
from optgym.corpus.staging import LOGS_DIR, now, staging_dir, swap_in, write_description
from optgym.errors import CorpusError
from optgym.toolchain.language import C_SUFFIXES, CXX_SUFFIXES, OBJC_SUFFIXES
from optgym.toolchain.llvm import Toolchain

MLGO_UTILS = "mlgo-utils"
ASM_SUFFIXES = (".s", ".S", ".asm", ".sx")
SOURCE_SUFFIXES = C_SUFFIXES + CXX_SUFFIXES + OBJC_SUFFIXES + ASM_SUFFIXES + (".i", ".ii")
#: Where a build system runs the compiles that probe the compiler rather than build the program: CMake's
#: try-compiles and compiler identification (``CMakeFiles/CMakeScratch/…``, ``CMakeFiles/3.25.1/CompilerIdC``;
#: the program's own objects land under ``CMakeFiles/X.dir/`` but compile in the build directory) and
#: Meson's (``meson-private/``).
PROBE_DIRS = ("/CMakeFiles/", "/meson-private/")

#: Driver options whose value is the next argument (so that value is not taken for a source file).
_WITH_VALUE = frozenset(
    [
        "-o",
        "-I",
        "-D",
        "-U",
        "-include",
        "-imacros",
        "-isystem",
        "-iquote",
        "-idirafter",
        "-iprefix",
        "-iwithprefix",
        "-isysroot",
        "--sysroot",
        "-MF",
        "-MT",
        "-MQ",
        "-x",
        "-Xclang",
        "-mllvm",
        "-Xlinker",
        "-Xassembler",
        "-Xpreprocessor",
        "-arch",
        "-target",
        "-L",
        "-l",
        "-u",
        "-z",
        "-T",
        "-e",
        "-aux-info",
        "-ivfsoverlay",
        "-working-directory",
        "-main-file-name",
        "-fmodule-file",
        "-gcc-toolchain",
    ]
)
#: Flags by which a library's PIC and non-PIC (or shared and static) compiles of one source differ.
_VARIANT_FLAGS = frozenset({"-fPIC", "-fpic", "-fPIE", "-fpie", "-DPIC", "-DDLL_EXPORT", "-fno-PIC", "-fno-pic"})


@dataclass(frozen=True)
class Entry:
    """One kept compile: its source, absolute object path and arguments."""

    directory: Path
    source: Path
    output: Path
    arguments: tuple[str, ...]


@dataclass
class ExtractReport:
    """What became of every compile-database entry."""

    modules: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (what, reason)
    entries: int = 0
    seconds: float = 0.0
    opt: str | None = None  # the -O level the build was asked for, when known
    opt_mismatches: dict[str, Any] | None = None  # modules at another level (info.opt_mismatches)

    def skip_counts(self) -> dict[str, int]:
        return dict(Counter(reason for _, reason in self.skipped).most_common())

    def opt_warning(self) -> str | None:
        """The warning line when modules came out at another -O level than :attr:`opt` (else ``None``)."""
        from optgym.corpus.info import describe_opt_mismatches

        if not self.opt_mismatches:
            return None
        return describe_opt_mismatches(self.opt_mismatches, len(self.modules), [self.opt] if self.opt else [])


def mlgo_utils_version() -> str:
    """The installed mlgo-utils version (recorded in provenance)."""
    try:
        return importlib.metadata.version(MLGO_UTILS)
    except importlib.metadata.PackageNotFoundError:
        raise CorpusError(
            "mlgo-utils is not installed; `pip install mlgo-utils==19.0.0.dev202407180600` (optgym's pin)"
        ) from None


def entry_arguments(entry: dict[str, Any]) -> list[str]:
    """The argument vector of a compile-database entry (``arguments``, else ``command`` split like a shell)."""
    if isinstance(entry.get("arguments"), list):
        return [str(a) for a in entry["arguments"]]
    if isinstance(entry.get("command"), str):
        return shlex.split(entry["command"])
    return []


def _positional(args: Sequence[str]) -> list[str]:
    out, skip = [], False
    for arg in args[1:]:
        if skip:
            skip = False
        elif arg in _WITH_VALUE:
            skip = True
        elif not arg.startswith("-"):
            out.append(arg)
    return out


def _output(args: Sequence[str]) -> str | None:
    for i, arg in enumerate(args):
        if arg == "-o" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("-o") and len(arg) > 2 and not arg.startswith("-objc"):
            return arg[2:]
    return None


def classify(entry: dict[str, Any]) -> Entry | str:
    """The kept compile of a database entry, or the reason it is not a module."""
    args = entry_arguments(entry)
    directory = Path(entry.get("directory") or ".")
    if not args:
        return "no arguments or command"
    if "-c" not in args:
        return "not a single-TU compile (no -c: a link or other step)"
    if any(a in ("-E", "-S", "-M", "-MM", "-fsyntax-only", "-emit-llvm") for a in args):
        return "does not produce an object"
    sources = [s for s in _positional(args) if s.endswith(SOURCE_SUFFIXES)]
    if len(sources) != 1:
        return f"compiles {len(sources)} sources in one command"
    source = sources[0]
    if source.endswith(ASM_SUFFIXES):
        return "assembly source (no bitcode)"
    if any(d in f"{os.path.normpath(directory)}/" for d in PROBE_DIRS):
        return "a build system's probe of the compiler"
    output = _output(args) or f"{Path(source).stem}.o"
    return Entry(
        directory=directory,
        source=Path(os.path.normpath(directory / source)),
        output=Path(os.path.normpath(directory / output)),
        arguments=tuple(args),
    )


def _variant_key(entry: Entry) -> tuple:
    """What identifies the code a compile produces, ignoring PIC/export-only differences and file names."""
    args, skip, kept = entry.arguments[1:], False, []
    for arg in args:
        if skip:
            skip = False
        elif arg in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
        elif (
            arg in _VARIANT_FLAGS
            or arg in ("-MD", "-MMD", "-MP")
            or arg.startswith(("-o", "-MF", "-MT", "-MQ"))
            or (arg.startswith("-D") and arg.split("=")[0].endswith("_EXPORTS"))
            or os.path.normpath(entry.directory / arg) == str(entry.source)
        ):
            continue
        else:
            kept.append(arg)
    return (str(entry.source), tuple(kept))


def select_entries(database: list[dict[str, Any]], *, keep_variants: bool = False) -> tuple[list[Entry], list]:
    """The single-TU compiles of a database, one per object and per distinct compile of a source."""
    skipped: list[tuple[str, str]] = []
    by_output: dict[Path, Entry] = {}
    for raw in database:
        got = classify(raw)
        if isinstance(got, str):
            skipped.append((str(raw.get("output") or raw.get("file") or "?"), got))
        else:
            if got.output in by_output:
                skipped.append((str(got.output), "object compiled again (later entry kept)"))
            by_output[got.output] = got
    kept: list[Entry] = []
    seen: dict[tuple, Entry] = {}
    for entry in by_output.values():
        key = _variant_key(entry)
        if not keep_variants and key in seen:
            skipped.append((str(entry.output), f"same code as {seen[key].output} (PIC/shared variant)"))
            continue
        seen[key] = entry
        kept.append(entry)
    return kept, skipped


def _base_dir(compdb: Path, entries: Sequence[Entry]) -> Path:
    """Module names are object paths relative to this: the database's directory when it holds them all."""
    home = compdb.parent.absolute()
    if all(e.output.is_relative_to(home) for e in entries):
        return home
    return Path(os.path.commonpath([str(e.output.parent) for e in entries]))


def matches(name: str, include: Sequence[str] = (), exclude: Sequence[str] = ()) -> bool:
    """Whether a module name passes ``--include``/``--exclude`` globs (no include glob: all are in)."""
    if include and not any(fnmatch.fnmatchcase(name, g) for g in include):
        return False
    return not any(fnmatch.fnmatchcase(name, g) for g in exclude)


def over_limit_reason(limit: int) -> str:
    """Why ``--max-decisions`` left a module out: one text per limit, so the summary counts them together."""
    return f"more than {limit} heuristic decisions (--max-decisions)"


def over_decision_limit(
    modules: Sequence[Module],
    limit: int,
    *,
    workers: int | None = None,
    problem: str = "inline-size",
    timeout: float = 300.0,
    progress: bool = True,
) -> list[str | None]:
    """Per module, why ``--max-decisions limit`` leaves it out (``None``: it stays).

    A huge module costs every episode that draws it thousands of steps, so training sets bound it.
    The counts are :func:`optgym.rollout.heuristic.heuristic_decisions`: the heuristic's own interactive
    compile, cached by module content, so ``corpus info --decisions`` and every later filter share
    them. A module whose count cannot be taken (its compile fails or times out) is left out too: an
    episode on it would fail the same way.
    """
    from optgym.corpus.info import heuristic_worker, size_tasks
    from optgym.parallel import run_tasks

    if limit < 0:
        raise CorpusError(f"--max-decisions must be at least 0, not {limit}")
    tasks = size_tasks(modules, problem, timeout, workers)
    reasons: list[str | None] = [None] * len(tasks)
    for i, row in run_tasks(heuristic_worker("decisions"), tasks, workers=workers, description="decision counts",
                            progress=progress):  # fmt: skip
        if row["status"] != "ok":
            reasons[i] = f"decision count failed: {row['status']} (--max-decisions)"
        elif row["decisions"] > limit:
            reasons[i] = over_limit_reason(limit)
    return reasons


def _is_bitcode_file(path: Path) -> bool:
    """Whether ``path`` is raw LLVM bitcode (what ``-flto`` writes instead of an object)."""
    with open(path, "rb") as f:
        head = f.read(4)
    return head in (b"BC\xc0\xde", b"\xde\xc0\x17\x0b")  # plain bitcode, or the bitcode wrapper


def cc1_count(cmd_file: Path) -> int:
    """How many ``-cc1`` commands a ``.cmd`` file holds (a link of embedded objects holds several)."""
    return sum(1 for a in cmd_file.read_bytes().split(b"\0") if a == b"-cc1")


def extract(
    toolchain: Toolchain,
    compdb: Path,
    dest: Path,
    *,
    workers: int | None = None,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    keep_variants: bool = False,
    provenance: dict[str, Any] | None = None,
    logs: Path | None = None,
    max_decisions: int | None = None,
    opt: str | None = None,
) -> ExtractReport:
    """Make ``dest`` a corpus of the objects that ``compdb`` compiled (see the module doc).

    With ``opt`` (the level the build was asked for), modules recorded at another level are counted in
    the report (:meth:`ExtractReport.opt_warning`): the corpus is still made, but the user is told.
    """
    start = time.perf_counter()
    compdb, dest = Path(compdb).absolute(), Path(dest).absolute()
    try:
        database = json.loads(compdb.read_text())
    except FileNotFoundError:
        raise CorpusError(f"{compdb}: no such compile database") from None
    except json.JSONDecodeError as e:
        raise CorpusError(f"{compdb} is not valid JSON: {e}") from None
    if not isinstance(database, list):
        raise CorpusError(f"{compdb} is not a compile database (a JSON list of entries)")
    report = ExtractReport(entries=len(database))
    entries, report.skipped = select_entries(database, keep_variants=keep_variants)
    if not entries:
        raise CorpusError(f"{compdb}: no single-TU compile in {len(database)} entries")
    base = _base_dir(compdb, entries)
    logs = Path(logs) if logs else dest / LOGS_DIR
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / "extract.log"
    with staging_dir(dest) as staging:
        with tempfile.TemporaryDirectory(prefix="optgym-extract-") as tmp:
            work = Path(tmp)
            filtered = work / "compile_commands.json"
            filtered.write_text(
                json.dumps(
                    [
                        {
                            "directory": str(base),
                            "file": str(e.source),
                            "arguments": [e.arguments[0], "-c", str(e.source), "-o", str(e.output.relative_to(base))],
                        }
                        for e in entries
                    ]
                )
            )
            argv = [
                sys.executable, "-m", "mlgo.corpus.extract_ir",
                "--input", str(filtered), "--input_type", "json", "--output_dir", str(staging),
                "--llvm_objcopy_path", str(toolchain.tool("llvm-objcopy")),
                "--obj_base_dir", str(base),
                "--num_workers", str(max(1, workers or len(os.sched_getaffinity(0)))),
            ]  # fmt: skip
            with open(log_path, "w") as log:
                log.write(f"$ {shlex.join(argv)}\n")
                log.flush()
                proc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            if proc.returncode != 0:
                raise CorpusError(f"extract_ir failed (exit {proc.returncode}); its log: {log_path}")
        extracted = set(json.loads((staging / "corpus_description.json").read_text()).get("modules", []))
        for entry in entries:
            name = str(entry.output.relative_to(base))
            if name not in extracted:
                if not entry.output.exists():
                    reason = "object missing (not built?)"
                elif _is_bitcode_file(entry.output):
                    reason = "an LTO object (bitcode, no embedded sections): the build turned on -flto itself"
                else:
                    reason = "no embedded bitcode (not built by clang with -Xclang -fembed-bitcode=all)"
                report.skipped.append((str(entry.output), reason))
                continue
            bc, cmd = staging / f"{name}.bc", staging / f"{name}.cmd"
            count = cc1_count(cmd)
            if count != 1 or not matches(name, include, exclude):
                reason = (
                    f"{count} -cc1 commands (a link of bitcode-embedded objects)"
                    if count > 1
                    else ("no -cc1 command line" if count == 0 else "left out by --include/--exclude")
                )
                report.skipped.append((name, reason))
                bc.unlink(missing_ok=True)
                cmd.unlink(missing_ok=True)
                continue
            report.modules.append(name)
        if max_decisions is not None and report.modules:
            staged = [Module(n, staging / f"{n}.bc", staging / f"{n}.cmd") for n in report.modules]
            reasons = over_decision_limit(staged, max_decisions, workers=workers)
            for module, left_out in zip(staged, reasons, strict=True):
                if left_out is not None:
                    report.skipped.append((module.name, left_out))
                    module.bitcode.unlink(missing_ok=True)
                    module.command.unlink(missing_ok=True)
            report.modules = [m.name for m, reason in zip(staged, reasons, strict=True) if reason is None]
        report.modules.sort()
        if not report.modules:
            raise CorpusError(f"{compdb}: no module could be extracted; see {log_path}")
        if opt is not None:
            from optgym.corpus.info import opt_mismatches

            report.opt = opt
            staged = [Module(n, staging / f"{n}.bc", staging / f"{n}.cmd") for n in report.modules]
            report.opt_mismatches = opt_mismatches((m, opt) for m in staged)
        meta = {
            "provenance": {
                "tool": f"optgym corpus extract (mlgo-utils {mlgo_utils_version()} extract_ir)",
                "compile_database": str(compdb),
                "object_base_dir": str(base),
                "compiler": toolchain.banner,
                "created": now(),
                "entries": report.entries,
                "skipped": report.skip_counts(),
                **({"opt": opt} if opt else {}),
                **(provenance or {}),
            }
        }
        write_description(staging, report.modules, meta)
        Corpus(staging)  # validates what we are about to publish
        with open(log_path, "a") as log:
            log.write(f"\n{len(report.modules)} modules; {len(report.skipped)} entries left out:\n")
            log.writelines(f"  {what}: {reason}\n" for what, reason in report.skipped)
            if warning := report.opt_warning():
                log.write(f"warning: {warning}\n")
        swap_in(staging, dest)
    report.seconds = time.perf_counter() - start
    return report
