"""``optgym train bc``: behavioral cloning of the heuristic's decisions from a trace, in torch.

Read top to bottom: load the trace's features and the heuristic's answers → normalize them with the
vocab → hold out part of the trace (whole modules when there are enough of them, since decisions in
one module are correlated; single decisions otherwise) → train a small MLP with cross-entropy →
export it as a numpy policy directory → compile the corpus with the greedy cloned policy and compare
its size with the heuristic's (target: within 1 %).

The cloned network has SB3 ``MlpPolicy``'s actor layout, so ``optgym train ppo --warmstart DIR``
starts from it (see :mod:`optgym.policies.torch_mlp`).

Output ``DIR``: ``policy/`` (the numpy policy; ``--policy DIR`` names it), ``metrics.json``,
``config.toml``, ``progress.csv``, TensorBoard events, ``eval/`` (the evaluation trace).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from optgym.files import atomic_write_bytes
from optgym.problems.inputs import PolicyInputs
from optgym.problems.normalize import Vocab, VocabError
from optgym.train.run import ProgressCSV, prepare_run_dir, write_config
from optgym.train.trace import TraceError, feature_matrix, iter_batches, read_meta, read_modules, trace


@dataclass
class BCConfig:
    trace: str
    vocab: str
    output: str
    hidden: list[int] = field(default_factory=lambda: [64, 64])
    activation: str = "tanh"
    epochs: int = 60
    batch_size: int = 128
    learning_rate: float = 2e-3
    weight_decay: float = 0.0
    holdout: float = 0.2  # fraction of the trace held out for agreement
    holdout_by: str = "auto"  # module | decision | auto (module when the trace has ≥ 10 modules)
    seed: int = 0
    evaluate: bool = True  # compile the corpus with the cloned policy
    workers: int | None = None
    timeout: float = 120.0
    label: str = "heuristic"  # the trace column learned: heuristic (clone clang) or action (the trace's policy)
    extras: list[str] = field(default_factory=list)  # derived inputs (optgym.problems.inputs), e.g. heuristic


def load_trace_arrays(
    path: Path | str, names: list[str], label: str = "heuristic"
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(features [N, F] float64, labels [N] int64, module [N] str, heuristic [N] int64)`` of a trace's
    decisions.

    ``label`` names the column learned: ``heuristic`` (clang's answers) or ``action`` (what the
    traced policy did — a search's best decisions, for ``optgym train imitate``). Everything is held in
    memory (38 features × 8 bytes: ~300 MB per million decisions); decisions without a label are dropped.
    """
    if label not in ("heuristic", "action"):
        raise TraceError(f"a bc label is heuristic or action, not {label!r}")
    feats, labels, modules, heuristic = [], [], [], []
    for batch in iter_batches(path, [*names, *dict.fromkeys([label, "heuristic"]), "module"]):
        feats.append(feature_matrix(batch, names))
        labels.append(batch.column(label).to_numpy())
        heuristic.append(batch.column("heuristic").to_numpy())
        modules.append(np.asarray(batch.column("module").to_pylist(), dtype=object))
    if not feats:
        raise TraceError(f"{path} has no decisions")
    x, y, m = np.concatenate(feats), np.concatenate(labels).astype(np.int64), np.concatenate(modules)
    h = np.concatenate(heuristic).astype(np.int64)
    keep = y >= 0
    return x[keep], y[keep], m[keep], h[keep]


def holdout_mask(modules: np.ndarray, fraction: float, by: str, seed: int) -> tuple[np.ndarray, str]:
    """Which rows are held out, and by what (``module`` or ``decision``); reproducible from ``seed``."""
    names = sorted(set(modules.tolist()))
    if by == "auto":
        by = "module" if len(names) >= 10 else "decision"
    if by == "module":
        ranked = sorted(names, key=lambda n: hashlib.sha256(f"{seed}\0{n}".encode()).hexdigest())
        held = set(ranked[: max(1, round(len(names) * fraction))])
        return np.array([m in held for m in modules.tolist()], dtype=bool), by
    if by != "decision":
        raise ValueError(f"holdout_by must be module, decision or auto, not {by!r}")
    return np.random.default_rng(seed).random(len(modules)) < fraction, by


def train_bc(cfg: BCConfig, *, progress: bool = True) -> dict[str, Any]:
    """Clone the heuristic; returns (and writes to ``metrics.json``) agreement and size figures."""
    import torch
    from torch.nn import functional as F
    from torch.utils.tensorboard import SummaryWriter

    from optgym.policies.torch_mlp import build_mlp, linear_layers, to_numpy_policy

    out = prepare_run_dir(Path(cfg.output), resume=False)
    write_config(out, "bc", asdict(cfg))
    torch.manual_seed(cfg.seed)
    # One thread: a 2×64 MLP gains nothing from more, and on a machine shared with compiles torch's
    # spinning threads made the same training 20× slower (measured: 19 s vs 386 s under load).
    torch.set_num_threads(1)

    # 1. data: the trace's features, normalized as every policy sees them, and the heuristic's answers
    meta = read_meta(cfg.trace)
    vocab = Vocab.load(cfg.vocab)
    if vocab.names != meta["features"]:
        raise VocabError(f"{cfg.vocab} does not cover the trace's features in its order (make it from this trace)")
    raw, labels, modules, heuristic = load_trace_arrays(cfg.trace, meta["features"], cfg.label)
    inputs = PolicyInputs(vocab, cfg.extras)
    x = torch.as_tensor(inputs(raw, heuristic, dtype=np.float32))
    y = torch.as_tensor(labels)
    held, held_by = holdout_mask(modules, cfg.holdout, cfg.holdout_by, cfg.seed)
    held_t = torch.as_tensor(held)
    x_train, y_train, x_held, y_held = x[~held_t], y[~held_t], x[held_t], y[held_t]

    # 2. the network and its optimizer
    net = build_mlp(inputs.width, cfg.hidden, 2, cfg.activation)
    optimizer = torch.optim.Adam(net.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    writer = SummaryWriter(str(out))
    csv = ProgressCSV(out / "progress.csv")

    def agreement(xs: torch.Tensor, ys: torch.Tensor) -> float:
        if len(ys) == 0:
            return float("nan")
        with torch.no_grad():
            return float((net(xs).argmax(-1) == ys).float().mean())

    # 3. cross-entropy on minibatches
    start = time.perf_counter()
    generator = torch.Generator().manual_seed(cfg.seed)
    for epoch in range(1, cfg.epochs + 1):
        order = torch.randperm(len(y_train), generator=generator)
        total = 0.0
        for i in range(0, len(order), cfg.batch_size):
            idx = order[i : i + cfg.batch_size]
            loss = F.cross_entropy(net(x_train[idx]), y_train[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(idx)
        row = {
            "epoch": epoch,
            "loss": total / max(1, len(y_train)),
            "train_agreement": agreement(x_train, y_train),
            "holdout_agreement": agreement(x_held, y_held),
        }
        for key, value in row.items():
            if key != "epoch":
                writer.add_scalar(f"bc/{key}", value, epoch)
        csv.write(row)
    train_seconds = time.perf_counter() - start

    # 4. export the numpy policy that rollout workers run
    policy = to_numpy_policy(linear_layers(net), vocab, activation=cfg.activation, problem=meta["problem"],
                             source={"algorithm": "bc", "trace": str(Path(cfg.trace).resolve())},
                             extras=cfg.extras)  # fmt: skip
    policy.save(out / "policy")
    torch.save(net.state_dict(), out / "bc_network.pt")

    metrics: dict[str, Any] = {
        "decisions": len(labels),
        "train_decisions": int((~held).sum()),
        "holdout_decisions": int(held.sum()),
        "holdout_by": held_by,
        "heuristic_inline_rate": float(labels.mean()),  # of the labels learned (see ``label``)
        "label": cfg.label,
        "train_agreement": agreement(x_train, y_train),
        "holdout_agreement": agreement(x_held, y_held),
        "train_seconds": round(train_seconds, 2),
    }

    # 5. the cloned policy, greedy, on the trace's corpus: its size against the heuristic's
    if cfg.evaluate:
        ev = trace(meta["corpus"], out / "eval", problem=meta["problem"], mode="eval", policy=str(out / "policy"),
                   split=meta.get("split"), workers=cfg.workers, timeout=cfg.timeout, progress=progress,
                   overwrite=True)  # fmt: skip
        summary = ev["summary"]
        metrics["size_ratio"] = summary["size_ratio"]
        metrics["text_bytes"] = summary["text_bytes"]
        metrics["heuristic_text_bytes"] = summary["heuristic_text_bytes"]
        metrics["eval_failures"] = summary["failures"]
        if held_by == "module":
            held_names = set(modules[held].tolist())
            rows = [r for r in read_modules(out / "eval") if r["module"] in held_names and r["status"] == "ok"]
            h = sum(r["heuristic_text_bytes"] for r in rows)
            metrics["holdout_size_ratio"] = sum(r["text_bytes"] for r in rows) / h if h else None
        writer.add_scalar("results/vs_heuristic", summary["size_ratio"] or float("nan"), cfg.epochs)
    writer.close()
    atomic_write_bytes(out / "metrics.json", json.dumps(metrics, indent=2).encode())
    return metrics


__all__ = ["BCConfig", "holdout_mask", "load_trace_arrays", "train_bc"]
