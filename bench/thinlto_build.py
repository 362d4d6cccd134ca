"""What a ThinLTO build costs with optgym serving its backends, against plain clang-22's ThinLTO build.

Both builds of each round run in this one process, one after the other, from the same source tree with the
same flags (``-Oz -flto=thin -fuse-ld=lld``, ``-j JOBS``): plain clang-22, then ``optgym-cc`` with the ThinLTO
plan (``--plan``; default the shipped one: its link and LLVM options) and the ThinLTO policies of the backends
(``--policy`` for inlining, ``--evict-policy`` and ``--priority-policy`` for the register allocator; each
defaults to what ``optgym-cc`` does with its variable unset, and leaves its decision to clang where none ships).
The figure is the build step's wall and CPU time (the policy server's CPU included: ``optgym compare-build`` reaps
it with the build), as a ratio optgym / plain, per round and the median over rounds. The bar for a drop-in compiler
is a wall ratio of at most 1.15 on 2 cores.

    .venv/bin/python bench/thinlto_build.py SRC [--plan FILE|none] [--policy SPEC] [--evict-policy SPEC]
        [--priority-policy SPEC] [--backends lld|distributed] [--rounds 3] [--jobs 2] [--target TRIPLE] [-o DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from optgym.evaluate.build_compare import CompareOptions, compare_build
from optgym_cc.thinlto import BACKENDS, BACKENDS_MODES, LTO_CHANNELS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="a CMake, Meson, autotools or Make source tree")
    defaults = {variable: default for _, variable, _, default in LTO_CHANNELS}  # what optgym-cc does unset
    parser.add_argument("--policy", default=defaults["OPTGYM_LTO_POLICY"], help="OPTGYM_LTO_POLICY of the optgym build")
    parser.add_argument("--evict-policy", default=defaults["OPTGYM_LTO_EVICT_POLICY"],
                        help="OPTGYM_LTO_EVICT_POLICY of that build")  # fmt: skip
    parser.add_argument("--priority-policy", default=defaults["OPTGYM_LTO_PRIORITY_POLICY"],
                        help="OPTGYM_LTO_PRIORITY_POLICY of that build")  # fmt: skip
    parser.add_argument("--plan", default="pretrained", help="OPTGYM_LTO_PLAN of the optgym build")
    parser.add_argument("--backends", choices=BACKENDS_MODES, default=BACKENDS_MODES[0],
                        help="OPTGYM_LTO_BACKENDS of that build: where a served link's backends run")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--target", help="cross-build both for this triple (the target's own plan, if it ships one)")
    parser.add_argument("-o", "--output", type=Path, help="where the builds go (default: a temporary directory)")
    args = parser.parse_args()
    os.environ["OPTGYM_LTO_POLICY"] = args.policy
    os.environ["OPTGYM_LTO_EVICT_POLICY"] = args.evict_policy
    os.environ["OPTGYM_LTO_PRIORITY_POLICY"] = args.priority_policy
    os.environ["OPTGYM_LTO_PLAN"] = args.plan
    os.environ[BACKENDS] = args.backends
    os.environ["OPTGYM_VERBOSE"] = "1"
    out = args.output or Path(tempfile.mkdtemp(prefix="bench-thinlto-"))
    walls, cpus = [], []
    cross = f" --target={args.target}" if args.target else ""
    print(f"{args.source.name}: -Oz -flto=thin -fuse-ld=lld -j {args.jobs}{cross}, "
          f"optgym's ThinLTO plan {args.plan}, policies: inlining {args.policy}, eviction {args.evict_policy}, "
          f"priority {args.priority_policy}, served backends {args.backends}")  # fmt: skip
    for round_ in range(args.rounds):
        report = compare_build(
            CompareOptions(args.source, out / f"round{round_}", lto="thin", jobs=args.jobs, target=args.target)
        )
        if report["problems"]:
            raise SystemExit(f"round {round_}: {'; '.join(report['problems'])}")
        plain, optgym = (report["builds"][v] for v in ("plain", "optgym"))
        step = {v: next(s for s in b["steps"] if s["name"] == "build") for v, b in (("plain", plain), ("optgym",
                optgym))}  # fmt: skip
        ratio = report["build_ratio"]
        walls.append(ratio["wall"])
        cpus.append(ratio["cpu"])
        sizes = report["totals"]["ratio"]
        print(f"round {round_}: wall {step['plain']['wall_s']:.1f} s → {step['optgym']['wall_s']:.1f} s "
              f"({ratio['wall']:.3f}×), CPU {step['plain']['cpu_s']:.1f} s → {step['optgym']['cpu_s']:.1f} s "
              f"({ratio['cpu']:.3f}×); linked sizes optgym / plain {sizes}")  # fmt: skip
    print(
        f"median over {args.rounds} rounds: wall {statistics.median(walls):.3f}×, CPU {statistics.median(cpus):.3f}×"
        f" (optgym / plain ThinLTO; bar: wall ≤ 1.15×)"
    )


if __name__ == "__main__":
    main()
