"""Training throughput: the policy's per-decision cost in the host, and decisions/s with 1 and 2 workers.

    .venv/bin/python bench/train_throughput.py [--corpus C] [--repeat 3]

1. *Policy cost*: a 2×64 tanh MLP (numpy, the form every trained policy takes inside a worker) on
   real feature vectors from a heuristic trace: normalization + forward + action, µs per decision
   (target ≤ 50 µs), greedy and sampling.
2. *Rollout throughput*: every module compiled ``--repeat`` times with that policy inside the
   workers (the path of trace, ES and evaluation), with 1 and with 2 workers: decisions/s and the
   parallel efficiency ``dps(2) / (2 · dps(1))``. The heuristic's throughput on the same path is
   shown for reference (the policy's share of the time is the difference).

Without ``--corpus`` the demo corpus (the four bundled programs) is built in a temporary directory.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from importlib.resources import files
from pathlib import Path

import numpy as np

from optgym.corpus import Corpus
from optgym.parallel import get_executor
from optgym.policies import resolve_policy
from optgym.policies.mlp import MLPPolicy
from optgym.train.trace import TraceTask, feature_matrix, iter_batches, read_meta, trace, trace_module
from optgym.train.vocab import vocab_from_trace


class _Point:
    __slots__ = ("_v",)

    def __init__(self, vector: np.ndarray) -> None:
        self._v = vector

    def vector(self) -> np.ndarray:
        return self._v


def policy_cost(policy: MLPPolicy, vectors: np.ndarray, rounds: int = 5) -> float:
    """Best-of-``rounds`` mean µs per decision over ``vectors``."""
    points = [_Point(v) for v in vectors.astype(np.float32)]
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for p in points:
            policy(p)
        best = min(best, (time.perf_counter() - start) / len(points))
    return best * 1e6


def _warm(_: int) -> int:
    import optgym.train.trace  # noqa: F401 - what trace_module needs, imported before the clock starts

    return 0


def throughput(corpus: Path, spec: str, workers: int, repeat: int) -> tuple[float, int, float]:
    """(decisions/s, decisions, seconds) for ``repeat`` passes over the corpus with ``workers``.

    The worker pool is started and warmed (imports) before the clock starts: pool start-up is paid
    once per command, not per module, and would swamp a short measurement."""
    factory = resolve_policy(spec)
    names = [m.name for m in Corpus(corpus)] * repeat
    names.sort(key=lambda n: -Corpus(corpus)[n].bitcode.stat().st_size)  # big modules first: less tail
    the_corpus = Corpus(corpus)
    tasks = [TraceTask("inline-size", the_corpus[n], n, factory, "eval", i, 120.0) for i, n in enumerate(names)]
    executor = get_executor(workers)
    try:
        list(executor.map_unordered(_warm, list(range(2 * workers))))
        start = time.perf_counter()
        decisions = sum(r.decisions for _, r in executor.map_unordered(trace_module, tasks))
        seconds = time.perf_counter() - start
    finally:
        executor.close()
    return decisions / seconds, decisions, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, help="corpus directory (default: the demo corpus, built here)")
    parser.add_argument("--repeat", type=int, default=5, help="passes over the corpus per measurement")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="optgym-bench-") as tmp_name:
        tmp = Path(tmp_name)
        corpus = args.corpus
        if corpus is None:
            from optgym.corpus.embedded import corpus_from_sources
            from optgym.problems import problem_class
            from optgym.toolchain import find_toolchain

            sources = {Path(str(p)).stem: Path(str(p)) for p in files("optgym.data.demo").iterdir()
                       if Path(str(p)).suffix in (".c", ".cpp")}  # fmt: skip
            corpus = corpus_from_sources(
                find_toolchain((problem_class("inline-size").hook,)), dict(sorted(sources.items())), tmp / "corpus"
            ).root
        trace(corpus, tmp / "trace", workers=2, progress=False)
        vocab = vocab_from_trace(tmp / "trace")
        policy = MLPPolicy.initial(vocab, (64, 64), seed=0)
        policy.save(tmp / "policy")
        names = read_meta(tmp / "trace")["features"]
        vectors = np.concatenate([feature_matrix(b, names) for b in iter_batches(tmp / "trace", names)])

        greedy = policy_cost(policy, vectors)
        sampling = policy_cost(policy.stochastic(seed=0), vectors)
        print(f"policy cost (2×64 MLP, numpy, {len(vectors)} real decisions): "
              f"greedy {greedy:.1f} µs/decision, sampling {sampling:.1f} µs/decision (target ≤ 50)")  # fmt: skip

        print(f"\nrollout throughput over {corpus} × {args.repeat}:")
        print(f"{'policy':<10} {'workers':>7} {'decisions':>10} {'seconds':>8} {'decisions/s':>12} {'efficiency':>10}")
        for label, spec in (("heuristic", "heuristic"), ("mlp 2×64", str(tmp / "policy"))):
            one = throughput(corpus, spec, 1, args.repeat)
            two = throughput(corpus, spec, 2, args.repeat)
            print(f"{label:<10} {1:>7} {one[1]:>10} {one[2]:>8.2f} {one[0]:>12.0f} {'':>10}")
            print(f"{label:<10} {2:>7} {two[1]:>10} {two[2]:>8.2f} {two[0]:>12.0f} {two[0] / (2 * one[0]):>10.2f}")


if __name__ == "__main__":
    main()
