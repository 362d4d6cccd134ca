"""Compiling one module with host-made decisions: the step-level :class:`Episode` and :func:`rollout`, both
deciding through :class:`Decider`, the decision core the policy server uses too."""

from optgym.rollout import heuristic as _heuristic  # noqa: F401  (registers the corpus layer's heuristic workers)
from optgym.rollout.decider import Decider, PolicyInfo
from optgym.rollout.episode import DEFAULT_TIMEOUT, Companion, Episode, EpisodeResult, baseline, plain_compile
from optgym.rollout.rollout import DecisionPoint, Policy, RolloutResult, Trajectory, rollout

__all__ = [
    "DEFAULT_TIMEOUT",
    "Companion",
    "Decider",
    "DecisionPoint",
    "Episode",
    "EpisodeResult",
    "Policy",
    "PolicyInfo",
    "RolloutResult",
    "Trajectory",
    "baseline",
    "plain_compile",
    "rollout",
]
