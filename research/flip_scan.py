#!/usr/bin/env python3
"""Single-flip scan: which near-threshold decisions of a policy would shrink the module if flipped?

    .venv/bin/python -m research.flip_scan CORPUS [--split train] [--language C++] [--modules 50]
        [--policy pretrained] [--lo 1 --hi 80] [--undo] [--where FEATURE<=V|>=V] [--skip N] [-j 2] -o rows.jsonl

Why: a rule like the shipped policy's ("also inline up to K above clang's threshold where …") is only as
good as its gates, and the gates should come from the compiler, not from guessing. Per module (a seeded
random sample of one language), the policy compiles once with every decision's raw features recorded;
then each candidate decision is flipped alone — the policy's recorded answers before it, the flip, the
policy after it — and compiled. Candidates are the call sites the policy leaves alone at ``cost −
threshold`` in ``[lo, hi]`` (flips to *inline*), or with ``--undo`` clang's own inlines at ``cost −
threshold`` in ``[-hi, -lo]`` (flips to *not inline*), at most ``--max-flips`` per module.

One JSON line per flip: module, decision index, the action flipped to, clang's answer there, the base size
and the size change (Berkeley text and ``.text``), and every raw feature at that decision. The summary
printed at the end groups the flips by callee users and ``is_callee_avail_external``: how many shrank the
module. This scan found the shipped policy's ``available_externally`` gate: of 1 009 flips to inline on 49 C++ training
modules, 28 % shrank the module with a normal callee and 3 % with an ``available_externally`` one.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from optgym.corpus import Corpus
from optgym.files import atomic_write_bytes
from optgym.parallel import run_tasks
from optgym.policies import resolve_policy
from optgym.problems import get_problem
from optgym.problems.inline_size import FEATURES
from optgym.toolchain import find_toolchain
from optgym.train.search import Compiler
from optgym.train.threshold import gate_holds, parse_gate


@dataclass(frozen=True)
class ScanTask:
    corpus: str
    split: str | None
    module: str
    policy: str
    lo: int
    hi: int
    undo: bool
    max_flips: int
    timeout: float
    where: tuple[tuple[str, str, int], ...] = ()  # only call sites passing every (feature, "<=" | ">=", bound)


def candidates(
    actions: np.ndarray, heuristic: np.ndarray, features: dict[str, np.ndarray], task: ScanTask
) -> list[int]:
    """The decisions to flip: left alone at ``over = cost − threshold`` in [lo, hi], or (``undo``) clang's own
    inlines at ``over`` in [-hi, -lo]; of those, the ones every ``--where`` bound admits."""
    over = features["cost_estimate"] - features["threshold"]
    if task.undo:
        chosen = (actions == 1) & (heuristic == 1) & (over >= -task.hi) & (over <= -task.lo)
    else:
        chosen = (actions == 0) & (over >= task.lo) & (over <= task.hi)
    for feature, op, bound in task.where:
        chosen &= gate_holds(features[feature], op, bound)
    picked = np.flatnonzero(chosen).tolist()
    random.Random(task.module).shuffle(picked)
    return sorted(picked[: task.max_flips])


def scan_module(task: ScanTask) -> tuple[list[dict], list[str]]:
    """Worker: the policy's compile of one module, then one compile per flipped decision; the flips, and
    what failed to compile (reported, never counted as a size change)."""
    module = Corpus(task.corpus, split=task.split).module(task.module)
    compiler = Compiler(get_problem("inline-size"), module, find_toolchain(), resolve_policy(task.policy).build(),
                        score=False)  # fmt: skip
    compiler.timeout = task.timeout
    try:
        base = compiler.run(np.zeros(0, np.int8), 0, features=True)
        if not base.ok:
            return [], [f"{task.module}: the policy's compile: {base.status}"]
        if not base.features:
            return [], []  # no decision to flip
        features = base.features
        rows, failed = [], []
        for i in candidates(base.actions, base.heuristic, features, task):
            actions = base.actions.copy()
            actions[i] = 1 - actions[i]
            out = compiler.run(actions, i + 1)  # the recorded answers up to the flip, the policy after it
            if not out.ok:
                failed.append(f"{task.module}: flip of decision {i}: {out.status}")
                continue
            rows.append({"module": task.module, "decision": i, "decisions": len(base.actions), "to": int(actions[i]),
                         "heuristic": int(base.heuristic[i]),
                         "base_text": base.text_bytes, "delta_text": out.text_bytes - base.text_bytes,
                         "delta_dottext": out.dottext_bytes - base.dottext_bytes,
                         **{name: int(values[i]) for name, values in features.items()}})  # fmt: skip
        return rows, failed
    finally:
        compiler.close()


def summary(rows: list[dict]) -> list[str]:
    """Per (callee users, available externally): flips, the share that shrank / grew the module, mean change."""
    groups: dict[tuple[str, int], list[int]] = defaultdict(list)
    for r in rows:
        users = str(r["callee_users"]) if r["callee_users"] < 5 else "≥5"
        groups[(users, r["is_callee_avail_external"])].append(r["delta_text"])
    lines = [f"{'callee users':>12} {'avail. ext.':>11} {'flips':>6} {'shrank':>7} {'grew':>6} {'mean Δ B':>9}"]
    for (users, external), deltas in sorted(groups.items()):
        d = np.array(deltas)
        lines.append(f"{users:>12} {external:>11} {len(d):>6} {(d < 0).mean():>7.0%} {(d > 0).mean():>6.0%} "
                     f"{d.mean():>9.1f}")  # fmt: skip
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpus", type=Path)
    parser.add_argument("-o", "--output", type=Path, required=True, help="the flips, one JSON line each")
    parser.add_argument("--split", default="train", help="train | test | all")
    parser.add_argument("--language", choices=("C++", "C"), default="C++")
    parser.add_argument("--modules", type=int, default=50, help="modules to scan (a seeded random sample)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--skip", type=int, default=0, help="start this far into the sample (scan it in chunks)")
    parser.add_argument("--policy", default="pretrained", help="the policy whose decisions are flipped")
    parser.add_argument("--lo", type=int, default=1)
    parser.add_argument("--hi", type=int, default=80)
    parser.add_argument("--undo", action="store_true", help="flip clang's own inlines to 'not inline' instead")
    parser.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="FEATURE<=V",
        help="only call sites where raw FEATURE ≤ V (or ≥ V; repeatable), the gates of optgym train threshold",
    )
    parser.add_argument("--max-flips", type=int, default=40, help="flips per module at most")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per compile")
    parser.add_argument("-j", "--workers", type=int, default=None)
    args = parser.parse_args()

    split = None if args.split == "all" else args.split
    where = []
    for text in args.where:
        try:
            where.append(parse_gate(text))
        except ValueError:
            sys.exit(f"--where takes FEATURE<=INTEGER or FEATURE>=INTEGER, not {text!r}")
        if where[-1][0] not in FEATURES:
            sys.exit(f"--where {text!r}: {where[-1][0]!r} is not one of clang's features")
    corpus = Corpus(args.corpus, split=split)
    resolve_policy(args.policy)  # a clear error now, not in every worker
    names = sorted(m.name for m in corpus if m.family == args.language)
    if not names:
        sys.exit(f"{args.corpus} has no {args.language} modules on the {args.split} side")
    random.Random(args.seed).shuffle(names)
    tasks = [ScanTask(str(args.corpus), split, name, args.policy, args.lo, args.hi, args.undo, args.max_flips,
                      args.timeout, tuple(where)) for name in names[args.skip : args.skip + args.modules]]  # fmt: skip
    rows: list[dict] = []
    failed: list[str] = []
    for _, (module_rows, module_failed) in run_tasks(scan_module, tasks, workers=args.workers, description="flip scan"):
        rows.extend(module_rows)
        failed.extend(module_failed)
    atomic_write_bytes(args.output, "".join(json.dumps(r) + "\n" for r in rows).encode())
    print(f"{len(rows)} flips over {len({r['module'] for r in rows})} modules → {args.output}")
    print("\n".join(summary(rows)))
    if failed:
        print(f"{len(failed)} compiles failed (not counted):", *failed[:20], sep="\n  ")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
