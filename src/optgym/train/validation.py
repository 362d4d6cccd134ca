"""Validation packages: the run's final policy is its best snapshot on code it never trained on.

A trainer's iterates keep moving along directions its batches barely constrain. An ES run's allowance drifts
where no batch pushes back, and PPO from a warm start can spend a lucky episode's credit on every call site
alike; either way a held-back package gets worse while the training batches still improve
(docs/experiments/2026-11-26-validation.md, docs/experiments/2026-11-26-ppo.md). So a part of the *training*
side is held back by package, never trained on, and every snapshot, the warm start included, is compiled on it.
The run's final policy is the snapshot with the best validation fitness, not the last iterate, as the .NET
CSE gym evaluates every snapshot. The held-out split stays untouched: choosing on it would make it a tuning set.

Bytes alone can choose a snapshot that wins its total by making many modules worse (a PPO run kept one with 41
of 226 validation modules more than 1 % larger: docs/experiments/2026-11-27-callee-linkage.md), which the
size target forbids and no later step could repair. With a cap (``--validation-max-worse``) the choice is the
target's own rule, as the pattern search keeps moves: the best fitness among snapshots with at most that share
of modules more than 1 % worse, or, when none is under it, the fewest such modules (then the best fitness).

ES (``optgym train es``) and the SB3 trainers (``optgym train ppo|a2c|dqn``) share this module.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optgym.corpus import Corpus
from optgym.corpus.split import compute_split, effective_by
from optgym.corpus.staging import read_description
from optgym.errors import CorpusError
from optgym.files import atomic_write_bytes
from optgym.policies.trained import snapshot_dirs
from optgym.train.evaluation import evaluate, summarize
from optgym.train.run import RunError, check_share, read_state

#: The figures of one snapshot on the validation packages, in the snapshot (and, for all of them, in ``RUN/final``).
VALIDATION_FILE = "validation.json"


def validation_modules(names: Sequence[str], groups: Sequence[str], percent: float, by: str = "package") -> list[str]:
    """The training side's modules held back for validation: the packages named in ``groups``
    (``--validation-groups``), or a draw of ``percent`` of them (``--validation-percent``), by package as the
    held-out split is (``by``: ``"module"`` for a corpus without packages). The draw's seed is fixed, not the
    run's, so every seed of a recipe validates on the same packages and trains on the same rest."""
    if not groups and not percent:
        return []
    if groups and percent:
        raise RunError("--validation-groups or --validation-percent, not both")
    try:
        _, held = compute_split(list(names), percent, 0, by, list(groups))
    except CorpusError as e:
        raise RunError(str(e).replace("--test-groups", "--validation-groups")) from None
    return held


def held_back(corpus: str | Path, training: Sequence[str], groups: Sequence[str], percent: float) -> list[str]:
    """:func:`validation_modules` of a run's training modules, by package where the corpus has packages. A
    validation that would leave nothing to train on is refused, like a bad companion, before the run exists."""
    by = effective_by(read_description(Path(corpus)), "package")
    held = validation_modules(training, groups, percent, by)
    if held and not set(training) - set(held):
        raise RunError("the validation packages are the whole training side: nothing is left to train on")
    return held


def bytes_saved(outcomes: list[dict[str, Any]]) -> float:
    """Bytes saved against clang per byte of clang's, over the modules compiled (losses count as they are): the
    build's total, which the size target counts."""
    heuristic = sum(o["heuristic_text_bytes"] for o in outcomes)
    return (heuristic - sum(o["text_bytes"] for o in outcomes)) / max(heuristic, 1)


@dataclass(frozen=True)
class Validation:
    """Where and how a run's snapshots are validated. ``fitness`` turns the compiled modules' outcomes
    (``heuristic_text_bytes``, ``text_bytes``) into the number the snapshots are ranked by, higher is better:
    ES passes its own ``"total"`` fitness, so the choice counts bytes as its training did."""

    corpus: Corpus
    modules: list[str]
    problem: str
    workers: int | None
    timeout: float
    fitness: Callable[[list[dict[str, Any]]], float]
    companions: list[tuple[str, str]] = field(default_factory=list)
    max_worse: float | None = None  # the largest share of modules > 1 % worse a chosen snapshot may have

    @classmethod
    def held_back_from(
        cls,
        side: Corpus,
        training: Sequence[str],
        groups: Sequence[str],
        percent: float,
        *,
        problem: str,
        workers: int | None,
        timeout: float,
        fitness: Callable[[list[dict[str, Any]]], float],
        companions: Sequence[tuple[str, str]] = (),
        max_worse: float | None = None,
    ) -> Validation | None:
        """The validation of a run that trains on ``training`` (modules of ``side``): the packages of
        :func:`held_back`, or ``None`` when the run holds nothing back."""
        check_share("--validation-max-worse", max_worse, "the validation modules")
        held = held_back(side.root, training, groups, percent)
        if max_worse is not None and not held:
            raise RunError("--validation-max-worse chooses among validated snapshots: it needs validation packages "
                           "(--validation-groups or --validation-percent)")  # fmt: skip
        return cls(side, held, problem, workers, timeout, fitness, list(companions), max_worse) if held else None

    def snapshot(self, snapshot: Path) -> dict[str, Any]:
        """A snapshot's policy on the validation modules, against clang: its fitness, total ratio and modules
        more than 1 % worse. Kept in the snapshot, so a resume never compiles it twice."""
        done = snapshot / VALIDATION_FILE
        if done.exists():
            return json.loads(done.read_text())
        rows = evaluate(str(snapshot / "policy"), self.corpus, problem=self.problem, modules=self.modules,
                        workers=self.workers, timeout=self.timeout, progress=False,
                        companions=self.companions)  # fmt: skip
        outcomes = [{"heuristic_text_bytes": h, "text_bytes": p} for h, p in (r.texts for r in rows if r.ok)]
        figures = summarize(rows)
        record = {
            "iteration": read_state(snapshot)["iteration"],
            "fitness": self.fitness(outcomes) if outcomes else None,
            "total_ratio": figures["total_ratio"],
            "worse": figures["regressed_over_1pct"],
            "worse_share": figures["regressed_over_1pct"] / max(figures["evaluated"], 1),
            "modules": figures["evaluated"],
            "failed": figures["failed"],
        }
        atomic_write_bytes(done, json.dumps(record, indent=2).encode())
        return record

    def choose(self, run: Path) -> tuple[Path, dict[str, Any], list[dict[str, Any]]]:
        """Every snapshot of ``run`` validated (one a kill left unvalidated, too); the best one, its record, and
        every record. A snapshot nothing compiled for ranks last; on a tie the earlier snapshot wins."""
        validated = {snap: self.snapshot(snap) for snap in snapshot_dirs(run)}
        if not validated:
            raise RunError(f"{run} has no snapshot to validate")
        chosen = max(validated, key=lambda snap: _rank(validated[snap], self.max_worse))
        return chosen, validated[chosen], list(validated.values())

    def why(self, chosen: dict[str, Any]) -> str:
        """Why :meth:`choose` took the snapshot of record ``chosen``, in words for the console."""
        if self.max_worse is None:
            return "the most bytes saved on validation"
        cap = f"{self.max_worse:.1%} of modules > 1 % worse"
        if chosen["fitness"] is not None and not _within(chosen, self.max_worse):
            return f"none on validation within {cap}: the fewest ({chosen['worse']} of {chosen['modules']})"
        return f"the most bytes saved on validation within {cap}"


def _within(record: dict[str, Any], max_worse: float | None) -> bool:
    """Whether a validated snapshot is under the cap (no cap: every one is)."""
    return max_worse is None or record["worse_share"] <= max_worse


def _rank(record: dict[str, Any], max_worse: float | None) -> tuple[float, ...]:
    """A validation record's place, higher is better: first whether it is within the cap; within it, fitness;
    past it, fewer modules worse and then fitness. A record nothing compiled for ranks last; on a tie the
    earlier iteration wins."""
    if record["fitness"] is None:
        return (-1.0,)
    if _within(record, max_worse):
        return (1.0, 0.0, record["fitness"], -record["iteration"])
    return (0.0, -record["worse_share"], record["fitness"], -record["iteration"])


def record_line(record: dict[str, Any]) -> str:
    """One console line of a snapshot's validation record."""
    if record["fitness"] is None:
        return f"validation at {record['iteration']}: no validation module compiled ({record['failed']} failed)"
    return (f"validation at {record['iteration']}: {record['total_ratio']:.4f} of clang's bytes, {record['worse']} of "
            f"{record['modules']} modules > 1 % worse, fitness {record['fitness']:+.4f}")  # fmt: skip


def to_tensorboard(writer: Any, record: dict[str, Any]) -> None:
    """A snapshot's validation record as ``validation/*`` scalars at its iteration (none when nothing compiled)."""
    if record["fitness"] is None:
        return
    for key in ("fitness", "total_ratio", "worse_share"):
        writer.add_scalar(f"validation/{key}", record[key], record["iteration"])
    writer.flush()


def write_selection(run: Path, selected: dict[str, Any], records: list[dict[str, Any]]) -> None:
    """``RUN/final/validation.json``: the chosen snapshot's record and every snapshot's."""
    payload = {"selected": selected, "snapshots": records}
    atomic_write_bytes(run / "final" / VALIDATION_FILE, json.dumps(payload, indent=2).encode())


__all__ = [
    "VALIDATION_FILE",
    "Validation",
    "bytes_saved",
    "held_back",
    "record_line",
    "to_tensorboard",
    "validation_modules",
    "write_selection",
]
