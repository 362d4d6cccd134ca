"""Where trained policies live on disk, and the resolver that lets ``--policy PATH`` name them.

A *policy directory* (``policy.json`` + ``weights.npz`` + ``vocab.json``, see
:mod:`optgym.policies.mlp`; or a candidate scorer's ``policy.json`` alone, see
:mod:`optgym.policies.scorer`) is what every trainer exports. A *run directory* (``optgym train …
-o RUN``) holds them at fixed places, so ``--policy RUN`` means "the run's best answer so far":

    RUN/final/policy/                 written when training ends
    RUN/snapshots/<iteration>/policy/ one per snapshot (iteration zero-padded to 8 digits)
    RUN/policy/                       behavioral cloning's output

Snapshot directories appear by an atomic rename, so the newest one present is always complete.
"""

from __future__ import annotations

import functools
from pathlib import Path

from optgym.policies import PolicyFactory, file_identity
from optgym.policies.mlp import MLPPolicy, is_policy_dir
from optgym.policies.scorer import CandidateScorer, is_scorer_dir

SNAPSHOTS = "snapshots"


def snapshot_dirs(run: Path) -> list[Path]:
    """Complete snapshots of a run, oldest first (temporary ``.``-prefixed directories excluded)."""
    root = Path(run) / SNAPSHOTS
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.isdigit())


def latest_snapshot(run: Path) -> Path | None:
    snaps = snapshot_dirs(run)
    return snaps[-1] if snaps else None


TrainedPolicy = MLPPolicy | CandidateScorer


def _holds_policy(path: Path) -> bool:
    return is_policy_dir(path) or is_scorer_dir(path)


def policy_dir_of(path: Path) -> Path | None:
    """The policy directory ``path`` stands for: itself, a run's final policy, or its latest snapshot's."""
    path = Path(path)
    if _holds_policy(path):
        return path
    for candidate in (path / "final" / "policy", path / "policy"):
        if _holds_policy(candidate):
            return candidate
    for snap in reversed(snapshot_dirs(path)):
        if _holds_policy(snap / "policy"):
            return snap / "policy"
    return None


def load_policy_dir(path: Path | str) -> TrainedPolicy:
    """The policy in directory ``path``, of whichever form it was saved in."""
    return CandidateScorer.load(path) if is_scorer_dir(Path(path)) else MLPPolicy.load(path)


@functools.lru_cache(maxsize=8)
def _load_cached(path: str, stamp: int) -> TrainedPolicy:
    return load_policy_dir(path)


def load_policy(path: str, seed: int | None = None) -> TrainedPolicy:
    """Builder run inside workers: the greedy policy (``.stochastic(seed)`` samples).

    Loading costs ~10 ms (vocab, normalizer tables), as much as compiling a small module, so a
    worker keeps the few policies it was last given (keyed by path and modification time; the
    greedy policy holds no state, and ``stochastic`` copies it)."""
    policy = _load_cached(str(path), (Path(path) / "policy.json").stat().st_mtime_ns)
    return policy if seed is None else policy.stochastic(seed)


def resolve_trained(path: Path) -> PolicyFactory | None:
    """The resolver registered with :func:`optgym.policies.register_resolver`."""
    found = policy_dir_of(path)
    if found is None:
        return None
    form = "scorer" if is_scorer_dir(found) else "mlp"
    return PolicyFactory(str(path), f"{form}:{file_identity(found)}", load_policy, (str(found),))


__all__ = ["latest_snapshot", "load_policy", "load_policy_dir", "policy_dir_of", "resolve_trained", "snapshot_dirs"]
