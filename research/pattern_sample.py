"""A policy on the very training sample a pattern-search run searched (``optgym train pattern``'s seeded draw).

Why: a run reports its own total on that sample; set beside the same figure of another policy (the hand rule,
``pretrained``), it says whether the search reached the rule on its own objective before any held-out question.

    python research/pattern_sample.py RUN [--policy pretrained] [-j 2]
"""

from __future__ import annotations

import argparse

from optgym.train.evaluation import evaluate, summarize
from optgym.train.pattern import config_from_run, training_sample


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run")
    parser.add_argument("--policy", default="pretrained")
    parser.add_argument("-j", "--workers", type=int, default=2)
    args = parser.parse_args()
    cfg = config_from_run(args.run)
    names = [m.name for m in training_sample(cfg)]
    rows = evaluate(args.policy, cfg.corpus, modules=names, workers=args.workers, progress=False)
    s = summarize(rows)
    print(
        f"{args.policy} on {args.run}'s {len(names)} training modules: total {s['total_ratio']:.4f}, "
        f"> 1 % worse {s['regressed_over_1pct']}, failed {s['failed']}"
    )


if __name__ == "__main__":
    main()
