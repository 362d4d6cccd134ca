"""A small MLP policy that runs in numpy: the form every trained policy takes inside a rollout worker.

Training happens in torch (behavioral cloning) or stable-baselines3 (PPO, A2C, DQN) or plain numpy
(ES), but what runs between two of clang's decisions is always this: the raw feature vector,
:class:`~optgym.problems.normalize.Normalizer`, then a few ``x @ W + b`` and ``tanh``. No torch
import, no thread pool, no per-decision allocation beyond numpy's own — a 2×64 network costs about
20 µs a decision (``bench/train_throughput.py``), against clang's ~150 µs of feature computation.

On disk a policy is a directory::

    policy.json   {"kind": "optgym-policy", "format_version": 1|2, "problem", "features", "hidden",
                   "activation", "extras" (format 2: derived inputs, see optgym.problems.inputs),
                   "source": {…}}
    weights.npz   W0, b0, W1, b1, …  (W: [inputs, outputs]; the last layer gives the action logits)
    vocab.json    the vocab the normalizer uses (see optgym.problems.normalize)
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from optgym.errors import OptgymError
from optgym.problems.inputs import PolicyInputs
from optgym.problems.normalize import PER_FEATURE, Vocab, VocabError
from optgym.rollout.rollout import DecisionPoint
from optgym.toolchain.language import is_cxx

POLICY_KIND = "optgym-policy"
POLICY_FORMAT_VERSION = 2  # 2: derived inputs ("extras"); a policy without them is still written as 1
ACTIVATIONS = ("tanh", "relu")


class PolicyFileError(OptgymError):
    """A policy directory that is missing files or has the wrong format."""


def _softmax_log(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max()
    return shifted - math.log(float(np.exp(shifted).sum()))


class MLPPolicy:
    """``features → normalize (+ derived inputs) → (Linear → activation)* → Linear → logits``; greedy unless
    made stochastic.

    Calling it on a :class:`DecisionPoint` returns ``(action, log_prob)``. ``stochastic(seed)`` gives
    the same network sampling its actions (trace's ``collect`` mode, evaluation's ``collect``).
    """

    def __init__(
        self,
        weights: Sequence[tuple[np.ndarray, np.ndarray]],
        vocab: Vocab,
        *,
        problem: str = "inline-size",
        activation: str = "tanh",
        greedy: bool = True,
        seed: int | None = None,
        source: dict[str, Any] | None = None,
        extras: Sequence[str] = (),
        languages: Sequence[str] | None = None,
    ) -> None:
        """``languages``: the families ("C", "C++") the policy decides, the ones it was trained on; compiles
        of another language get clang's own decisions (:func:`optgym.rollout.decider.decides`). ``None``: all."""
        if activation not in ACTIVATIONS:
            raise PolicyFileError(f"unknown activation {activation!r}; one of {ACTIVATIONS}")
        self.weights = [(np.asarray(w, dtype=np.float64), np.asarray(b, dtype=np.float64)) for w, b in weights]
        self.vocab, self.problem, self.activation = vocab, problem, activation
        self.inputs = PolicyInputs(vocab, extras)
        self.normalizer = self.inputs.normalizer
        if self.weights[0][0].shape[0] != self.inputs.width:
            raise PolicyFileError(
                f"the first layer takes {self.weights[0][0].shape[0]} inputs; the vocab and derived inputs "
                f"{self.inputs.extras} give {self.inputs.width}"
            )
        self.greedy = greedy
        self.rng = np.random.default_rng(seed)
        self.source = source or {}
        self.languages = None if languages is None else list(languages)
        self._prune()

    def _prune(self) -> None:
        """A first layer that reads none of the normalized features — a gate on derived inputs, as the
        shipped threshold policy is — lets one decision skip the normalizer, most of its cost (a served
        policy call measured ~100 µs before, ~20 µs after): ``_extras_rows`` keeps the rows that read
        the derived inputs. Rerun whenever the weights change."""
        first, width = self.weights[0][0], self.normalizer.width
        self._extras_rows = first[width:] if self.extras and not first[:width].any() else None

    @property
    def hidden(self) -> list[int]:
        return [w.shape[1] for w, _ in self.weights[:-1]]

    @property
    def feature_names(self) -> list[str]:
        return self.normalizer.names

    @property
    def extras(self) -> list[str]:
        """The derived inputs after the normalized features (``optgym.problems.inputs``)."""
        return self.inputs.extras

    @property
    def reads_callee_linkage(self) -> bool:
        """Whether it reads ``callee_survives``: a loop serving it learns the module's callee linkage first."""
        return self.inputs.needs_linkage

    def stochastic(self, seed: int | None = None) -> MLPPolicy:
        """The same network, sampling actions from its softmax (reproducible from ``seed``)."""
        clone = copy.copy(self)  # shares weights and normalizer: no per-module rebuild in workers
        clone.greedy, clone.rng = False, np.random.default_rng(seed)
        return clone

    def logits(
        self,
        raw: np.ndarray,
        heuristic: np.ndarray | int | None = None,
        cxx: np.ndarray | int | None = None,
        survives: np.ndarray | int | None = None,
    ) -> np.ndarray:
        """Action logits for raw feature vectors ``[..., F]`` (and the heuristic's decisions ``[...]``, whether
        the module is C++ and whether the callee survives, which policies with those derived inputs need)."""
        if self._extras_rows is not None and np.ndim(raw) == 1:
            extras = self.inputs.extras_of_one(np.asarray(raw, dtype=np.float64), heuristic, cxx, survives)
            h = np.asarray(extras) @ self._extras_rows
        else:
            h = self.inputs(raw, heuristic, cxx, survives) @ self.weights[0][0]
        h += self.weights[0][1]
        for w, b in self.weights[1:]:
            if self.activation == "tanh":
                np.tanh(h, out=h)
            else:
                np.maximum(h, 0.0, out=h)
            h = h @ w
            h += b
        return h

    def __call__(self, point: DecisionPoint) -> tuple[int, float]:
        survives = point.callee_survives if self.reads_callee_linkage else None
        logits = self.logits(point.vector(), point.heuristic, is_cxx(point.language), survives)
        if logits.size == 2:  # the common binary case in plain floats: numpy's per-call overhead dominates here
            a, b = float(logits[0]), float(logits[1])
            top = max(a, b)
            lse = top + math.log(math.exp(a - top) + math.exp(b - top))
            log_p = (a - lse, b - lse)
            action = int(b > a) if self.greedy else int(self.rng.random() < math.exp(log_p[1]))
            return action, log_p[action]
        lp = _softmax_log(logits)
        if self.greedy:
            action = int(lp.argmax())
        else:  # inverse CDF: Generator.choice(p=…) costs ~20 µs, this ~1 µs
            cdf = np.cumsum(np.exp(lp))
            action = min(int(np.searchsorted(cdf, self.rng.random() * cdf[-1], side="right")), len(lp) - 1)
        return action, float(lp[action])

    # -- parameters as one vector (ES) -----------------------------------------------------

    def parameters(self) -> np.ndarray:
        return np.concatenate([a.ravel() for pair in self.weights for a in pair])

    def with_parameters(self, flat: np.ndarray) -> MLPPolicy:
        """A copy whose weights are ``flat`` (laid out as :meth:`parameters` gives them)."""
        out, pos = [], 0
        for w, b in self.weights:
            nw, nb = w.size, b.size
            out.append((flat[pos : pos + nw].reshape(w.shape), flat[pos + nw : pos + nw + nb].reshape(b.shape)))
            pos += nw + nb
        if pos != flat.size:
            raise ValueError(f"expected {pos} parameters, got {flat.size}")
        clone = copy.copy(self)
        clone.weights = out
        clone._prune()
        return clone

    @classmethod
    def initial(
        cls,
        vocab: Vocab,
        hidden: Sequence[int] = (64, 64),
        *,
        activation: str = "tanh",
        seed: int = 0,
        extras: Sequence[str] = (),
        **kw: Any,
    ) -> MLPPolicy:
        """Random weights (orthogonal-ish scaled normal; the last layer small so actions start near 50/50)."""
        rng = np.random.default_rng(seed)
        sizes = [len(vocab.names) * PER_FEATURE + len(extras), *hidden, 2]
        weights = []
        for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
            scale = 0.01 if i == len(sizes) - 2 else 1.0 / math.sqrt(n_in)
            weights.append((rng.normal(0.0, scale, (n_in, n_out)), np.zeros(n_out)))
        return cls(weights, vocab, activation=activation, extras=extras, **kw)

    # -- files -----------------------------------------------------------------------------

    def save(self, directory: Path | str) -> Path:
        """Write the policy directory atomically (a temporary directory renamed into place)."""
        directory = Path(directory)
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
        try:
            arrays: dict[str, Any] = {}  # np.savez's keyword arrays
            for i, (w, b) in enumerate(self.weights):
                arrays[f"W{i}"], arrays[f"b{i}"] = w.astype(np.float32), b.astype(np.float32)
            np.savez(tmp / "weights.npz", **arrays)
            self.vocab.save(tmp / "vocab.json")
            meta = {
                "kind": POLICY_KIND,
                "format_version": POLICY_FORMAT_VERSION if self.extras else 1,
                "problem": self.problem,
                "features": self.feature_names,
                "hidden": self.hidden,
                "activation": self.activation,
                **({"extras": self.extras} if self.extras else {}),
                **({"languages": self.languages} if self.languages is not None else {}),
                "source": self.source,
            }
            (tmp / "policy.json").write_text(json.dumps(meta, indent=2))
            if directory.exists():
                old = directory.with_name(f".{directory.name}.old")
                shutil.rmtree(old, ignore_errors=True)
                directory.rename(old)
                tmp.rename(directory)
                shutil.rmtree(old, ignore_errors=True)
            else:
                tmp.rename(directory)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return directory

    @classmethod
    def load(cls, directory: Path | str, **kw: Any) -> MLPPolicy:
        directory = Path(directory)
        try:
            meta = json.loads((directory / "policy.json").read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise PolicyFileError(f"{directory} is not a policy directory: {e}") from None
        if meta.get("kind") != POLICY_KIND:
            raise PolicyFileError(f"{directory}/policy.json is not an optgym policy")
        if int(meta.get("format_version", 0)) > POLICY_FORMAT_VERSION:
            raise PolicyFileError(
                f"{directory} has policy format {meta['format_version']}; this optgym reads ≤ {POLICY_FORMAT_VERSION}"
            )
        with np.load(directory / "weights.npz") as z:
            n = len([k for k in z.files if k.startswith("W")])
            weights = [(z[f"W{i}"], z[f"b{i}"]) for i in range(n)]
        vocab = Vocab.load(directory / "vocab.json")
        if meta.get("features") and list(meta["features"]) != vocab.names:
            raise PolicyFileError(f"{directory}: policy.json's features differ from its vocab's")
        try:
            return cls(weights, vocab, problem=meta.get("problem", "inline-size"),
                       activation=meta.get("activation", "tanh"), source=meta.get("source", {}),
                       extras=meta.get("extras", ()), languages=meta.get("languages"), **kw)  # fmt: skip
        except VocabError as e:
            raise PolicyFileError(f"{directory}: {e}") from None


def is_policy_dir(path: Path) -> bool:
    return (path / "policy.json").is_file() and (path / "weights.npz").is_file()


__all__ = ["POLICY_FORMAT_VERSION", "MLPPolicy", "PolicyFileError", "is_policy_dir"]
