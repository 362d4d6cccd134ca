"""The gymnasium view of a compile: one episode per module, one step per compiler decision.

Observation: a ``Dict`` of the problem's named features (flattening and normalization are wrappers).
Reward: 0 until the last step, then the problem's reward against the heuristic's compile of the
same module (for inline-size, MLGO's ``1 - (policy + δ) / (heuristic + δ)``). The heuristic's
metrics are computed once per module and cached on disk.

``info`` carries ``heuristic_action`` whenever a decision is pending (and ``action_mask`` for masked
problems). The final step's info holds ``module``, ``decisions``, ``compile_seconds``, ``status`` and
``policy_<metric>``/``heuristic_<metric>`` for each metric (``policy_text_bytes`` …).
A compile that fails mid-episode ends it with ``truncated=True``, reward 0 and ``info["status"]``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from optgym.corpus import Corpus, Module
from optgym.corpus.cache import ResultCache
from optgym.errors import CompileError, CorpusError
from optgym.problems import Problem
from optgym.rollout.episode import DEFAULT_TIMEOUT, Episode, EpisodeResult, baseline
from optgym.toolchain.llvm import Toolchain, find_toolchain

log = logging.getLogger(__name__)


class CompilerEnv(gym.Env):
    """A problem over a corpus, driven decision by decision.

    Args:
        problem: the decision problem (e.g. ``InlineSize()``).
        corpus: a corpus directory or :class:`Corpus`.
        modules: restrict episodes to these module names (default: all).
        timeout: seconds of compiler time a compile may take before it is killed.
        on_error: ``"raise"`` (a module that fails before its first decision raises
            :class:`CompileError`) or ``"skip"`` (it is logged and the next module is taken).
        transcript_dir: record every exchange there (default ``$OPTGYM_TRANSCRIPT``).
        callee_linkage: have clang name the callees it refuses and put the pending decision's
            ``callee_survives`` (0/1, :mod:`optgym.rollout.linkage`) in ``info``.
        report_timing: put ``compile_seconds`` in the final info. It is the one value of an
            episode that is not a function of seed and actions, so gymnasium's determinism check
            (``check_env``) fails on a one-decision module unless this is off.
    """

    metadata = {"render_modes": []}  # noqa: RUF012 - gymnasium's convention

    def __init__(
        self,
        problem: Problem,
        corpus: Corpus | str | Path,
        *,
        modules: Sequence[str] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        on_error: str = "raise",
        transcript_dir: str | Path | None = None,
        toolchain: Toolchain | None = None,
        cache: ResultCache | None = None,
        report_timing: bool = True,
        callee_linkage: bool = False,
    ) -> None:
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.problem = problem
        self.corpus = corpus if isinstance(corpus, Corpus) else Corpus(corpus)
        self.modules: list[Module] = [self.corpus[n] for n in modules] if modules is not None else list(self.corpus)
        if not self.modules:
            raise CorpusError(f"corpus {self.corpus.root} has no modules to compile")
        self.toolchain = toolchain or find_toolchain((problem.hook,))
        self.timeout, self.on_error, self.report_timing = timeout, on_error, report_timing
        self.callee_linkage = callee_linkage
        transcript_dir = transcript_dir or os.environ.get("OPTGYM_TRANSCRIPT")
        self.transcript_dir = Path(transcript_dir) if transcript_dir else None
        self.cache = cache or ResultCache("baseline")
        self.observation_space: spaces.Dict = problem.observation_space()
        self.action_space = problem.action_space()
        self._order: list[int] = []
        self._no_decisions: set[str] = set()
        self._episode: Episode | None = None
        self._baseline: EpisodeResult | None = None
        self._episodes = 0

    # -- gymnasium API -----------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self._order = []
        self._close_episode()
        if options and "module" in options:  # asked for by name: its failure is an error, whatever on_error says
            obs = self._begin(self.corpus[options["module"]], explicit=True)
            if obs is None:
                raise CorpusError(f"module {options['module']} has no decisions for {self.problem.name}")
            return obs
        for _ in range(2 * len(self.modules)):
            module = self._next_module()
            if module.name in self._no_decisions:
                continue
            if (obs := self._begin(module)) is not None:
                return obs
        raise CorpusError(
            f"no module of {self.corpus.root} has a decision for {self.problem.name} (or all failed; see the log)"
        )

    def step(self, action: Any):
        if self._episode is None or self._episode.observation is None:
            raise RuntimeError("step() called without a pending decision: call reset() first")
        episode = self._episode
        obs = episode.act(action)
        if obs is not None:
            return self._observe(), 0.0, False, False, self._info()
        result = episode.result
        assert result is not None and self._baseline is not None
        info: dict[str, Any] = {"module": result.module, "status": result.status, "decisions": result.decisions}
        if self.report_timing:
            info["compile_seconds"] = result.compile_seconds
        self._episode = None
        if not result.ok:
            info.update(detail=result.detail, stderr_tail=result.stderr_tail)
            log.warning("%s: %s: %s", result.module, result.status, result.detail)
            return self._empty_observation(), 0.0, False, True, info
        for key, value in result.metrics.items():
            info[f"policy_{key}"] = value
            info[f"heuristic_{key}"] = self._baseline.metrics[key]
        reward = self.problem.reward(result.metrics, self._baseline.metrics)
        return self._empty_observation(), float(reward), True, False, info

    def close(self) -> None:
        self._close_episode()
        super().close()

    # -- internals ---------------------------------------------------------------------------

    def _next_module(self) -> Module:
        if not self._order:
            self._order = list(self.np_random.permutation(len(self.modules)))
        return self.modules[self._order.pop(0)]

    def _begin(self, module: Module, explicit: bool = False):
        """Start ``module``; the first (observation, info), or ``None`` if it has no decisions."""
        base = baseline(self.problem, module, self.toolchain, timeout=self.timeout, cache=self.cache)
        if not base.ok:
            return self._failed(base, explicit)
        transcript = None
        if self.transcript_dir is not None:
            self.transcript_dir.mkdir(parents=True, exist_ok=True)
            self._episodes += 1
            transcript = (
                self.transcript_dir / f"{module.name.replace('/', '_')}.{os.getpid()}.{self._episodes}.transcript"
            )
        episode = Episode(self.problem, module, self.toolchain, timeout=self.timeout, transcript=transcript,
                          read_linkage=self.callee_linkage)  # fmt: skip
        if episode.begin() is None:
            assert episode.result is not None
            if not episode.result.ok:
                return self._failed(episode.result, explicit)
            self._no_decisions.add(module.name)
            return None
        self._episode, self._baseline = episode, base
        return self._observe(), self._info()

    def _failed(self, result: EpisodeResult, explicit: bool = False):
        error = CompileError(result.module, result.status, result.detail, result.stderr_tail)
        if self.on_error == "raise" or explicit:
            raise error
        log.warning("skipping %s", error)
        return None

    def _observe(self) -> dict[str, np.ndarray]:
        episode = self._episode
        assert episode is not None and episode.view is not None and episode.observation is not None
        return episode.view.as_dict(episode.observation)

    def _info(self) -> dict[str, Any]:
        episode = self._episode
        assert episode is not None and episode.view is not None and episode.observation is not None
        info: dict[str, Any] = {"module": episode.module.name, "decision": episode.decisions}
        heuristic = episode.heuristic_action()
        if heuristic is not None:
            info["heuristic_action"] = heuristic
        mask = self.problem.action_mask(episode.view, episode.observation)
        if mask is not None:
            info["action_mask"] = mask
        if episode.linkage is not None:
            info["callee_survives"] = int(episode.linkage.survives(episode.observation))
        return info

    def _empty_observation(self) -> dict[str, np.ndarray]:
        """The terminal observation: zeros (gymnasium wants one; it carries no information)."""
        boxes = self.observation_space.spaces.items()  # every one a Box (Problem.observation_space)
        return {name: np.zeros(box.shape, dtype=box.dtype) for name, box in boxes if isinstance(box, spaces.Box)}

    def _close_episode(self) -> None:
        if self._episode is not None:
            self._episode.close()
            self._episode = None
