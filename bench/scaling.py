#!/usr/bin/env python3
"""How well do optgym's fan-outs scale? Modules/s on 1 and 2 local workers and on Ray, side by side.

The workload is the real one: ``evaluate_module`` (the heuristic's compile, the never-inline compile and
the policy's compile of one module), on a corpus made from the bundled demo programs, each in
``--variants`` copies that differ by one salted function, so every module has its own digest. Every run
gets freshly salted modules: no run can hit a cache another one filled (not even on an external cluster
that ran this bench before). Each configuration's figure is its best of ``--rounds`` runs, the order of the
configurations rotated each round, so a busy moment of the machine does not pick a winner.

Configurations:

* ``local ×1``, ``local ×2``: :class:`~optgym.parallel.ProcessExecutor` with 1 and 2 processes;
* ``ray``: :class:`~optgym.parallel.ray_backend.RayExecutor` on ``--ray-address``, or on a loopback
  cluster this script starts (``ray start --head --num-cpus 2``) and always stops. Modules travel as bytes
  through the object store (the upload is inside the timed region).

Every executor is warmed first (workers started, optgym imported), so the figures are steady-state
throughput. Efficiency is modules/s divided by (workers × the 1-worker modules/s). The per-task overhead is
measured with no-op tasks: the driver's dispatch rate through ``map_unordered`` (what bounds one driver
however big the cluster) and one task's round trip (``ray.get(f.remote())``, one after the other).
Finally the measured per-module time and per-task cost are extrapolated to 16–512 cores (see
docs/scaling.md for the model and its caveats).

    .venv/bin/python bench/scaling.py                          # starts and stops a local Ray cluster
    .venv/bin/python bench/scaling.py --ray-address HOST:PORT  # an existing cluster (all its CPUs)
    .venv/bin/python bench/scaling.py --variants 10 --json scaling.json
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

console = Console()
WIDE_WINDOW = 256  # tasks in flight for the driver's dispatch ceiling (2 × 128 workers)


@dataclass
class Measured:
    name: str
    workers: int
    modules: int
    seconds: float
    failed: int

    @property
    def rate(self) -> float:
        return self.modules / self.seconds


def _warm(seconds: float) -> int:
    """A warm-up task: imports what evaluate_module imports and holds its worker a moment (so all start)."""
    import optgym.train.evaluation  # noqa: F401

    time.sleep(seconds)
    return os.getpid()


def _noop(x: int) -> int:
    return x


def make_corpus(root: Path, variants: int, salt: str):
    """``variants`` salted copies of each demo program: same code, distinct digests."""
    from optgym.corpus.embedded import corpus_from_sources
    from optgym.problems import problem_class
    from optgym.toolchain import find_toolchain

    sources = {}
    src = root / "src"
    src.mkdir(parents=True)
    for p in sorted(files("optgym.data.demo").iterdir(), key=lambda p: p.name):
        path = Path(str(p))
        if path.suffix not in (".c", ".cpp"):
            continue
        for k in range(variants):
            out = src / f"{path.stem}_{k}{path.suffix}"
            extern = 'extern "C" ' if path.suffix == ".cpp" else ""
            out.write_text(path.read_text() + f"\n{extern}int optgym_scaling_{salt}_{k}(void) {{ return {k}; }}\n")
            sources[out.stem] = out
    return corpus_from_sources(find_toolchain((problem_class("inline-size").hook,)), sources, root / "corpus")


def tasks_for(corpus, policy: str, refs: Sequence[Any] | None = None) -> list:
    from optgym.policies import resolve_policy
    from optgym.train.evaluation import _Task

    factory = resolve_policy(policy)
    return [_Task("inline-size", refs[i] if refs else m, m.name, factory, "eval", i, 300.0)
            for i, m in enumerate(corpus)]  # fmt: skip


def run(executor, fn: Callable, items: Sequence[Any]) -> tuple[float, list[Any]]:
    start = time.perf_counter()
    results = [r for _, r in executor.map_unordered(fn, items)]
    return time.perf_counter() - start, results


def measure_evaluation(name: str, executor, corpus, policy: str, upload: Callable | None = None) -> Measured:
    from optgym.train.evaluation import evaluate_module

    run(executor, _warm, [0.3] * (2 * executor.workers))
    start = time.perf_counter()
    refs = upload(list(corpus)) if upload else None
    seconds, rows = run(executor, evaluate_module, tasks_for(corpus, policy, refs))
    seconds = time.perf_counter() - start
    return Measured(name, executor.workers, len(rows), seconds, sum(not r.ok for r in rows))


def noop_rate(executor, n: int) -> float:
    """Tasks/s of no-op tasks through map_unordered: the driver's dispatch ceiling."""
    run(executor, _noop, list(range(min(n, 100))))
    seconds, _ = run(executor, _noop, list(range(n)))
    return n / seconds


def ray_round_trip(n: int = 100) -> float:
    """Seconds for one no-op Ray task, submitted and awaited alone (latency, not throughput)."""
    import ray

    f = ray.remote(_noop)
    ray.get(f.remote(0))
    start = time.perf_counter()
    for i in range(n):
        ray.get(f.remote(i))
    return (time.perf_counter() - start) / n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ray-address", help="an existing Ray cluster (default: start a loopback one)")
    parser.add_argument("--variants", type=int, default=6, help="copies of each of the 4 demo programs")
    parser.add_argument("--policy", default="random:1", help="the policy evaluated against the heuristic")
    parser.add_argument("--rounds", type=int, default=2, help="each configuration's best of this many runs")
    parser.add_argument("--noop", type=int, default=2000, help="no-op tasks for the overhead figures")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    load = os.getloadavg()
    with ExitStack() as stack:
        work = Path(tempfile.mkdtemp(prefix="optgym-scaling-"))
        stack.callback(shutil.rmtree, work, True)
        os.environ["OPTGYM_CACHE_DIR"] = str(work / "cache")  # before any worker starts: they inherit it
        os.environ.pop("OPTGYM_RAY_ADDRESS", None)

        from optgym.corpus.portable import upload
        from optgym.parallel import ProcessExecutor
        from optgym.parallel import ray_backend as backend
        from optgym.parallel.ray_local import LocalCluster

        executors: dict[str, Any] = {}
        stack.callback(lambda: [ex.close() for ex in executors.values()])
        executors["local ×1"] = ProcessExecutor(1)
        executors["local ×2"] = ProcessExecutor(2)
        with console.status("Ray: starting a loopback cluster" if not args.ray_address else "Ray: connecting"):
            if args.ray_address:
                address = args.ray_address
            else:
                cluster = LocalCluster(num_cpus=2, env={"OPTGYM_CACHE_DIR": str(work / "ray-cache")})
                stack.callback(cluster.stop)
                address = cluster.start().address
            executors["ray"] = backend.RayExecutor(address)
        names = list(executors)

        # best of --rounds, the order rotated each round: a busy moment of the machine hits every backend alike
        best: dict[str, Measured] = {}
        for round_ in range(args.rounds):
            for name in names[round_ % 3 :] + names[: round_ % 3]:
                executor = executors[name]
                label = name if name != "ray" else f"ray ×{executor.workers}"
                with console.status(f"round {round_ + 1}/{args.rounds}: building a salted corpus for {label}"):
                    corpus = make_corpus(work / f"{round_}-{executor.workers}-{name[:3]}", args.variants,
                                         secrets.token_hex(6))  # fmt: skip
                with console.status(f"round {round_ + 1}/{args.rounds}: {label}, {len(corpus)} modules"):
                    up = (lambda modules: upload(modules, address)) if name == "ray" else None
                    m = measure_evaluation(label, executor, corpus, args.policy, upload=up)
                console.print(f"round {round_ + 1}: {label:9s} {m.seconds:6.2f} s  {m.rate:.2f} modules/s")
                if name not in best or m.seconds < best[name].seconds:
                    best[name] = m
        results = [best[name] for name in names]
        n = results[0].modules
        with console.status("per-task overhead"):
            local_noop = noop_rate(executors["local ×2"], args.noop)
            ray_noop = noop_rate(executors["ray"], args.noop)
            # a 128-core cluster's window (2 × 128 in flight): what one driver can dispatch at most
            wide = backend.RayExecutor(address, workers=WIDE_WINDOW // 2)
            ray_noop_wide = noop_rate(wide, args.noop)
            round_trip = ray_round_trip()

    base = results[0].rate
    table = Table(title=f"evaluate_module ({args.policy} vs heuristic), {n} modules, best of {args.rounds}")
    for col in ("backend", "workers", "seconds", "modules/s", "efficiency", "failed"):
        table.add_column(col, justify="left" if col == "backend" else "right")
    for r in results:
        table.add_row(r.name, str(r.workers), f"{r.seconds:.2f}", f"{r.rate:.2f}",
                      f"{r.rate / (r.workers * base):.0%}", str(r.failed))  # fmt: skip
    console.print(table)

    per_module = 1 / base  # one worker's seconds per module (three compiles + host)
    overhead = Table(title="per-task overhead (no-op tasks)")
    for col in ("", "in flight", "tasks/s", "µs per task"):
        overhead.add_column(col, justify="left" if not col else "right")
    overhead.add_row("local ×2 (dispatch)", "4", f"{local_noop:.0f}", f"{1e6 / local_noop:.0f}")
    overhead.add_row(f"ray ×{results[2].workers} (dispatch)", str(2 * results[2].workers), f"{ray_noop:.0f}",
                     f"{1e6 / ray_noop:.0f}")  # fmt: skip
    overhead.add_row("ray, driver ceiling", str(WIDE_WINDOW), f"{ray_noop_wide:.0f}", f"{1e6 / ray_noop_wide:.0f}")
    overhead.add_row("ray round trip (1 task alone)", "1", f"{1 / round_trip:.0f}", f"{1e6 * round_trip:.0f}")
    console.print(overhead)
    console.print(f"one worker: {per_module:.3f} s per module; a Ray task's round trip is "
                  f"{100 * round_trip / per_module:.2f}% of that; load average {load[0]:.1f} → "
                  f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (other work lowers efficiency)")  # fmt: skip

    projection = Table(title="expected on a Ray cluster: min(cores / (s per module + round trip), driver ceiling)")
    for col in ("cores", "ideal modules/s", "expected modules/s", "efficiency", "bound by"):
        projection.add_column(col, justify="right")
    for cores in (16, 64, 128, 256, 512, 1024):
        ideal = cores / per_module
        compute = cores / (per_module + round_trip)
        expected = min(compute, ray_noop_wide)
        projection.add_row(str(cores), f"{ideal:.0f}", f"{expected:.0f}", f"{expected / ideal:.0%}",
                           "compiles" if compute <= ray_noop_wide else "driver dispatch")  # fmt: skip
    console.print(projection)

    if args.json:
        args.json.write_text(json.dumps({
            "modules": n, "policy": args.policy, "rounds": args.rounds, "seconds_per_module_one_worker": per_module,
            "configurations": [{**r.__dict__, "modules_per_second": r.rate,
                                "efficiency": r.rate / (r.workers * base)} for r in results],
            "noop_tasks_per_second": {"local": local_noop, "ray": ray_noop, "ray_driver_ceiling": ray_noop_wide},
            "ray_round_trip_seconds": round_trip, "load_average": [load[0], os.getloadavg()[0]],
        }, indent=2))  # fmt: skip
    return 0 if not any(r.failed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
