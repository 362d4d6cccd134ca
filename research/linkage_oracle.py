"""How much would the inline rule gain if the host knew each callee's linkage? An oracle, on training modules.

Why: the shipped rule's losses sit at call sites it inlines beyond clang whose callee cannot be deleted afterwards
(``external`` or ``weak_odr`` linkage: the body stays, and the inlined copy is pure growth), while its gains sit at
``linkonce_odr`` and ``internal`` callees (docs/experiments/2026-11-24-register-allocation.md, "The guard for C++
too"). clang's channel sends no linkage, so a policy cannot gate on it; a host could learn it only with extra
machinery (a second compile, a lookup keyed by something the channel does send). Before building that, this
measures the prize: the rule with every *extra* inline of a non-deletable callee withdrawn, compiled for real.

Per module: compile the rule with clang's optimization record (which names each decision's callee, in order);
find the first decision where the rule inlines and clang would not, of a callee that ``llvm-dis`` shows defined
``external`` or ``weak_odr`` (or only declared); recompile with that decision withdrawn and the decisions before it
replayed, the rule deciding the rest; repeat until no such decision is left (at most ``--max-steps``).

    python research/linkage_oracle.py --corpus /work/corpora/train --split train --language C++ --sample 150 \
        --seed 5 [--hold-out-every 6] [-j 2]
"""

from __future__ import annotations

import argparse
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from optgym.corpus import Corpus, Module
from optgym.corpus.split import draw_by_size
from optgym.parallel import run_tasks
from optgym.policies import resolve_policy
from optgym.problems import get_problem
from optgym.rollout import baseline
from optgym.toolchain import find_toolchain
from optgym.train.evaluation import more_than_1pct_worse
from optgym.train.run import every_kth, modules_to_train_on
from optgym.train.search import Compiler

#: ``define [linkage] [visibility …] <type> @name(`` in ``llvm-dis`` output; no linkage word means external.
_DEFINE = re.compile(r"^define\s+(?P<head>[^@]*)@(?P<name>\"[^\"]+\"|[\w.$]+)\(", re.M)
_LINKAGES = ("private", "internal", "available_externally", "linkonce_odr", "linkonce", "weak_odr", "weak",
             "common", "appending", "extern_weak", "external")  # fmt: skip
DELETABLE = {"private", "internal", "linkonce_odr", "linkonce"}  # a body no one else may need once inlined away


def linkages(bitcode: Path, llvm_dis: str) -> dict[str, str]:
    """Each defined function's linkage, by (unquoted) name."""
    text = subprocess.run([llvm_dis, "-o", "-", str(bitcode)], capture_output=True, text=True, check=True).stdout
    found = {}
    for m in _DEFINE.finditer(text):
        words = m["head"].split()
        found[m["name"].strip('"')] = next((w for w in words if w in _LINKAGES), "external")
    return found


@dataclass(frozen=True)
class Task:
    module: Module
    policy: str
    max_steps: int


def oracle(task: Task) -> dict:
    """The rule's object and the oracle's for one module, with how many decisions the oracle withdrew."""
    problem = get_problem("inline-size")
    toolchain = find_toolchain()
    rule = resolve_policy(task.policy, problem.name).build()
    compiler = Compiler(problem, task.module, toolchain, rule, score=False)
    try:
        link = linkages(task.module.bitcode, str(toolchain.tool("llvm-dis")))
        out = compiler.run(np.zeros(0, np.int8), 0, features=True)
        if not out.ok or out.subjects is None:
            return {"module": task.module.name, "status": out.status if not out.ok else "no record"}
        rule_bytes, extra = out.text_bytes, int(((out.actions == 1) & (out.heuristic == 0)).sum())
        withdrawn, start = 0, 0
        for _ in range(task.max_steps):
            bad = [i for i in range(start, len(out.actions)) if out.actions[i] == 1 and out.heuristic[i] == 0
                   and link.get(out.subjects[i], "external") not in DELETABLE]  # fmt: skip
            if not bad:
                break
            i = bad[0]
            actions = out.actions.copy()
            actions[i] = 0
            nxt = compiler.run(actions, i + 1, features=True)
            if not nxt.ok or nxt.subjects is None:
                break
            out, start, withdrawn = nxt, i + 1, withdrawn + 1
        return {"module": task.module.name, "status": "ok", "clang": clang_bytes(task.module), "rule": rule_bytes,
                "oracle": out.text_bytes, "extra": extra, "withdrawn": withdrawn}  # fmt: skip
    finally:
        compiler.close()


def sample_parser(description: str) -> argparse.ArgumentParser:
    """The options both linkage studies take: which modules (a size-stratified draw), which rule, how many workers."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--split", default="train")
    parser.add_argument("--language", default="C++")
    parser.add_argument("--sample", type=int, default=150)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--hold-out-every", type=int, default=None, help="leave out every K-th module (the gate)")
    parser.add_argument("--policy", default="pretrained")
    parser.add_argument("-j", "--workers", type=int, default=2)
    return parser


def draw(args: argparse.Namespace) -> list[Module]:
    """The modules studied: the side's modules of the language, without every K-th, then a seeded draw by size
    (the same for both studies at the same seed)."""
    modules = modules_to_train_on(Corpus(args.corpus, split=args.split), args.language)
    if args.hold_out_every:
        held = set(every_kth([m.name for m in modules], args.hold_out_every))
        modules = [m for m in modules if m.name not in held]
    return draw_by_size(modules, args.sample, np.random.default_rng([args.seed, 29]))


def clang_bytes(module: Module) -> int:
    """clang's own ``-Oz`` object of ``module`` (cached on disk), asked in the worker that compiles the module."""
    return int(baseline(get_problem("inline-size"), module, find_toolchain()).metrics["text_bytes"])


def report(rows: list[dict], columns: tuple[str, ...]) -> list[dict]:
    """Each column's total against clang's own compile (each row's ``clang``), and its modules more than 1 % worse;
    returns the rows that compiled."""
    ok = [r for r in rows if r["status"] == "ok"]
    clang = sum(r["clang"] for r in ok)
    for key in columns:
        worse = sum(more_than_1pct_worse(r[key], r["clang"]) for r in ok)
        total = sum(r[key] for r in ok) / clang
        print(f"{key:7s} total {total:.4f} of clang's bytes, {worse} of {len(ok)} modules > 1 % worse")
    return ok


def main() -> None:
    parser = sample_parser(__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=40)
    args = parser.parse_args()
    modules = draw(args)
    rows = [r for _, r in run_tasks(oracle, [Task(m, args.policy, args.max_steps) for m in modules],
                                    workers=args.workers, progress=True)]  # fmt: skip
    ok = report(rows, ("rule", "oracle"))
    touched = [r for r in ok if r["withdrawn"]]
    print(f"modules with a withdrawn inline: {len(touched)}; withdrawn decisions {sum(r['withdrawn'] for r in ok)} of "
          f"{sum(r['extra'] for r in ok)} extra inlines; failed {len(rows) - len(ok)}")  # fmt: skip
    for r in sorted(touched, key=lambda r: r["oracle"] - r["rule"])[:15]:
        print(f"  {r['module']}: clang {r['clang']}  rule {r['rule']}  oracle {r['oracle']}  withdrew {r['withdrawn']}")


if __name__ == "__main__":
    main()
