"""One module compiled with a problem's decisions made by the host: the step-level core.

Both the gymnasium env (one ``step`` per decision, a policy outside) and the in-process rollout
(a policy inside the loop) drive an :class:`Episode`; nothing about a compile is written twice.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from optgym.corpus import Module
from optgym.corpus.cache import ResultCache
from optgym.problems import FeatureView, InvalidAction, Metrics, Problem, problem_flags
from optgym.protocol import Observation
from optgym.rollout.decider import Decider, Policy, PolicyInfo, decides
from optgym.rollout.linkage import REFUSAL_FLAGS, CalleeLinkage, surviving_functions, without_refusals
from optgym.toolchain import interactive
from optgym.toolchain.llvm import Toolchain
from optgym.toolchain.pass_plugin import SURVIVING_OUT, plugin_flags, read_surviving, surviving_plugin
from optgym.toolchain.process import private_tempdir, run

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


#: A policy that answers another decision problem of the same compile, in this process.
Companion = tuple[Problem, Policy]


class Episode:
    """Compile ``module`` with ``problem``'s decisions answered through :meth:`act`.

    ``begin()`` returns the first decision point (``None`` if the compile ended without any:
    no decisions, or a failure — see :attr:`result`). Each ``act(action)`` returns the next one,
    ``None`` after the last. ``keep_object`` copies the object there when the compile succeeds;
    ``extra_flags`` are added to the compile (optimization remarks, say).

    Every channel's decisions go through its :class:`~optgym.rollout.decider.Decider`, the one decision core
    the policy server uses too. :attr:`decider` is the problem's own, made at its first decision: ``act``
    sends through it, and with ``policy`` it also decides (``rollout`` asks it, ``decider.decide(obs)``).

    ``companions`` are other decision problems of the same compile, each answered by its own policy
    (a :class:`~optgym.rollout.decider.Policy`) without surfacing here: an inlining episode whose register
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
        policy: Policy | None = None,
        read_linkage: bool = False,
    ) -> None:
        self.problem, self.module, self.toolchain = problem, module, toolchain
        self.keep_object = keep_object
        # the callee linkage (optgym.rollout.linkage), for a policy that reads it or an env that hands it out:
        # clang names each call site it refuses on stderr, and the pass plugin writes which functions stay from
        # inside the compile, as in a served build (without a plugin here: the bitcode's external definitions)
        self._reads_linkage = read_linkage or PolicyInfo.of(policy).reads_callee_linkage
        self._surviving: Callable[[], frozenset[str] | None] | frozenset[str] | None = None
        self._work: tempfile.TemporaryDirectory[str] | None = None
        env = None
        if self._reads_linkage:
            extra_flags = [*extra_flags, *REFUSAL_FLAGS]
            if (plugin := surviving_plugin(toolchain)) is not None:
                self._work = private_tempdir("optgym-linkage-")
                written = Path(self._work.name) / "surviving"
                extra_flags = [*extra_flags, *plugin_flags(plugin)]
                env = {**os.environ, SURVIVING_OUT: str(written)}
                self._surviving = lambda: read_surviving(written)
            else:
                self._surviving = surviving_functions(module.bitcode, toolchain)
        self.linkage: CalleeLinkage | None = None  # made at the first decision, when clang's stderr exists
        self._object = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        companions = [(p, companion) for p, companion in companions if decides(companion, module.language)]
        problems = [problem, *(p for p, _ in companions)]
        self._policies: list[Policy | None] = [policy, *(companion for _, companion in companions)]
        self._deciders: list[Decider | None] = [None] * len(problems)  # per channel, at its first decision
        self._problems = problems
        self._compile = interactive.InteractiveCompile(
            lambda *bases: module.argv(toolchain.clang, [*extra_flags, *problem_flags(problems, bases)], "-"),
            channels=len(problems),
            timeout=timeout,
            transcript=transcript,
            meta={"module": module.name, "problem": problem.name, "compiler": toolchain.banner},
            stdout=self._object,
            cwd=module.workdir,
            env=env,
        )
        self.decider: Decider | None = None
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
        if self._work is not None:
            self._work.cleanup()

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
        assert self.decider is not None
        if not self._send(self.decider, self.observation, action):
            return None
        return self._advance()

    def heuristic_action(self) -> int | None:
        assert self.view is not None and self.observation is not None
        return self.problem.heuristic_action(self.view, self.observation)

    def _send(self, decider: Decider, obs: Observation, action: Any) -> bool:
        """Send ``action`` on the current channel; ``False`` (the episode ended) if its problem rules it out."""
        try:
            advice = decider.advice(obs, action)
        except InvalidAction as why:
            self.observation = None
            self.result = EpisodeResult(self.module.name, "invalid_action", str(why), decisions=self.decisions)
            self.close()
            return False
        self._compile.answer(advice)
        return True

    def _decider(self, channel: int) -> Decider:
        """The current channel's decider, made at its first decision from the header clang just sent."""
        header = self._compile.header
        assert header is not None
        problem = self._problems[channel]
        try:
            view = problem.view(header)
        except Exception:
            self.close()
            raise
        linkage = None
        if channel == 0 and self._reads_linkage:
            linkage = self.linkage = CalleeLinkage(self._surviving, self._compile.stderr_fd)
        decider = Decider(problem, view, self._policies[channel], self.module.language, linkage=linkage)
        self._deciders[channel] = decider
        return decider

    def _advance(self) -> Observation | None:
        """The next decision of this episode's problem, answering the companions' on the way."""
        compile_ = self._compile
        while True:
            obs = self.observation = None if compile_.outcome else compile_.next_observation()
            if obs is None:
                if self.result is None:
                    self._conclude()
                return None
            channel = compile_.channel
            decider = self._deciders[channel] or self._decider(channel)
            if channel == 0:
                self.decider, self.view = decider, decider.view
                return obs
            if not self._send(decider, obs, decider.decide(obs)):
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
            without_refusals(outcome.stderr_tail.encode()).decode() if self._reads_linkage else outcome.stderr_tail,
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
    extra_flags: Sequence[str] = (),
) -> EpisodeResult:
    """The module compiled by the compiler alone (its own heuristic), measured by ``problem``. ``extra_flags``: pass
    options of the compile (a portfolio candidate's), still with no channel open."""
    with tempfile.TemporaryFile() as obj:
        argv = module.argv(toolchain.clang, [*extra_flags, *problem.compile_flags()], "-")
        res = run(argv, timeout=timeout, stdout=obj, cwd=module.workdir)
        return _result(problem, module.name, res.status, res.detail, res.seconds, res.stderr_tail, obj, keep_object)


def baseline(
    problem: Problem,
    module: Module,
    toolchain: Toolchain,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    cache: ResultCache | None = None,
    extra_flags: Sequence[str] = (),
) -> EpisodeResult:
    """:func:`plain_compile`, cached on disk by module content, problem flags, ``extra_flags`` (a portfolio
    candidate's pass options) and compiler identity."""
    cache = cache or ResultCache("baseline")
    key = _compile_key(cache, problem, module, toolchain, extra_flags)
    if (hit := cache.get(key)) is not None:
        return EpisodeResult(**hit)
    result = plain_compile(problem, module, toolchain, timeout=timeout, extra_flags=extra_flags)
    if result.ok:  # failures are not cached: a timeout may pass on a quieter machine
        cache.put(key, result.__dict__)
    return result


def _compile_key(
    cache: ResultCache, problem: Problem, module: Module, toolchain: Toolchain, extra_flags: Sequence[str] = ()
) -> str:
    """What a cached result of compiling ``module`` for ``problem`` depends on: content, flags, compiler (without
    extra flags, the key clang's own compile always had)."""
    return cache.key([module.digest, problem.name, *problem.compile_flags(), toolchain.identity, *extra_flags])
