"""``optgym train imitate``: learn the decisions a search found, DAgger-style.

Read top to bottom, one *round* at a time:

1. **demonstrations** — the states of every verified best trajectory of the search directories
   (``optgym train search``), labelled with the action the best took there — and, unless
   ``--no-unsearched``, the heuristic's trajectories of the modules the search skipped (under its
   ``--min-decisions``: the best known there, and what keeps the policy close to clang where nothing
   was searched; trained on a search of cmark + graphite2, the policy was 1.034 of the heuristic on
   held-out zlib without them, 1.000 with) — written as a trace
   (``RUN/data/round-KK``, the format :mod:`optgym.train.trace` writes) so that behavioral cloning reads
   it unchanged;
2. **train** — :func:`optgym.train.bc.train_bc` on that trace with ``label="action"`` (the one
   trainer: same network, normalization and hold-out as cloning the heuristic) into
   ``RUN/rounds/KK``; the policy becomes snapshot ``KK`` (``RUN/snapshots/<KK>/policy``);
3. **DAgger** (rounds ≥ 1) — the previous round's policy compiles every searched module greedily,
   and a small search (``--dagger-budget`` compiles per module, no evolution) starts from the states
   *it* reaches: it tries flipping the policy's deviations from the heuristic and its least confident
   decisions, continuing with the policy after each flip. The states whose flip was tried get the
   better action as label (``examined`` in the search's states); they join the demonstrations of
   every earlier round, and the network is trained again on the aggregate.

Single-flip lookahead is the expert here: it is what a compile budget affords, and labels a state
with the better of two answers given that the policy decides the rest. Round 0 is plain behavioral
cloning of the search; ``--dagger-rounds K`` adds K rounds, and ``--resume RUN`` continues (a larger
``--dagger-rounds`` extends a finished run). ``RUN/final/policy`` is the last round's policy, evaluated
greedily on each side of the first search's corpus split (``RUN/final/metrics.json``).

Each round's figures go to ``progress.csv`` and TensorBoard: demonstrations, agreement on held-out
demonstrations, and — from the DAgger compiles — the previous round's policy's size against the
heuristic on the searched modules (``dagger/start_vs_heuristic``; in TensorBoard also
``results/vs_heuristic`` at that policy's round), and how much smaller the DAgger search got from there.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from optgym.files import atomic_write_bytes
from optgym.policies.allowance import LEADING, allowance_policy, describe, trainable
from optgym.problems import get_problem
from optgym.train.run import (
    ProgressCSV,
    RunError,
    config_from,
    evaluate_final,
    prepare_run_dir,
    read_state,
    write_config,
    write_snapshot,
)
from optgym.train.search import SearchConfig, module_records, read_search, read_states, search
from optgym.train.trace import ModuleTrace, TraceWriter, read_meta


@dataclass
class ImitateConfig:
    search: list[str]  # search directories (optgym train search); the first one's corpus is evaluated
    output: str
    vocab: str | None = None  # default: made from round 0's demonstrations (RUN/vocab.json)
    dagger_rounds: int = 0
    dagger_budget: int = 100  # compiles per module per DAgger search
    dagger_focus: float = 0.05  # DAgger flips the policy's deviations + this least confident fraction
    hidden: list[int] = field(default_factory=lambda: [64, 64])
    epochs: int = 60
    batch_size: int = 128
    learning_rate: float = 2e-3
    holdout: float = 0.2
    seed: int = 0
    workers: int | None = None
    timeout: float = 120.0
    final_eval: bool = True
    unsearched: bool = True  # also learn the (heuristic) trajectories of the modules a search skipped
    extras: list[str] = field(default_factory=list)  # derived inputs (optgym.problems.inputs); CLI: residual
    #: learn an allowance over clang's inline threshold gated by these 0/1 inputs (optgym.policies.allowance) by
    #: logistic regression on the examined states, instead of a network (see fit_allowance)
    allowance: list[str] = field(default_factory=list)
    l2: float = 1.0  # the allowance's ridge penalty on the gates' weights (in units of one demonstration)


def feature_names(problem: str) -> list[str]:
    """The visible features in the problem's order: the columns of every trace and policy."""
    return get_problem(problem).visible_features()


def demonstrations(directory: Path | str, *, examined_only: bool, skipped: bool = False) -> list[ModuleTrace]:
    """One :class:`ModuleTrace` per searched module of a search directory: its best trajectory's states
    and actions (only the ``examined`` states with ``examined_only``), and with ``skipped`` the start
    trajectories of the modules the search skipped. Failed modules give nothing."""
    meta = read_search(directory)
    names = feature_names(meta["problem"])
    out = []
    for rec in module_records(directory):
        if rec["status"] not in ("budget", "converged", *(("skipped",) if skipped else ())):
            continue
        table = read_states(directory, rec["module"])
        if table is None:
            continue
        keep = table.column("examined").to_numpy(zero_copy_only=False) if examined_only else None
        if keep is not None and not keep.any():
            continue

        def column(name: str, keep=keep, table=table) -> np.ndarray:
            values = table.column(name).to_numpy()
            return values[keep] if keep is not None else values

        out.append(
            ModuleTrace(
                rec["module"],
                "ok",
                decisions=int(keep.sum()) if keep is not None else table.num_rows,
                features={n: column(n) for n in names},
                actions=column("action"),
                heuristic=column("heuristic"),
                metrics={"text_bytes": rec["best"]["text_bytes"], "dottext_bytes": rec["best"]["dottext_bytes"]},
                heuristic_metrics=dict(rec["heuristic"]),
            )
        )
    return out


def write_demonstrations(out: Path, sources: list[tuple[str, bool, bool]], problem: str, corpus: str) -> dict[str, Any]:
    """The demonstrations of ``sources`` (search directory, examined states only?, skipped modules too?)
    as one trace at ``out``."""
    if out.exists():
        shutil.rmtree(out)  # a round's data is derived, never edited: made again on resume
    writer = TraceWriter(out)
    per_source = {}
    for directory, examined_only, skipped in sources:
        traces = demonstrations(directory, examined_only=examined_only, skipped=skipped)
        per_source[directory] = sum(len(t.actions) for t in traces if t.actions is not None)
        for t in traces:
            writer.add(t)
    meta = {
        "kind": "optgym-trace",
        "problem": problem,
        "mode": "demonstrations",
        "policy": "search",
        "corpus": corpus,
        "split": None,
        "features": feature_names(problem),
        "sources": per_source,
    }
    meta = writer.close(meta)
    if meta["decisions"] == 0:
        raise RunError(f"the searches {[s[0] for s in sources]} hold no verified best trajectory to learn from")
    return meta


def _dagger_figures(meta: dict[str, Any]) -> dict[str, float]:
    """The previous round's policy (the DAgger search's start) and the DAgger best, against the heuristic."""
    rows = [r for r in meta["modules"] if r["status"] in ("budget", "converged")]
    heur = sum(r["heuristic_text_bytes"] for r in rows)
    if not heur:
        return {}
    return {
        "dagger/start_vs_heuristic": sum(r["start_text_bytes"] for r in rows) / heur,
        "dagger/best_vs_heuristic": sum(r["best_text_bytes"] for r in rows) / heur,
        "dagger/compiles": sum(r["compiles"] + r["verify_compiles"] for r in rows),
        "dagger/improved_modules": sum(r["best_text_bytes"] < r["start_text_bytes"] for r in rows),
    }


def logistic_regression(x: np.ndarray, y: np.ndarray, penalty: np.ndarray, iterations: int = 100) -> np.ndarray:
    """Coefficients β minimizing ``Σ log-loss(σ(x·β), y) + ½ Σ penalty·β²`` by Newton's method: a convex problem,
    so the answer depends on the data alone, never on a seed or a step size. A tiny ridge on every coefficient
    keeps it finite where the data separate (a gate that is always 0 among the rows)."""
    beta = np.zeros(x.shape[1])
    ridge = penalty + 1e-6
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-(x @ beta)))
        gradient = x.T @ (p - y) + ridge * beta
        hessian = (x * (p * (1 - p))[:, None]).T @ x + np.diag(ridge)
        step = np.linalg.solve(hessian, gradient)
        beta -= step
        if np.abs(step).max() < 1e-9:
            break
    return beta


def fit_allowance(
    data: Path, gates: list[str], out: Path, l2: float, problem: str, languages: list[str] | None = None
) -> dict[str, Any]:
    """The allowance (:mod:`optgym.policies.allowance`) that best predicts the search's answers where clang
    refused, written as a policy directory at ``out/policy``.

    The family inlines where ``m + b + w·g > 0`` (``m`` the cost margin, ``g`` the gates) on a call site clang
    refuses, and keeps every inline clang makes. So only the examined states where clang said no carry
    information about ``b`` and ``w``: there the label is whether inlining turned out smaller. A logistic
    regression ``P(inline) = σ(α·m + β + γ·g)`` on those states puts its even-odds boundary at ``b = β/α``,
    ``w = γ/α``: the allowance where the searched call sites were as often better inlined as not. Nothing is
    set by hand but the gates (a fixed basis) and the ridge ``l2`` on ``γ``. ``languages``: what the policy
    decides (the searches' ``--language``); other compiles keep clang's decisions."""
    from optgym.train.bc import load_trace_arrays

    meta = read_meta(data)
    start = allowance_policy(gates, problem)
    if start.inputs.needs_language:
        raise RunError("an imitated allowance takes no 'cxx' gate: the demonstrations do not say a module's language")
    raw, labels, _modules, heuristic = load_trace_arrays(data, meta["features"], "action")
    refused = heuristic == 0
    if not refused.any():
        raise RunError(f"{data}: no examined state where clang refused to inline; nothing to learn an allowance from")
    derived = start.inputs(raw[refused], heuristic[refused])[:, start.normalizer.width :]  # [h, m, gates…]
    margin, gate_values = derived[:, 1], derived[:, len(LEADING) :]
    x = np.column_stack([margin, np.ones(len(margin)), gate_values])
    penalty = np.array([0.0, 0.0, *[l2] * gate_values.shape[1]])
    alpha, beta, *gamma = logistic_regression(x, labels[refused].astype(np.float64), penalty)
    if alpha <= 0:
        raise RunError(f"the searched inlines do not grow likelier as the cost nears the threshold (α = {alpha:.3g})"
                       "; an allowance cannot describe them")  # fmt: skip
    theta = start.parameters()
    theta[trainable(start) > 0] = [*(np.asarray(gamma) / alpha), beta / alpha]  # the gates' weights, then the bias
    policy = start.with_parameters(theta)
    policy.languages = languages
    policy.save(out / "policy")
    decided = policy.logits(raw[refused], heuristic[refused]).argmax(-1)
    metrics = {
        "demonstrations": len(labels),
        "refused_states": int(refused.sum()),
        "heuristic_inline_rate": float(labels[refused].mean()),  # the searched "yes" share where clang said no
        "train_agreement": float((decided == labels[refused]).mean()),
        "holdout_agreement": float("nan"),
        "margin_scale": float(alpha),
        "allowance": dict(describe(policy)),
    }
    atomic_write_bytes(out / "metrics.json", json.dumps(metrics, indent=2).encode())
    return metrics


def train_imitate(cfg: ImitateConfig, *, resume: bool = False, say=print, progress: bool = False) -> dict[str, Any]:
    """Run (or resume) imitation of ``cfg.search``; returns the final results (``RUN/final/metrics.json``)."""
    import torch
    from torch.utils.tensorboard import SummaryWriter

    from optgym.policies.mlp import MLPPolicy
    from optgym.policies.trained import latest_snapshot
    from optgym.train.bc import BCConfig, train_bc
    from optgym.train.vocab import vocab_from_trace

    if not cfg.search:
        raise RunError("--search names no search directory")
    run = Path(cfg.output)
    cfg.search = [str(Path(s).resolve()) for s in cfg.search]
    metas = [read_search(s) for s in cfg.search]
    problem = metas[0]["problem"]
    if any(m["problem"] != problem for m in metas):
        raise RunError("the searches are of different problems")
    if cfg.allowance:  # it learns from examined states alone: elsewhere a label is the start's answer, not a finding
        cfg.unsearched = False
    prepare_run_dir(run, resume=resume)
    write_config(run, "imitate", asdict(cfg))  # a resume may extend --dagger-rounds
    torch.set_num_threads(1)  # the learner shares the cores with the compilers

    last = latest_snapshot(run) if resume else None
    first_round = read_state(last)["iteration"] + 1 if last is not None else 0
    if last is not None:
        say(f"resuming {run} after round {first_round - 1}")
    writer = SummaryWriter(str(run))
    csv = ProgressCSV(run / "progress.csv", resumed_at=("round", first_round - 1))
    sources = [(s, bool(cfg.allowance), cfg.unsearched) for s in cfg.search]
    for k in range(1, first_round):  # the DAgger searches of the rounds already done
        sources += [(str(d), True, False) for d in sorted((run / "dagger" / f"round-{k:02d}").glob("search-*"))]

    for k in range(first_round, cfg.dagger_rounds + 1):
        start = time.perf_counter()
        row: dict[str, Any] = {"round": k}
        # DAgger (step 3 of the module doc): search from the states the previous round's policy reaches
        if k > 0:
            policy_dir = str(latest_snapshot(run) / "policy")  # type: ignore[operator]
            for j, meta in enumerate(metas):
                searched = [
                    r["module"] for r in module_records(cfg.search[j]) if r["status"] in ("budget", "converged")
                ]
                out = run / "dagger" / f"round-{k:02d}" / f"search-{j}"
                dagger = search(SearchConfig(corpus=meta["corpus"], output=str(out), budget=cfg.dagger_budget,
                                             workers=cfg.workers, module_names=searched, start=policy_dir,
                                             focus=cfg.dagger_focus, groups=False, evolve=False,
                                             seed=cfg.seed + k,
                                             timeout=cfg.timeout, problem=problem),
                                progress=progress, say=say)  # fmt: skip
                if j == 0:
                    row.update(_dagger_figures(dagger))
                sources.append((str(out), True, False))

        # step 1: the demonstrations of every search so far, as one trace
        data = run / "data" / f"round-{k:02d}"
        data_meta = write_demonstrations(data, sources, problem, metas[0]["corpus"])
        if cfg.vocab is None and not cfg.allowance:  # an allowance reads no normalized feature
            vocab_from_trace(data).save(run / "vocab.json")  # round 0's states: every later round keeps it
            cfg.vocab = str((run / "vocab.json").resolve())
            write_config(run, "imitate", asdict(cfg))

        # step 2: behavioral cloning of the demonstrations' actions (a fresh network on the aggregate), or the
        # allowance's logistic regression
        bc_dir = run / "rounds" / f"{k:02d}"
        if bc_dir.exists():
            shutil.rmtree(bc_dir)  # a round killed before its snapshot: trained again
        if cfg.allowance:
            language = metas[0]["options"].get("language")
            metrics = fit_allowance(data, cfg.allowance, bc_dir, cfg.l2, problem, [language] if language else None)
        else:
            assert cfg.vocab is not None  # made from round 0's states above
            metrics = train_bc(BCConfig(trace=str(data), vocab=cfg.vocab, output=str(bc_dir), hidden=cfg.hidden,
                                        epochs=cfg.epochs, batch_size=cfg.batch_size, learning_rate=cfg.learning_rate,
                                        holdout=cfg.holdout, seed=cfg.seed, evaluate=False, label="action",
                                        workers=cfg.workers, timeout=cfg.timeout, extras=cfg.extras),
                             progress=progress)  # fmt: skip
        row.update({
            "demonstrations": data_meta["decisions"],
            "imitate/train_agreement": metrics["train_agreement"],
            "imitate/holdout_agreement": metrics["holdout_agreement"],
            "imitate/label_inline_rate": metrics["heuristic_inline_rate"],
            "time/round_seconds": time.perf_counter() - start,
        })  # fmt: skip

        def fill(tmp: Path, bc_dir: Path = bc_dir, k: int = k) -> None:
            policy = MLPPolicy.load(bc_dir / "policy")
            policy.source = {"algorithm": "imitate", "round": k, "searches": cfg.search}
            policy.save(tmp / "policy")

        write_snapshot(run, k, fill, {"round": k, "demonstrations": data_meta["decisions"], "time": time.time()})
        for key, value in row.items():
            if key != "round":
                writer.add_scalar(key, value, k)
        if "dagger/start_vs_heuristic" in row:  # the size of round k - 1's policy, plotted at its round
            writer.add_scalar("results/vs_heuristic", row["dagger/start_vs_heuristic"], k - 1)
        writer.flush()
        csv.write(row)
        figures = (
            f"; round {k - 1}'s policy on the searched modules: {row['dagger/start_vs_heuristic']:.4f} of the "
            f"heuristic, the DAgger search from there {row['dagger/best_vs_heuristic']:.4f}"
            if "dagger/start_vs_heuristic" in row
            else ""
        )
        held_out = row["imitate/holdout_agreement"]
        agreement = (  # an allowance is fitted to every examined state: it has no held-out part to report
            f"held-out agreement {held_out:.4f}"
            if not math.isnan(held_out)
            else f"agreement {row['imitate/train_agreement']:.4f} on the states it was fitted to"
        )
        say(f"round {k}: {row['demonstrations']} demonstrations, {agreement}{figures}")
    writer.close()

    last = latest_snapshot(run)
    assert last is not None
    final = run / "final" / "policy"
    if final.exists():
        shutil.rmtree(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(last / "policy", final)
    head = {"algorithm": "imitate", "rounds": cfg.dagger_rounds + 1, "searches": cfg.search}
    return evaluate_final(run, metas[0]["corpus"], metas[0].get("split"), head, enabled=cfg.final_eval,
                          workers=cfg.workers, timeout=cfg.timeout, problem=problem, say=say)  # fmt: skip


def config_from_run(path: Path) -> ImitateConfig:
    return config_from(path, ImitateConfig, ["imitate"], "an imitate one")


__all__ = [
    "ImitateConfig",
    "config_from_run",
    "demonstrations",
    "fit_allowance",
    "logistic_regression",
    "train_imitate",
    "write_demonstrations",
]
