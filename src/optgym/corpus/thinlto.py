"""Corpora of distributed-ThinLTO backend compiles.

Why: a ThinLTO backend decides its inlining after importing other modules' functions and after the
link has internalized what nothing outside needs, so its room differs from a per-TU compile's
(docs/experiments/2026-11-24-thinlto.md). This is the corpus to measure and train on there — the kind
MLGO itself trains on (``extract_ir --thinlto_build=distributed``).

Each module of such a corpus is a ThinLTO pre-link bitcode object ``NAME.bc`` with its individual index
``NAME.bc.thinlto.bc`` beside it, written by one ``lld --thinlto-index-only`` link of its program; its
command is a backend ``-cc1`` with ``-fthinlto-index=NAME.bc.thinlto.bc`` (the compile ``clang -Oz -x ir
NAME.bc -fthinlto-index=NAME.bc.thinlto.bc -c`` runs).
Every optgym command (search, evaluate, train) then runs on it unchanged, and clang's own answers give
the backend's object byte for byte. The index names the other modules by absolute path, and a backend
finds its own summaries under the path it was linked as: the corpus does not move.

Three sources:

* :func:`corpus_from_build` — the real ``-flto=thin`` links of a source tree's build (``optgym corpus thinlto
  --build``, ``optgym corpus debian --thinlto``): each module is a backend exactly as its link ran it, with the
  link's own symbol resolution, libraries and options (:func:`corpus_from_capture`);
* :func:`corpus_from_objects` — the bitcode objects of a real ``-flto=thin`` build and its link;
* :func:`corpus_from_corpus` — a per-TU corpus (``optgym corpus debian``): every module is compiled to
  its pre-link object from the bitcode and ``-cc1`` command the corpus holds, and each program of a
  package is linked the way a static link would: its ``main`` module plus, transitively, the first
  module of the package that defines each symbol still undefined (archive semantics). A package whose
  modules define no ``main`` is linked as one shared library of all of them (everything exported).
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from optgym.corpus.corpus import SITE_SUFFIX, THINLTO_INDEX, Corpus, Module, sanitize_cc1_args, write_corpus
from optgym.corpus.extract import PROBE_DIRS
from optgym.errors import CorpusError
from optgym.parallel import run_tasks
from optgym.toolchain import find_toolchain

BITCODE_MAGIC = b"BC\xc0\xde"
#: Link arguments of a program linked from a corpus: the package's other libraries are not there, and
#: a module compiled twice (static and shared variants) defines its symbols twice.
CORPUS_LINK_ARGS = ("-Wl,--unresolved-symbols=ignore-all", "-Wl,--allow-multiple-definition")


def backend_cc1(clang: Path, bitcode: Path, opt: str = "-Oz") -> list[str]:
    """The ``-cc1`` arguments of the distributed backend compile of ``bitcode``, without input and output."""
    driver = [str(clang), "-###", opt, "-x", "ir", str(bitcode), f"{THINLTO_INDEX}{bitcode}.thinlto.bc", "-c",
              "-o", "/dev/null"]  # fmt: skip
    listing = subprocess.run(driver, capture_output=True, text=True, check=True, timeout=60).stderr
    cc1 = next(shlex.split(line) for line in listing.splitlines() if '"-cc1"' in line)
    return sanitize_cc1_args([arg for arg in cc1[1:] if arg != str(bitcode)])


def index_only_link(clang: Path, files: Sequence[Path], root: Path, link_args: Sequence[str]) -> list[str]:
    """Write ``F.thinlto.bc`` beside every bitcode file ``F`` by one index-only lld link; its command."""
    # -Wl,: the driver would compile a .bc input to an object first; the linker must see the bitcode itself
    link = [str(clang), "-flto=thin", "-fuse-ld=lld", f"-Wl,--thinlto-index-only={root / 'index-only.txt'}",
            *(f"-Wl,{f}" for f in files), *link_args, "-o", str(root / "index-only.out")]  # fmt: skip
    result = subprocess.run(link, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise CorpusError(f"the index-only link failed:\n{result.stderr[-3000:]}")
    return link


def check_bitcode(paths: Iterable[Path]) -> None:
    for path in paths:
        with open(path, "rb") as f:
            if f.read(4) != BITCODE_MAGIC:
                raise CorpusError(f"{path} is not bitcode: compile with -flto=thin")


def _new_root(root: Path) -> None:
    if root.exists():
        raise CorpusError(f"{root} exists; choose a new directory")
    root.mkdir(parents=True)


def corpus_from_objects(objects: Sequence[Path], root: Path, link_args: Sequence[str] = (), opt: str = "-Oz") -> int:
    """A corpus of the backends of one ``-flto=thin`` link of ``objects``; the number of modules.

    The objects are copied in, so pass the link's own libraries with ``link_args`` (its symbol
    resolution decides what every backend imports). On any failure nothing is left behind.
    """
    clang = find_toolchain().clang
    check_bitcode(objects)
    names: list[str] = []
    for obj in objects:
        stem = obj.name.removesuffix(".o").replace(".", "_")
        name, n = stem, 1
        while name in names:
            name, n = f"{stem}-{n}", n + 1
        names.append(name)
    _new_root(root)
    try:
        copies = [(root / f"{name}.bc").resolve() for name in names]
        for obj, copy in zip(objects, copies, strict=True):
            shutil.copyfile(obj, copy)
        link = index_only_link(clang, copies, root, link_args)
        modules = [(name, copy.read_bytes(), backend_cc1(clang, copy, opt))
                   for name, copy in zip(names, copies, strict=True)]  # fmt: skip
        write_corpus(root, modules, source="distributed ThinLTO backends", link=link)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return len(modules)


# --- from a per-TU corpus -------------------------------------------------------------------------


def prelink_args(module: Module) -> list[str]:
    """The module's ``-cc1`` command turned into its ThinLTO pre-link compile (bitcode with a summary)."""
    args = ["-emit-llvm-bc" if a == "-emit-obj" else a for a in module.cc1_args]
    if "-emit-llvm-bc" not in args:
        raise CorpusError(f"module {module.name}: its command does not compile to an object (-emit-obj)")
    return [*args, "-flto=thin", "-flto-unit"]


@dataclass(frozen=True)
class Symbols:
    """The global symbols a pre-link object defines and those it needs."""

    defined: frozenset[str]
    undefined: frozenset[str]


def read_symbols(nm: Path, path: Path) -> Symbols:
    """``llvm-nm -P`` of one bitcode object: its global definitions and undefined references."""
    out = subprocess.run([str(nm), "-P", str(path)], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise CorpusError(f"llvm-nm cannot read {path}: {out.stderr.strip()}")
    defined, undefined = set(), set()
    for line in out.stdout.splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        name, kind = fields[0], fields[1]
        if kind == "U":
            undefined.add(name)
        elif kind.isupper():  # lowercase: local, or a weak reference (w, v), which loads no archive member
            defined.add(name)
    return Symbols(frozenset(defined), frozenset(undefined))


@dataclass(frozen=True)
class Program:
    """One link of a package: its name and its modules (the ``main`` module first, if any)."""

    name: str
    modules: tuple[str, ...]
    shared: bool = False


def static_link(main: str, symbols: dict[str, Symbols], order: Sequence[str]) -> tuple[str, ...]:
    """The modules a static link of ``main`` against all of ``order`` as one archive would load."""
    first_definer: dict[str, str] = {}
    for name in order:
        for symbol in symbols[name].defined:
            first_definer.setdefault(symbol, name)
    loaded, defined = [main], set(symbols[main].defined)
    pending = sorted(symbols[main].undefined, reverse=True)  # sorted: the same order in every run
    while pending:
        symbol = pending.pop()
        if symbol in defined or (member := first_definer.get(symbol)) is None or member in loaded:
            continue
        loaded.append(member)
        defined |= symbols[member].defined
        pending.extend(sorted(symbols[member].undefined, reverse=True))
    return tuple(loaded)


def package_programs(package: str, symbols: dict[str, Symbols], max_programs: int) -> list[Program]:
    """Up to ``max_programs`` programs of one package, chosen to cover the most of its modules.

    Programs are the modules defining ``main``; each takes the others of the package as its archive.
    Greedy cover: the next program is the one that adds the most modules not yet in a chosen one, so a
    test runner and the tool of a library do not both bring the same library twice when a third program
    brings something new. Without a ``main``: the package as one shared library.
    """
    order = sorted(symbols)
    mains = [name for name in order if "main" in symbols[name].defined]
    if not mains:
        return [Program(f"{package}/lib.so", tuple(order), shared=True)]
    library = [name for name in order if name not in mains]
    links = {main: static_link(main, symbols, library) for main in mains}
    chosen: list[str] = []
    covered: set[str] = set()
    while len(chosen) < min(max_programs, len(mains)):
        main = max((m for m in mains if m not in chosen), key=lambda m: (len(set(links[m]) - covered), m))
        if chosen and not set(links[main]) - covered:
            break
        chosen.append(main)
        covered |= set(links[main])
    # a program is named by its main module's file, or by its whole path where two files share a name
    stems = [main.rsplit("/", 1)[-1] for main in chosen]
    paths = [main.removeprefix(f"{package}/").replace("/", "_") for main in chosen]
    names = [stem if stems.count(stem) == 1 else path for stem, path in zip(stems, paths, strict=True)]
    return [
        Program(f"{package}/{name.removesuffix('.o')}", links[main]) for name, main in zip(names, chosen, strict=True)
    ]


def _prelink(task: tuple[Module, Path, Path, Path]) -> Symbols | str:
    """Compile one module to its pre-link object: its symbols, or why it failed."""
    module, clang, nm, out = task
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [str(clang), *prelink_args(module), "-x", "ir", str(module.bitcode), "-o", str(out)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        out.unlink(missing_ok=True)
        return f"{module.name}: {result.stderr.strip()[-500:]}"
    return read_symbols(nm, out)


def corpus_from_corpus(
    source: Corpus,
    root: Path,
    *,
    language: str | None = "C",
    packages: Sequence[str] | None = None,
    max_programs: int = 3,
    workers: int | None = None,
    progress: bool = True,
) -> int:
    """A ThinLTO backend corpus of the programs of every package of ``source``; the number of modules.

    Module names are ``<program>/<module>`` — ``<package>/<main module>/<module name minus package>`` —
    so a module linked into two programs is two modules (its backends import different things). Only
    modules of ``language`` (a ``Module.family``, "C" or "C++"; ``None``: all) are taken; the split of
    ``source`` is the caller's choice (``Corpus(dir, split="train")``). A module that fails to pre-link
    is left out and reported. On any other failure nothing is left behind.
    """
    toolchain = find_toolchain()
    clang, nm = toolchain.clang, toolchain.tool("llvm-nm")
    modules = [m for m in source if (language is None or m.family == language)
               and (packages is None or m.name.split("/", 1)[0] in packages)]  # fmt: skip
    if not modules:
        raise CorpusError(f"{source.root} has no {language or ''} modules".replace("  ", " "))
    root = root.resolve()
    _new_root(root)
    try:
        prelinked = root / ".prelink"
        tasks = [(m, clang, nm, prelinked / f"{m.name}.o") for m in modules]
        failures: list[str] = []
        by_package: dict[str, dict[str, Symbols]] = {}
        for i, outcome in run_tasks(_prelink, tasks, workers=workers, description="pre-link", progress=progress):
            if isinstance(outcome, str):
                failures.append(outcome)
            else:
                by_package.setdefault(modules[i].name.split("/", 1)[0], {})[modules[i].name] = outcome
        by_name = {m.name: m for m in modules}
        entries: list[tuple[str, bytes, list[str]]] = []
        links: dict[str, list[str]] = {}
        for package, symbols in sorted(by_package.items()):
            for program in package_programs(package, symbols, max_programs):
                files = []
                for name in program.modules:
                    linked = root / program.name / f"{name.removeprefix(package + '/')}.bc"
                    linked.parent.mkdir(parents=True, exist_ok=True)
                    linked.hardlink_to(prelinked / f"{name}.o")
                    files.append(linked)
                shared = ("-shared",) if program.shared else ()
                links[program.name] = index_only_link(clang, files, root / program.name, (*shared, *CORPUS_LINK_ARGS))
                for name, path in zip(program.modules, files, strict=True):
                    # the module's own codegen flags, as its package compiled it, plus the index
                    command = [*by_name[name].cc1_args, f"{THINLTO_INDEX}{path}.thinlto.bc"]
                    entries.append((str(path.relative_to(root)).removesuffix(".bc"), path.read_bytes(), command))
        shutil.rmtree(prelinked)
        write_corpus(root, entries, source=f"distributed ThinLTO backends of {source.root}", links=links,
                     prelink_failures=sorted(failures))  # fmt: skip
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return len(entries)


# --- from real links ------------------------------------------------------------------------------------------

#: Where a capture build records its links' backends (inside the corpus: the modules run there).
CAPTURE_DIR = "captured"


def _source_language(module: str) -> str:
    """The language a backend's module was compiled from, read off its object's name as the build made it:
    ``a.cpp.o`` (CMake), ``lib.a(b.cc.o at 156).2.54B4.o`` (a member lld extracted), ``x.o`` (Make: C)."""
    from optgym.toolchain.language import CXX_SUFFIXES

    name = module.split("(", 1)[1].split(" at ", 1)[0] if "(" in module else module
    stem = name.removesuffix(".o").removesuffix(".obj")
    return "C++" if stem.endswith(CXX_SUFFIXES) else "C"


#: Links a build system makes to probe the compiler, not the program: CMake's (``cmTC_…``, the compiler-id
#: ``a.out``, under ``CMakeFiles/``), Meson's (under ``meson-private/``), autoconf's (``conftest``).
PROBE_LINKS = ("cmTC_", "a.out", "conftest")


def _configure_check(record: dict) -> bool:
    link = Path(record["link"] or "").name
    return link.startswith(PROBE_LINKS) or any(d in record["cwd"] + "/" for d in PROBE_DIRS)


def _captured_cc1(clang: Path, record: dict, workdir: Path) -> list[str]:
    """The ``-cc1`` arguments of one captured backend (the driver's ``-###`` in its working directory), without
    its module and output."""
    module, *rest = record["job"]
    driver = [str(clang), "-###", *record["common"][1:], module, *rest]
    listing = subprocess.run(driver, capture_output=True, text=True, check=True, timeout=60, cwd=workdir).stderr
    cc1 = next(shlex.split(line) for line in listing.splitlines() if '"-cc1"' in line)[1:]
    last = len(cc1) - 1 - cc1[::-1].index(module)  # the input; -main-file-name names it too, and stays
    return sanitize_cc1_args(cc1[:last] + cc1[last + 1 :])


def corpus_from_capture(capture: Path, root: Path, *, prefix: str = "") -> int:
    """Make ``root`` a corpus of the backends a capture build recorded in ``capture``; the number of modules.

    ``capture`` lives inside ``root`` (the modules run in its working directories: see
    :attr:`optgym.corpus.corpus.Module.site`). A module is named ``<prefix><link output>/<module path>``; a
    backend whose files are gone (a configure check's link, run in a directory the build system removed) is left
    out, and so are the links a build system makes to probe the compiler. A link made twice (a build re-run)
    counts once: the last one."""
    clang = find_toolchain().clang
    lines = (capture / "backends.jsonl").read_text().splitlines() if (capture / "backends.jsonl").exists() else []
    latest: dict[tuple[str, str], dict] = {}
    for line in lines:
        record = json.loads(line)
        if not _configure_check(record):
            latest[(record["link"] or "link", record["job"][0])] = record
    entries: list[tuple[str, bytes, list[str]]] = []
    sites: dict[str, str] = {}
    for (link, module), record in sorted(latest.items()):
        workdir = (capture / record["workdir"]).resolve()
        bitcode = workdir / module
        if not bitcode.exists():
            continue
        try:
            command = _captured_cc1(clang, record, workdir)
        except (subprocess.CalledProcessError, StopIteration):
            continue
        clean = module.replace("(", "_").replace(")", "_").replace(" ", "_").lstrip("./")
        name = f"{prefix}{link.strip('./').replace('/', '_')}/{clean.removesuffix('.o')}"
        entries.append((name, bitcode.read_bytes(), command))
        sites[name] = f"{workdir}\n{module}\n{_source_language(module)}\n"
    if not entries:
        raise CorpusError(f"{capture} recorded no ThinLTO backend whose files are still there")
    for name, text in sites.items():  # before the description: a corpus with a description is complete
        path = root / f"{name}{SITE_SUFFIX}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    write_corpus(root, entries, source=f"real ThinLTO links captured in {capture}")
    return len(entries)


def corpus_from_build(
    src: Path,
    root: Path,
    *,
    opt: str = "-Oz",
    workers: int | None = None,
    build_system: str | None = None,
    configure_args: Sequence[str] = (),
    prefix: str = "",
    logs: Path | None = None,
) -> int:
    """Build ``src`` with ``-flto=thin`` linked by lld, every backend of every link recorded, and make ``root`` a
    corpus of those backends (:func:`corpus_from_capture`); the number of modules."""
    from optgym.corpus.build import run_build

    root = Path(root).absolute()
    root.mkdir(parents=True, exist_ok=True)
    done = run_build(find_toolchain(), src, root, opt=opt, workers=workers, build_system=build_system,
                     configure_args=configure_args, logs=logs, thinlto_capture=root / CAPTURE_DIR)  # fmt: skip
    try:
        return corpus_from_capture(root / CAPTURE_DIR, root, prefix=prefix)
    except CorpusError as e:
        log = (Path(logs) if logs else root / "logs") / "build.log"
        raise CorpusError(f"{e} (build exit {done.returncode}; log {log})") from None
