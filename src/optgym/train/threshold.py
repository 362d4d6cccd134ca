"""``optgym train threshold``: clang's own heuristic, its cost threshold moved per language — tuned on a corpus.

Why this trainer exists: single-flip searches around the heuristic (``optgym search``) keep finding
the same kind of improvement at ``-Oz``: call sites whose inline cost is *at or just above* clang's
threshold, which the heuristic leaves alone and inlining shrinks (the callee's body folds into the
caller, or its last call goes and the callee with it). A policy that inlines exactly those — "do what
clang does, and also inline where ``cost_estimate − threshold ≤ k``" — has one parameter per language,
so it is tuned by compiling the training packages once per candidate, and it cannot memorize a module.
Per language, because the same move measured opposite ways: on 470 C++ training modules ``k = 10``
gave 0.973 of clang's size, on 469 C modules ``k = 0`` already gave 1.003.

The policy is an ordinary :class:`~optgym.policies.mlp.MLPPolicy` reading derived inputs
(:mod:`optgym.problems.inputs`: clang's decision ``h``, the margin ``m`` of ``threshold −
cost_estimate``, and ``cxx``) with set weights: one ReLU layer of six units computing three steps of
``m`` — "keep clang's inline" (open when ``h = 1``), "add a C++ inline" (``h = 0``, ``cxx = 1``, ``m ≥
−k_C++``) and "add a C inline" (``h = 0``, ``cxx = 0``, ``m ≥ −k_C``); the inline logit is ``2·(sum of
steps) − 1``. So it exports to ONNX, is served by ``optgym-cc`` and warm-starts ES like any policy.

A candidate may also be *gated*: ``K/U`` moves the threshold by ``K`` only where the callee has at most ``U``
users in the module (``callee_users``, counting this call) — the callees whose copy inlining can delete;
measured on the C++ training sample, ``10/2`` kept 0.976 of clang's size with 1.5 % of modules more than 1 %
worse, where ungated ``10`` reached 0.971 with 6.8 %.

Read top to bottom: candidates (``--up`` values, each applied to both languages) → each compiled on
the training side (``optgym.evaluate``, cached per policy and module) → per language, the candidate
with the smallest total size among those whose share of that language's modules more than 1 % worse
is within ``--max-regressed`` (else clang's own, ``none``) → ``RUN/final/policy``,
``RUN/candidates.json``, and the final policy on each side of the split (``RUN/final/metrics.json``).
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
from optgym.problems.inputs import CXX_INPUT, HEURISTIC_INPUT, margin
from optgym.problems.normalize import Vocab
from optgym.toolchain.language import CXX_LANGUAGES
from optgym.train.run import RunError, evaluate_final, prepare_run_dir, write_config
from optgym.train.trace import sample_modules

EXTRAS = (HEURISTIC_INPUT, "margin:threshold-cost_estimate", CXX_INPUT)
GATE_FEATURE = "callee_users"
#: A shift: ``(K, U)`` — inline where cost − threshold ≤ K (and, with U, the callee has ≤ U users).
Shift = tuple[int, int | None]
STEEP = 1e4  # the steps' slope: adjacent integer margins near the threshold differ by ≥ 0.01 in m
GATE = 1e6  # what a closed gate subtracts: far more than any STEEP · m
LANGUAGES = ("C++", "C")  # C++ also stands for ObjC++ (cxx = 1); C for everything else
#: The evaluation figures kept per candidate and language.
REPORTED = ("evaluated", "failed", "total_ratio", "dottext_ratio", "geomean_ratio", "improved", "regressed",
            "regressed_over_1pct")  # fmt: skip


@dataclass
class ThresholdConfig:
    corpus: str
    output: str
    split: str | None = "train"  # tuned on this side; the final policy is evaluated on both
    up: list[str] = field(default_factory=lambda: ["none", "0", "2", "5", "10", "10/2", "10/4"])  # K or K/U
    max_regressed: float = 0.02  # share of a language's modules > 1 % worse a candidate may have (issue 7: 2 %)
    sampling_rate: float = 1.0  # tune on this reproducible fraction of the modules (MLGO's sampling rate)
    seed: int = 0
    workers: int | None = None
    timeout: float = 120.0
    final_eval: bool = True
    problem: str = "inline-size"


def parse_shift(text: str | int | None) -> Shift | None:
    """``none`` → ``None``; ``K`` → ``(K, None)``; ``K/U`` → ``(K, U)`` (a shift gated on callee users)."""
    if text is None or text == "none":
        return None
    if isinstance(text, int):
        return (text, None)
    if isinstance(text, tuple):
        return text
    k, _, users = str(text).partition("/")
    try:
        return (int(k), int(users) if users else None)
    except ValueError:
        raise RunError(f"a threshold shift is none, K or K/U (integers), not {text!r}") from None


def _label(shift: Shift | None) -> str:
    if shift is None:
        return "none"
    return str(shift[0]) if shift[1] is None else f"{shift[0]}/{shift[1]}"


def threshold_policy(features: Sequence[str], *, cxx: Shift | int | None, c: Shift | int | None) -> MLPPolicy:
    """Clang's decision, plus inlining where ``cost − threshold ≤ K`` (and, for a gated shift ``(K, U)``,
    the callee has at most ``U`` users) — the ``cxx`` shift in C++ modules, ``c`` in C ones; ``None``
    leaves that language as clang decides."""
    shifts = {"cxx": parse_shift(cxx), "c": parse_shift(c)}
    gates = sorted({s[1] for s in shifts.values() if s is not None and s[1] is not None})
    extras = (*EXTRAS, *(f"at_most:{GATE_FEATURE}:{u}" for u in gates))
    vocab = Vocab({name: [0.0] for name in features})  # the normalized features get zero weight
    width = len(features) * 4
    h, m, lang = width, width + 1, width + 2
    gate_column = {u: width + len(EXTRAS) + i for i, u in enumerate(gates)}

    def at(d: float) -> float:
        return float(margin(np.array([d]), np.array([0.0]))[0])

    def add_above(shift: Shift | None) -> float:
        return 10.0 if shift is None else at(-shift[0] - 0.5)  # m > this ⇔ cost − threshold ≤ K; 10: never

    def users(shift: Shift | None) -> int | None:
        return None if shift is None else shift[1]

    # (step at, weight on h, weight on cxx, gate bias, callee-users gate): a unit is open only where its gate sums to 0
    steps = [
        (-10.0, GATE, 0.0, -GATE, None),
        (add_above(shifts["cxx"]), -GATE, GATE, -GATE, users(shifts["cxx"])),
        (add_above(shifts["c"]), -GATE, -GATE, 0.0, users(shifts["c"])),
    ]
    w0, b0 = np.zeros((width + len(extras), 2 * len(steps))), np.zeros(2 * len(steps))
    w1, b1 = np.zeros((2 * len(steps), 2)), np.array([0.0, -1.0])
    for i, (step_at, on_h, on_cxx, gate, limit) in enumerate(steps):
        for unit, offset, sign in ((2 * i, 0.0, 2.0), (2 * i + 1, -1.0, -2.0)):  # relu(x) − relu(x − 1): a step
            w0[m, unit], w0[h, unit], w0[lang, unit] = STEEP, on_h, on_cxx
            b0[unit] = -STEEP * step_at + gate + offset
            if limit is not None:  # closed unless the callee has at most `limit` users
                w0[gate_column[limit], unit] = GATE
                b0[unit] -= GATE
            w1[unit, 1] = sign
    source = {"algorithm": "threshold", "up": {"C++": _label(shifts["cxx"]), "C": _label(shifts["c"])}}
    return MLPPolicy([(w0, b0), (w1, b1)], vocab, activation="relu", extras=extras, source=source)


def train_threshold(cfg: ThresholdConfig, *, say: Callable[[str], Any] = print) -> dict[str, Any]:
    """Tune the per-language threshold shift on ``cfg.corpus``; returns (and writes) the final figures."""
    from optgym.corpus import Corpus
    from optgym.evaluate.evaluation import evaluate, summarize

    run = prepare_run_dir(Path(cfg.output), resume=False)
    # TOML has no null: "none" and "all" stand for None
    shifts = [parse_shift(text) for text in cfg.up]
    cfg.up = [_label(shift) for shift in shifts]
    write_config(run, "threshold", {**asdict(cfg), "split": cfg.split or "all"})
    problem = get_problem(cfg.problem)
    features = [s.name for s in problem.expected_features() if s.name not in problem.hidden_features]
    if "threshold" not in features or "cost_estimate" not in features:
        raise RunError(f"{cfg.problem} has no threshold and cost_estimate features to move")
    corpus = Corpus(cfg.corpus, split=cfg.split)
    if len(corpus) == 0:
        raise RunError(f"{cfg.corpus} has no modules on the {cfg.split} side")
    tuned_on = sample_modules([m.name for m in corpus], cfg.sampling_rate, cfg.seed)
    language = {n: "C++" if corpus.module(n).language in CXX_LANGUAGES else "C" for n in tuned_on}
    say(f"tuning on {len(tuned_on)} of {len(corpus)} modules ({sum(v == 'C++' for v in language.values())} C++), "
        f"{len(cfg.up)} candidates")  # fmt: skip

    # 1. every candidate compiled on the sample; its figures per language
    candidates: list[dict[str, Any]] = []
    for shift in shifts:
        start = time.perf_counter()
        name = f"up{_label(shift).replace('/', '-users')}"
        directory = threshold_policy(features, cxx=shift, c=shift).save(run / "candidates" / name)
        rows = evaluate(str(directory), corpus, problem=cfg.problem, modules=tuned_on, workers=cfg.workers,
                        timeout=cfg.timeout, progress=False)  # fmt: skip
        row: dict[str, Any] = {"up": _label(shift), "seconds": round(time.perf_counter() - start, 1)}
        for lang in LANGUAGES:
            figures = summarize([r for r in rows if language[r.module] == lang])
            row[lang] = {key: figures[key] for key in REPORTED}
            row[lang]["regressed_share"] = figures["regressed_over_1pct"] / max(1, figures["evaluated"])
            if figures["evaluated"]:
                say(f"up {_label(shift)}, {lang}: {figures['total_ratio']:.4f} of the heuristic "
                    f"(.text {figures['dottext_ratio']:.4f}), {figures['regressed_over_1pct']} of "
                    f"{figures['evaluated']} modules > 1 % worse")  # fmt: skip
        candidates.append(row)

    # 2. per language, the smallest total within the regression budget
    chosen: dict[str, str] = {}
    for lang in LANGUAGES:
        allowed = [c for c in candidates if c[lang]["evaluated"] and not c[lang]["failed"]
                   and c[lang]["regressed_share"] <= cfg.max_regressed]  # fmt: skip
        best = min(allowed, key=lambda c, lang=lang: c[lang]["total_ratio"], default=None)
        chosen[lang] = best["up"] if best else "none"
    say(f"chosen: C++ up {chosen['C++']}, C up {chosen['C']}")
    threshold_policy(features, cxx=parse_shift(chosen["C++"]), c=parse_shift(chosen["C"])).save(
        run / "final" / "policy"
    )
    table = {"candidates": candidates, "chosen": chosen}
    atomic_write_bytes(run / "candidates.json", json.dumps(table, indent=2).encode())

    # 3. the final policy on each side of the split
    head = {"algorithm": "threshold", "chosen": table["chosen"],
            "tuned_on": {"corpus": cfg.corpus, "split": cfg.split, "modules": len(tuned_on),
                         "sampling_rate": cfg.sampling_rate, "seed": cfg.seed}}  # fmt: skip
    stored_split = Corpus(cfg.corpus).description.get("optgym", {}).get("split")
    return evaluate_final(run, cfg.corpus, "train" if stored_split else None, head, enabled=cfg.final_eval,
                          workers=cfg.workers, timeout=cfg.timeout, problem=cfg.problem, say=say)  # fmt: skip


def config_from_options(options: dict[str, Any], output: Path | str) -> ThresholdConfig:
    """A recorded ``[run]`` table (``RUN/config.toml``) as a config writing to ``output``."""
    fields = {k: v for k, v in options.items() if k in ThresholdConfig.__dataclass_fields__}
    fields["split"] = None if fields.get("split", "all") == "all" else fields["split"]
    return ThresholdConfig(**{**fields, "output": str(output)})


__all__ = ["ThresholdConfig", "config_from_options", "parse_shift", "threshold_policy", "train_threshold"]
