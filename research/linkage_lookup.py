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

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from optgym.corpus import Module
from optgym.parallel import run_tasks
from optgym.policies import resolve_policy
from optgym.problems import get_problem
from optgym.rollout import rollout
from optgym.rollout.decider import DecisionPoint
from optgym.rollout.linkage import defined_symbols
from optgym.toolchain import find_toolchain
from optgym.train.search import Compiler
from research.linkage_oracle import DELETABLE, clang_bytes, draw, linkages, report, sample_parser

#: Features every inline moves, module-wide: left out of the key that finds a call site again.
MODULE_WIDE = ("node_count", "edge_count")


def key_of(features: dict[str, np.ndarray]) -> tuple[int, ...]:
    return tuple(int(np.asarray(v).reshape(-1)[0]) for k, v in sorted(features.items()) if k not in MODULE_WIDE)


def action_of(policy: Any, point: DecisionPoint) -> int:
    """``policy``'s action at ``point``: an MLP policy answers (action, log-probability), a function the action."""
    answer = policy(point)
    return int(answer[0] if isinstance(answer, tuple) else answer)


class LinkageGate:
    """The rule, with its extra inlines (rule yes, clang no) withdrawn wherever ``survives(point)`` says the callee
    stays: here a key step 1 saw only with non-deletable callees; in ``research/rule_with_linkage.py`` the product's
    ``callee_survives``."""

    def __init__(self, rule: Any, survives: Callable[[DecisionPoint], bool], reads_callee_linkage: bool = False):
        self.rule, self.survives, self.withdrawn = rule, survives, 0
        self.reads_callee_linkage = reads_callee_linkage  # the loop then reads the compile's callee linkage

    def __call__(self, point: DecisionPoint) -> int:
        action = action_of(self.rule, point)
        if action == 1 and point.heuristic == 0 and self.survives(point):
            self.withdrawn += 1
            return 0
        return action


#: ``llvm-nm`` kinds as linkage: weak ones (``W``: ``linkonce_odr``, and the rare ``weak_odr`` with them) and local
#: ones (``t``) count as deletable.
_KINDS = {"T": "external", "W": "linkonce_odr", "V": "linkonce_odr", "t": "internal"}


def object_linkages(obj: Path, llvm_nm: str) -> dict[str, str]:
    """Linkage as the first compile's object shows it, for a served compile that has source, not bitcode: a
    global text symbol (``T``) is external, the others as ``_KINDS`` says. A function absent from the object was
    deleted, or never had a body here."""
    return {name: _KINDS[kind] for name, kind in defined_symbols(obj, llvm_nm).items() if kind in _KINDS}


@dataclass(frozen=True)
class Task:
    module: Module
    policy: str
    linkage_from: str = "bitcode"  # or "object": the first compile's symbol table
    first_policy: str | None = None  # the first compile's policy, if not the rule's (``heuristic``: clang's own)


def two_compiles(task: Task) -> dict:
    problem, toolchain = get_problem("inline-size"), find_toolchain()
    rule = resolve_policy(task.policy, problem.name).build()
    first_policy = rule if task.first_policy is None else resolve_policy(task.first_policy, problem.name).build()
    compiler = Compiler(problem, task.module, toolchain, first_policy, score=False)
    try:
        first = compiler.run(np.zeros(0, np.int8), 0, features=True)
        if not first.ok or first.subjects is None or first.features is None:
            return {"module": task.module.name, "status": first.status if not first.ok else "no record"}
        if task.linkage_from == "object":
            link = object_linkages(compiler.object_path, str(toolchain.tool("llvm-nm")))
            unknown = "linkonce_odr"  # absent from the object: deleted, or only declared
        else:
            link, unknown = linkages(task.module.bitcode, str(toolchain.tool("llvm-dis"))), "external"
        names = sorted(first.features)
        classes: dict[tuple[int, ...], set[bool]] = defaultdict(set)
        for i, callee in enumerate(first.subjects):
            key = key_of({n: first.features[n][i] for n in names})
            classes[key].add(link.get(callee, unknown) in DELETABLE)
        non_deletable = {k for k, c in classes.items() if c == {False}}
        rule_bytes = first.text_bytes
        if task.first_policy is not None:  # the rule's own object is a compile of its own
            rule_bytes = int(rollout(problem, task.module, toolchain, rule).result.metrics["text_bytes"])
        gate = LinkageGate(rule, lambda point: key_of(point.features()) in non_deletable)
        second = rollout(problem, task.module, toolchain, gate).result
        if not second.ok:
            return {"module": task.module.name, "status": second.status}
        return {"module": task.module.name, "status": "ok", "clang": clang_bytes(task.module), "rule": rule_bytes,
                "lookup": int(second.metrics["text_bytes"]), "withdrawn": gate.withdrawn}  # fmt: skip
    finally:
        compiler.close()


def main() -> None:
    parser = sample_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--linkage-from",
        choices=("bitcode", "object"),
        default="bitcode",
        help="llvm-dis of the input, or the first compile's symbol table (what a served compile has)",
    )
    parser.add_argument("--first-policy", default=None, help="the first compile's policy (default: the rule itself)")
    args = parser.parse_args()
    modules = draw(args)
    tasks = [Task(m, args.policy, args.linkage_from, args.first_policy) for m in modules]
    rows = [r for _, r in run_tasks(two_compiles, tasks, workers=args.workers, progress=True)]
    ok = report(rows, ("rule", "lookup"))
    print(f"withdrawn decisions {sum(r['withdrawn'] for r in ok)} in {sum(1 for r in ok if r['withdrawn'])} modules; "
          f"failed {len(rows) - len(ok)}")  # fmt: skip


if __name__ == "__main__":
    main()
