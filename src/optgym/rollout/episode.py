"""One module compiled with a problem's decisions made by the host: the step-level core.

Both the gymnasium env (one ``step`` per decision, a policy outside) and the in-process rollout
(a policy inside the loop) drive an :class:`Episode`; nothing about a compile is written twice.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from optgym.corpus import Module
from optgym.corpus.cache import ResultCache
from optgym.problems import FeatureView, Metrics, Problem, problem_flags
from optgym.protocol import Observation
from optgym.toolchain import interactive
from optgym.toolchain.language import family
from optgym.toolchain.llvm import Toolchain
from optgym.toolchain.process import run

DEFAULT_TIMEOUT = 120.0


@dataclass
class EpisodeResult:
    """How one module's compile ended, with its metrics when it succeeded."""

    module: str
    status: str  # "ok" or a failure status (compile_error, crash, timeout, protocol_error, invalid_action, …)
    detail: str = ""
    metrics: Metrics = field(default_factory=dict)
    decisions: int = 0
    compile_seconds: float = 0.0
    stderr_tail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class DecisionPoint:
    """What a policy sees at one decision; feature views are computed only when asked for."""

    __slots__ = ("_obs", "_view", "heuristic", "index", "language", "problem")

    def __init__(
        self,
        view: FeatureView,
        obs: Observation,
        heuristic: int | None,
        index: int,
        language: str | None = None,
        problem: Problem | None = None,
    ) -> None:
        self._view, self._obs, self.heuristic, self.index = view, obs, heuristic, index
        self.language = language  # of the module compiled (C, C++ …; optgym.toolchain.language), if known
        self.problem = problem  # the decision's problem, when the loop knows it: see valid_actions()

    def valid_actions(self) -> np.ndarray | None:
        """The indices of the actions the problem allows here (an eviction's unmasked candidates), or ``None``
        when every action of the space is allowed or the problem is not known. A policy that picks without a
        model (random, never, always) reads it so that it never sends what would crash the compiler."""
        if self.problem is None:
            return None
        mask = self.problem.action_mask(self._view, self._obs)
        return None if mask is None else np.flatnonzero(mask)

    def vector(self) -> np.ndarray:
        """Visible features flattened to float32, in the problem's feature order."""
        return self._view.vector(self._obs)

    def rows(self, names: Sequence[str]) -> np.ndarray:
        """Features ``names`` as the rows of one float64 matrix (see :meth:`FeatureView.rows`)."""
        return self._view.rows(self._obs, names)

    def firsts(self, names: Sequence[str]) -> list[float]:
        """The first value of each of ``names`` as Python floats (see :meth:`FeatureView.firsts`)."""
        return self._view.firsts(self._obs, names)

    def features(self) -> dict[str, np.ndarray]:
        return self._view.as_dict(self._obs)

    def stream_features(self) -> dict[str, np.ndarray]:
        """Every tensor the compiler sent at this decision, by name — also those the problem does not read
        (IR2Vec embeddings when clang is given a vocabulary); decoded on each call, so not for the hot path."""
        return self._obs.as_dict()

    @property
    def raw(self) -> bytes:
        return self._obs.raw


#: A policy: the action for a decision point, optionally with its log-probability.
Policy = Callable[[DecisionPoint], int | tuple[int, float]]


#: A policy that answers another decision problem of the same compile, in this process.
Companion = tuple[Problem, Policy]


def decides(policy: object, language: str) -> bool:
    """Whether ``policy`` decides compiles of ``language``: a policy with ``languages`` (the families it was
    trained and shipped for, "C" or "C++") leaves the others to clang — its channel is not even opened."""
    languages = getattr(policy, "languages", None)
    return languages is None or family(language) in languages


class Episode:
    """Compile ``module`` with ``problem``'s decisions answered through :meth:`act`.

    ``begin()`` returns the first decision point (``None`` if the compile ended without any:
    no decisions, or a failure — see :attr:`result`). Each ``act(action)`` returns the next one,
    ``None`` after the last. ``keep_object`` copies the object there when the compile succeeds;
    ``extra_flags`` are added to the compile (optimization remarks, say).

    ``companions`` are other decision problems of the same compile, each answered by its own policy
    (a :data:`optgym.rollout.rollout.Policy`) without surfacing here: an inlining episode whose register
    allocation a trained eviction policy decides, or the reverse. Their decisions are counted in
    :attr:`decisions` too; an answer a companion's problem rules out ends the episode as ``act`` does.

    The compiler writes its object to stdout, an anonymous temporary file: the object never has a
    name on disk, so not even a host killed with SIGKILL leaves it behind.
    """

    def __init__(
        self,
        problem: Problem,
        module: Module,
        toolchain: Toolchain,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        transcript: Path | None = None,
        keep_object: Path | None = None,
        extra_flags: Sequence[str] = (),
        companions: Sequence[Companion] = (),
    ) -> None:
        self.problem, self.module, self.toolchain = problem, module, toolchain
        self.keep_object = keep_object
        self._object = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        companions = [(p, policy) for p, policy in companions if decides(policy, module.language)]
        problems = [problem, *(p for p, _ in companions)]
        self._policies = [None, *(policy for _, policy in companions)]
        self._views: list[FeatureView | None] = [None] * len(problems)
        self._indices = [0] * len(problems)  # decisions so far, per channel
        self._problems = problems
        self._compile = interactive.InteractiveCompile(
            lambda *bases: module.argv(toolchain.clang, [*extra_flags, *problem_flags(problems, bases)], "-"),
            channels=len(problems),
            timeout=timeout,
            transcript=transcript,
            meta={"module": module.name, "problem": problem.name, "compiler": toolchain.banner},
            stdout=self._object,
            cwd=module.workdir,
        )
        self.view: FeatureView | None = None
        self.observation: Observation | None = None
        self.result: EpisodeResult | None = None

    def __enter__(self) -> Episode:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._compile.close()
        self._object.close()

    @property
    def decisions(self) -> int:
        return self._compile.decisions

    def begin(self) -> Observation | None:
        self._compile.start()
        return self._advance()

    def act(self, action: Any) -> Observation | None:
        """Answer the pending decision; the next one, or ``None`` once the episode has ended. An action
        the problem rules out (:meth:`Problem.invalid_action`) is never sent: the compile is stopped and
        the episode ends with status ``invalid_action``."""
        assert self._compile.header is not None and self.observation is not None, "act() without a decision"
        assert self.view is not None
        if not self._answer(self.problem, self.view, self.observation, action):
            return None
        return self._advance()

    def heuristic_action(self) -> int | None:
        assert self.view is not None and self.observation is not None
        return self.problem.heuristic_action(self.view, self.observation)

    def _answer(self, problem: Problem, view: FeatureView, obs: Observation, action: Any) -> bool:
        """Send ``action`` on the current channel; ``False`` (the episode ended) if ``problem`` rules it out."""
        why = problem.invalid_action(view, obs, action)
        if why is not None:
            self.observation = None
            self.result = EpisodeResult(self.module.name, "invalid_action", why, decisions=self.decisions)
            self.close()
            return False
        header = self._compile.header
        assert header is not None
        self._compile.answer(problem.encode_action(header, action))
        return True

    def _advance(self) -> Observation | None:
        """The next decision of this episode's problem, answering the companions' on the way."""
        compile_ = self._compile
        while True:
            self.observation = None if compile_.outcome else compile_.next_observation()
            if self.observation is None:
                if self.result is None:
                    self._conclude()
                return None
            channel = compile_.channel
            view = self._views[channel]
            if view is None:
                header = compile_.header
                assert header is not None
                try:
                    view = self._views[channel] = self._problems[channel].view(header)
                except Exception:
                    self.close()
                    raise
            if channel == 0:
                self.view = view
                return self.observation
            problem, policy = self._problems[channel], self._policies[channel]
            assert policy is not None
            point = DecisionPoint(view, self.observation, problem.heuristic_action(view, self.observation),
                                  self._indices[channel], self.module.language, problem)  # fmt: skip
            self._indices[channel] += 1
            choice = policy(point)
            if not self._answer(problem, view, self.observation, choice[0] if isinstance(choice, tuple) else choice):
                return None

    def _conclude(self) -> None:
        outcome = self._compile.outcome
        assert outcome is not None
        self.result = _result(
            self.problem,
            self.module.name,
            outcome.status,
            outcome.detail,
            outcome.seconds,
            outcome.stderr_tail,
            self._object,
            self.keep_object,
        )
        self.result.decisions = outcome.decisions
        self.close()


def _result(
    problem: Problem,
    module: str,
    status: str,
    detail: str,
    seconds: float,
    stderr_tail: str,
    obj_file: IO[bytes],
    keep_object: Path | None,
) -> EpisodeResult:
    """An :class:`EpisodeResult`, measuring the object when the compile succeeded."""
    result = EpisodeResult(module, status, detail, compile_seconds=seconds, stderr_tail=stderr_tail)
    if status == "ok":
        obj_file.seek(0)
        obj = obj_file.read()
        if not obj:
            result.status, result.detail = "no_object", "the compiler exited 0 but wrote no object"
            return result
        result.metrics = problem.measure(obj)
        if keep_object is not None:
            Path(keep_object).write_bytes(obj)
    return result


def plain_compile(
    problem: Problem,
    module: Module,
    toolchain: Toolchain,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    keep_object: Path | None = None,
) -> EpisodeResult:
    """The module compiled by the compiler alone (its own heuristic), measured by ``problem``."""
    with tempfile.TemporaryFile() as obj:
        argv = module.argv(toolchain.clang, problem.compile_flags(), "-")
        res = run(argv, timeout=timeout, stdout=obj, cwd=module.workdir)
        return _result(problem, module.name, res.status, res.detail, res.seconds, res.stderr_tail, obj, keep_object)


def baseline(
    problem: Problem,
    module: Module,
    toolchain: Toolchain,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    cache: ResultCache | None = None,
) -> EpisodeResult:
    """:func:`plain_compile`, cached on disk by module content, problem flags and compiler identity."""
    cache = cache or ResultCache("baseline")
    key = cache.key([module.digest, problem.name, *problem.compile_flags(), toolchain.identity])
    if (hit := cache.get(key)) is not None:
        return EpisodeResult(**hit)
    result = plain_compile(problem, module, toolchain, timeout=timeout)
    if result.ok:  # failures are not cached: a timeout may pass on a quieter machine
        cache.put(key, result.__dict__)
    return result
