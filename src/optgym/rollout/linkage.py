"""Which call sites call a function whose body stays in the object anyway: callee linkage, learned by the host.

Why: inlining for size pays where the inlined callee's last copy can then go (``internal``, ``linkonce_odr``), and
is pure growth where the body stays whatever happens (an ``external`` function of this translation unit). The
shipped rule's losses sit at the second kind, and no policy can tell them apart: clang's channel sends numbers,
never the callee's name or linkage (docs/experiments/2026-11-27-callee-linkage.md). A host can learn it with
no change to clang, from one compile it makes first:

1. compile the module with clang's own decisions through the channel, with the optimization record, which names
   each decision's callee in decision order, and keep the object;
2. read each callee's linkage off that object's symbol table (a global text symbol stays; a weak one, a local
   one or one the compile deleted could go): the same source a served build has, where there is no bitcode;
3. key every decision by its features, without the module-wide counters that every inline moves
   (``node_count``, ``edge_count``). A key all of whose callees stay is a *surviving-callee* key.

A later compile of the same module, by any policy, then asks :meth:`CalleeLinkage.survives` at each decision:
whether its key is one of those. Decisions before the policy's first departure from clang's are the first
compile's own, and most after it are too (an inline changes its caller's features, not the others').
The derived input ``callee_survives`` (:mod:`optgym.problems.inputs`) hands the answer to a policy.
"""

from __future__ import annotations

import subprocess
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from optgym.problems import FeatureView, Problem
from optgym.protocol import Observation
from optgym.toolchain.interactive import InteractiveCompile
from optgym.toolchain.remarks import read_remarks

#: Features every inline moves, module-wide: left out of the key that finds a call site again.
MODULE_WIDE = ("node_count", "edge_count")
#: ``llvm-nm`` kinds of a defined function whose body stays in the object whatever is inlined: global text.
SURVIVING_SYMBOLS = frozenset("T")
#: The optimization record's remarks that name each inlining decision's callee (pass, argument).
DECISION_REMARKS = ("inline-ml", "Callee")


def key_columns(names: Sequence[str]) -> list[int]:
    """The positions, among a feature view's ``names``, of the features a call site's key is made of."""
    return [i for i, name in enumerate(names) if name not in MODULE_WIDE]


@dataclass(frozen=True)
class CalleeLinkage:
    """The surviving-callee keys of one module, found by a first compile (see the module docstring)."""

    keys: frozenset[tuple[int, ...]]
    #: The view's feature names the keys were made over, in order: a later view must read the same ones.
    names: tuple[str, ...]
    status: str = "ok"  # why the table is empty, where it is: the first compile failed, or its record did not align

    @cached_property
    def _columns(self) -> list[int]:
        return key_columns(self.names)

    def survives(self, view: FeatureView, obs: Observation) -> bool:
        """Whether this decision's call site was seen, in the first compile, only with callees that stay. ``view``
        reads the features the table was made over (the same problem's)."""
        if not self.keys:
            return False
        vector = view.vector(obs)
        return tuple(int(vector[i]) for i in self._columns) in self.keys

    @classmethod
    def empty(cls, names: Sequence[str], status: str) -> CalleeLinkage:
        return cls(frozenset(), tuple(names), status)

    @classmethod
    def from_decisions(
        cls, names: Sequence[str], features: np.ndarray, callees: Sequence[str], surviving: Iterable[str]
    ) -> CalleeLinkage:
        """The table of a first compile: its decisions' ``features`` ``[T, F]`` (over ``names``, as a view's
        :meth:`~optgym.problems.FeatureView.vector` gives them), the callee each was about, and the functions
        whose bodies stay. A key seen with any deletable callee is not a surviving one: the input must never
        call a site the policy could win at a losing one."""
        stays = set(surviving)
        seen: dict[tuple[int, ...], set[bool]] = defaultdict(set)
        columns = key_columns(names)
        for row, callee in zip(np.asarray(features)[:, columns].astype(np.int64).tolist(), callees, strict=True):
            seen[tuple(row)].add(callee in stays)
        return cls(frozenset(k for k, kinds in seen.items() if kinds == {True}), tuple(names))

    def to_json(self) -> dict:
        return {"names": list(self.names), "keys": sorted(list(k) for k in self.keys), "status": self.status}

    @classmethod
    def from_json(cls, value: dict) -> CalleeLinkage:
        return cls(frozenset(tuple(k) for k in value["keys"]), tuple(value["names"]), value.get("status", "ok"))


def defined_symbols(obj: Path, llvm_nm: str) -> dict[str, str]:
    """Each symbol defined in object ``obj`` and its ``llvm-nm`` kind (``T`` global text, ``W`` weak, ``t`` local …)."""
    out = subprocess.run([llvm_nm, "--defined-only", str(obj)], capture_output=True, text=True, check=True).stdout
    return {parts[2]: parts[1] for parts in map(str.split, out.splitlines()) if len(parts) == 3}


def surviving_functions(obj: Path, llvm_nm: str) -> set[str]:
    """The functions defined in object ``obj`` whose bodies stay whatever a compile inlines: global text
    symbols. Weak (``linkonce_odr``), local and absent ones (deleted, or never defined here) could go."""
    return {name for name, kind in defined_symbols(obj, llvm_nm).items() if kind in SURVIVING_SYMBOLS}


def learn_linkage(
    compile_: InteractiveCompile, problem: Problem, record: Path, obj: Path, llvm_nm: str
) -> CalleeLinkage:
    """The callee linkage a first compile shows: ``compile_`` (not started; one channel, ``problem``'s, writing
    optimization record ``record`` and object ``obj``) answered with clang's own decisions. A compile that fails, or
    whose record does not name one callee per decision, gives an empty table, its ``status`` saying why."""
    names = problem.visible_features()
    features: list[np.ndarray] = []
    with compile_:
        if compile_.start() is not None:
            header = compile_.header
            assert header is not None
            view = problem.view(header)
            while (obs := compile_.next_observation()) is not None:
                features.append(view.vector(obs))
                compile_.answer(problem.encode_action(header, problem.heuristic_action(view, obs)))
        outcome = compile_.finish()
    if not outcome.ok or outcome.returncode != 0:
        return CalleeLinkage.empty(names, f"first compile: {outcome.status} {outcome.detail}".strip())
    pass_name, argument = DECISION_REMARKS
    callees = [r.get(argument, "") for r in read_remarks(record, pass_name)] if record.exists() else []
    if len(callees) != len(features):
        return CalleeLinkage.empty(names, f"{len(callees)} remarks for {len(features)} decisions")
    matrix = np.stack(features) if features else np.zeros((0, len(names)), np.float32)
    return CalleeLinkage.from_decisions(names, matrix, callees, surviving_functions(obj, llvm_nm))


__all__ = [
    "DECISION_REMARKS",
    "MODULE_WIDE",
    "CalleeLinkage",
    "defined_symbols",
    "key_columns",
    "learn_linkage",
    "surviving_functions",
]
