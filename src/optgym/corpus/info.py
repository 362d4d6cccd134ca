"""``optgym corpus info``: what a corpus holds — modules, languages, opt levels, bytes, heuristic sizes.

The language of a module comes from its ``-cc1`` command: ``-x`` when the build named it, else the
suffix of ``-main-file-name`` (clang always records the source's name there; the embedded command
carries no ``-x``). Its target is the command's ``-triple``: a policy decides for one target, so a corpus that
mixes targets says so. Heuristic sizes are the plain compile of every module, fanned out with
:func:`optgym.parallel.run_tasks` and cached on disk by :func:`optgym.rollout.episode.baseline` (the workers are
the rollout layer's: :func:`register_heuristic_worker`), so a second ``info`` is instant.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optgym.corpus.corpus import Corpus, Module
from optgym.corpus.target import module_triple
from optgym.errors import CorpusError

if TYPE_CHECKING:  # the corpus layer imports parallel/ only where it fans out
    from optgym.corpus.portable import PortableModule

OPT_LEVELS = ("-O0", "-O1", "-O2", "-O3", "-Os", "-Oz", "-Ofast")


def raw_cc1_args(module: Module) -> list[str]:
    """The ``.cmd`` as clang embedded it (the sanitized form drops ``-x``)."""
    return [a.decode(errors="replace") for a in module.command.read_bytes().split(b"\0") if a]


def opt_level(args: list[str]) -> str:
    """The ``-O`` level of a ``-cc1`` command line (the last one wins, as in clang)."""
    level = "-O0"
    for arg in args:
        if arg in OPT_LEVELS or (arg.startswith("-O") and arg[2:].isdigit()):
            level = arg
    return level


def requested_opt(meta: dict[str, Any], package: str = "") -> str | None:
    """The opt level a corpus (or one of its packages) was built for, from its description: a Debian package's
    own, else the build's (``corpus build``), else csmith's; ``None`` when the corpus does not say
    (``corpus extract`` of someone else's build)."""
    level = (meta.get("packages") or {}).get(package, {}).get("opt") or (meta.get("provenance") or {}).get("opt")
    return level or (meta.get("csmith") or {}).get("config", {}).get("opt")


def opt_mismatches(modules: Iterable[tuple[Module, str | None]], examples: int = 20) -> dict[str, Any]:
    """The ``(module, requested level)`` pairs whose module was compiled at another ``-O`` level: how many, at
    which levels, and the first ``examples`` as ``{module: level}``.

    A build whose own flags came after optgym's compiled at their level, not the requested one: training
    on -O2 modules for an -Oz problem would learn another pipeline's decisions, so the commands that make
    or describe a corpus say so (:func:`describe_opt_mismatches`)."""
    found: dict[str, str] = {}
    for module, requested in modules:
        level = opt_level(raw_cc1_args(module))
        if requested is not None and level != requested:
            found[module.name] = level
    levels = Counter(found.values()).most_common()
    return {"modules": len(found), "levels": dict(levels), "examples": dict(list(found.items())[:examples])}


def describe_opt_mismatches(mismatches: dict[str, Any], total: int, requested: Sequence[str] = ()) -> str | None:
    """One warning line for :func:`opt_mismatches`' result (``None`` when there are none)."""
    if not mismatches["modules"]:
        return None
    levels = ", ".join(f"{level}: {n}" for level, n in mismatches["levels"].items())
    wanted = f"the requested {'/'.join(requested)}" if requested else "the requested one"
    shown = list(mismatches["examples"])[:3]
    examples = ", ".join(shown) + (", …" if mismatches["modules"] > len(shown) else "")
    return (f"{mismatches['modules']} of {total} modules were compiled at another -O level than {wanted} "
            f"({levels}): the build's own flags won ({examples})")  # fmt: skip


def package_of(name: str, has_packages: bool) -> str:
    return name.split("/", 1)[0] if has_packages else ""


@dataclass(frozen=True)
class SizeTask:
    """One module's heuristic compile (picklable: runs in a worker)."""

    source: PortableModule  # the module, or under Ray its content: see corpus.portable
    problem: str
    timeout: float


def size_tasks(modules: Iterable[Module], problem: str, timeout: float, workers: int | None) -> list[SizeTask]:
    """One :class:`SizeTask` per module, carrying it as :func:`~optgym.corpus.portable.portable_modules` says."""
    from optgym.corpus.portable import portable_modules

    return [SizeTask(source, problem, timeout) for source in portable_modules(list(modules), workers)]


#: A task function over :class:`SizeTask` (picklable, top-level): the module compiled by clang's own heuristic, as
#: a row (``module``, ``status``, ``detail`` and figures).
HeuristicWorker = Callable[[SizeTask], dict[str, Any]]
_HEURISTIC_WORKERS: dict[str, HeuristicWorker] = {}


def register_heuristic_worker(kind: str, worker: HeuristicWorker) -> None:
    """Register the worker behind ``kind`` (``"sizes"``: the plain compile; ``"decisions"``: the interactive
    one, counting decisions). Compiling a module for a decision problem is the rollout layer's, above this one:
    :mod:`optgym.rollout.heuristic` registers both when ``optgym.rollout`` is imported."""
    _HEURISTIC_WORKERS[kind] = worker


def heuristic_worker(kind: str) -> HeuristicWorker:
    """The worker registered for ``kind`` (see :func:`register_heuristic_worker`)."""
    try:
        return _HEURISTIC_WORKERS[kind]
    except KeyError:
        raise CorpusError(f"no heuristic {kind} worker is registered: import optgym.rollout first") from None


def corpus_info(
    root: Path,
    *,
    split: str | None = None,
    sizes: bool = True,
    decisions: bool = False,
    workers: int | None = None,
    problem: str = "inline-size",
    timeout: float = 300.0,
    progress: bool = True,
) -> dict[str, Any]:
    """The summary ``optgym corpus info`` prints (and ``--json`` emits)."""
    from optgym.parallel import run_tasks

    corpus = Corpus(root, split=split)
    meta = corpus.description.get("optgym", {})
    packages_meta = meta.get("packages") or {}
    has_packages = bool(packages_meta)
    languages: Counter[str] = Counter()
    levels: Counter[str] = Counter()
    targets: Counter[str] = Counter()
    module_targets: dict[str, str] = {}
    per_package: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"modules": 0, "languages": Counter(), "targets": Counter(), "bitcode_bytes": 0}
    )
    total_bc = 0
    wanted: dict[str, str | None] = {}  # module → the opt level its build was asked for
    for m in corpus:
        wanted[m.name] = requested_opt(meta, package_of(m.name, has_packages))
        args = raw_cc1_args(m)
        lang, size = m.language, m.bitcode.stat().st_size
        languages[lang] += 1
        levels[opt_level(args)] += 1
        total_bc += size
        triple = module_targets[m.name] = module_triple(args) or "unknown"
        targets[triple] += 1
        pkg = per_package[package_of(m.name, has_packages)]
        pkg["modules"] += 1
        pkg["languages"][lang] += 1
        pkg["targets"][triple] += 1
        pkg["bitcode_bytes"] += size
    mismatches = opt_mismatches((m, wanted[m.name]) for m in corpus)
    heuristic: dict[str, Any] | None = None
    tasks = size_tasks(corpus, problem, timeout, workers) if (sizes or decisions) and len(corpus) else []
    if sizes and tasks:
        failed: list[dict[str, Any]] = []
        totals: Counter[str] = Counter()
        for _, row in run_tasks(heuristic_worker("sizes"), tasks, workers=workers, description="heuristic sizes",
                                progress=progress):  # fmt: skip
            if row["status"] != "ok":
                failed.append(row)
                continue
            pkg = per_package[package_of(row["module"], has_packages)]
            for key in ("text_bytes", "dottext_bytes"):
                totals[key] += row[key]
                pkg[key] = pkg.get(key, 0) + row[key]
        heuristic = {"problem": problem, **totals, "failed": len(failed), "failures": failed[:20]}
    counted: dict[str, Any] | None = None
    if decisions and tasks:
        totals = Counter()
        failed = []
        for _, row in run_tasks(heuristic_worker("decisions"), tasks, workers=workers, description="decisions",
                                progress=progress):  # fmt: skip
            if row["status"] != "ok":
                failed.append(row)
                continue
            totals["decisions"] += row["decisions"]
            totals["heuristic_yes"] += row["heuristic_yes"]
            pkg = per_package[package_of(row["module"], has_packages)]
            pkg["decisions"] = pkg.get("decisions", 0) + row["decisions"]
        counted = {"problem": problem, **totals, "failed": len(failed), "failures": failed[:20]}
    return {
        "root": str(corpus.root),
        "split": split,
        "modules": len(corpus),
        "languages": dict(languages.most_common()),
        "opt_levels": dict(levels.most_common()),
        "targets": dict(targets.most_common()),
        "module_targets": module_targets,
        "requested_opt": sorted({level for level in wanted.values() if level}),
        "opt_mismatches": mismatches,
        "bitcode_bytes": total_bc,
        "heuristic": heuristic,
        "decisions": counted,
        "packages": {
            name: {
                **info,
                "languages": dict(info["languages"]),
                "targets": dict(info["targets"]),
                **packages_meta.get(name, {}),
                "modules": info["modules"],
            }
            for name, info in sorted(per_package.items())
        }
        if has_packages
        else {},
        "stored_split": {k: v for k, v in meta["split"].items() if k != "test"} if "split" in meta else None,
        "provenance": meta.get("provenance"),
    }
