"""What a policy network reads: the vocab-normalized features, plus optional *derived* inputs.

Why derived inputs: quantile normalization maps each feature on its own to ``[0, 1]``. The decisions
worth learning, though, are mostly "do what clang would, except where …", and clang's inliner decides
essentially ``cost_estimate < threshold`` — a comparison of two features of different scales that a
small MLP only approximates from their separately bucketized values. Handing it the heuristic's own
answer and that signed margin makes *agreeing with clang* the easy function, and a deviation the thing
the network has to learn (a residual policy). clang-22 sends the heuristic's answer with every
decision (``-inliner-interactive-include-default``), at training time and in a served build alike, so
a policy that reads it costs nothing to deploy.

Derived inputs are named, and the names are stored with the policy:

* ``heuristic`` — the heuristic's decision at this point, ``0`` or ``1``;
* ``cxx`` — ``1`` when the module is C++ (or Objective-C++), ``0`` otherwise: the same call-site
  features mean different things in C and C++ (a C++ callee is often a ``linkonce_odr`` template whose
  last inlined call deletes it), so a policy may decide differently — measured: moving clang's
  threshold shrinks C++ and grows C. The language is the module's in a rollout
  (:attr:`optgym.corpus.Module.language`) and the compile's in a served build
  (:func:`optgym.toolchain.language.driver_language`);
* ``callee_survives`` — ``1`` where the call site's callee stays in the object whatever is inlined (an
  ``external`` function of this translation unit, or one whose address is taken: a vtable's slot keeps a virtual
  destructor): inlining such a callee is pure growth, where inlining a
  ``linkonce_odr`` one can delete its last copy. clang never sends linkage; the loop that asks the policy
  supplies it from the compile itself (:mod:`optgym.rollout.linkage`): clang names the callee of each call site
  its heuristic refuses, and a call site it inlines itself reads ``1``;
* ``deletes:K`` — ``1`` where the callee has at most ``K`` users and does not survive (``callee_survives`` is
  ``0``): a call site whose inlining, with the callee's few other uses, deletes the body and its frame record.
  Half of what the shipped C++ rule saves per object is ``.eh_frame``, the records of functions that go
  (docs/experiments/2026-11-29-where-the-bytes-go.md). A conjunction, because a sum of the two gates' weights
  cannot give the callees that stay nothing while giving the others much;
* ``at_most:A:K`` — ``1`` where raw feature ``A`` is at most the integer ``K`` (a gate: the shipped policy
  moves clang's threshold only for callees with few users, ``at_most:callee_users:2``);
* ``at_least:A:K`` — ``1`` where raw feature ``A`` is at least ``K`` (a gate on the module's size, say:
  ``at_least:node_count:20``);
* ``margin:A-B`` — ``sign(A - B) · log1p(|A - B|) / 8`` of two raw features ``A`` and ``B``
  (``margin:threshold-cost_estimate`` is positive where clang's cost model inlines); the ``/ 8``
  keeps the usual range (|A - B| up to a few thousand) near ``[-1, 1]``.

They follow the normalized features, in the order named: inputs ``[features × 4, extras…]``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from optgym.problems.normalize import Normalizer, Vocab, VocabError

HEURISTIC_INPUT = "heuristic"
CXX_INPUT = "cxx"
SURVIVES_INPUT = "callee_survives"
#: The 0/1 inputs the loop gives (clang's answer, the language, the callee's linkage), not read off the features.
GIVEN = (HEURISTIC_INPUT, CXX_INPUT, SURVIVES_INPUT)
MARGIN_PREFIX = "margin:"
AT_MOST_PREFIX = "at_most:"
AT_LEAST_PREFIX = "at_least:"
DELETES_PREFIX = "deletes:"
#: The raw feature a ``deletes:K`` input bounds.
USERS_FEATURE = "callee_users"
#: The kinds of derived input that read the callee's linkage: a loop asking such a policy learns it first.
READS_LINKAGE = (SURVIVES_INPUT, "deletes")
#: The bound gates: kind → whether raw value ``v`` passes bound ``k``.
BOUNDS = {"at_most": lambda v, k: v <= k, "at_least": lambda v, k: v >= k}
MARGIN_SCALE = 8.0
#: What ``optgym train imitate`` and ``--extras residual`` give a network for inline-size.
RESIDUAL_EXTRAS = (HEURISTIC_INPUT, "margin:threshold-cost_estimate")


def parse_extras(extras: Sequence[str], names: Sequence[str]) -> list[tuple[str, int, int]]:
    """``(kind, a, b)`` per derived input: ``a``/``b`` the raw-feature columns of a margin, the column and
    bound of an ``at_most`` or ``at_least``, else -1."""
    parsed = []
    for extra in extras:
        if extra in GIVEN:
            parsed.append((extra, -1, -1))
            continue
        if extra.startswith((AT_MOST_PREFIX, AT_LEAST_PREFIX)) and extra.count(":") == 2:
            kind, feature, bound = extra.split(":")
            if feature not in names:
                raise VocabError(f"derived input {extra!r} names feature {feature!r}, which the vocab does not have")
            try:
                parsed.append((kind, list(names).index(feature), int(bound)))
            except ValueError:
                raise VocabError(f"derived input {extra!r}: the bound must be an integer") from None
            continue
        if extra.startswith(DELETES_PREFIX) and extra.count(":") == 1:
            bound = extra[len(DELETES_PREFIX) :]
            if USERS_FEATURE not in names or not bound.isdigit():
                raise VocabError(f"derived input {extra!r}: deletes:K takes an integer K and needs {USERS_FEATURE!r}")
            parsed.append(("deletes", list(names).index(USERS_FEATURE), int(bound)))
            continue
        if extra.startswith(MARGIN_PREFIX) and "-" in extra[len(MARGIN_PREFIX) :]:
            a, b = extra[len(MARGIN_PREFIX) :].split("-", 1)
            missing = [f for f in (a, b) if f not in names]
            if missing:
                raise VocabError(f"derived input {extra!r} names features {missing} that the vocab does not have")
            parsed.append(("margin", list(names).index(a), list(names).index(b)))
            continue
        raise VocabError(
            f"unknown derived input {extra!r}: 'heuristic', 'cxx', 'callee_survives', 'deletes:K', 'at_most:A:K', "
            "'at_least:A:K' or 'margin:A-B' "
            "(A, B feature names)"
        )
    return parsed


def reads_linkage(kinds: Iterable[str]) -> bool:
    """Whether derived inputs of these kinds (or names) read the callee's linkage, which the loop must learn."""
    return any(kind in READS_LINKAGE or kind.startswith(DELETES_PREFIX) for kind in kinds)


def margin(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``sign(a - b) · log1p(|a - b|) / 8`` (float64), computed as ``log(1 + |a - b|)``: the operations an
    exported ONNX graph performs (it has no Log1p), so both give the same bits."""
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    return np.sign(d) * np.log(np.abs(d) + 1.0) / MARGIN_SCALE


_GIVEN_WHAT = {HEURISTIC_INPUT: "the heuristic's decision", CXX_INPUT: "the module's language",
               SURVIVES_INPUT: "the callee's linkage (optgym.rollout.linkage)"}  # fmt: skip


def _given(kind: str, heuristic: Any, cxx: Any, survives: Any) -> Any:
    """The caller's value for a ``heuristic``, ``cxx`` or ``callee_survives`` input; a clear error if it had none."""
    value = heuristic if kind == HEURISTIC_INPUT else cxx if kind == CXX_INPUT else survives
    if value is None:
        raise VocabError(f"this policy reads {_GIVEN_WHAT[kind]}, and none was given")
    return value


class PolicyInputs:
    """``(raw features [..., F], heuristic [...], …) → network inputs [..., F × 4 + E]`` (float64 or as asked)."""

    def __init__(self, vocab: Vocab, extras: Sequence[str] = ()) -> None:
        self.normalizer = Normalizer(vocab)
        self.extras = list(extras)
        self.parsed = parse_extras(self.extras, self.normalizer.names)
        self.width = self.normalizer.width + len(self.extras)
        #: Whether ``callee_survives`` is read: asked at every decision a policy makes, so computed once here.
        self.needs_linkage = reads_linkage(kind for kind, _, _ in self.parsed)

    @property
    def needs_heuristic(self) -> bool:
        return any(kind == HEURISTIC_INPUT for kind, _, _ in self.parsed)

    @property
    def needs_language(self) -> bool:
        return any(kind == CXX_INPUT for kind, _, _ in self.parsed)

    def __call__(
        self,
        raw: np.ndarray,
        heuristic: np.ndarray | int | None = None,
        cxx: np.ndarray | int | None = None,
        survives: np.ndarray | int | None = None,
        dtype: type = np.float64,
    ) -> np.ndarray:
        normalized = self.normalizer(raw, dtype=np.float64)
        if not self.parsed:
            return normalized if dtype == np.float64 else normalized.astype(dtype)
        raw = np.asarray(raw, dtype=np.float64)
        if raw.ndim == 1:
            return self._one(raw, normalized, heuristic, cxx, survives, dtype)
        columns = []
        for kind, a, b in self.parsed:
            if kind in GIVEN:
                flag = np.asarray(_given(kind, heuristic, cxx, survives), dtype=np.float64) > 0
                columns.append(np.broadcast_to(flag.astype(np.float64), raw.shape[:-1]))
            elif kind in BOUNDS:
                columns.append(BOUNDS[kind](raw[..., a], b).astype(np.float64))
            elif kind == "deletes":
                stays = np.asarray(_given(SURVIVES_INPUT, heuristic, cxx, survives), dtype=np.float64) > 0
                columns.append(((raw[..., a] <= b) & ~stays).astype(np.float64))
            else:
                columns.append(margin(raw[..., a], raw[..., b]))
        out = np.concatenate([normalized, np.stack(columns, axis=-1)], axis=-1)
        return out if dtype == np.float64 else out.astype(dtype)

    def _one(
        self, raw: np.ndarray, normalized: np.ndarray, heuristic: Any, cxx: Any, survives: Any, dtype: type
    ) -> np.ndarray:
        """One decision's inputs: the normalized features, then :meth:`extras_of_one`."""
        out = np.empty(self.width, dtype=np.float64)
        width = self.normalizer.width
        out[:width] = normalized
        out[width:] = self.extras_of_one(raw, heuristic, cxx, survives)
        return out if dtype == np.float64 else out.astype(dtype)

    def extras_of_one(self, raw: np.ndarray, heuristic: Any, cxx: Any, survives: Any = None) -> list[float]:
        """One decision's derived inputs (``raw`` one feature vector), computed as scalars: a served build
        asks one decision at a time, and broadcasting costs ~90 µs of numpy calls per row (measured) for
        a handful of numbers. Bit for bit the batched values: the margin takes the same ``np.log`` ufunc,
        everything else is exact."""
        values = raw.tolist()
        out = []
        for kind, a, b in self.parsed:
            if kind in GIVEN:
                out.append(1.0 if _given(kind, heuristic, cxx, survives) > 0 else 0.0)
            elif kind in BOUNDS:
                out.append(1.0 if BOUNDS[kind](values[a], b) else 0.0)
            elif kind == "deletes":
                out.append(1.0 if values[a] <= b and not _given(SURVIVES_INPUT, heuristic, cxx, survives) > 0 else 0.0)
            else:
                d = values[a] - values[b]
                out.append(math.copysign(float(np.log(np.float64(abs(d) + 1.0))), d) / MARGIN_SCALE if d else 0.0)
        return out


__all__ = [
    "CXX_INPUT",
    "GIVEN",
    "HEURISTIC_INPUT",
    "RESIDUAL_EXTRAS",
    "SURVIVES_INPUT",
    "PolicyInputs",
    "margin",
    "parse_extras",
    "reads_linkage",
]
