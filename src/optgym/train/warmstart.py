"""Where a training run starts: a warm start named on the command line, as a policy directory, and an allowance start
in the form ES, the pattern search and PPO train.

One module for every trainer's ``--warmstart``: ES, the pattern search and PPO all take run directories, policy
directories and exported files alike, and an allowance from any of them, however it was trained.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from optgym.policies import pretrained_path
from optgym.policies.allowance import (
    HEURISTIC_WEIGHT,
    AllowanceError,
    check_start,
    gates_of,
    is_allowance,
    unscaled,
    with_gates,
)
from optgym.policies.embedded import unpack_policy
from optgym.policies.exported import ExportError
from optgym.policies.mlp import MLPPolicy
from optgym.policies.trained import load_policy_dir, policy_dir_of
from optgym.train.run import RunError


def grown_to(policy: MLPPolicy, gates: list[str]) -> MLPPolicy:
    """An allowance start in the family's form (:func:`~optgym.policies.allowance.unscaled`: a PPO allowance's
    logit carries its temperature), with only the first of ``gates`` given the others at weight 0; any other
    policy as it is (:func:`~optgym.policies.allowance.check_start` judges it)."""
    if not is_allowance(policy):
        return policy
    policy = unscaled(policy)
    return with_gates(policy, gates) if len(gates_of(policy)) < len(gates) else policy


def allowance_start(spec: str, problem: str, gates: list[str], heuristic_weight: float = HEURISTIC_WEIGHT) -> MLPPolicy:
    """The allowance a run starts from (``--warmstart``: e.g. an imitated allowance, which ES or a pattern search
    trains further), refused unless it is of the family asked for. A start with only the first of the gates asked
    for learns the others from where it stands (:func:`~optgym.policies.allowance.with_gates`). It is loaded
    aside, so a refused run leaves no directory behind."""
    with tempfile.TemporaryDirectory() as aside:
        found = warm_start_dir(spec, problem, Path(aside))
        if found is None:
            raise RunError(f"--warmstart {spec} holds no policy")
        loaded = load_policy_dir(found)
        if not isinstance(loaded, MLPPolicy):
            raise RunError(f"--warmstart {spec}: not an allowance policy (optgym train imitate --allowance makes one)")
        try:
            policy = grown_to(loaded, gates)
            check_start(policy, gates, heuristic_weight)
        except AllowanceError as e:
            raise RunError(f"--warmstart {spec}: {e}") from None
    return policy


def warm_start_dir(spec: str, problem: str, run: Path) -> Path | None:
    """The policy directory a run starts from: a run or policy directory as it is, or an exported file
    (``pretrained``: the one shipped for ``problem``), whose embedded training policy is unpacked into
    ``RUN/start`` — so a shipped policy can be trained further, on a corpus it never saw (ThinLTO backends,
    another target), and the run keeps what it started from."""
    if spec == "pretrained":
        spec = str(pretrained_path(problem))
    path = Path(spec)
    if path.is_file():
        try:
            return unpack_policy(path, run / "start")
        except ExportError as e:
            raise RunError(f"--warmstart {spec}: {e}") from None
    return policy_dir_of(path)


__all__ = ["allowance_start", "grown_to", "warm_start_dir"]
