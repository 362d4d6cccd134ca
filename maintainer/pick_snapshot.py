#!/usr/bin/env python3
"""Score policies (a run's snapshots, say) on a fixed sample of *training* modules — never the held-out ones.

    .venv/bin/python -m maintainer.pick_snapshot --corpus CORPUS --problem P [--language C] [--step 7]
        [--with PROBLEM=POLICY]... POLICY...

The sample is every ``step``-th module of the language by name, starting at the fourth: the same modules for
every policy and every run, so snapshots of several runs compare on one footing. Per policy one line: total
Berkeley text against clang, ``.text``, modules more than 1 % worse, the guarded total (per module the smaller
of policy and clang), the total guarded only below ``GUARD_BELOW`` bytes with its count > 1 % worse, failures.
Compiles are cached (``optgym evaluate``'s cache), so a policy scored once costs nothing the second time.
"""

from __future__ import annotations

import argparse

from optgym.corpus import Corpus
from optgym.train.evaluation import GUARD_BELOW, evaluate, summarize


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("policies", nargs="+", help="policy specs: snapshot or run directories, .onnx files…")
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--problem", default="inline-size")
    parser.add_argument("--language", default="C", choices=("C", "C++"))
    parser.add_argument("--step", type=int, default=7)
    parser.add_argument("--with", dest="companions", action="append", default=[], metavar="PROBLEM=POLICY")
    parser.add_argument("-j", "--workers", type=int, default=None)
    args = parser.parse_args()

    companions = [tuple(item.split("=", 1)) for item in args.companions]
    corpus = Corpus(args.corpus, split="train")
    sample = sorted(m.name for m in corpus if m.family == args.language)[3 :: args.step]
    for policy in args.policies:
        rows = evaluate(policy, corpus, problem=args.problem, modules=sample, workers=args.workers, progress=False,
                        companions=companions)  # fmt: skip
        s = summarize(rows)
        print(f"{policy}: {s['evaluated']} modules, total {s['total_ratio']:.4f}, .text {s['dottext_ratio']:.4f}, "
              f"> 1 % worse {s['regressed_over_1pct']}, guarded {s['guarded_ratio']:.4f}, guarded below "
              f"{GUARD_BELOW} B {s['guarded_below_ratio']:.4f} · {s['guarded_below_over_1pct']}, failed {s['failed']}",
              flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
