"""A linear scorer over candidate columns: the policy form of problems whose action picks one candidate.

The eviction advisor describes each of its 33 candidates by the same features, one column each (see
:mod:`optgym.problems.regalloc_evict`). A scorer gives every column ``score = Σ_f w_f · x_f`` and picks
the valid column (``mask``) of highest score — MLGO's eviction model scores columns the same way, with
a network where this has one weight per feature. Its start, ``w = -1`` on ``use_def_density``, is the
default advisor's rule in one line: evict what interferes least, unless the register being allocated
(the last column) is lighter still. Few parameters and no normalizer suit evolution strategies, whose
sample cost grows with the parameter count.

A problem whose action is one number rather than a pick (the allocator's priority of a live range)
is decided by the same few weights read as exponents: :class:`LogLinearScorer`, ``value = e^b · Π_f
x_f^{w_f}``. A problem names its form (``Problem.scorer_form``); :meth:`CandidateScorer.initial` and
:meth:`CandidateScorer.load` build the right class.

On disk a scorer is a directory with one ``policy.json``: ``{"kind": "optgym-policy", "form":
"candidate-scorer", "problem", "features", "weights", "source", "languages"}`` (``languages``: the
families it decides, ``null`` for all); a log-linear one has form "log-linear-scorer" and adds
``bias`` and ``ceiling``; a residual one (:class:`ResidualScorer`) has form "residual-scorer" and adds
``hidden``: ``{"U", "c", "v"}``.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from optgym.files import atomic_write_bytes, read_versioned
from optgym.policies.mlp import PolicyFileError
from optgym.problems import ProblemError, problem_class
from optgym.rollout.rollout import DecisionPoint

FORM = "candidate-scorer"
LOG_LINEAR_FORM = "log-linear-scorer"
RESIDUAL_FORM = "residual-scorer"
#: Where a log-linear scorer's inputs are cut from below before the logarithm (a spill weight of 0, say).
TINY = 1e-30


class CandidateScorer:
    """``argmax over valid columns c of Σ_f w_f · x_{f,c}``; greedy (a scorer has no sampling mode)."""

    greedy = True
    form: str = FORM

    def __init__(
        self,
        weights: Mapping[str, float],
        *,
        problem: str,
        mask: str = "mask",
        source: dict[str, Any] | None = None,
        languages: Sequence[str] | None = None,
    ) -> None:
        """``languages``: the families ("C", "C++") the scorer decides; ``None``, all (see
        :func:`optgym.rollout.episode.decides`)."""
        self.languages = None if languages is None else list(languages)
        self.features = list(weights)
        self.weights = np.asarray([weights[f] for f in self.features], dtype=np.float64)
        self.problem, self.source = problem, source or {}
        self.mask: str | None = mask  # None: a scorer without one (LogLinearScorer)
        self._read: list[str] = [*self.features, mask]

    @classmethod
    def initial(cls, problem: str, **kw: Any) -> CandidateScorer:
        """The problem's own starting rule (its ``scorer_start``), every other column feature at weight 0; a
        :class:`LogLinearScorer` where the problem's action is a number."""
        spec = problem_class(problem)
        if spec.scorer_start is None:
            raise ProblemError(f"{problem} has no candidate columns to score")
        if spec.scorer_form == "log-linear":
            return LogLinearScorer(dict(spec.scorer_start), problem=problem, bias=spec.scorer_bias_start,
                                   ceiling=spec.scorer_ceiling, **kw)  # fmt: skip
        return cls(dict(spec.scorer_start), problem=problem, **kw)

    @property
    def feature_names(self) -> list[str]:
        """Every feature the scorer reads (its columns and the mask): a compiler must send them all."""
        return list(self._read)

    def column_scores(self, columns: np.ndarray) -> np.ndarray:
        """The score of every column of ``columns`` (one row per feature), before the mask."""
        return self.weights @ columns

    def scores(self, features: Mapping[str, np.ndarray]) -> np.ndarray:
        """Every column's score, ``-inf`` where the mask rules the column out."""
        columns = np.stack([np.asarray(features[f], dtype=np.float64).ravel() for f in self.features])
        scores = self.column_scores(columns)
        if self.mask is not None:
            scores[np.asarray(features[self.mask]).ravel() == 0] = -np.inf
        return scores

    def __call__(self, point: DecisionPoint) -> tuple[int | float, float]:
        # one matrix straight from the stream's bytes, the mask its last row: ~10x faster than scores(dict)
        rows = point.rows(self._read)
        scores = self.column_scores(rows[:-1])
        scores[rows[-1] == 0] = -np.inf
        return int(np.argmax(scores)), 0.0

    def stochastic(self, seed: int | None = None) -> CandidateScorer:
        return self

    # -- parameters as one vector (ES) -----------------------------------------------------

    def parameters(self) -> np.ndarray:
        return self.weights.copy()

    def with_parameters(self, flat: np.ndarray) -> CandidateScorer:
        if flat.shape != self.weights.shape:
            raise ValueError(f"expected {self.weights.size} parameters, got {flat.size}")
        clone = copy.copy(self)
        clone.weights = np.asarray(flat, dtype=np.float64).copy()
        return clone

    # -- files -----------------------------------------------------------------------------

    def save(self, directory: Path | str) -> Path:
        """Write ``directory/policy.json`` (atomically: a temporary file renamed into place)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        meta = {
            "kind": "optgym-policy",
            "form": self.form,
            "problem": self.problem,
            "mask": self.mask,
            "features": self.features,
            "weights": self.weights.tolist(),
            "source": self.source,
            "languages": self.languages,
            **self._more_meta(),
        }
        atomic_write_bytes(directory / "policy.json", json.dumps(meta, indent=2).encode())
        return directory

    @classmethod
    def load(cls, directory: Path | str) -> CandidateScorer:
        meta = read_versioned(Path(directory) / "policy.json", error=PolicyFileError, what="policy",
                              missing="not a policy directory", max_version=1)  # fmt: skip
        if meta.get("form") not in _FORMS or len(meta.get("features", ())) != len(meta.get("weights", ())):
            raise PolicyFileError(f"{directory}/policy.json is not a candidate scorer")
        weights = dict(zip(meta["features"], meta["weights"], strict=True))
        common = {"problem": meta["problem"], "source": meta.get("source", {}), "languages": meta.get("languages")}
        if meta["form"] == LOG_LINEAR_FORM:
            return LogLinearScorer(weights, bias=float(meta["bias"]), ceiling=float(meta["ceiling"]), **common)
        if meta["form"] == RESIDUAL_FORM:
            try:
                layer = {key: np.asarray(meta["hidden"][key], dtype=np.float64) for key in ("U", "c", "v")}
                return ResidualScorer(weights, **layer, mask=meta.get("mask", "mask"), **common)
            except (KeyError, TypeError, ValueError) as e:
                raise PolicyFileError(f"{directory}/policy.json: a residual scorer's hidden layer: {e}") from None
        return cls(weights, mask=meta.get("mask", "mask"), **common)

    def _more_meta(self) -> dict[str, Any]:
        return {}


class LogLinearScorer(CandidateScorer):
    """``value = min(e^(b + Σ_f w_f · ln max(x_f, TINY)), ceiling)``: the action of a problem whose answer is
    one number (a live range's allocation priority). The weights are exponents — ``e^b · Π_f x_f^{w_f}`` —
    so a start like "10⁶ · spill weight" is one weight and the bias; and the order of values, which is all a
    priority queue reads, moves smoothly with them. Parameters for ES: the weights, then ``b``."""

    form = LOG_LINEAR_FORM

    def __init__(
        self,
        weights: Mapping[str, float],
        *,
        problem: str,
        bias: float = 0.0,
        ceiling: float = float("inf"),
        source: dict[str, Any] | None = None,
        languages: Sequence[str] | None = None,
    ) -> None:
        super().__init__(weights, problem=problem, source=source, languages=languages)
        self.bias, self.ceiling = float(bias), float(ceiling)
        self._log_ceiling = math.log(self.ceiling)  # the hot path's cut-off, computed once
        self.mask, self._read = None, list(self.features)  # no mask: every answer is valid

    def log_values(self, rows: np.ndarray) -> np.ndarray:
        """``b + Σ_f w_f ln x_f`` of each column of ``rows`` (one row per feature, finite values)."""
        return self.bias + self.weights @ np.log(np.maximum(rows, TINY))

    def values(self, rows: np.ndarray) -> np.ndarray:
        """The answers for the columns of ``rows``: ``e^log_value``, or the ceiling itself from ``ln ceiling`` up
        (the exponential taken below it only: no overflow)."""
        logs, top = self.log_values(rows), np.log(self.ceiling)
        return np.where(logs >= top, self.ceiling, np.exp(np.minimum(logs, top)))

    def scores(self, features: Mapping[str, np.ndarray]) -> np.ndarray:
        """The answer for raw features by name (each one value, or a row of them)."""
        rows = np.stack([np.asarray(features[f], dtype=np.float64).ravel() for f in self.features])
        return self.values(np.nan_to_num(rows, nan=0.0))

    def __call__(self, point: DecisionPoint) -> tuple[float, float]:
        # plain floats: clang asks once per live range queued, and numpy's per-call cost on three numbers is
        # most of the host's time per decision
        log_value = self.bias
        for weight, x in zip(self.weights.tolist(), point.firsts(self._read), strict=True):
            log_value += weight * math.log(max(x, TINY))
        return (self.ceiling if log_value >= self._log_ceiling else math.exp(log_value)), 0.0

    def parameters(self) -> np.ndarray:
        return np.append(self.weights, self.bias)

    def with_parameters(self, flat: np.ndarray) -> LogLinearScorer:
        if flat.shape != (self.weights.size + 1,):
            raise ValueError(f"expected {self.weights.size + 1} parameters, got {flat.size}")
        clone = copy.copy(self)
        clone.weights, clone.bias = np.asarray(flat[:-1], dtype=np.float64).copy(), float(flat[-1])
        return clone

    def _more_meta(self) -> dict[str, Any]:
        return {"bias": self.bias, "ceiling": self.ceiling}


class ResidualScorer(CandidateScorer):
    """``score_c = Σ_f w_f x_{f,c} + Σ_h v_h tanh(c_h + Σ_f U_{f,h} z_{f,c})``, ``z = sign(x) ln(1 + |x|)``.

    Why: the linear scorer weighs each feature alone, and on the training modules it stopped improving at
    ~0.995 of ``-Oz`` however ES was run (docs/experiments/2026-11-24-register-allocation.md) — whether
    evicting a range pays may depend on two features together (a long range that is also local; a dense one
    that is also hinted). A few hidden units can learn such a pairing; the log keeps the counts and lengths,
    which span 1 to 10⁴, from saturating ``tanh``. It starts as the linear scorer it extends (``v = 0``,
    :meth:`extending`), so ES begins from that scorer's decisions exactly. Parameters for ES: ``w``, then ``U``
    (row-major, one row per feature), ``c``, ``v``."""

    form = RESIDUAL_FORM

    def __init__(
        self,
        weights: Mapping[str, float],
        *,
        U: np.ndarray,
        c: np.ndarray,
        v: np.ndarray,
        **kw: Any,
    ) -> None:
        super().__init__(weights, **kw)
        self.U, self.c, self.v = (np.asarray(a, dtype=np.float64) for a in (U, c, v))
        hidden = self.c.size
        if self.U.shape != (len(self.features), hidden) or self.v.shape != (hidden,):
            raise ValueError(
                f"a hidden layer of {hidden} units over {len(self.features)} features needs U "
                f"{len(self.features)}×{hidden} and v of {hidden}; got U {self.U.shape}, v {self.v.shape}"
            )

    @classmethod
    def extending(cls, linear: CandidateScorer, hidden: int, *, seed: int = 0) -> ResidualScorer:
        """``linear`` with ``hidden`` units added whose output weights are 0: the same decisions, more to tune."""
        if hidden < 1 or isinstance(linear, LogLinearScorer) or linear.mask is None:
            raise ValueError("a residual scorer extends a linear candidate scorer by at least one unit")
        rng = np.random.default_rng(seed)
        n = len(linear.features)
        weights = dict(zip(linear.features, linear.weights.tolist(), strict=True))
        layer = {"U": rng.normal(0.0, n**-0.5, (n, hidden)), "c": np.zeros(hidden), "v": np.zeros(hidden)}
        return cls(weights, **layer, problem=linear.problem, mask=linear.mask, source=linear.source,
                   languages=linear.languages)  # fmt: skip

    def column_scores(self, columns: np.ndarray) -> np.ndarray:
        z = np.sign(columns) * np.log1p(np.abs(columns))
        return self.weights @ columns + self.v @ np.tanh(self.U.T @ z + self.c[:, None])

    def parameters(self) -> np.ndarray:
        return np.concatenate([self.weights, self.U.ravel(), self.c, self.v])

    def with_parameters(self, flat: np.ndarray) -> ResidualScorer:
        n, hidden = self.U.shape
        if flat.shape != (n + n * hidden + 2 * hidden,):
            raise ValueError(f"expected {n + n * hidden + 2 * hidden} parameters, got {flat.size}")
        flat = np.asarray(flat, dtype=np.float64)
        clone = copy.copy(self)
        clone.weights = flat[:n].copy()
        clone.U = flat[n : n + n * hidden].reshape(n, hidden).copy()
        clone.c = flat[n + n * hidden : n + n * hidden + hidden].copy()
        clone.v = flat[n + n * hidden + hidden :].copy()
        return clone

    def _more_meta(self) -> dict[str, Any]:
        return {"hidden": {"U": self.U.tolist(), "c": self.c.tolist(), "v": self.v.tolist()}}


_FORMS = (FORM, LOG_LINEAR_FORM, RESIDUAL_FORM)


def is_scorer_dir(path: Path) -> bool:
    """A directory holding a scorer's ``policy.json`` (either form)."""
    try:
        return json.loads((Path(path) / "policy.json").read_text()).get("form") in _FORMS
    except (OSError, ValueError):
        return False


__all__ = [
    "FORM",
    "LOG_LINEAR_FORM",
    "RESIDUAL_FORM",
    "CandidateScorer",
    "LogLinearScorer",
    "ResidualScorer",
    "is_scorer_dir",
]
