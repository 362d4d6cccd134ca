"""What the pattern search's replay holds in memory, and what a candidate's check costs: every stored trajectory of a
module kept whole (``Recorded``, its rows as recorded) against kept in one table of distinct rows per module
(``Trajectories``), side by side on the same trajectories and the same candidates.

    .venv/bin/python bench/replay_memory.py [--modules 200] [--candidates 20]

It reads the trajectory store (``<cache>/trajectories``, filled by ``optgym train pattern``): the first
``--modules`` module directories in name order. Per module, ``--candidates`` seeded allowances (clang's answer at
weight 4, the margin at 1, every gate and the bias a multiple of 1/64 in [-1, 1]) are decided both ways; the two
must name the same first replayed trajectory, or the run fails (exit 1). Printed: bytes held each way and their
ratio, and seconds spent deciding each way and their ratio.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from optgym.corpus.cache import ResultCache
from optgym.train.pattern import Recorded, Trajectories, replays


def load(directory) -> list[Recorded]:
    records = []
    for path in sorted(directory.glob("*.npz")):
        with np.load(path) as f:
            records.append(Recorded(f["inputs"], f["actions"], int(f["text_bytes"]), int(f["heuristic_text_bytes"])))
    return records


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modules", type=int, default=200)
    parser.add_argument("--candidates", type=int, default=20)
    args = parser.parse_args()
    root = ResultCache("trajectories").directory
    directories = sorted(d for d in root.glob("*/*") if d.is_dir() and any(d.glob("*.npz")))[: args.modules]
    if not directories:
        print(f"no stored trajectories under {root}: run optgym train pattern first", file=sys.stderr)
        return 1
    rng = np.random.default_rng(0)
    whole_bytes = table_bytes = trajectories = 0
    whole_seconds = table_seconds = 0.0
    for directory in directories:
        records = load(directory)
        table = Trajectories()
        held = [table.add(r) for r in records]
        trajectories += len(records)
        whole_bytes += sum(r.inputs.nbytes + r.actions.nbytes for r in records)
        table_bytes += sum(row.nbytes for row in table.rows) + sum(t.rows.nbytes + t.inline.nbytes for t in held)
        width = records[0].inputs.shape[1]
        for _ in range(args.candidates):
            weights = np.concatenate([[4.0, 1.0], rng.integers(-64, 65, width - 2) / 64])
            bias = float(rng.integers(-64, 65) / 64)
            start = time.perf_counter()
            first_whole = next((i for i, r in enumerate(records) if replays(r, weights, bias)), None)
            whole_seconds += time.perf_counter() - start
            start = time.perf_counter()
            hit = table.first_replayed(held, weights, bias)
            table_seconds += time.perf_counter() - start
            first_table = None if hit is None else next(i for i, t in enumerate(held) if t is hit)
            if first_whole != first_table:
                print(f"{directory}: the two forms disagree ({first_whole} against {first_table})", file=sys.stderr)
                return 1
    print(f"{len(directories)} modules, {trajectories} trajectories, {args.candidates} candidates each")
    print(f"held whole: {whole_bytes / 1e6:9.1f} MB   in tables: {table_bytes / 1e6:7.1f} MB   "
          f"ratio {whole_bytes / table_bytes:.1f}x")  # fmt: skip
    print(f"deciding whole: {whole_seconds:7.2f} s   in tables: {table_seconds:7.2f} s   "
          f"ratio {whole_seconds / table_seconds:.1f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
