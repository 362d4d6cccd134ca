"""``optgym trace``: every decision a policy makes over a corpus, as sharded Parquet.

Modes, as the .NET MLJIT names them: ``record`` (the compiler's heuristic — the data behavioral
cloning and the vocab are made from), ``collect`` (a policy sampling its actions) and ``eval`` (a
policy acting greedily). Each module is one :func:`~optgym.rollout.rollout` on a worker with the
policy built *inside* the worker; results stream back and are written as they come, a row group at
a time, so memory stays flat however large the corpus.

A trace directory::

    trace.json                 format version, problem, mode, policy, corpus, feature names, totals
                               (written last: a trace without it is incomplete)
    decisions-00000.parquet    one row per decision: module, step, every visible feature (its own
                               column, raw values), heuristic (-1: none), action, log_prob
    modules.parquet            one row per module: status, decisions, the policy's and the
                               heuristic's sizes, compile seconds

Shards are written under a temporary name and renamed when closed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from optgym.corpus import Corpus
from optgym.corpus.portable import PortableModule, local_module, portable_modules
from optgym.errors import OptgymError
from optgym.files import atomic_write_bytes, read_versioned
from optgym.parallel import run_tasks
from optgym.policies import PolicyFactory, resolve_policy
from optgym.policies.portable import portable_policy
from optgym.problems import Metrics, get_problem
from optgym.rollout import DEFAULT_TIMEOUT, baseline, rollout
from optgym.rollout.rollout import DecisionPoint
from optgym.toolchain import find_toolchain

TRACE_FORMAT_VERSION = 1
MODES = ("record", "collect", "eval")
META = "trace.json"
MODULES = "modules.parquet"
RESERVED = ("module", "step", "heuristic", "action", "log_prob")


class TraceError(OptgymError):
    """A trace that cannot be written or read."""


@dataclass(frozen=True)
class TraceTask:
    problem: str
    source: PortableModule  # the module, or under Ray its content: see corpus.portable
    module: str
    policy: PolicyFactory
    mode: str
    seed: int
    timeout: float


@dataclass
class ModuleTrace:
    """What a worker sends back for one module."""

    module: str
    status: str
    detail: str = ""
    decisions: int = 0
    compile_seconds: float = 0.0
    features: dict[str, np.ndarray] = field(default_factory=dict)  # name → [T] (or [T, k])
    actions: np.ndarray | None = None
    heuristic: np.ndarray | None = None
    log_probs: np.ndarray | None = None
    metrics: Metrics = field(default_factory=dict)
    heuristic_metrics: Metrics = field(default_factory=dict)


class _Recorder:
    """Wraps a policy to keep each decision's raw features (with their own dtypes, unlike ``vector()``)."""

    def __init__(self, policy) -> None:
        self.policy = policy
        self.rows: list[dict[str, np.ndarray]] = []

    def __call__(self, point: DecisionPoint):
        self.rows.append(point.features())
        return self.policy(point)


def build_policy(factory: PolicyFactory, mode: str, seed: int):
    """The policy a mode runs: record → heuristic, eval → greedy, collect → sampling (when it can)."""
    policy = factory.build(seed=seed) if factory.stochastic else factory.build()
    if mode == "collect" and hasattr(policy, "stochastic"):
        policy = policy.stochastic(seed=seed)
    return policy


def trace_module(task: TraceTask) -> ModuleTrace:
    """Worker: compile one module with the task's policy and return its decisions and sizes."""
    problem = get_problem(task.problem)
    toolchain = find_toolchain((problem.hook,))
    module = local_module(task.source)
    recorder = _Recorder(build_policy(task.policy, task.mode, task.seed))
    run = rollout(problem, module, toolchain, recorder, timeout=task.timeout)
    res, traj = run.result, run.trajectory
    out = ModuleTrace(task.module, res.status, res.detail, res.decisions, res.compile_seconds, metrics=res.metrics)
    if not res.ok:
        return out  # a failed compile's decisions are not a trajectory of anything
    if task.mode == "record":
        out.heuristic_metrics = dict(res.metrics)  # replaying the heuristic is byte-identical to it
    else:
        base = baseline(problem, module, toolchain, timeout=task.timeout)
        out.heuristic_metrics = dict(base.metrics) if base.ok else {}
    if recorder.rows:
        names = recorder.rows[0].keys()
        out.features = {n: np.stack([r[n] for r in recorder.rows]) for n in names}
        out.features = {n: (v[:, 0] if v.ndim == 2 and v.shape[1] == 1 else v) for n, v in out.features.items()}
    out.actions, out.heuristic, out.log_probs = traj.actions, traj.heuristic, traj.log_probs
    return out


class TraceWriter:
    """Appends module traces to Parquet shards (a row group per ``row_group`` rows, a shard per ``shard_rows``)."""

    def __init__(self, root: Path, *, row_group: int = 65_536, shard_rows: int = 2_000_000) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.row_group, self.shard_rows = row_group, shard_rows
        self._buffer: list[ModuleTrace] = []
        self._buffered = 0
        self._writer: pq.ParquetWriter | None = None
        self._shard = 0
        self._shard_rows = 0
        self._tmp: Path | None = None
        self.schema: pa.Schema | None = None
        self.shards: list[str] = []
        self._modules: list[dict[str, Any]] = []
        self.decisions = 0

    def add(self, trace: ModuleTrace) -> None:
        self._modules.append(
            {
                "module": trace.module,
                "status": trace.status,
                "detail": trace.detail,
                "decisions": trace.decisions,
                "compile_seconds": trace.compile_seconds,
                "text_bytes": trace.metrics.get("text_bytes"),
                "dottext_bytes": trace.metrics.get("dottext_bytes"),
                "heuristic_text_bytes": trace.heuristic_metrics.get("text_bytes"),
                "heuristic_dottext_bytes": trace.heuristic_metrics.get("dottext_bytes"),
            }
        )
        if trace.actions is None or len(trace.actions) == 0:
            return
        self._buffer.append(trace)
        self._buffered += len(trace.actions)
        if self._buffered >= self.row_group:
            self._flush()

    def _table(self, traces: Sequence[ModuleTrace]) -> pa.Table:
        n = [len(t.actions) for t in traces]  # type: ignore[arg-type]
        columns: dict[str, Any] = {
            "module": pa.array(np.repeat(np.array([t.module for t in traces], dtype=object), n), pa.string()),
            "step": np.concatenate([np.arange(k, dtype=np.int32) for k in n]),
        }
        for name in traces[0].features:
            values = np.concatenate([t.features[name] for t in traces])
            columns[name] = values if values.ndim == 1 else pa.FixedSizeListArray.from_arrays(
                values.reshape(-1), values.shape[1]
            )  # fmt: skip
        columns["heuristic"] = np.concatenate([t.heuristic for t in traces]).astype(np.int64)
        columns["action"] = np.concatenate([t.actions for t in traces]).astype(np.int64)
        logp = [t.log_probs if t.log_probs is not None else np.full(len(t.actions), np.nan, np.float32) for t in traces]  # type: ignore[arg-type]
        columns["log_prob"] = np.concatenate(logp).astype(np.float32)
        return pa.table(columns)

    def _flush(self) -> None:
        if not self._buffer:
            return
        table = self._table(self._buffer)
        self._buffer, self._buffered = [], 0
        if self.schema is None:
            self.schema = table.schema
        table = table.cast(self.schema)
        if self._writer is None:
            self._tmp = self.root / f".decisions-{self._shard:05d}.parquet.tmp"
            self._writer = pq.ParquetWriter(self._tmp, self.schema, compression="zstd")
        self._writer.write_table(table)
        self._shard_rows += table.num_rows
        self.decisions += table.num_rows
        if self._shard_rows >= self.shard_rows:
            self._close_shard()

    def _close_shard(self) -> None:
        if self._writer is None:
            return
        self._writer.close()
        name = f"decisions-{self._shard:05d}.parquet"
        assert self._tmp is not None
        os.replace(self._tmp, self.root / name)
        self.shards.append(name)
        self._writer, self._tmp = None, None
        self._shard += 1
        self._shard_rows = 0

    def close(self, meta: dict[str, Any]) -> dict[str, Any]:
        """Flush everything, write ``modules.parquet`` and then ``trace.json``; the metadata written."""
        self._flush()
        self._close_shard()
        modules = (
            pa.Table.from_pylist(self._modules) if self._modules else pa.table({"module": pa.array([], pa.string())})
        )
        tmp = self.root / f".{MODULES}.tmp"
        pq.write_table(modules, tmp)
        os.replace(tmp, self.root / MODULES)
        meta = {**meta, "format_version": TRACE_FORMAT_VERSION, "shards": self.shards, "decisions": self.decisions}
        atomic_write_bytes(self.root / META, json.dumps(meta, indent=2).encode())
        return meta

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)


def sample_modules(names: Sequence[str], rate: float, seed: int) -> list[str]:
    """MLGO's ``--sampling_rate``: a reproducible fraction of the modules (at least one)."""
    if not 0.0 < rate <= 1.0:
        raise TraceError(f"--sampling-rate must be in (0, 1], not {rate}")
    if rate >= 1.0:
        return list(names)
    keep = np.random.default_rng(seed).random(len(names)) < rate
    if not keep.any() and len(names):
        keep[np.random.default_rng(seed).integers(len(names))] = True
    return [n for n, k in zip(names, keep, strict=True) if k]


def _summary(writer: TraceWriter) -> dict[str, Any]:
    rows = writer._modules
    ok = [r for r in rows if r["status"] == "ok" and r["heuristic_text_bytes"] is not None]
    policy = sum(r["text_bytes"] for r in ok)
    heuristic = sum(r["heuristic_text_bytes"] for r in ok)
    return {
        "modules": len(rows),
        "modules_ok": len(ok),
        "failures": {r["module"]: r["status"] for r in rows if r["status"] != "ok"},
        "text_bytes": policy,
        "heuristic_text_bytes": heuristic,
        "size_ratio": policy / heuristic if heuristic else None,
    }


def trace(
    corpus: Path | str,
    output: Path | str,
    *,
    problem: str = "inline-size",
    mode: str = "record",
    policy: str | None = None,
    split: str | None = None,
    sampling_rate: float = 1.0,
    modules: Sequence[str] | None = None,
    workers: int | None = None,
    seed: int = 0,
    timeout: float = DEFAULT_TIMEOUT,
    progress: bool = True,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Trace ``corpus`` into ``output``; returns what ``trace.json`` holds (with a ``summary``)."""
    if mode not in MODES:
        raise TraceError(f"unknown mode {mode!r}; one of {', '.join(MODES)}")
    policy = policy or "heuristic"
    if mode == "record" and policy != "heuristic":
        raise TraceError("--mode record traces the heuristic; use --mode collect or eval for another policy")
    output = Path(output)
    if output.exists() and any(output.iterdir()):
        if not overwrite:
            raise TraceError(f"{output} exists and is not empty (pass --overwrite to replace a trace there)")
        for f in [*output.glob("*.parquet"), *output.glob(".*.tmp"), output / META]:
            f.unlink(missing_ok=True)
    factory = resolve_policy(policy, problem)
    the_corpus = Corpus(corpus, split=split)
    names = list(modules) if modules is not None else [m.name for m in the_corpus]
    names = sample_modules(names, sampling_rate, seed)
    sources = portable_modules([the_corpus.module(n) for n in names], workers)  # under Ray: by content
    shipped = portable_policy(factory, workers)  # and a trained policy's directory too
    tasks = [TraceTask(problem, source, n, shipped, mode, seed + i, timeout)
             for i, (n, source) in enumerate(zip(names, sources, strict=True))]  # fmt: skip
    writer = TraceWriter(output)
    done = {"h": 0, "p": 0}

    def status() -> str:
        return f"{writer.decisions + writer._buffered} decisions" + (
            f", ratio {done['p'] / done['h']:.4f}" if done["h"] else ""
        )

    try:
        for _, result in run_tasks(trace_module, tasks, workers=workers, description=f"trace {mode}",
                                   status=status, progress=progress):  # fmt: skip
            writer.add(result)
            if result.status == "ok" and result.heuristic_metrics:
                done["h"] += int(result.heuristic_metrics["text_bytes"])
                done["p"] += int(result.metrics["text_bytes"])
    except BaseException:
        writer.abort()
        raise
    meta = {
        "kind": "optgym-trace",
        "problem": problem,
        "mode": mode,
        "policy": policy,
        "policy_identity": factory.identity,
        "corpus": str(Path(corpus).resolve()),
        "split": split,
        "sampling_rate": sampling_rate,
        "seed": seed,
        "features": _problem_feature_order(problem),
        "summary": _summary(writer),
    }
    return writer.close(meta)


def _problem_feature_order(problem: str) -> list[str]:
    """The visible features in the problem's own order (what ``DecisionPoint.vector()`` gives)."""
    return get_problem(problem).visible_features()


# -- reading ---------------------------------------------------------------------------------------


def read_meta(path: Path | str) -> dict[str, Any]:
    return read_versioned(Path(path) / META, error=TraceError, what="trace", missing="not a complete trace",
                          max_version=TRACE_FORMAT_VERSION)  # fmt: skip


def iter_batches(path: Path | str, columns: Sequence[str] | None = None) -> Iterator[pa.RecordBatch]:
    """The trace's decision rows, a record batch at a time (memory: one batch)."""
    meta = read_meta(path)
    for shard in meta["shards"]:
        yield from pq.ParquetFile(Path(path) / shard).iter_batches(columns=list(columns) if columns else None)


def read_modules(path: Path | str) -> list[dict[str, Any]]:
    read_meta(path)
    return pq.read_table(Path(path) / MODULES).to_pylist()


def feature_matrix(batch: pa.RecordBatch, names: Sequence[str]) -> np.ndarray:
    """``[rows, F]`` float64 of the scalar features ``names`` in that order."""
    return np.stack([batch.column(n).to_numpy(zero_copy_only=False).astype(np.float64) for n in names], axis=1)


__all__ = [
    "MODES",
    "ModuleTrace",
    "TraceError",
    "TraceTask",
    "TraceWriter",
    "feature_matrix",
    "iter_batches",
    "read_meta",
    "read_modules",
    "sample_modules",
    "trace",
    "trace_module",
]
