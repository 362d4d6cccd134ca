"""Policies that need no model: the compiler's own heuristic, never, always, and uniform random.

On a yes/no problem (inlining) ``never`` answers 0 and ``always`` 1. On a problem whose valid answers a mask
gives (eviction: which registers' occupants may be evicted, column 32 = evict nothing) they pick among the
valid ones only — ``never`` the last (for eviction: evict nothing, where allowed), ``always`` the first (evict
from the first allowed register), ``random`` uniformly — since a masked answer would crash the compiler.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from optgym.rollout.rollout import DecisionPoint


def heuristic(point: DecisionPoint) -> int:
    """The compiler's own answer (for inline-size this reproduces plain -Oz byte for byte)."""
    if point.heuristic is None:
        raise ValueError("this problem's stream carries no heuristic answer")
    return point.heuristic


def never(point: DecisionPoint) -> int:
    valid = point.valid_actions()
    return 0 if valid is None or not len(valid) else int(valid[-1])


def always(point: DecisionPoint) -> int:
    valid = point.valid_actions()
    return 1 if valid is None or not len(valid) else int(valid[0])


class RandomPolicy:
    """Uniform over {0, 1} (with probability ``p`` of 1), or over the valid actions where the problem masks
    them; reproducible from ``seed``."""

    def __init__(self, seed: int | None = None, p: float = 0.5) -> None:
        self.rng, self.p = np.random.default_rng(seed), p

    def __call__(self, point: DecisionPoint) -> int:
        valid = point.valid_actions()
        if valid is not None and len(valid):
            return int(valid[self.rng.integers(len(valid))])
        return int(self.rng.random() < self.p)


#: Each a policy, but ``random``: the class whose instances are (optgym.policies builds them with a seed).
SIMPLE_POLICIES: dict[str, Callable[..., Any]] = {
    "heuristic": heuristic,
    "never": never,
    "always": always,
    "random": RandomPolicy,
}
