"""``optgym corpus merge``: several corpora → one, with module filters.

Files are hard-linked, not copied (a merged training corpus costs no disk), and the result is staged
and renamed into place like every corpus write. A name taken by two inputs is an error unless
``prefix`` puts each input's directory name in front of its modules. A stored split is not carried
over — the inputs' splits need not agree — so the merged corpus is split afresh.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from optgym.corpus.corpus import Corpus
from optgym.corpus.extract import matches, over_decision_limit
from optgym.corpus.staging import link_or_copy, now, staging_dir, swap_in, write_description
from optgym.errors import CorpusError


def merge_corpora(
    inputs: Sequence[Path],
    dest: Path,
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    prefix: bool = False,
    max_decisions: int | None = None,
    workers: int | None = None,
) -> Corpus:
    """Merge ``inputs`` into ``dest``; the merged corpus.

    ``max_decisions`` leaves out modules with more heuristic decisions than that (counted in parallel
    with ``workers``, cached); they are listed under ``optgym.max_decisions`` in the description.
    """
    corpora = [Corpus(p) for p in inputs]
    if prefix:
        stems = [c.root.absolute().name for c in corpora]
        if len(set(stems)) != len(stems):
            raise CorpusError(f"--prefix needs inputs with distinct directory names, not {stems}")
    owner: dict[str, Path] = {}
    plan: list[tuple[str, Any]] = []
    packages: dict[str, Any] = {}
    for corpus in corpora:
        pre = f"{corpus.root.absolute().name}/" if prefix else ""
        for name, info in corpus.description.get("optgym", {}).get("packages", {}).items():
            key = f"{pre}{name}"
            if key in packages and packages[key] != info:
                raise CorpusError(f"package {key!r} is in two inputs with different builds: {packages[key]} / {info}")
            packages[key] = info
        for module in corpus:
            name = f"{pre}{module.name}"
            if not matches(name, include, exclude):
                continue
            if name in owner:
                raise CorpusError(
                    f"module {name!r} is in both {owner[name]} and {corpus.root}; merge with --prefix to keep both"
                )
            owner[name] = corpus.root
            plan.append((name, module))
    left_out: dict[str, str] = {}
    if max_decisions is not None and plan:
        reasons = over_decision_limit([m for _, m in plan], max_decisions, workers=workers)
        left_out = {name: reason for (name, _), reason in zip(plan, reasons, strict=True) if reason is not None}
        plan = [(name, m) for name, m in plan if name not in left_out]
    if not plan:
        raise CorpusError("the merged corpus would have no module (check --include/--exclude/--max-decisions)")
    with staging_dir(dest) as staging:
        for name, module in plan:
            for suffix, path in module.files():
                link_or_copy(path, staging / f"{name}{suffix}")
        meta: dict[str, Any] = {
            "provenance": {
                "tool": "optgym corpus merge",
                "created": now(),
                "inputs": [
                    {"path": str(c.root.absolute()), "provenance": c.description.get("optgym", {}).get("provenance")}
                    for c in corpora
                ],
            }
        }
        if packages:
            meta["packages"] = packages
        if max_decisions is not None:
            meta["max_decisions"] = {"limit": max_decisions, "left_out": left_out}
        write_description(staging, [n for n, _ in plan], meta)
        swap_in(staging, dest)
    return Corpus(dest)
