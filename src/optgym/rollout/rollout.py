"""The fast path: compile one module with a policy that lives in this process.

No gymnasium, no per-decision round trip to a learner: the loop below is all the host does between
two of the compiler's decisions, and the decision itself is the :class:`~optgym.rollout.decider.Decider`'s,
as in the policy server. trace, evaluation, search and ES all call :func:`rollout`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from optgym.corpus import Module
from optgym.problems import Problem
from optgym.rollout.decider import DecisionPoint, Policy
from optgym.rollout.episode import DEFAULT_TIMEOUT, Companion, Episode, EpisodeResult
from optgym.toolchain.llvm import Toolchain

#: ``DecisionPoint`` and ``Policy`` are imported from here by policies written before the decision core.
__all__ = ["DecisionPoint", "Policy", "RolloutResult", "Trajectory", "rollout"]


@dataclass
class Trajectory:
    actions: np.ndarray  # int64 [T]
    heuristic: np.ndarray  # int64 [T], -1 where the stream carries no heuristic answer
    log_probs: np.ndarray | None  # float32 [T] when the policy gave them
    features: np.ndarray | None  # float32 [T, F] when recorded


@dataclass
class RolloutResult:
    result: EpisodeResult
    trajectory: Trajectory


def rollout(
    problem: Problem,
    module: Module,
    toolchain: Toolchain,
    policy: Policy,
    *,
    record_features: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    transcript: Path | None = None,
    keep_object: Path | None = None,
    extra_flags: Sequence[str] = (),
    companions: Sequence[Companion] = (),
) -> RolloutResult:
    """Compile ``module`` answering every decision with ``policy``; return the outcome and trajectory.
    ``companions`` decide other problems of the same compile (see :class:`Episode`); the trajectory
    holds ``problem``'s decisions only."""
    actions: list[int] = []
    heuristic: list[int] = []
    log_probs: list[float] = []
    features: list[np.ndarray] = []
    with Episode(
        problem, module, toolchain, timeout=timeout, transcript=transcript, keep_object=keep_object,
        extra_flags=extra_flags, companions=companions, policy=policy,
    ) as ep:  # fmt: skip
        obs = ep.begin()
        decider = ep.decider
        while obs is not None:
            assert decider is not None
            action = decider.decide(obs)
            if decider.log_prob is not None:
                log_probs.append(decider.log_prob)
            actions.append(int(action))
            heuristic.append(-1 if decider.heuristic is None else decider.heuristic)
            if record_features:
                features.append(decider.view.vector(obs))
            obs = ep.act(action)
    assert ep.result is not None
    trajectory = Trajectory(
        actions=np.asarray(actions, dtype=np.int64),
        heuristic=np.asarray(heuristic, dtype=np.int64),
        log_probs=np.asarray(log_probs, dtype=np.float32) if log_probs else None,
        features=np.stack(features) if features else None,
    )
    return RolloutResult(ep.result, trajectory)
