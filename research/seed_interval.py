#!/usr/bin/env python3
"""Seeds of one recipe against a bar: each seed's ``optgym evaluate`` report, and their 95 % t-interval.

    .venv/bin/python -m research.seed_interval REPORT_DIR… --bar TOTAL [--max-worse-share 0.02]

Why: a registered claim (docs/experiments/registrations.md) says a recipe beats the rule when every seed's total
is below the rule's, at most a share of each seed's modules is more than 1 % worse, and the seeds' 95 % interval on
the total lies below the rule's. This prints those three checks from the reports themselves, so the claim's
figures come from one command rather than from arithmetic done by hand. Exit status 0 when all three hold.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from optgym.evaluate.stats import mean_ci


def seed_figures(report: Path) -> dict[str, float | int]:
    """The figures a claim reads from one seed's report: total ratio, modules > 1 % worse, modules evaluated."""
    data = json.loads((report / "report.json").read_text())
    return {"total": data["total_ratio"], "worse": data["regressed_over_1pct"], "modules": data["evaluated"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+", type=Path, help="one `optgym evaluate -o` directory per seed")
    parser.add_argument("--bar", type=float, required=True, help="the rule's total on the same modules")
    parser.add_argument("--max-worse-share", type=float, default=0.02, help="largest share of modules > 1 %% worse")
    args = parser.parse_args(argv)

    seeds = {report: seed_figures(report) for report in args.reports}
    holds = True
    for report, seed in seeds.items():
        below = seed["total"] < args.bar
        few_worse = seed["worse"] <= args.max_worse_share * seed["modules"]
        holds &= below and few_worse
        print(f"{report}: {seed['total']:.4f}, {seed['worse']} of {seed['modules']} worse"
              f"{'' if below else ', NOT below the bar'}{'' if few_worse else ', TOO MANY worse'}")  # fmt: skip
    interval = mean_ci([seed["total"] for seed in seeds.values()])
    if interval["ci95"] is None:
        print("one seed: no interval")
        return 1
    top = interval["mean"] + interval["ci95"]
    clear = top < args.bar
    print(f"{interval['n']} seeds: {interval['mean']:.4f} ± {interval['ci95']:.4f}, "
          f"[{interval['mean'] - interval['ci95']:.4f}, {top:.4f}]; bar {args.bar:.5f}: "
          f"{'clear' if clear else 'NOT clear'}")  # fmt: skip
    return 0 if holds and clear else 1


if __name__ == "__main__":
    sys.exit(main())
