"""Policies on the validation packages an SB3 or ES run held back (``--validation-percent``/``--validation-groups``).

Why: a run ranks its own snapshots there; set beside the same figure of another policy (the hand rule,
``pretrained``, or the run's warm start), it says how far the chosen snapshot is from the rule on training-side
code no update saw, before any held-out question. The chosen snapshot's figure is optimistic: it was chosen there.

    python research/validation_packages.py RUN [--policy pretrained …] [-j 2]
"""

from __future__ import annotations

import argparse

from optgym.corpus import Corpus
from optgym.train.evaluation import evaluate, summarize
from optgym.train.run import of_language, read_config
from optgym.train.validation import held_back


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run")
    parser.add_argument("--policy", action="append", default=None, help="repeatable (default: pretrained)")
    parser.add_argument("-j", "--workers", type=int, default=2)
    args = parser.parse_args()
    _, cfg, _ = read_config(args.run)
    side = Corpus(cfg["corpus"], split=cfg.get("split") or None)
    training = [m.name for m in of_language(side, cfg.get("language") or None)]
    names = held_back(cfg["corpus"], training, cfg.get("validation_groups", []), cfg.get("validation_percent", 0.0))
    if not names:
        raise SystemExit(f"{args.run} held back no validation package")
    for policy in args.policy or ["pretrained"]:
        s = summarize(evaluate(policy, side, modules=names, workers=args.workers, progress=False))
        print(f"{policy} on {args.run}'s {len(names)} validation modules: total {s['total_ratio']:.4f}, "
              f"> 1 % worse {s['regressed_over_1pct']}, failed {s['failed']}")  # fmt: skip


if __name__ == "__main__":
    main()
