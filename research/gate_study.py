#!/usr/bin/env python3
"""Can a learned gate tell which near-threshold call sites shrink the module — and do IR2Vec embeddings help?

    .venv/bin/python -m research.gate_study FLIPS.jsonl… --corpus CORPUS --vocab IR2VEC.json
        [--cache DIR] [--folds 5] [--seeds 3] [-j 2] [--json OUT]

Why: the shipped policy is a rule ("inline up to 40 above clang's threshold where the callee has ≤ 2 users
and is not available_externally"), and every wider rule tried cost more regressions than it gained. A
learned gate would admit call sites one by one. Before building one into a policy, this measures whether
the information is there: the flips of ``research/flip_scan.py`` (each a real compile, labelled by the size
change it caused, ``delta_text``) are the data; a classifier predicts "this flip shrinks the module" from

* ``base`` — the 38 features clang sends (signed ``log1p``, standardized) plus ``cost − threshold``;
* ``base+ir2vec`` — the same plus the caller's and callee's IR2Vec embeddings (clang-22 sends them when
  given a vocabulary: ``research/ir2vec_vocab.py``; the issue asks to try them and keep them if they help).

Embeddings are collected by compiling each scanned module once more with the vocabulary and the
scanned policy (``--policy``, default the shipped one): the IR2Vec analysis only reads the IR, so the
decisions are the scan's, which is checked — every flip's 38 features must equal the new compile's at
that decision index, or the module is dropped and reported.

Evaluation is by package (grouped K-fold: a fold's packages are never trained on), over seeds, and reports
per feature set: ROC AUC, accuracy, and what the gate would buy if each flip's change added up — per
``--cutoffs`` value, the share of the flips admitted (p > cutoff), their summed size change (against
admitting all of them and against the oracle, only the shrinking ones). Flips interact, so the last
figures are indicative; module-level figures come only from ``optgym evaluate`` of a built policy.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from optgym.corpus import Corpus
from optgym.evaluate.stats import mean_ci
from optgym.files import atomic_write_bytes
from optgym.parallel import run_tasks
from optgym.policies import resolve_policy
from optgym.problems import get_problem
from optgym.problems.inline_size import FEATURES
from optgym.rollout.rollout import DecisionPoint, rollout
from optgym.toolchain import find_toolchain
from research.ir2vec_vocab import EMBEDDING_FEATURES, embedding_flags

FEATURE_SETS = ("base", "base+ir2vec")


@dataclass(frozen=True)
class EmbedTask:
    corpus: str
    module: str
    policy: str
    vocab: str
    vocab_digest: str  # SHA-256 of the vocabulary: part of the cache key, computed once
    cache: str
    timeout: float


def _cache_file(task: EmbedTask) -> Path:
    key = hashlib.sha256(f"{task.module}\0{task.policy}\0{task.vocab_digest}".encode())
    return Path(task.cache) / f"{key.hexdigest()[:24]}.npz"


def embed_module(task: EmbedTask) -> tuple[str, dict[str, np.ndarray] | str]:
    """Worker: the module compiled under the policy with the vocabulary; per decision the 38 features and
    both embeddings (cached), or why not."""
    path = _cache_file(task)
    if path.exists():
        with np.load(path) as data:
            return task.module, dict(data)
    module = Corpus(task.corpus).module(task.module)
    policy = resolve_policy(task.policy).build()
    rows: list[dict[str, np.ndarray]] = []

    def recording(point: DecisionPoint):
        rows.append(point.stream_features())
        return policy(point)

    run = rollout(get_problem("inline-size"), module, find_toolchain(), recording, timeout=task.timeout,
                  extra_flags=embedding_flags(Path(task.vocab)))  # fmt: skip
    if not run.result.ok:
        return task.module, f"compile with the vocabulary: {run.result.status}"
    if not rows or any(name not in rows[0] for name in EMBEDDING_FEATURES):
        return task.module, "clang sent no embeddings"
    out = {
        "features": np.stack([[int(r[n].ravel()[0]) for n in FEATURES] for r in rows]).astype(np.int64),
        **{n: np.stack([r[n].ravel() for r in rows]).astype(np.float32) for n in EMBEDDING_FEATURES},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, **out)
    tmp.rename(path)
    return task.module, out


def signed_log(x: np.ndarray) -> np.ndarray:
    return np.sign(x) * np.log1p(np.abs(x))


def design(rows: Sequence[dict], embeddings: dict[str, dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per feature set, the unstandardized inputs of every flip (rows aligned with ``rows``)."""
    raw = np.array([[r[n] for n in FEATURES] for r in rows], dtype=np.float64)
    over = raw[:, FEATURES.index("cost_estimate")] - raw[:, FEATURES.index("threshold")]
    base = np.column_stack([signed_log(raw), signed_log(over)])
    emb = np.array([np.concatenate([embeddings[r["module"]][n][r["decision"]] for n in EMBEDDING_FEATURES])
                    for r in rows])  # fmt: skip
    return {"base": base, "base+ir2vec": np.column_stack([base, emb])}


def train_mlp(x: np.ndarray, y: np.ndarray, seed: int, epochs: int = 300, weight_decay: float = 1e-3):
    """A 2×32 tanh MLP on standardized inputs, full-batch Adam on the logistic loss; returns a predictor."""
    import torch

    torch.manual_seed(seed)
    mean, std = x.mean(0), x.std(0) + 1e-6
    xt = torch.tensor((x - mean) / std, dtype=torch.float32)
    yt = torch.tensor(y, dtype=torch.float32)
    net = torch.nn.Sequential(torch.nn.Linear(x.shape[1], 32), torch.nn.Tanh(), torch.nn.Linear(32, 32),
                              torch.nn.Tanh(), torch.nn.Linear(32, 1))  # fmt: skip
    opt = torch.optim.Adam(net.parameters(), lr=3e-3, weight_decay=weight_decay)
    for _ in range(epochs):
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(net(xt)[:, 0], yt)
        loss.backward()
        opt.step()

    def predict(z: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return torch.sigmoid(net(torch.tensor((z - mean) / std, dtype=torch.float32))[:, 0]).numpy()

    return predict


def roc_auc(y: np.ndarray, p: np.ndarray) -> float:
    """Mann–Whitney: the chance a shrinking flip scores above a non-shrinking one (ties count half)."""
    pos, neg = p[y == 1], p[y == 0]
    if not len(pos) or not len(neg):
        return float("nan")
    order = np.argsort(np.concatenate([pos, neg]), kind="mergesort")
    ranks = np.empty(len(order))
    ranks[order] = np.arange(1, len(order) + 1)
    allp = np.concatenate([pos, neg])
    for value in np.unique(allp):  # average ranks of ties
        tie = allp == value
        ranks[tie] = ranks[tie].mean()
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def grouped_folds(groups: Sequence[str], k: int, seed: int) -> list[np.ndarray]:
    """``k`` test masks; each package's flips fall in exactly one."""
    names = sorted(set(groups))
    np.random.default_rng(seed).shuffle(names)
    fold_of = {g: i % k for i, g in enumerate(names)}
    ids = np.array([fold_of[g] for g in groups])
    return [ids == i for i in range(k)]


def cross_validate(
    inputs: np.ndarray, delta: np.ndarray, groups: Sequence[str], folds: int, seed: int, cutoffs: Sequence[float]
) -> dict:
    """Out-of-fold predictions for every flip, then the figures over all of them (per cutoff: what a gate
    admitting ``p > cutoff`` would admit)."""
    y = (delta < 0).astype(np.float64)
    p = np.zeros(len(y))
    for test in grouped_folds(groups, folds, seed):
        p[test] = train_mlp(inputs[~test], y[~test], seed)(inputs[test])
    out = {"auc": roc_auc(y, p), "accuracy": float(((p > 0.5) == (y == 1)).mean())}
    for cutoff in cutoffs:
        admitted = p > cutoff
        out[f"admitted@{cutoff}"] = float(admitted.mean())
        out[f"admitted_delta@{cutoff}"] = float(delta[admitted].sum())
        out[f"admitted_shrank@{cutoff}"] = float(y[admitted].mean()) if admitted.any() else 0.0
    return out


def mean_ci_text(values: Sequence[float]) -> str:
    ci = mean_ci(values)
    return f"{ci['mean']:.3f}" if ci["ci95"] is None else f"{ci['mean']:.3f} ± {ci['ci95']:.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("flips", type=Path, nargs="+", help="research/flip_scan.py outputs")
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--vocab", type=Path, required=True, help="IR2Vec vocabulary (research/ir2vec_vocab.py)")
    parser.add_argument("--policy", default="pretrained", help="the policy the flips were scanned around")
    parser.add_argument("--cache", type=Path, default=None, help="embeddings per module (default: beside FLIPS)")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--cutoffs", type=float, nargs="+", default=[0.5, 0.6, 0.7, 0.8])
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("-j", "--workers", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None, help="write the figures here too")
    args = parser.parse_args()

    rows = [json.loads(line) for path in args.flips for line in path.read_text().splitlines() if line.strip()]
    if not rows:
        sys.exit("no flips in " + ", ".join(map(str, args.flips)))
    cache = args.cache or args.flips[0].parent / "embeddings"
    modules = sorted({r["module"] for r in rows})
    digest = hashlib.sha256(args.vocab.read_bytes()).hexdigest()
    tasks = [EmbedTask(str(args.corpus), m, args.policy, str(args.vocab.resolve()), digest, str(cache), args.timeout)
             for m in modules]  # fmt: skip
    embeddings: dict[str, dict[str, np.ndarray]] = {}
    dropped: list[str] = []
    for _, (name, got) in run_tasks(embed_module, tasks, workers=args.workers, description="embeddings"):
        if isinstance(got, str):
            dropped.append(f"{name}: {got}")
        else:
            embeddings[name] = got
    kept = []
    for r in rows:  # the scan's decision must be the same call site in the embedding compile
        got = embeddings.get(r["module"])
        same = got is not None and r["decision"] < len(got["features"])
        same = same and all(int(got["features"][r["decision"], i]) == r[n] for i, n in enumerate(FEATURES))
        if same:
            kept.append(r)
        elif got is not None:
            dropped.append(f"{r['module']} decision {r['decision']}: features differ from the scan's")
    if not kept:
        sys.exit("no flip could be matched with its embeddings:\n  " + "\n  ".join(dropped[:20]))
    delta = np.array([r["delta_text"] for r in kept], dtype=np.float64)
    groups = [r["module"].split("/", 1)[0] for r in kept]
    print(f"{len(kept)} flips over {len({r['module'] for r in kept})} modules, {len(set(groups))} packages; "
          f"{(delta < 0).mean():.0%} shrank; all admitted: {delta.sum():+.0f} B, "
          f"oracle {delta[delta < 0].sum():+.0f} B")  # fmt: skip
    if dropped:
        print(f"{len(dropped)} dropped:", *dropped[:10], sep="\n  ")
    inputs = design(kept, embeddings)
    results = {name: [cross_validate(inputs[name], delta, groups, args.folds, seed, args.cutoffs)
                      for seed in range(args.seeds)] for name in FEATURE_SETS}  # fmt: skip
    print(f"{'features':<12} {'AUC':>14} {'accuracy':>14}")
    for name, runs in results.items():
        print(
            f"{name:<12} {mean_ci_text([r['auc'] for r in runs]):>14} {mean_ci_text([r['accuracy'] for r in runs]):>14}"
        )
    print(f"{'features':<12} {'cutoff':>6} {'admitted':>14} {'admitted Δ B':>20} {'of those shrank':>16}")
    for name, runs in results.items():
        for c in args.cutoffs:
            cols = [
                mean_ci_text([r[f"{k}@{c}"] for r in runs]) for k in ("admitted", "admitted_delta", "admitted_shrank")
            ]
            print(f"{name:<12} {c:>6} {cols[0]:>14} {cols[1]:>20} {cols[2]:>16}")
    if args.json:
        figures = {"flips": len(kept), "packages": len(set(groups)), "all_delta": float(delta.sum()),
                   "oracle_delta": float(delta[delta < 0].sum()), "results": results}  # fmt: skip
        atomic_write_bytes(args.json, json.dumps(figures, indent=1).encode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
