"""The validation curve of one or more runs as a PNG: each snapshot's total on the held-back packages.

Why: a run's final policy is its best validation snapshot (``--validation-percent``); the curve shows what the
choice was between, where each seed drifted, and where a reference policy (the hand rule on the same packages)
lies. The figures are the runs' own ``snapshots/*/validation.json``; nothing is compiled.

    python research/validation_curves.py RUN [RUN …] -o curve.png [--reference "hand rule=0.9305"]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from optgym.policies.trained import snapshot_dirs
from optgym.train.validation import VALIDATION_FILE


def curve(run: Path) -> tuple[list[int], list[float], list[int]]:
    """``(iterations, total ratios, modules > 1 % worse)`` of every validated snapshot of ``run``."""
    records = [
        json.loads((s / VALIDATION_FILE).read_text()) for s in snapshot_dirs(run) if (s / VALIDATION_FILE).exists()
    ]
    records = [r for r in records if r["fitness"] is not None]
    return [r["iteration"] for r in records], [r["total_ratio"] for r in records], [r["worse"] for r in records]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("--reference", action="append", default=[], help="NAME=RATIO, a horizontal line")
    parser.add_argument("--title", default="validation packages: total Berkeley text ÷ clang -Oz")
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for run in args.runs:
        iterations, ratios, _ = curve(run)
        chosen = json.loads((run / "final" / VALIDATION_FILE).read_text())["selected"]["iteration"]
        (line,) = ax.plot(iterations, ratios, marker="o", label=run.name)
        ax.plot([chosen], [ratios[iterations.index(chosen)]], marker="*", markersize=14, color=line.get_color())
    for item in args.reference:
        name, value = item.rsplit("=", 1)
        ax.axhline(float(value), linestyle="--", color="grey")
        ax.annotate(name, (0, float(value)), textcoords="offset points", xytext=(2, 3), color="grey")
    ax.set_xlabel("iteration (★ the run's final policy)")
    ax.set_ylabel("total ratio (lower is smaller)")
    ax.set_title(args.title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
