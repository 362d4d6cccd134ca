"""Gymnasium wrappers for the compiler env: normalization, flattening, the optimal-decision reward.

* :class:`NormalizeFeatures` — each feature through the vocab's quantiles (MLGO's ``x, x², √x``
  and log z-score; :mod:`optgym.problems.normalize`, the same code policies run in workers).
* :class:`FlattenFeatures` — the ``Dict`` observation as one float32 ``Box`` in the problem's
  feature order, what SB3's ``MlpPolicy`` takes. ``FlattenFeatures(NormalizeFeatures(env, vocab))``
  gives exactly the vector a :class:`~optgym.policies.mlp.MLPPolicy` computes inside a compile.
* :class:`PolicyInputsObservation` — the vector an :class:`~optgym.policies.mlp.MLPPolicy` *with derived
  inputs* computes (the normalized features, then clang's answer, margins, 0/1 gates…): what SB3 needs to
  train from a warm start that reads them, such as the learned allowance.
* :class:`OptimalDecision` — the CSE gym's ``--reward-optimal-cse`` for inlining: at each step,
  the module is compiled twice more with the decisions so far, then each answer to the current
  decision, then the heuristic for the rest; the step's reward says how much smaller the chosen
  answer's object is than the other's. Expensive: two full compiles per decision, so an episode
  of T decisions costs 2·T + 1 compiles (a 1 000-decision module: ~2 000 compiles, minutes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from optgym.problems.normalize import PER_FEATURE, Normalizer, Vocab
from optgym.rollout.rollout import DecisionPoint, rollout
from optgym.toolchain.language import is_cxx

if TYPE_CHECKING:
    from optgym.env.compiler_env import CompilerEnv


def feature_order(env: gym.Env) -> list[str]:
    """The problem's visible features in its own order (a ``Dict`` space sorts its keys)."""
    return env.unwrapped.problem.visible_features()  # type: ignore[attr-defined]


class NormalizeFeatures(gym.ObservationWrapper):
    """Every feature ``f`` becomes ``Box(PER_FEATURE,)``: ``[x, x², √x, z]`` from the vocab's quantiles."""

    def __init__(self, env: gym.Env, vocab: Vocab | str) -> None:
        super().__init__(env)
        self.vocab = Vocab.load(vocab) if isinstance(vocab, str) else vocab
        self.names = feature_order(env)
        self.normalizer = Normalizer(self.vocab, self.names)
        box = spaces.Box(-np.inf, np.inf, shape=(PER_FEATURE,), dtype=np.float32)
        self.observation_space = spaces.Dict({n: box for n in self.names})

    def observation(self, observation: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raw = np.array([observation[n].reshape(-1)[0] for n in self.names], dtype=np.float64)
        values = self.normalizer(raw).reshape(len(self.names), PER_FEATURE)
        return {n: values[i] for i, n in enumerate(self.names)}


class FlattenFeatures(gym.ObservationWrapper):
    """A ``Dict`` of features → one float32 ``Box``, concatenated in the problem's feature order."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.names = feature_order(env)
        space = env.observation_space
        assert isinstance(space, spaces.Dict)
        self.sizes = [int(np.prod(space[n].shape or ())) for n in self.names]
        self.observation_space = spaces.Box(-np.inf, np.inf, shape=(sum(self.sizes),), dtype=np.float32)

    def observation(self, observation: dict[str, np.ndarray]) -> np.ndarray:
        return np.concatenate([np.asarray(observation[n], dtype=np.float32).reshape(-1) for n in self.names])


class PolicyInputsObservation(gym.Wrapper):
    """The raw ``Dict`` observation → ``Box`` of :class:`~optgym.problems.inputs.PolicyInputs`: the normalized
    features, then the derived inputs ``extras``.

    A wrapper, not an ``ObservationWrapper``: three of the derived inputs are not in the observation.
    Clang's own answer comes from the step's ``info["heuristic_action"]``, ``callee_survives`` from
    ``info["callee_survives"]`` (an env made with ``callee_linkage=True``). Whether the module is C++ comes from
    the corpus entry named by ``info["module"]``. Bit for bit the vector a served policy computes inside a
    compile, so a policy trained on it behaves the same when ``optgym-cc`` serves it."""

    def __init__(self, env: gym.Env, vocab: Vocab | str, extras: list[str]) -> None:
        from optgym.problems.inputs import PolicyInputs

        super().__init__(env)
        vocab = Vocab.load(vocab) if isinstance(vocab, str) else vocab
        self.inputs = PolicyInputs(vocab, extras)
        self.names = self.inputs.normalizer.names
        self.observation_space = spaces.Box(-np.inf, np.inf, shape=(self.inputs.width,), dtype=np.float32)

    def _vector(self, observation: dict[str, np.ndarray], info: dict[str, Any]) -> np.ndarray:
        if "decision" not in info:  # an episode's end (or failure): nothing is pending
            return np.zeros(self.inputs.width, dtype=np.float32)
        raw = np.array([observation[n].reshape(-1)[0] for n in self.names], dtype=np.float64)
        language = self.env.unwrapped.corpus[info["module"]].language  # type: ignore[attr-defined]
        survives = info.get("callee_survives")
        return self.inputs(raw, info.get("heuristic_action"), is_cxx(language), survives, dtype=np.float32)

    def reset(self, **kwargs: Any):
        observation, info = self.env.reset(**kwargs)
        return self._vector(observation, info), info

    def step(self, action: Any):
        observation, reward, terminated, truncated, info = self.env.step(action)
        return self._vector(observation, info), reward, terminated, truncated, info


class _Replay:
    """Decisions ``prefix`` then ``choice``, then the heuristic for the rest."""

    def __init__(self, prefix: list[int], choice: int) -> None:
        self.prefix, self.choice = prefix, choice

    def __call__(self, point: DecisionPoint) -> int:
        i = point.index
        if i < len(self.prefix):
            return self.prefix[i]
        if i == len(self.prefix):
            return self.choice
        assert point.heuristic is not None, "the optimal-decision reward needs the heuristic's answer"
        return point.heuristic


class OptimalDecision(gym.Wrapper):
    """Per-step reward from a one-flip look-ahead (see the module doc: 2 compiles per step).

    ``reward_t = (size(other answer) − size(chosen answer)) / heuristic size`` of the module, each
    completed by the heuristic; positive when the agent chose the better answer. The episode's own
    final reward is added at the last step unless ``keep_final=False``. ``info["optimal_action"]``
    says which answer the look-ahead found better (ties: the heuristic's).
    """

    def __init__(self, env: gym.Env, keep_final: bool = True) -> None:
        super().__init__(env)
        self.keep_final = keep_final
        self._actions: list[int] = []
        self._module: str | None = None

    def reset(self, **kwargs: Any):
        obs, info = self.env.reset(**kwargs)
        self._actions, self._module = [], info.get("module")
        self._heuristic = info.get("heuristic_action")
        return obs, info

    def _size(self, choice: int) -> float | None:
        base = cast("CompilerEnv", self.env.unwrapped)
        assert self._module is not None, "reset() names the module"
        module = base.corpus[self._module]
        run = rollout(base.problem, module, base.toolchain, _Replay(self._actions, choice), timeout=base.timeout)
        return run.result.metrics.get("text_bytes") if run.result.ok else None

    def step(self, action: Any):
        action = int(action)
        sizes = {a: self._size(a) for a in (0, 1)}
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._actions.append(action)
        baseline = cast("CompilerEnv", self.env.unwrapped)._baseline
        base_size = baseline.metrics.get("text_bytes") if baseline else None
        look_ahead = 0.0
        if None not in sizes.values() and base_size:
            chosen, other = sizes[action], sizes[1 - action]
            look_ahead = (other - chosen) / base_size  # type: ignore[operator]
            best = min((0, 1), key=lambda a: (sizes[a], a != self._heuristic))
            info["optimal_action"] = best
        info["look_ahead_reward"] = look_ahead
        self._heuristic = info.get("heuristic_action")
        total = look_ahead + (float(reward) if self.keep_final else 0.0)
        return obs, total, terminated, truncated, info


__all__ = ["FlattenFeatures", "NormalizeFeatures", "OptimalDecision", "PolicyInputsObservation", "feature_order"]
