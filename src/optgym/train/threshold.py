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
worse, where ungated ``10`` reached 0.971 with 6.8 %. ``K@F<=V`` gates on any other raw feature, and rules
joined by ``+`` each admit call sites: ``10/2+40/2@is_callee_avail_external<=0`` also inlines up to 40 above
the threshold when the callee is not ``available_externally`` (libstdc++'s ``extern template`` members:
inlining one never deletes it, so a single-flip scan found almost only losses there). The gates are derived
inputs (``at_most:F:V``; ``K@F>=V`` is ``at_least:F:V``), so a gated policy still exports and serves as an
ordinary MLP. A ``>=`` gate on ``node_count`` (the functions defined in the module) keeps a wide margin to
large modules: on the C++ training sample, ``100/2@is_callee_avail_external<=0`` saved 2.3 kB over 101
modules under 2 kB of text and put 6 of them more than 1 % over clang's size, against 243 kB and 3 regressions
over the 235 larger ones — where a module has little to gain, one wrong inline is a large share of it.

Read top to bottom: candidates (``--up`` values, each applied to both languages) → each compiled on
``--samples`` samples of the training side (``optgym.evaluate``, cached per policy and module; languages
not in ``--languages`` keep clang's decisions) → per language, the candidate with the smallest total size
among those whose share of that language's modules more than 1 % worse is within ``--max-regressed`` on
every sample (else clang's own, ``none``) → ``RUN/final/policy``, ``RUN/candidates.json``, and the final
policy on each side of the split (``RUN/final/metrics.json``). Why several samples: a candidate near the bar
passes or fails by which modules were drawn — C++ ``60/2@is_callee_avail_external<=0`` had 1.5 % of one 30 %
sample worse and 2.3 % of another (and 2.1 % of the held-out packages); ``40/…`` had 1.2 % of both.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from optgym.files import atomic_write_bytes
from optgym.policies.mlp import MLPPolicy
from optgym.problems import get_problem
from optgym.problems.inputs import BOUNDS, CXX_INPUT, HEURISTIC_INPUT, margin
from optgym.problems.normalize import Vocab
from optgym.train.run import RunError, evaluate_final, prepare_run_dir, write_config
from optgym.train.trace import sample_modules

EXTRAS = (HEURISTIC_INPUT, "margin:threshold-cost_estimate", CXX_INPUT)
GATE_KINDS = {"<=": "at_most", ">=": "at_least"}  # a rule's gate → the derived input that computes it
USERS = "callee_users"  # ``K/U`` gates on it: a callee with few users is one inlining can delete
STEEP = 1e4  # the steps' slope: adjacent integer margins near the threshold differ by ≥ 0.01 in m
GATE = 1e6  # what a closed gate subtracts: far more than any STEEP · m
LANGUAGES = ("C++", "C")  # C++ also stands for ObjC++ (cxx = 1); C for everything else
#: The evaluation figures kept per candidate and language.
REPORTED = ("evaluated", "failed", "total_ratio", "dottext_ratio", "geomean_ratio", "improved", "regressed",
            "regressed_over_1pct")  # fmt: skip


@dataclass(frozen=True)
class Rule:
    """Also inline where ``cost − threshold ≤ up`` and every gate holds (raw feature ``<=`` or ``>=`` its bound).

    A *withdrawing* rule (``refuse``, written ``noK``) goes the other way: it answers "no" where clang
    inlines, ``cost − threshold ≥ −up`` (the call site is within ``up`` of the threshold) and every gate
    holds — the move a ThinLTO backend needs at imported callees, whose copy inlining never deletes.
    """

    up: int
    gates: tuple[tuple[str, str, int], ...] = ()  # (raw feature, "<=" or ">=", bound)
    refuse: bool = False

    @property
    def label(self) -> str:
        users = [v for f, op, v in self.gates if (f, op) == (USERS, "<=")]
        rest = [g for g in self.gates if (g[0], g[1]) != (USERS, "<=")]
        head = f"{'no' if self.refuse else ''}{self.up}{f'/{users[0]}' if users else ''}"
        return head + "".join(f"@{f}{op}{v}" for f, op, v in rest)

    def admits(self, cost_minus_threshold: np.ndarray) -> np.ndarray:
        """Where the rule's margin test holds (its gates aside): what a test checks a policy against."""
        d = np.asarray(cost_minus_threshold)
        return d >= -self.up if self.refuse else d <= self.up


#: A candidate: clang's decisions plus every call site one of its rules admits.
Shift = tuple[Rule, ...]
#: A rule's unit in the policy's network: (step at, direction, weight on h, weight on cxx, gate bias, gates).
Step = tuple[float, float, float, float, float, tuple[tuple[str, str, int], ...]]
Candidate = Shift | str | int | tuple[int, int | None] | None  # what threshold_policy takes (see parse_shift)


@dataclass
class ThresholdConfig:
    corpus: str
    output: str
    split: str | None = "train"  # tuned on this side; the final policy is evaluated on both
    up: list[str] = field(default_factory=lambda: ["none", "0", "2", "5", "10", "10/2", "10/4"])  # see parse_shift
    max_regressed: float = 0.02  # share of a language's modules > 1 % worse a candidate may have (the target's 2 %)
    sampling_rate: float = 1.0  # tune on this reproducible fraction of the modules (MLGO's sampling rate)
    seed: int = 0
    workers: int | None = None
    timeout: float = 120.0
    final_eval: bool = True
    problem: str = "inline-size"
    languages: list[str] = field(default_factory=lambda: list(LANGUAGES))  # tune these; the others keep clang's
    samples: int = 1  # independent samples (seeds seed, seed + 1, …): a candidate must keep the bar on each


def parse_gate(text: str) -> tuple[str, str, int]:
    """``FEATURE<=V`` or ``FEATURE>=V`` (V an integer) as ``(feature, op, V)``; ``ValueError`` otherwise."""
    op = next((op for op in GATE_KINDS if op in text), None)
    if op is None:
        raise ValueError(text)
    feature, _, bound = text.partition(op)
    if not feature:
        raise ValueError(text)
    return feature, op, int(bound)


def gate_holds(values: np.ndarray, op: str, bound: int) -> np.ndarray:
    """Where raw feature ``values`` pass a gate (the derived input's own test, :data:`inputs.BOUNDS`)."""
    return BOUNDS[GATE_KINDS[op]](values, bound)


def _rule(text: str) -> Rule:
    head, *gates = text.split("@")
    refuse = head.startswith("no")
    k, _, users = head.removeprefix("no").partition("/")
    triples = [(USERS, "<=", int(users))] if users else []
    rule = Rule(int(k), tuple(triples + [parse_gate(gate) for gate in gates]), refuse)
    if refuse and rule.up < 0:
        raise ValueError(text)
    return rule


def parse_shift(text: Candidate) -> Shift | None:
    """A candidate's text as its rules: ``none`` → ``None`` (clang's own); ``K`` → inline also where
    ``cost − threshold ≤ K``; ``K/U`` → only where the callee has ≤ ``U`` users; ``K@F<=V`` → only
    where raw feature ``F`` ≤ ``V`` (``K@F>=V``: ≥; gates combine: ``40/2@is_callee_avail_external<=0``); rules
    joined by ``+`` each admit call sites (``10/2+40/2@is_callee_avail_external<=0``); ``noK…`` (K ≥ 0, same
    gates) withdraws clang's inlines where ``cost − threshold ≥ −K`` (``no1000@is_callee_avail_external>=1``).
    An int ``K`` or a pair ``(K, U)`` stands for ``K`` and ``K/U``."""
    if text is None or text == "none":
        return None
    if isinstance(text, int):
        return (Rule(text),)
    if isinstance(text, tuple) and all(isinstance(rule, Rule) for rule in text):
        return cast(Shift, text)  # already parsed
    if isinstance(text, tuple):
        k, users = cast(tuple[int, int | None], text)
        return (Rule(k, () if users is None else ((USERS, "<=", users),)),)
    try:
        return tuple(_rule(part) for part in str(text).split("+"))
    except ValueError:
        raise RunError(
            f"a threshold candidate is none, or rules K, K/U, K@FEATURE<=V, K@FEATURE>=V, noK… joined by + "
            f"(integers), not {text!r}"
        ) from None


def _label(shift: Shift | None) -> str:
    return "none" if shift is None else "+".join(rule.label for rule in shift)


def _directory_name(shift: Shift | None) -> str:
    """A file-safe name for a candidate's policy directory."""
    label = _label(shift)
    for old, new in (("/", "-users"), ("<=", "-le"), (">=", "-ge"), ("@", "-"), ("+", "-or-")):
        label = label.replace(old, new)
    return f"up{label}"


def threshold_policy(features: Sequence[str], *, cxx: Candidate, c: Candidate) -> MLPPolicy:
    """Clang's decision, plus inlining where one of a candidate's rules admits the call site — the
    ``cxx`` candidate in C++ modules, ``c`` in C ones; ``None`` leaves that language as clang decides."""
    shifts = {"cxx": parse_shift(cxx), "c": parse_shift(c)}
    gates = sorted({g for s in shifts.values() for rule in s or () for g in rule.gates})
    missing = sorted({f for f, _, _ in gates} - set(features))
    if missing:
        raise RunError(f"a threshold rule gates on {missing}, which the problem's features do not include")
    extras = (*EXTRAS, *(f"{GATE_KINDS[op]}:{f}:{v}" for f, op, v in gates))
    vocab = Vocab({name: [0.0] for name in features})  # the normalized features get zero weight
    width = len(features) * 4
    h, m, lang = width, width + 1, width + 2
    gate_column = {g: width + len(EXTRAS) + i for i, g in enumerate(gates)}

    def step(rule: Rule, cxx: bool) -> Step:
        """A rule's unit. Added (h = 0): open where m > at ⇔ threshold − cost > −K − ½ ⇔ cost − threshold ≤ K.
        Withdrawn (h = 1): open where m < at ⇔ threshold − cost < K + ½ ⇔ cost − threshold ≥ −K."""
        at = float(margin(np.array([rule.up + 0.5 if rule.refuse else -rule.up - 0.5]), np.array([0.0]))[0])
        on_h, h_bias = (GATE, -GATE) if rule.refuse else (-GATE, 0.0)
        on_cxx, cxx_bias = (GATE, -GATE) if cxx else (-GATE, 0.0)
        return (at, -1.0 if rule.refuse else 1.0, on_h, on_cxx, h_bias + cxx_bias, rule.gates)

    # (step at, direction, weight on h, weight on cxx, gate bias, gates): open only where its gates sum to 0;
    # direction +1 opens above `at` and adds an inline, −1 opens below it and takes clang's away
    steps: list[Step] = [(-10.0, 1.0, GATE, 0.0, -GATE, ())]  # keep clang's inline
    steps += [step(r, cxx=True) for r in shifts["cxx"] or ()]  # C++ rules
    steps += [step(r, cxx=False) for r in shifts["c"] or ()]  # C rules
    w0, b0 = np.zeros((width + len(extras), 2 * len(steps))), np.zeros(2 * len(steps))
    w1, b1 = np.zeros((2 * len(steps), 2)), np.array([0.0, -1.0])
    for i, (step_at, direction, on_h, on_cxx, gate, unit_gates) in enumerate(steps):
        for unit, offset, sign in ((2 * i, 0.0, 2.0), (2 * i + 1, -1.0, -2.0)):  # relu(x) − relu(x − 1): a step
            w0[m, unit], w0[h, unit], w0[lang, unit] = direction * STEEP, on_h, on_cxx
            b0[unit] = -direction * STEEP * step_at + gate + offset
            for g in unit_gates:  # closed unless every gate's feature is within its bound
                w0[gate_column[g], unit] = GATE
                b0[unit] -= GATE
            w1[unit, 1] = direction * sign
    source = {"algorithm": "threshold", "up": {"C++": _label(shifts["cxx"]), "C": _label(shifts["c"])}}
    # a language left as clang decides is not the policy's to decide: served, its channel is not even opened
    languages = [family for family, key in (("C", "c"), ("C++", "cxx")) if shifts[key] is not None] or None
    return MLPPolicy([(w0, b0), (w1, b1)], vocab, activation="relu", extras=extras, source=source, languages=languages)


def train_threshold(cfg: ThresholdConfig, *, say: Callable[[str], Any] = print) -> dict[str, Any]:
    """Tune the per-language threshold shift on ``cfg.corpus``; returns (and writes) the final figures."""
    from optgym.corpus import Corpus
    from optgym.train.evaluation import evaluate

    unknown = sorted(set(cfg.languages) - set(LANGUAGES))
    if unknown or not cfg.languages:
        raise RunError(f"languages to tune are among {list(LANGUAGES)}, not {cfg.languages}")
    run = prepare_run_dir(Path(cfg.output), resume=False)
    # TOML has no null: "none" and "all" stand for None
    shifts = [parse_shift(text) for text in cfg.up]
    cfg.up = [_label(shift) for shift in shifts]
    write_config(run, "threshold", {**asdict(cfg), "split": cfg.split or "all"})
    problem = get_problem(cfg.problem)
    features = problem.visible_features()
    if "threshold" not in features or "cost_estimate" not in features:
        raise RunError(f"{cfg.problem} has no threshold and cost_estimate features to move")
    corpus = Corpus(cfg.corpus, split=cfg.split)
    if len(corpus) == 0:
        raise RunError(f"{cfg.corpus} has no modules on the {cfg.split} side")
    if cfg.samples < 1:
        raise RunError(f"samples must be at least 1, not {cfg.samples}")
    # each sample is drawn from every module, then kept to the languages tuned: the same sample per language
    names = [m.name for m in corpus]
    samples = [set(sample_modules(names, cfg.sampling_rate, cfg.seed + i)) for i in range(cfg.samples)]
    union = set().union(*samples)
    language = {n: corpus.module(n).family for n in union}
    tuned_on = [n for n in names if n in union and language[n] in cfg.languages]
    say(f"tuning on {len(tuned_on)} of {len(corpus)} modules ({sum(language[n] == 'C++' for n in tuned_on)} C++"
        f"{f', {cfg.samples} samples' if cfg.samples > 1 else ''}), {len(cfg.up)} candidates")  # fmt: skip

    # 1. every candidate compiled on the sample; its figures per language
    candidates: list[dict[str, Any]] = []
    for shift in shifts:
        start = time.perf_counter()
        directory = threshold_policy(features, cxx=shift, c=shift).save(run / "candidates" / _directory_name(shift))
        rows = evaluate(str(directory), corpus, problem=cfg.problem, modules=tuned_on, workers=cfg.workers,
                        timeout=cfg.timeout, progress=False)  # fmt: skip
        row: dict[str, Any] = {"up": _label(shift), "seconds": round(time.perf_counter() - start, 1)}
        for lang in cfg.languages:
            ours = [r for r in rows if language[r.module] == lang]
            row[lang] = summary_figures(ours)
            if cfg.samples > 1:  # and per sample: the bar must hold on each
                row[lang]["samples"] = [summary_figures([r for r in ours if r.module in sample]) for sample in samples]
            for figures in row[lang].get("samples", [row[lang]]):
                if figures["evaluated"]:
                    say(f"up {_label(shift)}, {lang}: {figures['total_ratio']:.4f} of the heuristic "
                        f"(.text {figures['dottext_ratio']:.4f}), {figures['regressed_over_1pct']} of "
                        f"{figures['evaluated']} modules > 1 % worse")  # fmt: skip
        candidates.append(row)

    # 2. per language, the smallest total (over all samples) within the regression budget on every sample
    chosen = {lang: "none" for lang in LANGUAGES}
    for lang in cfg.languages:
        allowed = [c for c in candidates if c[lang]["evaluated"] and not c[lang]["failed"] and all(
                   f["regressed_share"] <= cfg.max_regressed for f in c[lang].get("samples", [c[lang]]))]  # fmt: skip

        def total_ratio(c: dict[str, Any], lang: str = lang) -> float:
            return c[lang]["total_ratio"]

        best = min(allowed, key=total_ratio, default=None)
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
                         "sampling_rate": cfg.sampling_rate, "seed": cfg.seed, "samples": cfg.samples}}  # fmt: skip
    stored_split = Corpus(cfg.corpus).description.get("optgym", {}).get("split")
    return evaluate_final(run, cfg.corpus, "train" if stored_split else None, head, enabled=cfg.final_eval,
                          workers=cfg.workers, timeout=cfg.timeout, problem=cfg.problem, say=say)  # fmt: skip


def summary_figures(rows: Sequence[Any], keys: Sequence[str] = REPORTED) -> dict[str, Any]:
    """``keys`` of the evaluation summary of some modules, with the share of them more than 1 % worse (the
    size target's regression bar) — what the tuner and ``maintainer/ship_pretrained.py`` report per language."""
    from optgym.train.evaluation import summarize

    figures = summarize(rows)
    return {key: figures[key] for key in keys} | {
        "regressed_share": figures["regressed_over_1pct"] / max(1, figures["evaluated"])
    }


def figures_by_language(
    rows: Sequence[Any], family_of: dict[str, str], keys: Sequence[str] = REPORTED
) -> dict[str, dict[str, Any]]:
    """:func:`summary_figures` over all ``rows`` and per language family (``family_of``: module name → "C" or
    "C++", ObjC++ counted as C++) — the shape every provenance file and leaderboard row keeps."""
    out = {"all": summary_figures(rows, keys)}
    for family in ("C", "C++"):
        out[family] = summary_figures([r for r in rows if family_of[r.module] == family], keys)
    return out


def config_from_options(options: dict[str, Any], output: Path | str) -> ThresholdConfig:
    """A recorded ``[run]`` table (``RUN/config.toml``) as a config writing to ``output``."""
    fields = {k: v for k, v in options.items() if k in ThresholdConfig.__dataclass_fields__}
    fields["split"] = None if fields.get("split", "all") == "all" else fields["split"]
    return ThresholdConfig(**{**fields, "output": str(output)})


__all__ = [
    "ThresholdConfig",
    "config_from_options",
    "figures_by_language",
    "gate_holds",
    "parse_gate",
    "parse_shift",
    "summary_figures",
    "threshold_policy",
    "train_threshold",
]
