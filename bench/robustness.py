#!/usr/bin/env python3
"""Robustness: a thousand csmith modules through the gymnasium env with random actions.

csmith's programs are valid C that no one would write by hand, so they reach corners of the inliner
(and of optgym's host: long streams, odd feature values, compiles that end mid-decision) that real
packages rarely do. Every module gets one episode of ``optgym.make("inline-size", …)`` with
``env.reset(options={"module": m})`` and actions drawn from ``env.action_space`` (seeded per module,
so a failure replays), and its end is classified:

* **framework error** — an exception that is optgym's fault: anything other than the documented
  :class:`~optgym.errors.CompileError` from ``reset`` or the "has no decisions" :class:`CorpusError`,
  an observation outside ``observation_space``, a non-finite reward, a step count that disagrees with
  ``info["decisions"]``, a worker process that died. Target: 0.
* **compiler outcome** — ``ok``, ``no_decisions``, or a compile that failed, recorded with its status
  (``crash`` for a signal, ``compile_error``, ``timeout``, ``protocol_error`` …). Every module that did
  not end ``ok`` (framework errors included) is copied with a JSON record (status, detail, stderr tail,
  the actions taken and their seed) into ``OUT/crashes/<status>/`` for a bug report.
* **leftovers** after the run — compiler processes still alive among this process's descendants, or
  anywhere on the machine with this run's private FIFO directory on their command line (an orphan
  reparented to init would escape a descendants check), and run directories or FIFOs left under the
  run's own ``XDG_RUNTIME_DIR`` (optgym's :func:`~optgym.toolchain.process.runtime_root`). Target: 0.

The corpus is ``optgym corpus csmith -n N --seed S`` in ``OUT/corpus`` (incremental: a second run, or
a larger ``-n``, reuses what exists); the heuristic-baseline cache is fresh for every run so every
module's plain compile really runs. Outcomes go to ``OUT/robustness.json``.

    nice -n 10 .venv/bin/python bench/robustness.py -n 1000 --out /tmp/optgym-robustness
    .venv/bin/python bench/robustness.py -n 50 --budget-minutes 5       # stop starting modules after 5 min

Exit status 0 when there were no framework errors and no leftovers, else 1 (compiler crashes are
findings, not failures of the bench).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import stat
import statistics
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

console = Console()

FRAMEWORK_ERROR = "framework_error"
NOT_RUN = "not_run"
#: Outcomes that are not failures of anything.
CLEAN = ("ok", "no_decisions")


@dataclass(frozen=True)
class Chunk:
    """A few modules run by one worker through one env (picklable)."""

    corpus: str
    modules: tuple[str, ...]
    seed: int
    timeout: float
    deadline: float  # wall-clock time after which modules are not started (reported as not_run)
    crashes: str


def action_seed(seed: int, module: str) -> int:
    """The seed of one module's random actions: stable, so a failing episode can be replayed."""
    return int.from_bytes(hashlib.sha256(f"{seed}\0{module}".encode()).digest()[:4], "big")


def run_chunk(chunk: Chunk) -> list[dict[str, Any]]:
    """Worker: one episode per module of ``chunk``; a row per module, never an exception."""
    import optgym

    try:
        env = optgym.make("inline-size", corpus=chunk.corpus, modules=list(chunk.modules), on_error="raise",
                          timeout=chunk.timeout)  # fmt: skip
    except Exception:
        trace = traceback.format_exc()
        return [_row(m, FRAMEWORK_ERROR, "make", f"optgym.make failed:\n{trace}") for m in chunk.modules]
    rows = []
    try:
        for name in chunk.modules:
            if time.time() > chunk.deadline:
                rows.append(_row(name, NOT_RUN, "", "the time budget ran out before it started"))
                continue
            row = run_episode(env, name, chunk.seed)
            if row["outcome"] not in CLEAN:
                keep_for_report(Path(chunk.corpus), Path(chunk.crashes), row)
            rows.append(row)
    finally:
        env.close()
    return rows


def _row(module: str, outcome: str, phase: str, detail: str = "", **extra: Any) -> dict[str, Any]:
    return {"module": module, "outcome": outcome, "phase": phase, "detail": detail, **extra}


def run_episode(env: Any, name: str, seed: int) -> dict[str, Any]:
    """One episode of random actions on ``name``, classified (see the module doc)."""
    import numpy as np

    from optgym.errors import CompileError, CorpusError

    a_seed = action_seed(seed, name)
    env.action_space.seed(a_seed)
    actions: list[int] = []
    start = time.perf_counter()
    extra = {"action_seed": a_seed, "actions": actions}

    def done(outcome: str, phase: str, detail: str = "", **more: Any) -> dict[str, Any]:
        return _row(name, outcome, phase, detail, seconds=time.perf_counter() - start, **extra, **more)

    try:
        obs, info = env.reset(options={"module": name})
    except CompileError as e:  # the documented failure of a module before its first decision
        return done(e.status, "reset", e.detail, stderr_tail=e.stderr_tail[-2000:])
    except CorpusError as e:
        if "has no decisions" in str(e):
            return done("no_decisions", "reset")
        return done(FRAMEWORK_ERROR, "reset", traceback.format_exc())
    except Exception:
        return done(FRAMEWORK_ERROR, "reset", traceback.format_exc())
    try:
        steps = 0
        while True:
            if not env.observation_space.contains(obs):
                return done(FRAMEWORK_ERROR, "step", f"observation {steps} is outside observation_space")
            action = env.action_space.sample()
            actions.append(int(action))
            obs, reward, terminated, truncated, info = env.step(action)
            steps += 1
            if terminated or truncated:
                break
    except Exception:
        return done(FRAMEWORK_ERROR, "step", traceback.format_exc(), decisions=len(actions))
    if truncated:  # the compile failed mid-episode: a compiler outcome, with its status
        return done(info.get("status", "?"), "step", info.get("detail", ""), decisions=steps,
                    stderr_tail=info.get("stderr_tail", "")[-2000:])  # fmt: skip
    problems = []
    if info.get("decisions") != steps:
        problems.append(f"info['decisions'] = {info.get('decisions')} but {steps} steps were taken")
    if not np.isfinite(reward):
        problems.append(f"reward {reward} is not finite")
    if info.get("status") != "ok" or "policy_text_bytes" not in info:
        problems.append(f"a terminated episode's info lacks status ok / policy_text_bytes: {sorted(info)}")
    if problems:
        return done(FRAMEWORK_ERROR, "end", "; ".join(problems), decisions=steps)
    return done("ok", "end", decisions=steps, reward=float(reward))


def keep_for_report(corpus: Path, crashes: Path, row: dict[str, Any]) -> None:
    """Copy the module's .bc/.cmd and a JSON record of the episode into ``crashes/<outcome>/``."""
    target = crashes / row["outcome"]
    target.mkdir(parents=True, exist_ok=True)
    name = row["module"]
    for suffix in (".bc", ".cmd"):
        src = corpus / f"{name}{suffix}"
        if src.exists():
            shutil.copy2(src, target / f"{name.replace('/', '_')}{suffix}")
    record = {**row, "corpus": str(corpus), "replay": "env.action_space.seed(action_seed); the same actions in order"}
    (target / f"{name.replace('/', '_')}.json").write_text(json.dumps(record, indent=2))


def _lost(chunk: Chunk, failure: Exception) -> list[dict[str, Any]]:
    """A chunk whose task raised or whose worker died: a framework error for each of its modules."""
    return [_row(m, FRAMEWORK_ERROR, "worker", f"the task failed: {failure}") for m in chunk.modules]


# ---------------------------------------------------------------------------------------------
# leftovers


def leftovers(run_dir: Path) -> dict[str, list[str]]:
    """Processes and files a clean run cannot leave behind (see the module doc)."""
    import psutil

    me = psutil.Process()
    found: dict[str, list[str]] = {"descendants": [], "orphans": [], "run_dirs": [], "fifos": []}
    ours = {me.pid}
    for child in me.children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
            cmdline = " ".join(child.cmdline())
        except psutil.NoSuchProcess:
            continue
        ours.add(child.pid)
        if "multiprocessing" in cmdline and ("forkserver" in cmdline or "resource_tracker" in cmdline):
            continue  # Python's own helpers: they exit with this process, and never run a compiler
        found["descendants"].append(f"{child.pid} {cmdline[:200]}")
    marker = str(run_dir)
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
        except psutil.NoSuchProcess:
            continue
        if proc.info["pid"] not in ours and marker in cmdline:
            found["orphans"].append(f"{proc.info['pid']} {cmdline[:200]}")
    root = run_dir / "optgym"
    if root.exists():
        found["run_dirs"] = sorted(str(p) for p in root.iterdir())
    for base, _dirs, files in os.walk(run_dir):
        for f in files:
            path = Path(base) / f
            try:
                if stat.S_ISFIFO(path.lstat().st_mode):
                    found["fifos"].append(str(path))
            except FileNotFoundError:
                pass
    return found


# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=1000, help="csmith modules (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="csmith corpus seed and action seed")
    parser.add_argument("--out", type=Path, default=Path("robustness-out"), help="corpus, crashes/, JSON")
    parser.add_argument("--corpus", type=Path, help="use this corpus instead of building OUT/corpus")
    parser.add_argument("-j", "--workers", type=int, default=None, help="worker processes (default: all cores)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per compile (default 120)")
    parser.add_argument("--chunk", type=int, default=5, help="modules per task (one env each)")
    parser.add_argument("--budget-minutes", type=float, default=None, help="start no module after this long")
    args = parser.parse_args(argv)

    out = args.out.absolute()
    out.mkdir(parents=True, exist_ok=True)
    # A private FIFO root and a fresh baseline cache: leftovers are attributable to this run (other
    # optgym users on the machine share the default root), and every plain compile really runs.
    run_dir, cache_dir, crashes = out / "run", out / "cache", out / "crashes"
    for d in (run_dir, cache_dir, crashes):
        shutil.rmtree(d, ignore_errors=True)
    run_dir.mkdir(mode=0o700)
    os.environ["XDG_RUNTIME_DIR"] = str(run_dir)
    os.environ["OPTGYM_CACHE_DIR"] = str(cache_dir)

    from optgym.corpus import Corpus
    from optgym.corpus.csmith import build_csmith_corpus, csmith_version
    from optgym.parallel import run_tasks
    from optgym.problems import problem_class
    from optgym.toolchain import find_toolchain

    toolchain = find_toolchain((problem_class("inline-size").hook,))
    start = time.perf_counter()
    corpus_seconds = 0.0
    if args.corpus:
        corpus = Corpus(args.corpus)
    else:
        t0 = time.perf_counter()
        report = build_csmith_corpus(toolchain, out / "corpus", count=args.n, seed=args.seed, workers=args.workers)
        corpus_seconds = time.perf_counter() - t0
        console.print(f"corpus {out / 'corpus'}: {report.modules} modules ({report.new} new, {report.reused} reused, "
                      f"{len(report.failed)} programs failed) in {corpus_seconds:.0f} s", highlight=False)  # fmt: skip
        corpus = Corpus(out / "corpus")
    names = [m.name for m in corpus][: args.n]
    deadline = time.time() + args.budget_minutes * 60 if args.budget_minutes else float("inf")
    root = str(corpus.root.absolute())
    chunks = [
        Chunk(root, tuple(names[i : i + args.chunk]), args.seed, args.timeout, deadline, str(crashes))
        for i in range(0, len(names), args.chunk)
    ]
    rows: list[dict[str, Any]] = []
    counts: Counter[str] = Counter()
    t0 = time.perf_counter()
    for _, chunk_rows in run_tasks(run_chunk, chunks, workers=args.workers, description="episodes",
                                   status=lambda: ", ".join(f"{k} {v}" for k, v in counts.most_common()),
                                   on_error=_lost):  # fmt: skip
        rows.extend(chunk_rows)
        counts.update(r["outcome"] for r in chunk_rows)
    episodes_seconds = time.perf_counter() - t0
    left = leftovers(run_dir)

    table = Table(title=f"{len(rows)} csmith modules through optgym.make('inline-size') with random actions")
    for col in ("outcome", "modules", "share", "decisions", "median s", "max s"):
        table.add_column(col, justify="left" if col == "outcome" else "right")
    by_outcome: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_outcome.setdefault(r["outcome"], []).append(r)
    for outcome, group in sorted(by_outcome.items(), key=lambda kv: (kv[0] not in CLEAN, -len(kv[1]))):
        secs = [r["seconds"] for r in group if "seconds" in r]
        style = "green" if outcome in CLEAN else ("dim" if outcome == NOT_RUN else "red")
        median, longest = (f"{statistics.median(secs):.2f}", f"{max(secs):.2f}") if secs else ("—", "—")
        share = f"{100 * len(group) / max(1, len(rows)):.1f} %"
        decided = str(sum(r.get("decisions", 0) for r in group))
        table.add_row(f"[{style}]{outcome}[/]", str(len(group)), share, decided, median, longest)
    console.print(table)
    framework = by_outcome.get(FRAMEWORK_ERROR, [])
    crashes_n = len(by_outcome.get("crash", []))
    failures = sum(len(g) for o, g in by_outcome.items() if o not in (*CLEAN, FRAMEWORK_ERROR, NOT_RUN, "crash"))
    ran = [r for r in rows if r["outcome"] != NOT_RUN]
    decisions = sum(r.get("decisions", 0) for r in ran)
    summary = {
        "modules": len(rows),
        "ran": len(ran),
        "framework_errors": len(framework),
        "compiler_crashes": crashes_n,
        "compiler_failures": failures,
        "leftover_processes": len(left["descendants"]) + len(left["orphans"]),
        "leftover_run_dirs": len(left["run_dirs"]),
        "leftover_fifos": len(left["fifos"]),
        "decisions": decisions,
        "corpus_seconds": round(corpus_seconds, 1),
        "episodes_seconds": round(episodes_seconds, 1),
        "total_seconds": round(time.perf_counter() - start, 1),
        "workers": args.workers,
        "csmith": csmith_version(),
        "compiler": toolchain.banner,
        "corpus": str(corpus.root.absolute()),
    }
    ok = summary["framework_errors"] == 0 and not any(left.values())
    style = "green" if ok else "red"
    console.print(
        f"[{style}]framework errors {summary['framework_errors']} (target 0)[/], compiler crashes {crashes_n}, "
        f"other compiler failures {failures}, [{style}]leftover processes {summary['leftover_processes']}, "
        f"run dirs {summary['leftover_run_dirs']}, FIFOs {summary['leftover_fifos']} (target 0)[/]",
        highlight=False,
    )
    console.print(
        f"{len(ran)} episodes, {decisions} decisions in {episodes_seconds:.0f} s "
        f"({len(ran) / max(episodes_seconds, 1e-9):.2f} modules/s); corpus {corpus_seconds:.0f} s",
        highlight=False,
    )
    for r in framework[:10]:
        console.print(f"[red]{r['module']}[/] ({r['phase']}): {r['detail'][-1500:]}", highlight=False)
    for kind, items in left.items():
        for item in items[:10]:
            console.print(f"[red]leftover {kind}[/]: {item}", highlight=False)
    if any(o not in CLEAN and o != NOT_RUN for o in by_outcome):
        console.print(f"modules kept for bug reports: {crashes}/<outcome>/", highlight=False)
    (out / "robustness.json").write_text(json.dumps({"summary": summary, "leftovers": left, "rows": rows}, indent=1))
    console.print(f"rows: {out / 'robustness.json'}", highlight=False)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
