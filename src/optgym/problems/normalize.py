"""Feature normalization from a vocab of per-feature quantiles, as MLGO does it — in one place.

Both the env wrappers (``optgym.env.wrappers.NormalizeFeatures``) and the policies (training and the
torch-free serving path inside rollout workers) call :class:`Normalizer`, so a network always sees
the same numbers whether it runs under gymnasium or inside a compile.

The facts, from LLVM's ml-compiler-opt (``sparse_bucket_generator``, ``feature_ops``):

* A vocab holds, per feature, ``num_buckets`` (1000) quantile boundaries: ``np.quantile`` of the
  feature's values at ``linspace(0, 1, num_buckets)``, computed on a random subset of the trace
  (``sampling_fraction``, drawn without replacement).
* A value ``v`` becomes ``x = bucket(v) / len(boundaries)``, where ``bucket(v)`` counts the
  boundaries ``≤ v`` (TensorFlow's ``Bucketize``), so ``x ∈ [0, 1]``; the network gets ``x``,
  ``x²`` and ``√x``, plus a z-score of the value against the quantiles' mean and spread.
  MLGO takes that z-score on ``log(v + first_positive_quantile)``; a few clang-22 features are
  negative (``cost_estimate``, ``sroa_losses`` can be), where that log is undefined, so here the
  value is first shifted by the lowest quantile and clipped at 0 — identical to MLGO's for features
  whose quantiles start at 0, which is nearly all of them.

Each feature thus becomes :data:`PER_FEATURE` numbers, laid out feature by feature
(``[f0: x, x², √x, z, f1: …]``), in the vocab's feature order (the problem's order).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from optgym.errors import OptgymError

VOCAB_FORMAT_VERSION = 1
VOCAB_KIND = "optgym-vocab"
DEFAULT_BUCKETS = 1000
PER_FEATURE = 4  # x, x², √x, z(log)
_EPS = 1e-8


class VocabError(OptgymError):
    """A vocab file that cannot be read, or does not fit the features it is asked to normalize."""


@dataclass
class Vocab:
    """Per-feature quantile boundaries, in the problem's feature order."""

    features: dict[str, list[float]]
    problem: str = "inline-size"
    num_buckets: int = DEFAULT_BUCKETS
    sampling_fraction: float = 1.0
    samples: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return list(self.features)

    def to_json(self) -> str:
        return json.dumps(
            {
                "kind": VOCAB_KIND,
                "format_version": VOCAB_FORMAT_VERSION,
                "problem": self.problem,
                "num_buckets": self.num_buckets,
                "sampling_fraction": self.sampling_fraction,
                "samples": self.samples,
                "meta": self.meta,
                "features": self.features,
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str, source: str = "vocab") -> Vocab:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise VocabError(f"{source} is not JSON: {e}") from None
        if not isinstance(data, dict) or data.get("kind") != VOCAB_KIND:
            raise VocabError(f"{source} is not an optgym vocab (no kind={VOCAB_KIND!r})")
        version = data.get("format_version")
        if not isinstance(version, int) or version > VOCAB_FORMAT_VERSION:
            raise VocabError(f"{source} has vocab format {version!r}; this optgym reads ≤ {VOCAB_FORMAT_VERSION}")
        features = data.get("features")
        if not isinstance(features, dict) or not features:
            raise VocabError(f"{source} has no features")
        for name, bounds in features.items():
            if not isinstance(bounds, list) or not bounds or sorted(bounds) != bounds:
                raise VocabError(f"{source}: feature {name!r} needs a non-empty sorted list of boundaries")
        return cls(
            features={k: [float(b) for b in v] for k, v in features.items()},
            problem=data.get("problem", "inline-size"),
            num_buckets=int(data.get("num_buckets", DEFAULT_BUCKETS)),
            sampling_fraction=float(data.get("sampling_fraction", 1.0)),
            samples=int(data.get("samples", 0)),
            meta=data.get("meta", {}),
        )

    def save(self, path: Path | str) -> None:
        from optgym.files import atomic_write_bytes

        atomic_write_bytes(Path(path), self.to_json().encode())

    @classmethod
    def load(cls, path: Path | str) -> Vocab:
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise VocabError(f"cannot read vocab {path}: {e}") from None
        return cls.from_json(text, str(path))


def quantile_boundaries(
    values: np.ndarray, num_buckets: int = DEFAULT_BUCKETS, sampling_fraction: float = 1.0, rng=None
) -> list[float]:
    """MLGO's boundaries for one feature: quantiles at ``linspace(0, 1, num_buckets)`` of a sample."""
    values = np.asarray(values, dtype=np.float64).ravel()
    if values.size == 0:
        return [0.0]
    if sampling_fraction < 1.0:
        rng = rng or np.random.default_rng(0)
        k = max(1, int(np.floor(values.size * sampling_fraction)))
        values = rng.choice(values, size=k, replace=False)
    return np.quantile(values, np.linspace(0.0, 1.0, num_buckets)).tolist()


def build_vocab(
    columns: Mapping[str, np.ndarray],
    *,
    problem: str = "inline-size",
    num_buckets: int = DEFAULT_BUCKETS,
    sampling_fraction: float = 1.0,
    seed: int = 0,
    meta: dict[str, Any] | None = None,
) -> Vocab:
    """A vocab from each feature's values (in the order given: keep the problem's order)."""
    if not 0.0 < sampling_fraction <= 1.0:
        raise VocabError(f"sampling fraction must be in (0, 1], not {sampling_fraction}")
    rng = np.random.default_rng(seed)
    features = {
        name: quantile_boundaries(values, num_buckets, sampling_fraction, rng) for name, values in columns.items()
    }
    samples = len(next(iter(columns.values()))) if columns else 0
    return Vocab(features, problem, num_buckets, sampling_fraction, samples, meta or {})


class Normalizer:
    """``raw feature vector [..., F] → normalized [..., F × PER_FEATURE]`` (float32), vectorized.

    The per-decision cost matters (it runs inside every compile, between two of clang's decisions),
    so every feature is bucketized by *one* ``np.searchsorted`` over all features' boundaries laid
    end to end: feature ``f``'s boundaries and values are shifted into the disjoint interval
    ``[f·R, (f+1)·R)`` (values clipped to the vocab's overall range first, which changes no
    bucket). That is exact while the shifted numbers stay within float64's integer range; beyond it
    (never for inline-size) a per-feature loop is used.
    """

    def __init__(self, vocab: Vocab, names: Sequence[str] | None = None) -> None:
        names = list(names) if names is not None else vocab.names
        missing = [n for n in names if n not in vocab.features]
        if missing:
            raise VocabError(f"the vocab has no boundaries for the features {missing}")
        self.vocab, self.names = vocab, names
        self.width = len(names) * PER_FEATURE
        bounds = [np.asarray(vocab.features[n], dtype=np.float64) for n in names]
        self._bounds = bounds
        self._count = np.array([len(b) for b in bounds], dtype=np.float64)
        # the z-score of log(v - lowest + first positive gap), against the same transform of the quantiles
        self._low = np.array([b[0] for b in bounds])
        self._gap = np.array([_first_positive(b - b[0]) for b in bounds])
        logq = [np.log(b - b[0] + g) for b, g in zip(bounds, self._gap, strict=True)]
        self._mean = np.array([q.mean() for q in logq])
        self._std = np.array([q.std() for q in logq]) + _EPS
        lo = min(b[0] for b in bounds) - 1.0
        hi = max(b[-1] for b in bounds)
        self._clip = (lo, hi)
        span = hi - lo + 1.0
        self._offset = np.arange(len(names), dtype=np.float64) * span
        self._starts = np.cumsum([0] + [len(b) for b in bounds[:-1]]).astype(np.int64)
        joined = np.concatenate([b - lo + off for b, off in zip(bounds, self._offset, strict=True)])
        self._joined = joined if span * len(names) < 2.0**52 and np.all(np.diff(joined) >= 0) else None

    def buckets(self, raw: np.ndarray) -> np.ndarray:
        """How many boundaries are ``≤`` each value: int64 of ``raw``'s shape ``[..., F]``."""
        raw = np.asarray(raw, dtype=np.float64)
        if self._joined is None:
            out = np.empty(raw.shape, dtype=np.int64)
            for f, b in enumerate(self._bounds):
                out[..., f] = np.searchsorted(b, raw[..., f], side="right")
            return out
        lo, hi = self._clip
        keys = np.maximum(raw, lo)  # ufuncs with out=: np.clip costs more than the search itself
        np.minimum(keys, hi, out=keys)
        keys += self._offset - lo
        found = np.searchsorted(self._joined, keys, side="right")
        found -= self._starts
        return found

    def __call__(self, raw: np.ndarray, dtype: type = np.float32) -> np.ndarray:
        raw = np.asarray(raw, dtype=np.float64)
        out = np.empty((*raw.shape, PER_FEATURE), dtype=np.float64)
        x, z = out[..., 0], out[..., 3]
        np.divide(self.buckets(raw), self._count, out=x)
        np.multiply(x, x, out=out[..., 1])
        np.sqrt(x, out=out[..., 2])
        np.subtract(raw, self._low, out=z)
        np.maximum(z, 0.0, out=z)
        z += self._gap
        np.log(z, out=z)
        z -= self._mean
        z /= self._std
        out = out.reshape(*raw.shape[:-1], self.width)
        return out if dtype == np.float64 else out.astype(dtype)


def _first_positive(values: np.ndarray) -> float:
    positive = values[values > 0]
    return float(positive[0]) if positive.size else 1.0


__all__ = [
    "DEFAULT_BUCKETS",
    "PER_FEATURE",
    "VOCAB_FORMAT_VERSION",
    "Normalizer",
    "Vocab",
    "VocabError",
    "build_vocab",
    "quantile_boundaries",
]
