"""``optgym train threshold``: clang's own heuristic, with its cost threshold moved — tuned on a corpus.

Why this trainer exists: single-flip searches around the heuristic (``optgym search``) keep finding
the same kind of improvement at ``-Oz``: call sites whose inline cost is *at or just above* clang's
threshold, which the heuristic leaves alone and inlining shrinks (the callee's body folds into the
caller's constants, or its last call goes away). A policy that inlines exactly those — "do what clang
does, and also inline where ``cost_estimate − threshold ≤ k``" — has one parameter, so it can be tuned
on the training packages by compiling them once per candidate and generalizes as far as the rule
does; nothing in it can memorize a module.

The policy is an ordinary :class:`~optgym.policies.mlp.MLPPolicy` reading the residual derived inputs
(:mod:`optgym.problems.inputs`: clang's decision ``h`` and the margin ``m`` of ``threshold −
cost_estimate``), with hand-set weights: one ReLU layer of four units computing two steps of ``m``,
one gated by ``h = 1`` (keep clang's "inline" unless the margin is below ``down``) and one by ``h =
0`` (inline where the margin is at least ``-up``). So it exports to ONNX, is served by ``optgym-cc``,
and warm-starts ES like any trained policy.

Read top to bottom: candidates (``--up`` values, optionally ``--down``) → each compiled on the training
side of the corpus (``optgym.evaluate``, cached per policy and module) → the smallest total size among
candidates whose share of modules more than 1 % worse stays within ``--max-regressed`` (else clang's own,
``up = none``) → ``RUN/final/policy``, ``RUN/candidates.json``, and the final policy on each side of the
split (``RUN/final/metrics.json``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from optgym.corpus.corpus import atomic_write_bytes
from optgym.policies.mlp import MLPPolicy
from optgym.problems import get_problem
from optgym.problems.inputs import RESIDUAL_EXTRAS, margin
from optgym.problems.normalize import Vocab
from optgym.train.run import RunError, evaluate_final, prepare_run_dir, write_config
from optgym.train.trace import sample_modules

STEEP = 1e4  # the steps' slope: adjacent integer margins near the threshold differ by ≥ 0.01 in m
GATE = 1e6  # what the gate subtracts: far more than any STEEP · m
#: The evaluation figures kept per candidate.
REPORTED = ("evaluated", "failed", "total_ratio", "dottext_ratio", "geomean_ratio", "improved", "regressed",
            "regressed_over_1pct")  # fmt: skip


@dataclass
class ThresholdConfig:
    corpus: str
    output: str
    split: str | None = "train"  # tuned on this side; the final policy is evaluated on both
    up: list[int | None] = field(default_factory=lambda: [None, 0, 1, 2, 5, 10])
    down: list[int | None] = field(default_factory=lambda: [None])
    max_regressed: float = 0.05  # share of modules > 1 % worse a candidate may have
    sampling_rate: float = 1.0  # tune on this reproducible fraction of the modules (MLGO's sampling rate)
    seed: int = 0
    workers: int | None = None
    timeout: float = 120.0
    final_eval: bool = True
    problem: str = "inline-size"


def threshold_policy(features: Sequence[str], *, up: int | None, down: int | None = None) -> MLPPolicy:
    """Clang's decision, moved: where clang inlines, keep it unless ``threshold − cost ≤ down``; where
    it does not, inline if ``cost − threshold ≤ up``. ``None`` leaves that side as clang decides."""
    vocab = Vocab({name: [0.0] for name in features})  # the normalized features get zero weight
    width = len(features) * 4
    h, m = width + RESIDUAL_EXTRAS.index("heuristic"), width + RESIDUAL_EXTRAS.index(RESIDUAL_EXTRAS[1])

    def at(d: float) -> float:
        return float(margin(np.array([d]), np.array([0.0]))[0])

    keep_above = -10.0 if down is None else at(down + 0.5)  # h = 1: inline iff m > keep_above
    add_above = 10.0 if up is None else at(-up - 0.5)  # h = 0: inline iff m > add_above
    w0, b0 = np.zeros((width + len(RESIDUAL_EXTRAS), 4)), np.zeros(4)
    # units 0 − 1: step(m > keep_above), open only when h = 1; units 2 − 3: step(m > add_above) when h = 0
    for unit, (step_at, gate_on_h, offset) in enumerate(
        [(keep_above, 1, 0.0), (keep_above, 1, -1.0), (add_above, 0, 0.0), (add_above, 0, -1.0)]
    ):
        w0[m, unit] = STEEP
        w0[h, unit] = GATE if gate_on_h else -GATE
        b0[unit] = -STEEP * step_at + offset - (GATE if gate_on_h else 0.0)
    w1 = np.zeros((4, 2))
    w1[:, 1] = [2.0, -2.0, 2.0, -2.0]  # inline logit: 2·(step kept or step added) − 1
    b1 = np.array([0.0, -1.0])
    return MLPPolicy([(w0, b0), (w1, b1)], vocab, activation="relu", extras=RESIDUAL_EXTRAS,
                     source={"algorithm": "threshold", "up": up, "down": down})  # fmt: skip


def _name(up: int | None, down: int | None) -> str:
    return f"up{'none' if up is None else up}-down{'none' if down is None else down}"


def train_threshold(cfg: ThresholdConfig, *, say: Callable[[str], Any] = print) -> dict[str, Any]:
    """Tune the threshold shift on ``cfg.corpus``; returns (and writes) the candidates and the final figures."""
    from optgym.corpus import Corpus
    from optgym.evaluate.evaluation import evaluate, summarize

    run = prepare_run_dir(Path(cfg.output), resume=False)
    shifts = {k: ["none" if v is None else v for v in getattr(cfg, k)] for k in ("up", "down")}  # TOML has no null
    write_config(run, "threshold", {**asdict(cfg), **shifts})
    problem = get_problem(cfg.problem)
    features = [s.name for s in problem.expected_features() if s.name not in problem.hidden_features]
    if "threshold" not in features or "cost_estimate" not in features:
        raise RunError(f"{cfg.problem} has no threshold and cost_estimate features to move")
    corpus = Corpus(cfg.corpus, split=cfg.split)
    if len(corpus) == 0:
        raise RunError(f"{cfg.corpus} has no modules on the {cfg.split} side")
    tuned_on = sample_modules([m.name for m in corpus], cfg.sampling_rate, cfg.seed)
    say(f"tuning on {len(tuned_on)} of {len(corpus)} modules, {len(cfg.up) * len(cfg.down)} candidates")

    candidates = []
    for up in cfg.up:
        for down in cfg.down:
            start = time.perf_counter()
            directory = threshold_policy(features, up=up, down=down).save(run / "candidates" / _name(up, down))
            figures = summarize(evaluate(str(directory), corpus, problem=cfg.problem, modules=tuned_on,
                                         workers=cfg.workers, timeout=cfg.timeout, progress=False))  # fmt: skip
            row = {"name": _name(up, down), "up": up, "down": down, "seconds": round(time.perf_counter() - start, 1),
                   "regressed_share": figures["regressed_over_1pct"] / max(1, figures["evaluated"]),
                   **{k: figures[k] for k in REPORTED}}  # fmt: skip
            candidates.append(row)
            say(f"{row['name']}: {row['total_ratio']:.4f} of the heuristic (.text {row['dottext_ratio']:.4f}), "
                f"{row['regressed_over_1pct']} of {row['evaluated']} modules > 1 % worse")  # fmt: skip
    allowed = [c for c in candidates if c["regressed_share"] <= cfg.max_regressed and not c["failed"]]
    best = min(allowed, key=lambda c: c["total_ratio"], default=None)
    chosen = best or {"name": _name(None, None), "up": None, "down": None}
    say(f"chosen: {chosen['name']}" + ("" if best else " (no candidate within --max-regressed: clang's own)"))
    threshold_policy(features, up=chosen["up"], down=chosen["down"]).save(run / "final" / "policy")
    atomic_write_bytes(run / "candidates.json", json.dumps({"candidates": candidates, "chosen": chosen["name"]},
                                                           indent=2).encode())  # fmt: skip
    head = {"algorithm": "threshold", "chosen": chosen["name"], "up": chosen["up"], "down": chosen["down"],
            "tuned_on": {"corpus": cfg.corpus, "split": cfg.split, "modules": len(tuned_on),
                         "sampling_rate": cfg.sampling_rate, "seed": cfg.seed}}  # fmt: skip
    stored_split = Corpus(cfg.corpus).description.get("optgym", {}).get("split")
    return evaluate_final(run, cfg.corpus, "train" if stored_split else None, head, enabled=cfg.final_eval,
                          workers=cfg.workers, timeout=cfg.timeout, problem=cfg.problem, say=say)  # fmt: skip


__all__ = ["ThresholdConfig", "threshold_policy", "train_threshold"]
