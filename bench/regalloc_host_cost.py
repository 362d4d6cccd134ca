#!/usr/bin/env python3
"""What do the register allocator's channels cost a compile? Plain compile against the same compile with each
register-allocation scorer answering over its channel, side by side.

The priority channel asks once per live range queued — every range of every function, not only when
registers run out as eviction does — so it is the channel with the most decisions per compile, and the one
where a slow host would show first. Per module and round, in an order rotated each round so a noisy moment
hits every variant alike:

  plain      the module's own compile (clang's default advisors), timed around ``subprocess.run`` itself
             (``plain_compile``'s runner polls for the exit with growing sleeps and rounds a time up);
  evict      ``rollout`` with the shipped eviction scorer (or ``--evict``);
  priority   ``rollout`` with the shipped priority scorer (or ``--priority``);
  C host     the priority channel answered by bench/minimal_host.c with the start rule (10⁶ · weight): the
             floor for any host of that channel — what clang's side of the protocol costs — its object
             checked in the warm-up round to be the optgym host's with the same rule;

the channels timed as the compile's wall time (``EpisodeResult.compile_seconds``: exits seen at once
through a pidfd), and the scorer's own time inside it measured
around every call. Per module the median over rounds, summed over modules; printed as ratios to plain.

    .venv/bin/python bench/regalloc_host_cost.py --corpus corpora/train --language C --modules 24 --repeat 3
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from host_overhead import build_c_host, c_host_compile  # bench/ is not a package: the shared C host
from rich.console import Console
from rich.table import Table

from optgym.corpus import Corpus, Module
from optgym.policies import resolve_policy
from optgym.policies.scorer import CandidateScorer
from optgym.problems import get_problem
from optgym.rollout import rollout
from optgym.toolchain import find_toolchain
from optgym.toolchain.sizes import object_sizes

VARIANTS = ("plain", "evict", "priority", "c_host")


def timed(policy: Callable, spent: list[float]) -> Callable:
    """``policy`` with the time of each call added to ``spent[0]``."""

    def call(point):
        start = time.perf_counter()
        try:
            return policy(point)
        finally:
            spent[0] += time.perf_counter() - start

    return call


def scorer_for(spec: str, problem: str) -> Callable:
    """The policy ``spec`` names for ``problem``; ``start``, the problem's starting rule (the C host's rule, for
    priority: the two hosts then answer alike)."""
    return CandidateScorer.initial(problem) if spec == "start" else resolve_policy(spec, problem).build()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--split", default="train")
    parser.add_argument("--language", default="C")
    parser.add_argument("--modules", type=int, default=24, help="every N-th module by name, this many")
    parser.add_argument("--repeat", type=int, default=3)
    spec = "a policy spec (pretrained, a run or .onnx file) or start: the problem's starting rule"
    parser.add_argument("--evict", default="pretrained", help=spec)
    parser.add_argument("--priority", default="pretrained", help=spec)
    args = parser.parse_args()

    corpus = Corpus(args.corpus, split=args.split)
    names = sorted(m.name for m in corpus if m.family == args.language)
    modules: list[Module] = [corpus.module(n) for n in names[:: max(1, len(names) // args.modules)][: args.modules]]
    problems = {name: get_problem(f"regalloc-{name}") for name in ("evict", "priority")}
    policies = {name: scorer_for(getattr(args, name), f"regalloc-{name}") for name in problems}
    toolchain = find_toolchain(tuple(p.hook for p in problems.values()))

    scratch = Path(tempfile.mkdtemp(prefix="optgym-regalloc-bench-"))
    atexit.register(shutil.rmtree, scratch, True)  # on every way out, a failed check's SystemExit included
    host_binary = build_c_host(scratch)
    start_rule = CandidateScorer.initial("regalloc-priority")
    priority = problems["priority"]

    def c_host_argv(module: Module, out: Path) -> Callable[[str], list[str]]:
        flags = priority.compile_flags()
        return lambda base: module.argv(toolchain.clang, [*flags, *priority.channel_flags(base)], out)

    wall = {v: [[] for _ in modules] for v in VARIANTS}
    host = {v: [[] for _ in modules] for v in VARIANTS}
    decisions = dict.fromkeys(VARIANTS, 0)
    for round_ in range(args.repeat + 1):  # round 0 warms the caches and is not counted
        order = VARIANTS[round_ % len(VARIANTS) :] + VARIANTS[: round_ % len(VARIANTS)]
        for i, module in enumerate(modules):
            for variant in order:
                spent = [0.0]
                if variant == "plain":
                    start = time.perf_counter()
                    subprocess.run(module.argv(toolchain.clang, (), os.devnull), check=True)
                    seconds, count = time.perf_counter() - start, 0
                elif variant == "c_host":
                    out = scratch / "c_host.o"
                    seconds, _, fields = c_host_compile(host_binary, c_host_argv(module, out), scratch, "priority")
                    count = int(fields[0])
                    if not round_:  # the floor decides as optgym's host with the same rule, or it floors nothing
                        same = rollout(priority, module, toolchain, start_rule).result
                        if not same.ok or same.metrics["text_bytes"] != object_sizes(out).text_bytes:
                            raise SystemExit(f"{module.name}: the C host's object differs from optgym's start rule")
                else:
                    result = rollout(problems[variant], module, toolchain, timed(policies[variant], spent)).result
                    if not result.ok:
                        raise SystemExit(f"{module.name} ({variant}): {result.status} {result.detail}")
                    seconds, count = result.compile_seconds, result.decisions
                if round_:
                    wall[variant][i].append(seconds)
                    host[variant][i].append(spent[0])
                    decisions[variant] += count

    total = {v: sum(statistics.median(w) for w in wall[v]) for v in VARIANTS}
    scorer = {v: sum(statistics.median(h) for h in host[v]) for v in VARIANTS}
    table = Table(title=f"{len(modules)} {args.language} modules, median of {args.repeat} rounds")
    columns = ("variant", "compile wall s", "vs plain", "decisions/compile", "scorer s", "scorer share", "µs/decision")
    for column in columns:
        table.add_column(column, justify="right")
    for v in VARIANTS:
        per_compile = decisions[v] / args.repeat
        table.add_row(
            v, f"{total[v]:.2f}", f"{total[v] / total['plain']:.3f}", f"{per_compile:.0f}", f"{scorer[v]:.3f}",
            f"{scorer[v] / total[v]:.1%}", f"{scorer[v] / per_compile * 1e6:.0f}" if per_compile else "",
        )  # fmt: skip
    Console().print(table)
    print(f"priority channel: optgym's host {total['priority'] / total['c_host']:.3f}× the C host's compile wall")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
