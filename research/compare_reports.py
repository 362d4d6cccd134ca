#!/usr/bin/env python3
"""Where one policy beats another: two ``optgym evaluate`` reports of the same corpus, by package, by module size
and by language.

    .venv/bin/python -m research.compare_reports BASELINE_REPORT CANDIDATE_REPORT [--corpus CORPUS]

Why: a report's total says *whether* a learned inliner is smaller than the rule on an unseen set; the research
log needs *where*. Every learned allowance so far lost to the rule in modules of 20 kB or more and won in modules
under 2 kB (docs/experiments/2026-11-27-imitated-allowance.md), and one PPO seed cut Berkeley text while its
``.text`` grew 14 %. The totals printed here are sums of per-object sizes over the modules both reports compiled,
against clang's own compile (``heuristic_text``), so the two columns are directly comparable. The language of a
module comes from the corpus (``--corpus``, default the one recorded in the baseline's report.json).
"""

from __future__ import annotations

import argparse
import csv
import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

#: Module-size bins, by clang's own Berkeley text: where the losses of the learned allowances were found.
SIZE_BINS = ((2048, "under 2 kB"), (20480, "2-20 kB"), (float("inf"), "20 kB or more"))


def read_rows(report: Path) -> dict[str, dict[str, int]]:
    """The compiled modules of a report (``modules.csv``), with their sizes as integers."""
    sizes = ("heuristic_text", "policy_text", "heuristic_dottext", "policy_dottext")
    with (report / "modules.csv").open() as f:
        return {r["module"]: {k: int(r[k]) for k in sizes} for r in csv.DictReader(f) if r["status"] == "ok"}


def size_bin(heuristic_text: int) -> str:
    return next(label for bound, label in SIZE_BINS if heuristic_text < bound)


def grouped(
    baseline: dict[str, dict[str, int]], candidate: dict[str, dict[str, int]], key: Callable[[str], str]
) -> dict[str, dict[str, float]]:
    """Per group of the modules both compiled: the module count, clang's bytes, and each side's Berkeley text and
    ``.text`` ratio against clang."""
    sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for name in baseline.keys() & candidate.keys():
        group, base, cand = sums[key(name)], baseline[name], candidate[name]
        group["modules"] += 1
        group["clang"] += base["heuristic_text"]
        group["baseline"] += base["policy_text"]
        group["candidate"] += cand["policy_text"]
        group["clang_dottext"] += base["heuristic_dottext"]
        group["baseline_dottext"] += base["policy_dottext"]
        group["candidate_dottext"] += cand["policy_dottext"]
    return {
        name: {
            "modules": g["modules"],
            "clang": g["clang"],
            "baseline": g["baseline"] / g["clang"] if g["clang"] else 1.0,
            "candidate": g["candidate"] / g["clang"] if g["clang"] else 1.0,
            "baseline_dottext": g["baseline_dottext"] / g["clang_dottext"] if g["clang_dottext"] else 1.0,
            "candidate_dottext": g["candidate_dottext"] / g["clang_dottext"] if g["clang_dottext"] else 1.0,
        }
        for name, g in sorted(sums.items())
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("baseline", type=Path, help="optgym evaluate's output directory for the baseline")
    parser.add_argument("candidate", type=Path, help="the same for the candidate, on the same corpus")
    parser.add_argument("--corpus", type=Path, help="the corpus (default: the baseline report's)")
    args = parser.parse_args()
    from optgym.corpus import Corpus

    corpus = Corpus(args.corpus or json.loads((args.baseline / "report.json").read_text())["corpus"])
    baseline, candidate = read_rows(args.baseline), read_rows(args.candidate)
    keys: dict[str, Callable[[str], str]] = {
        "package": lambda name: name.split("/")[0],
        "size": lambda name: size_bin(baseline[name]["heuristic_text"]),
        "language": lambda name: corpus.module(name).family,
    }
    for title, key in keys.items():
        print(f"by {title}: clang bytes, baseline and candidate Berkeley text (.text) against clang")
        for name, g in grouped(baseline, candidate, key).items():
            print(
                f"  {name:24s} {g['modules']:5.0f} modules {g['clang']:10.0f} B  baseline {g['baseline']:.4f} "
                f"({g['baseline_dottext']:.4f})  candidate {g['candidate']:.4f} ({g['candidate_dottext']:.4f})"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
