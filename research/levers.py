#!/usr/bin/env python3
"""Levers beyond inlining: how much does each of clang's own alternatives to one ``-Oz`` choice move size?

    .venv/bin/python -m research.levers CORPUS [--split train] [--language C] [--modules 200] [--seed 11] [-j 2]

Why: the C half of issue 7 (≤ 0.99 of ``-Oz``) is out of reach of per-module inlining decisions (a
per-module search finds 0.4 %), so the question is whether another decision clang makes at ``-Oz``
could carry C further. Each module of a seeded random sample of one language is compiled with clang's
own heuristic under each alternative — passes clang keeps off at ``-Oz`` (the outliners, another register
allocator, …), thresholds of passes it runs (jump tables, tail merging, …) — and once with every inlining
decision answered "no" over the interactive channel. Printed per alternative: the total against ``-Oz``
(Berkeley text and ``.text``), the modules it makes smaller, and the total when each module takes the
better of it and ``-Oz`` — what a perfect per-module chooser would get; last, the smallest of all of them
per module, and of the thresholds alone (the safe ones) when any was compiled.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path

from optgym.corpus import Corpus
from optgym.parallel import run_tasks
from optgym.policies import resolve_policy
from optgym.policies.portfolio import PASS_OPTIONS
from optgym.problems import get_problem
from optgym.rollout import rollout
from optgym.toolchain import find_toolchain

#: clang's own alternatives to one -Oz choice: name → extra clang flags
PASSES: dict[str, tuple[str, ...]] = {
    "machine outliner": ("-mllvm", "-enable-machine-outliner=always"),
    "basic register allocator": ("-mllvm", "-regalloc=basic"),
    "module inliner": ("-mllvm", "-enable-module-inliner"),
    "IR outliner": ("-mllvm", "-ir-outliner"),
    "GVN sinking": ("-mllvm", "-enable-gvn-sink"),
    "GVN hoisting": ("-mllvm", "-enable-gvn-hoist"),
    "merge functions": ("-fmerge-functions",),
    "interprocedural RA": ("-mllvm", "-enable-ipra"),
    "no SLP vectorizer": ("-mllvm", "-slp-threshold=1000000"),
}
#: thresholds of passes -Oz runs anyway: the pool the C portfolio's candidates are chosen from (the product's)
THRESHOLDS = PASS_OPTIONS
#: the passes that shrink C in total without many modules worse, switched on together
TOGETHER = ("interprocedural RA", "IR outliner", "GVN hoisting")
#: name → (policy answering the inlining decisions, extra clang flags)
ALTERNATIVES: dict[str, tuple[str, tuple[str, ...]]] = {
    "-Oz": ("heuristic", ()),
    **{name: ("heuristic", flags) for name, flags in PASSES.items()},
    **{name: ("heuristic", flags) for name, flags in THRESHOLDS.items()},
    "IPRA + IR outliner + GVN hoisting": ("heuristic", tuple(flag for name in TOGETHER for flag in PASSES[name])),
    "never inline": ("never", ()),
}


@dataclass(frozen=True)
class LeverTask:
    corpus: str
    split: str | None
    module: str
    timeout: float
    alternatives: tuple[str, ...] = tuple(ALTERNATIVES)  # "-Oz" always among them


def compile_alternatives(task: LeverTask) -> dict[str, tuple[int, int] | None]:
    """Worker: (Berkeley text, ``.text``) of one module under every alternative; ``None`` where it failed."""
    module = Corpus(task.corpus, split=task.split).module(task.module)
    problem, toolchain = get_problem("inline-size"), find_toolchain()
    sizes: dict[str, tuple[int, int] | None] = {}
    for name in task.alternatives:
        policy, flags = ALTERNATIVES[name]
        run = rollout(problem, module, toolchain, resolve_policy(policy).build(), timeout=task.timeout,
                      extra_flags=flags)  # fmt: skip
        metrics = run.result.metrics
        sizes[name] = (metrics["text_bytes"], metrics["dottext_bytes"]) if run.result.ok else None
    return sizes


def table(rows: list[dict[str, tuple[int, int] | None]]) -> list[str]:
    """The printed table over the modules every alternative compiled."""
    ok: list[dict[str, tuple[int, int]]] = [{k: v for k, v in r.items() if v} for r in rows if all(r.values())]
    base, base_dot = sum(r["-Oz"][0] for r in ok), sum(r["-Oz"][1] for r in ok)
    width = len("-Oz and thresholds, smallest per module") + 1  # the longest label
    lines = [f"{len(ok)} modules ({len(rows) - len(ok)} with a failed compile left out), {base} B Berkeley text at -Oz",
             f"{'alternative':<{width}} {'total':>7} {'.text':>7} {'smaller':>8} {'>1% worse':>9} "
             f"{'better of it and -Oz':>21}"]  # fmt: skip
    if not ok:
        return lines
    for name in (n for n in ALTERNATIVES if n != "-Oz" and n in ok[0]):
        total = sum(r[name][0] for r in ok) / base
        dot = sum(r[name][1] for r in ok) / base_dot
        smaller = sum(r[name][0] < r["-Oz"][0] for r in ok)
        worse = sum(r[name][0] > 1.01 * r["-Oz"][0] for r in ok)
        best = sum(min(r[name][0], r["-Oz"][0]) for r in ok) / base
        lines.append(f"{name:<{width}} {total:>7.4f} {dot:>7.4f} {smaller:>8} {worse:>9} {best:>21.4f}")
    groups = [("all", tuple(ALTERNATIVES))]
    if not THRESHOLDS.keys().isdisjoint(ok[0]):  # the safe ones alone, when any was compiled
        groups.append(("-Oz and thresholds", ("-Oz", *THRESHOLDS)))
    for label, names in groups:
        smallest = sum(min(size[0] for name, size in r.items() if name in names) for r in ok) / base
        lines.append(f"{label + ', smallest per module':<{width}} {'':>7} {'':>7} {'':>8} {'':>9} {smallest:>21.4f}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpus", type=Path)
    parser.add_argument("--split", default="train", help="train | test | all")
    parser.add_argument("--language", choices=("C++", "C"), default="C")
    parser.add_argument("--modules", type=int, default=200, help="modules to compile (a seeded random sample)")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--only", action="append", choices=list(ALTERNATIVES)[1:], default=[],
                        help="compile just these alternatives (repeatable; default: all)")  # fmt: skip
    parser.add_argument("--rows", type=Path, help="also write each module's sizes here (JSON lines)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per compile")
    parser.add_argument("-j", "--workers", type=int, default=None)
    args = parser.parse_args()

    split = None if args.split == "all" else args.split
    corpus = Corpus(args.corpus, split=split)
    names = sorted(m.name for m in corpus if m.family == args.language)
    if not names:
        sys.exit(f"{args.corpus} has no {args.language} modules on the {args.split} side")
    random.Random(args.seed).shuffle(names)
    chosen = ("-Oz", *args.only) if args.only else tuple(ALTERNATIVES)
    tasks = [LeverTask(str(args.corpus), split, name, args.timeout, chosen) for name in names[: args.modules]]
    done = list(run_tasks(compile_alternatives, tasks, workers=args.workers, description="levers"))
    rows = [row for _, row in done]
    if args.rows:
        args.rows.write_text("".join(json.dumps({"module": tasks[i].module, **row}) + "\n" for i, row in done))
    print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
