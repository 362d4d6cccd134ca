"""The second named baseline of the linkage claims: the shipped rule with its extra inlines of surviving callees
withdrawn, by hand.

A learned allowance that reads ``callee_survives`` (:mod:`optgym.rollout.linkage`) has to beat more than the rule:
a hand-set use of the same input is a baseline too. This is the obvious one: wherever the rule inlines and clang
would not, and the first compile saw the call site only with callees whose bodies stay, do what clang does. The
table comes from the product (the same first compile a served build makes), not from the research lookups.

Modules are chosen as ``optgym evaluate`` chooses them (``--every K``: the sorted names' every K-th), and each
module's row is written to ``--rows`` (CSV) for intervals and pairing with ``optgym evaluate``'s reports.

    python research/rule_with_linkage.py --corpus /work/corpora/train --split train --language C++ --every 6 -j 2
"""

from __future__ import annotations

import argparse
import csv
from dataclasses import dataclass
from pathlib import Path

from optgym.corpus import Corpus, Module
from optgym.parallel import run_tasks
from optgym.policies import resolve_policy
from optgym.problems import get_problem
from optgym.rollout import rollout
from optgym.toolchain import find_toolchain
from optgym.train.run import every_kth, of_language
from research.linkage_lookup import LinkageGate
from research.linkage_oracle import clang_bytes, report


@dataclass(frozen=True)
class Task:
    module: Module
    policy: str


def compile_both(task: Task) -> dict:
    problem, toolchain = get_problem("inline-size"), find_toolchain()
    rule = resolve_policy(task.policy, problem.name).build()
    plain = rollout(problem, task.module, toolchain, rule).result
    withdrawing = LinkageGate(rule, lambda point: bool(point.callee_survives), reads_callee_linkage=True)
    gated = rollout(problem, task.module, toolchain, withdrawing).result
    if not (plain.ok and gated.ok):
        return {"module": task.module.name, "status": plain.status if not plain.ok else gated.status}
    return {"module": task.module.name, "status": "ok", "clang": clang_bytes(task.module),
            "rule": int(plain.metrics["text_bytes"]), "withdrawn": int(gated.metrics["text_bytes"])}  # fmt: skip


def sample_parser(description: str) -> argparse.ArgumentParser:
    """The options of a research script that compiles a policy on a sample of a corpus's modules."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--split", default=None)
    parser.add_argument("--language", default="C++")
    parser.add_argument("--every", type=int, default=1)
    parser.add_argument("--policy", default="pretrained")
    parser.add_argument("-j", "--workers", type=int, default=2)
    return parser


def sample_tasks(args: argparse.Namespace) -> list[Task]:
    """One task per module of the sample ``args`` name (``--every K`` as ``optgym evaluate`` chooses)."""
    corpus = Corpus(args.corpus, split=args.split)
    chosen = set(every_kth((m.name for m in of_language(corpus, args.language)), args.every))
    return [Task(m, args.policy) for m in corpus if m.name in chosen]


def main() -> None:
    parser = sample_parser(__doc__.splitlines()[0])
    parser.add_argument("--rows", type=Path, default=None, help="write each module's row here (CSV)")
    args = parser.parse_args()
    tasks = sample_tasks(args)
    rows = [r for _, r in run_tasks(compile_both, tasks, workers=args.workers, progress=True)]
    ok = report(rows, ("rule", "withdrawn"))
    print(f"failed {len(rows) - len(ok)}")
    if args.rows:
        with args.rows.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["module", "status", "clang", "rule", "withdrawn"])
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
