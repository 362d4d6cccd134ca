"""Where an inline policy's bytes go: Berkeley ``text`` split by section kind, against clang's own compile.

Berkeley ``text`` counts machine code (``.text*``), read-only data (``.rodata*``, jump tables and constants), and
exception-handling tables (``.eh_frame``, the call-frame records of every function, and ``.gcc_except_table*``,
C++'s per-call-site landing-pad tables). An inliner moves each of them differently: inlining a small callee at an
``invoke`` removes a call-site entry, and a function that goes removes its frame record. Which of these a policy's
saving (or loss) comes from says which inputs a learned inliner would need.

    python -m research.section_shares --corpus /work/corpora/train-cxx --split test --language C++ \\
        --policy pretrained -j 2
"""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

from optgym.parallel import run_tasks
from optgym.policies import resolve_policy
from optgym.problems import get_problem
from optgym.rollout import rollout
from optgym.toolchain import find_toolchain
from optgym.toolchain.sizes import text_sections
from research.rule_with_linkage import Task, sample_parser, sample_tasks

KINDS = (".text", ".rodata", ".eh_frame", ".gcc_except_table", "other")


def kind(name: str) -> str:
    """The kind of a section Berkeley ``text`` counts."""
    for prefix in KINDS[:-1]:
        if name == prefix or name.startswith(prefix + "."):
            return prefix
    return "other"


def text_by_kind(data: bytes) -> Counter:
    """Berkeley ``text`` bytes of one object, by section kind."""
    out: Counter = Counter()
    for name, size in text_sections(data):
        out[kind(name)] += size
    return out


def compile_both(task: Task) -> dict:
    """clang's object and the policy's, each split by kind."""
    problem, toolchain = get_problem("inline-size"), find_toolchain()
    row: dict = {"module": task.module.name}
    with tempfile.TemporaryDirectory(prefix="optgym-shares-") as tmp:
        for label, spec in (("clang", "heuristic"), ("policy", task.policy)):
            out = Path(tmp) / f"{label}.o"
            policy = resolve_policy(spec, problem.name).build()
            result = rollout(problem, task.module, toolchain, policy, keep_object=out).result
            if not result.ok or not out.exists():
                return row | {"status": result.status}
            row[label] = text_by_kind(out.read_bytes())
    return row | {"status": "ok"}


def main() -> None:
    args = sample_parser(__doc__.splitlines()[0]).parse_args()
    rows = [r for _, r in run_tasks(compile_both, sample_tasks(args), workers=args.workers, progress=True)]
    ok = [r for r in rows if r["status"] == "ok"]
    clang = sum((r["clang"] for r in ok), Counter())
    policy = sum((r["policy"] for r in ok), Counter())
    total_clang, total_policy = sum(clang.values()), sum(policy.values())
    print(f"{len(ok)} of {len(rows)} modules; Berkeley text {total_policy / total_clang:.4f} of clang's")
    print(f"{'kind':20s} {'clang':>10s} {'policy':>10s} {'ratio':>7s} {'share of clang':>15s} {'share of change':>16s}")
    for k in KINDS:
        change = policy[k] - clang[k]
        print(f"{k:20s} {clang[k]:10d} {policy[k]:10d} {policy[k] / max(1, clang[k]):7.4f} "
              f"{clang[k] / total_clang:15.3f} {change / (total_policy - total_clang or 1):16.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
