"""How much the inliner gains where an inline deletes its callee: hand-set probes, for direction only.

Half of what the shipped C++ rule saves per object (and after linking, graphite2's shared library) is
``.eh_frame``: the frame records of functions that go (``research/section_shares.py``). clang's cost model gives
the last call to a *local* function a large bonus, but not the last call to a ``linkonce_odr`` one (C++'s inline
functions and templates), whose body may be kept by another object of the program. Per object, and in a library
whose other objects inline it too, inlining that call deletes the body and its frame record.

Each probe is clang's decision plus inlining where ``cost − threshold ≤ K`` at a call site that deletes its callee
(few uses, ``callee_users ≤ --max-users``, 1 by default: the last; a body that does not stay: not
``callee_survives``, not ``available_externally``), on top of either clang's decisions or the shipped rule's. The
probes are hand-set: they say whether a learned allowance has headroom in that direction; nothing ships from them.

    python -m research.deletion_probe --corpus /work/corpora/train-cxx --split train --language C++ --every 6 \\
        --allowances 40,200,1000 -j 2
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from optgym.parallel import run_tasks
from optgym.policies import resolve_policy
from optgym.problems import get_problem
from optgym.rollout import rollout
from optgym.rollout.decider import DecisionPoint
from optgym.toolchain import find_toolchain
from research.linkage_lookup import action_of
from research.linkage_oracle import clang_bytes, report
from research.rule_with_linkage import Task, sample_parser, sample_tasks

GATES = ("cost_estimate", "threshold", "callee_users", "is_callee_avail_external")


@dataclass
class DeletionAllowance:
    """``base``'s decision (clang's, or a policy's), plus inlining at a call site that deletes its callee when
    ``cost − threshold ≤ allowance``."""

    base: Any
    allowance: float
    max_users: int = 1
    reads_callee_linkage: bool = True  # the loop has clang name the callees it refuses (optgym.rollout.linkage)

    def __call__(self, point: DecisionPoint) -> int:
        if point.heuristic if self.base is None else action_of(self.base, point):
            return 1
        cost, threshold, users, external = point.firsts(GATES)
        deletes = users <= self.max_users and not external and point.callee_survives is False
        return int(deletes and cost - threshold <= self.allowance)


@dataclass(frozen=True)
class ProbeTask:
    task: Task
    allowances: tuple[float, ...]
    max_users: int


def probe(item: ProbeTask) -> dict:
    problem, toolchain = get_problem("inline-size"), find_toolchain()
    module = item.task.module
    rule = resolve_policy(item.task.policy, problem.name).build()
    row: dict = {"module": module.name, "status": "ok", "clang": clang_bytes(module)}
    policies: dict[str, Any] = {"rule": rule}
    for k in item.allowances:
        policies[f"clang+del{k:g}"] = DeletionAllowance(None, k, item.max_users)
        policies[f"rule+del{k:g}"] = DeletionAllowance(rule, k, item.max_users)
    for name, policy in policies.items():
        result = rollout(problem, module, toolchain, policy).result
        if not result.ok:
            return {"module": module.name, "status": f"{name}: {result.status}"}
        row[name] = int(result.metrics["text_bytes"])
    return row


def main() -> None:
    parser = sample_parser(__doc__.splitlines()[0])
    parser.add_argument("--allowances", default="40,200,1000", help="the K values probed, comma-separated")
    parser.add_argument("--max-users", type=int, default=1, help="callee_users at most this (1: the last use)")
    args = parser.parse_args()
    allowances = tuple(float(k) for k in args.allowances.split(","))
    items = [ProbeTask(t, allowances, args.max_users) for t in sample_tasks(args)]
    rows = [r for _, r in run_tasks(probe, items, workers=args.workers, progress=True)]
    columns = ("rule", *(f"{base}+del{k:g}" for base in ("clang", "rule") for k in allowances))
    ok = report(rows, columns)
    print(f"failed {len(rows) - len(ok)}")


if __name__ == "__main__":
    main()
