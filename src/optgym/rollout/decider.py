"""One decision of one channel, made the same way by every loop that answers clang: the decision core.

Three loops answer a compile's decisions — :class:`~optgym.rollout.episode.Episode` (the gymnasium env's
steps, and the companions' decisions on the way), :func:`~optgym.rollout.rollout.rollout` (a policy inside
the loop) and the policy server behind ``optgym-cc`` (:mod:`optgym.serve.server`). Each gives every channel
of a compile one :class:`Decider` at its first decision and leaves the decision to it: clang's own answer,
the :class:`DecisionPoint` the policy sees, the policy's answer, the problem's rule against answers clang
would crash on, and the answer's bytes. A change to how a decision is made is therefore made once, and what
the server serves is what evaluation measured.

The decider runs once per decision between two of clang's feature computations, so it allocates nothing a
decision does not need: the point only when a policy is asked, the advice bytes once per distinct answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from optgym.problems import FeatureView, InvalidAction, Problem
from optgym.protocol import Header, Observation
from optgym.rollout.linkage import CalleeLinkage
from optgym.toolchain.language import family

#: What a policy answers: an index (inlining: 0/1; eviction: a column) or a number (a live range's priority).
Action = int | float
#: A policy's return: the action, or the action and its log-probability (a sampling policy's, for training).
Choice = Action | tuple[Action, float]

#: Decision points a server remembers per policy (~0.5 KB each): a C++ build meets the same call site — same
#: features, same heuristic answer — in many translation units (35 % of graphite2's 9,208 decisions repeat one).
MEMO_ENTRIES = 1 << 15


class DecisionPoint:
    """What a policy sees at one decision; feature views are computed only when asked for."""

    __slots__ = ("_obs", "_view", "heuristic", "index", "language", "linkage", "problem")

    def __init__(
        self,
        view: FeatureView,
        obs: Observation,
        heuristic: int | None,
        index: int,
        language: str | None = None,
        problem: Problem | None = None,
        linkage: CalleeLinkage | None = None,
    ) -> None:
        self._view, self._obs, self.heuristic, self.index = view, obs, heuristic, index
        self.language = language  # of the module compiled (C, C++ …; optgym.toolchain.language), if known
        self.problem = problem  # the decision's problem, when the loop knows it: see valid_actions()
        self.linkage = linkage  # the compile's callee linkage, when the policy reads it

    @property
    def callee_survives(self) -> bool | None:
        """Whether this call site's callee stays in the object whatever is inlined, as clang named it
        (:mod:`optgym.rollout.linkage`); ``None`` where the loop reads no linkage."""
        return None if self.linkage is None else self.linkage.survives(self._obs)

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


class Policy(Protocol):
    """What decides in clang's place: called with a :class:`DecisionPoint`, it returns the action, or
    ``(action, log_prob)``. A plain function is a policy (:mod:`optgym.rollout.simple`).

    A policy may also say what it was made for, in optional attributes that the loops read through
    :class:`PolicyInfo` (a function has none, so none is required here):

    * ``problem`` — the name of the problem it was trained on;
    * ``feature_names`` — the features it reads: a compiler that does not send them all must not be served by it;
    * ``languages`` — the language families ("C", "C++") it decides; the others are left to clang, whose channel
      is then not even opened (:func:`decides`);
    * ``compiler`` — the clang version it was trained with (or a ``source`` record's ``compiler`` entry, as
      :class:`~optgym.policies.mlp.MLPPolicy` and the scorers keep it): another major version is not served;
    * ``reads_callee_linkage`` — true when it reads :attr:`DecisionPoint.callee_survives`: the loop then has
      clang name the callees it refuses, on stderr (:mod:`optgym.rollout.linkage`).
    """

    def __call__(self, point: DecisionPoint, /) -> Choice: ...


@dataclass(frozen=True)
class PolicyInfo:
    """The optional attributes a :class:`Policy` declares, each ``None`` where the policy says nothing."""

    problem: str | None = None
    feature_names: tuple[str, ...] | None = None
    languages: tuple[str, ...] | None = None
    compiler: str | None = None
    reads_callee_linkage: bool = False

    @classmethod
    def of(cls, policy: object) -> PolicyInfo:
        """What ``policy`` declares. Read once per policy and compile, never per decision."""
        names = getattr(policy, "feature_names", None)
        languages = getattr(policy, "languages", None)
        compiler = getattr(policy, "compiler", None) or (getattr(policy, "source", None) or {}).get("compiler")
        return cls(
            problem=getattr(policy, "problem", None),
            feature_names=None if names is None else tuple(names),
            languages=None if languages is None else tuple(languages),
            compiler=compiler or None,
            reads_callee_linkage=bool(getattr(policy, "reads_callee_linkage", False)),
        )


def decides(policy: object, language: str) -> bool:
    """Whether ``policy`` decides compiles of ``language``: a policy with ``languages`` (the families it was
    trained and shipped for, "C" or "C++") leaves the others to clang — its channel is not even opened."""
    languages = PolicyInfo.of(policy).languages
    return languages is None or family(language) in languages


def rules_out_actions(problem: Problem) -> bool:
    """Whether ``problem`` can refuse an answer at all (it masks actions or has its own rule): where it cannot,
    as for inlining, the decider skips the per-decision check."""
    cls = type(problem)
    return cls.action_mask is not Problem.action_mask or cls.invalid_action is not Problem.invalid_action


class Decider:
    """One channel's decisions in one compile: ``problem``'s, over its ``view`` of the channel's header,
    answered by ``policy`` for a module of ``language``.

    :meth:`decide` asks the policy — with no policy, clang's own answer is the decision, which is how a
    server answers for a policy that does not fit this compiler — and keeps what a loop may read after it:
    :attr:`heuristic` and :attr:`log_prob`; :attr:`index` counts the decisions made. :meth:`advice` turns an
    answer (the policy's, or an agent's in the gymnasium env) into the advice bytes clang reads, or raises
    :class:`~optgym.problems.InvalidAction` for an answer the problem rules out (never sent: a masked eviction
    index is a SIGSEGV in clang). ``memo`` (a greedy policy's answers, shared by every compile a server serves)
    is asked before the policy, keyed by all a :class:`DecisionPoint` gives such a policy but its index.

    Two calls per decision, and nothing kept that no loop reads: the same work written inline in the server's
    loop was ~0.1 µs per decision faster (of the ~1 µs the host spends on a memoized or heuristic answer).
    """

    __slots__ = (
        "_encoded",
        "_heuristic_action",
        "_rules",
        "header",
        "heuristic",
        "index",
        "language",
        "linkage",
        "log_prob",
        "memo",
        "policy",
        "problem",
        "view",
    )

    def __init__(
        self,
        problem: Problem,
        view: FeatureView,
        policy: Policy | None,
        language: str | None,
        *,
        memo: dict[tuple[Any, ...], Action] | None = None,
        linkage: CalleeLinkage | None = None,
    ) -> None:
        if policy is not None and language is not None and not decides(policy, language):
            policy = None  # a policy leaves this language to clang: clang's answers, and no input of its is read
        self.problem, self.view, self.policy, self.language, self.memo = problem, view, policy, language, memo
        self.linkage = linkage  # the compile's callee linkage, for a policy that reads it
        self.header: Header = view.header
        self._heuristic_action = problem.heuristic_action  # bound once: called at every decision
        self._rules = rules_out_actions(problem)
        self._encoded: dict[Any, bytes] = {}  # advice bytes by action: a channel's answers are few distinct values
        self.index = 0
        self.heuristic: int | None = None
        self.log_prob: float | None = None

    def decide(self, obs: Observation) -> Any:
        """The action at ``obs``: the policy's (the memo's, where it has it), or clang's own without a policy."""
        heuristic = self.heuristic = self._heuristic_action(self.view, obs)
        index = self.index
        self.index = index + 1
        policy = self.policy
        if policy is None:
            return heuristic  # log_prob stays None: a decider's policy never changes
        memo = self.memo
        if memo is not None:
            key: tuple[Any, ...] = (self.view, obs.raw, heuristic, self.language)
            if self.linkage is not None:  # the same features mean another input in another module
                key += (self.linkage.survives(obs),)
            action = memo.get(key)
            if action is not None:
                self.log_prob = None  # remembered answers keep no log-probability: a greedy policy's is not read
                return action
        choice = policy(DecisionPoint(self.view, obs, heuristic, index, self.language, self.problem, self.linkage))
        if isinstance(choice, tuple):
            action, self.log_prob = choice
        else:
            action, self.log_prob = choice, None
        if memo is not None:
            if len(memo) >= MEMO_ENTRIES:
                memo.clear()
            memo[key] = action
        return action

    def advice(self, obs: Observation, action: Any) -> bytes:
        """The bytes clang reads for ``action`` at ``obs``; :class:`InvalidAction` (with the problem's reason)
        for an answer the problem rules out there."""
        if self._rules and (why := self.problem.invalid_action(self.view, obs, action)) is not None:
            raise InvalidAction(why)
        try:
            advice = self._encoded.get(action)
        except TypeError:  # an unhashable action (a gymnasium Box's array): encoded each time
            return self.problem.encode_action(self.header, action)
        if advice is None:
            advice = self._encoded[action] = self.problem.encode_action(self.header, action)
        return advice
