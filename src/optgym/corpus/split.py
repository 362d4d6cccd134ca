"""``optgym corpus split``: a deterministic train/test split stored in the corpus description.

Nothing is copied: the test modules are listed under ``optgym.split`` and :class:`Corpus` with
``split="train"|"test"`` reads them. The split is by package by default — a module-level split lets
one package's headers and templates, inlined into many of its modules, sit on both sides and flatter
the test score. A group goes to test when its rank by ``sha256(seed, group)`` is among the first
``test_percent`` % of groups, so the same seed always gives the same split, and a group's side
depends on its own name, not on the order modules happen to be listed in.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from optgym.corpus.corpus import DESCRIPTION, FORMAT_VERSION, Corpus, Module
from optgym.corpus.staging import read_description
from optgym.errors import CorpusError
from optgym.files import atomic_write_bytes

BY = ("package", "module")


#: How an iteration draws its modules when it takes fewer than all (``--batch``).
BATCHING = ("uniform", "size")
#: ``--batch size``: the strata of module size a batch draws from evenly.
SIZE_STRATA = 4


def draw_modules(modules: list[str], count: int | None, rng: np.random.Generator, batching: str = "uniform",
               sizes: dict[str, int] | None = None) -> list[str]:  # fmt: skip
    """The modules of one ES iteration (or of a search's ``--sample``): all of them, or ``count`` drawn without
    replacement — uniformly, or (``"size"``) as evenly as possible from :data:`SIZE_STRATA` strata of
    ``sizes`` (the larger strata take the remainder). Why strata: with ``--fitness total`` a batch's bytes are
    mostly its large modules, yet a corpus holds mostly small ones, so a uniform draw of 32 often holds no
    large module at all, and the step follows what small modules want (the AArch64 allowance runs never opened
    the allowance of large modules, which the hand rule gets most of its bytes from)."""
    if not count or count >= len(modules):
        return modules
    if batching == "uniform":
        return sorted(rng.choice(modules, count, replace=False).tolist())
    assert sizes is not None
    ordered = sorted(modules, key=lambda m: (sizes[m], m))
    strata = [list(part) for part in np.array_split(np.array(ordered, dtype=object), SIZE_STRATA)]
    each, remainder = divmod(count, SIZE_STRATA)
    takes = [min(len(stratum), each + (k >= SIZE_STRATA - remainder)) for k, stratum in enumerate(strata)]
    for k in reversed(range(SIZE_STRATA)):  # a stratum too small for its share: the larger ones make it up
        takes[k] += min(count - sum(takes), len(strata[k]) - takes[k])
    chosen: list[str] = []
    for take, stratum in zip(takes, strata, strict=True):
        chosen += rng.choice(stratum, take, replace=False).tolist()
    return sorted(chosen)


def draw_by_size(modules: list[Module], count: int | None, rng: np.random.Generator) -> list[Module]:
    """``count`` of ``modules`` drawn by :func:`draw_modules` evenly over strata of bitcode size, in their order: the
    fixed training sample of a search (``optgym train search --sample``) or a pattern search."""
    sizes = {m.name: m.bitcode.stat().st_size for m in modules}
    drawn = set(draw_modules(sorted(sizes), count, rng, "size", sizes))
    return [m for m in modules if m.name in drawn]


def group_of(name: str, by: str) -> str:
    """The unit a module is split with: its package (first path component) or itself."""
    return name.split("/", 1)[0] if by == "package" else name


def compute_split(
    names: Sequence[str], test_percent: float, seed: int, by: str, test_groups: Sequence[str] = ()
) -> tuple[list[str], list[str]]:
    """(test groups, test modules) — deterministic in (names, test_percent, seed, by). Explicit
    ``test_groups`` (packages named before any result is seen: a held-out set chosen by hand) replace the
    seeded draw; each must exist."""
    if by not in BY:
        raise CorpusError(f"unknown --by {by!r}; one of {', '.join(BY)}")
    if test_groups:
        present = {group_of(n, by) for n in names}
        missing = sorted(set(test_groups) - present)
        if missing:
            raise CorpusError(f"--test-groups names {missing}, which the corpus does not have (by {by})")
        chosen = set(test_groups)
        return sorted(chosen), [n for n in names if group_of(n, by) in chosen]
    if not 0 <= test_percent <= 100:
        raise CorpusError(f"--test-percent must be within 0..100, not {test_percent}")
    groups = sorted({group_of(n, by) for n in names})
    ranked = sorted(groups, key=lambda g: hashlib.sha256(f"{seed}\0{g}".encode()).hexdigest())
    k = round(len(groups) * test_percent / 100)
    if test_percent > 0 and k == 0 and len(groups) > 1:
        k = 1  # a tiny corpus still gets a test side
    if k == len(groups) and test_percent < 100 and len(groups) > 1:
        k -= 1  # …and a train side
    test_groups = sorted(ranked[:k])
    chosen = set(test_groups)
    return test_groups, [n for n in names if group_of(n, by) in chosen]


def effective_by(description: dict[str, Any], by: str) -> str:
    """``package`` needs packages: a corpus without any (one source tree) is split by module."""
    if by == "package" and not description.get("optgym", {}).get("packages"):
        return "module"
    return by


def apply_split(
    root: Path, *, test_percent: float, seed: int, by: str = "package", test_groups: Sequence[str] = ()
) -> dict[str, Any]:
    """Compute the split of the corpus at ``root`` and store it in its description; the stored record."""
    Corpus(root)  # a readable corpus, or a clear error
    description = read_description(root)
    names = description["modules"]
    by = effective_by(description, by)
    explicit = list(test_groups)
    test_groups, test = compute_split(names, test_percent, seed, by, explicit)
    record = {
        "test_percent": test_percent,
        "seed": seed,
        "by": by,
        **({"explicit_test_groups": explicit} if explicit else {}),
        "test_groups": test_groups if by == "package" else [],
        "test": test,
        "train_modules": len(names) - len(test),
        "test_modules": len(test),
    }
    # only the optgym key changes: whatever else the description holds (mlgo-utils' keys) stays
    description.setdefault("optgym", {"format_version": FORMAT_VERSION})["split"] = record
    atomic_write_bytes(Path(root) / DESCRIPTION, json.dumps(description, indent=2).encode())
    return record
