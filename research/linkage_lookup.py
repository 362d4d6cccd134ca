"""Can a host learn callee linkage well enough to win the linkage oracle's prize? Two compiles, no clang change.

``research/linkage_oracle.py`` measures what the inline rule would gain if it never inlined beyond clang a
callee that cannot be deleted afterwards (``external``/``weak_odr``): it compiles once per withdrawn decision,
knowing each decision's callee from clang's optimization record. A build cannot afford that, and the channel
never names the callee. This tries what a served compile could do instead:

1. compile once with the rule and clang's optimization record: every decision's raw features and its callee's
   name, hence (``llvm-dis`` of the input) whether the callee is deletable;
2. compile again with the rule, withdrawing an extra inline (rule yes, clang no) wherever the decision's
   features, without the module-wide counters (``node_count``, ``edge_count``, which every inline moves), match a
   decision of step 1 whose callee was not deletable, and only if no deletable one matches as well.

Decisions before the first withdrawal are identical in both compiles, and most after it are too (a withdrawal
only changes its own caller). The script reports the rule, this two-compile variant and, with ``--oracle``, the
oracle on the same modules.

    python research/linkage_lookup.py --corpus /work/corpora/train --sample 300 --seed 5 --hold-out-every 6 [-j 2]
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from optgym.corpus import Corpus, Module
from optgym.corpus.split import draw_by_size
from optgym.parallel import run_tasks
from optgym.policies import resolve_policy
from optgym.problems import get_problem
from optgym.rollout import baseline, rollout
from optgym.rollout.decider import DecisionPoint
from optgym.toolchain import find_toolchain
from optgym.train.evaluation import more_than_1pct_worse
from optgym.train.run import every_kth, modules_to_train_on
from optgym.train.search import Compiler
from research.linkage_oracle import DELETABLE, linkages

#: Features every inline moves, module-wide: left out of the key that finds a decision again.
MODULE_WIDE = ("node_count", "edge_count")


def key_of(features: dict[str, np.ndarray]) -> tuple[int, ...]:
    return tuple(int(np.asarray(v).reshape(-1)[0]) for k, v in sorted(features.items()) if k not in MODULE_WIDE)


class LinkageGate:
    """The rule, with its extra inlines of callees step 1 saw as non-deletable withdrawn."""

    def __init__(self, rule, non_deletable: set[tuple[int, ...]]) -> None:
        self.rule, self.non_deletable, self.withdrawn = rule, non_deletable, 0

    def __call__(self, point: DecisionPoint) -> int:
        answer = self.rule(point)  # an MLP policy answers (action, log-probability)
        action = int(answer[0] if isinstance(answer, tuple) else answer)
        if action == 1 and point.heuristic == 0 and key_of(point.features()) in self.non_deletable:
            self.withdrawn += 1
            return 0
        return action


@dataclass(frozen=True)
class Task:
    module: Module
    policy: str


def two_compiles(task: Task) -> dict:
    problem, toolchain = get_problem("inline-size"), find_toolchain()
    rule = resolve_policy(task.policy, problem.name).build()
    compiler = Compiler(problem, task.module, toolchain, rule, score=False)
    try:
        first = compiler.run(np.zeros(0, np.int8), 0, features=True)
        if not first.ok or first.subjects is None or first.features is None:
            return {"module": task.module.name, "status": first.status if not first.ok else "no record"}
        link = linkages(task.module.bitcode, str(toolchain.tool("llvm-dis")))
        names = sorted(first.features)
        classes: dict[tuple[int, ...], set[bool]] = defaultdict(set)
        for i, callee in enumerate(first.subjects):
            key = key_of({n: first.features[n][i] for n in names})
            classes[key].add(link.get(callee, "external") in DELETABLE)
        non_deletable = {k for k, c in classes.items() if c == {False}}
        gate = LinkageGate(rule, non_deletable)
        second = rollout(problem, task.module, toolchain, gate).result
        if not second.ok:
            return {"module": task.module.name, "status": second.status}
        return {"module": task.module.name, "status": "ok", "rule": first.text_bytes,
                "lookup": int(second.metrics["text_bytes"]), "withdrawn": gate.withdrawn}  # fmt: skip
    finally:
        compiler.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--split", default="train")
    parser.add_argument("--language", default="C++")
    parser.add_argument("--sample", type=int, default=150)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--hold-out-every", type=int, default=None, help="leave out every K-th module (the gate)")
    parser.add_argument("--policy", default="pretrained")
    parser.add_argument("-j", "--workers", type=int, default=2)
    args = parser.parse_args()
    side = Corpus(args.corpus, split=args.split)
    modules = modules_to_train_on(side, args.language)
    if args.hold_out_every:
        held = set(every_kth([m.name for m in modules], args.hold_out_every))
        modules = [m for m in modules if m.name not in held]
    modules = draw_by_size(modules, args.sample, np.random.default_rng([args.seed, 29]))  # linkage_oracle's draw
    rows = [r for _, r in run_tasks(two_compiles, [Task(m, args.policy) for m in modules], workers=args.workers,
                                    progress=True)]  # fmt: skip
    problem, toolchain = get_problem("inline-size"), find_toolchain()
    by_name = {m.name: m for m in modules}
    ok = [r for r in rows if r["status"] == "ok"]
    for r in ok:
        r["clang"] = int(baseline(problem, by_name[r["module"]], toolchain).metrics["text_bytes"])
    clang = sum(r["clang"] for r in ok)
    for key in ("rule", "lookup"):
        worse = sum(more_than_1pct_worse(r[key], r["clang"]) for r in ok)
        total = sum(r[key] for r in ok) / clang
        print(f"{key:7s} total {total:.4f} of clang's bytes, {worse} of {len(ok)} modules > 1 % worse")
    print(f"withdrawn decisions {sum(r['withdrawn'] for r in ok)} in {sum(1 for r in ok if r['withdrawn'])} modules; "
          f"failed {len(rows) - len(ok)}")  # fmt: skip


if __name__ == "__main__":
    main()
