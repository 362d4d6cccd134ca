#!/usr/bin/env python3
"""What a step optgym does not serve costs through ``optgym-cc``: clang-22 itself, the ``/bin/sh`` front door
(``scripts/optgym-cc``) and the Python launcher behind it, side by side.

Most steps of a build are not served: a ThinLTO build's compile steps only write bitcode, configure's probes
link, other ``-O`` levels pass through. Each still goes through ``optgym-cc``, so its fixed cost is what a
build of small files pays. Every round runs the three ways on each step in a rotated order, so a noisy moment
hits all alike; the median of each way's per-step wall is reported, and the ratios to clang.

    .venv/bin/python bench/front_door.py            # 3 steps x 3 ways x 40 rounds
    .venv/bin/python bench/front_door.py --rounds 100

Exit status 0 unless a step failed (1).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from optgym.toolchain import find_toolchain

BIN = Path(sys.executable).parent
#: Steps a build runs without serving, each as a build would: (name, arguments).
STEPS = (
    ("ThinLTO compile step", ["-Oz", "-flto=thin", "-c", "unit.c", "-o", "unit.o"]),
    ("-O2 compile", ["-O2", "-c", "unit.c", "-o", "unit.o"]),
    ("link without LTO", ["-Oz", "main.c", "-o", "prog"]),
)
UNIT = "int twice(int x) { return 2 * x; }\nint thrice(int x) { return 3 * x; }\n"
MAIN = "int main(void) { return 0; }\n"


def timed(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    """Wall seconds of one step; a failing step ends the benchmark."""
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{argv[0]} failed: {done.stderr.decode(errors='replace')[:500]}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40)
    opts = parser.parse_args()
    ways = {
        "clang-22": str(find_toolchain().clang),
        "optgym-cc (front door)": str(BIN / "optgym-cc"),
        "Python launcher": str(BIN / "optgym-cc-launcher"),
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPTGYM_")}  # the shipped defaults
    times: dict[tuple[str, str], list[float]] = {(s, w): [] for s, _ in STEPS for w in ways}
    with tempfile.TemporaryDirectory(prefix="optgym-front-") as tmp:
        cwd = Path(tmp)
        (cwd / "unit.c").write_text(UNIT)
        (cwd / "main.c").write_text(MAIN)
        names = list(ways)
        for round_ in range(opts.rounds + 1):  # round 0 warms the page cache, unmeasured
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for step, args in STEPS:
                for way in order:
                    elapsed = timed([ways[way], *args], cwd, env)
                    if round_:
                        times[(step, way)].append(elapsed)
    print(f"median wall per step over {opts.rounds} rounds (ms), and the ratio to clang-22 itself")
    print(f"{'step':24} " + " ".join(f"{w:>28}" for w in names))
    for step, _ in STEPS:
        medians = [statistics.median(times[(step, w)]) for w in names]
        cells = [f"{m * 1e3:8.1f} ms ({m / medians[0]:.3f}x)" for m in medians]
        print(f"{step:24} " + " ".join(f"{c:>28}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
