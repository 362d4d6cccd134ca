"""Trainer comparison: PPO, ES and imitation of a search on one compile budget, one held-out split, N seeds.

    nice -n 10 .venv/bin/python -m research.compare_trainers [--corpus /work/corpora/demo] [--work /tmp/cmp]
                                                          [--seeds 3] [--passes 3] [--test-package zlib]

Issue 7 asks which trainer to spend compiles on. One run cannot tell a trainer's effect from its
seed's, and a trainer's own training-set figure flatters it, so every trainer here gets the same
corpus, the same stored package split, the same budget counted in compiles, and N seeds; every final
policy is measured by ``optgym evaluate`` on both sides of the split, and the table gives the mean
and a 95 % Student-t confidence interval over the seeds.

Top to bottom:

1. **corpus** — ``optgym corpus merge SOURCE -o WORK/corpus`` (hard links: the source corpus is only
   read) and ``optgym corpus split --by package --test-groups zlib``: zlib (C) is never trained on.
2. **shared by every seed** — ``optgym trace`` of the train side (clang's heuristic, deterministic) and
   ``optgym vocab`` of it: the inputs of behavioral cloning, the same for every trainer.
3. **per seed s** (every stochastic step gets ``--seed s``):

   * ``optgym train bc`` — the warm start, cloned per seed so that the seed covers the whole pipeline
     of PPO and ES; evaluated too (the row they start from, 0 compiles of its own);
   * ``optgym train ppo --warmstart BC`` — ``passes × decisions of the train side`` steps: each pass
     is one episode (one compile) per module;
   * ``optgym train es --warmstart BC`` — iterations × directions × 2 × modules per iteration ≈ the
     budget;
   * ``optgym search --focus 0.05 --min-decisions 100`` then ``optgym train imitate --extras
     residual`` — the search's budget is spent on the decision-heavy modules (where the headroom
     is); every other module costs its one start compile, and the imitation learns clang's own
     decisions there. Verifying compiles of accepted improvements are counted separately. (A budget
     too small to reach the search's seeded evolution gives every seed the same search.)

4. every final policy: ``optgym evaluate --split train`` and ``--split test``; ``report.json`` gives the
   Berkeley-text ratio (``total_ratio``, what MLGO rewards), the ``.text`` ratio, and the modules more
   than 1 % worse than the heuristic.

The budget is ``--passes`` compiles per train module (default 3: 330 compiles on the demo's train
side) — small, so that the whole comparison takes 17 minutes on 2 busy cores; it ranks the trainers
at a small budget, not at convergence. A rerun with the same ``--work`` reuses every finished step
(a trainer's final policy, a report), so an interrupted comparison continues where it stopped.
A step that fails is recorded with its reason (the ``error:`` line of its log, ``WORK/logs/``) and
shows as failed in the table, never dropped. Results: ``WORK/compare_trainers.json`` (per seed and
summarized) and ``WORK/compare_trainers.md`` (the table, for the README).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from optgym.corpus import Corpus
from optgym.evaluate.stats import mean_ci
from optgym.train.search import read_search, select_modules
from optgym.train.trace import read_meta, read_modules

console = Console(width=None if sys.stdout.isatty() else 160)  # a log keeps the whole table

OPTGYM = str(Path(sys.executable).with_name("optgym"))  # the CLI of the venv running this script
SIDES = ("train", "test")
#: The figures of ``optgym evaluate``'s report.json the comparison keeps per side.
REPORT_KEYS = ("total_ratio", "dottext_ratio", "regressed_over_1pct", "evaluated", "failed")
ALGORITHMS = ("bc", "ppo", "es", "imitate")
LABELS = {"heuristic": "clang's heuristic", "bc": "BC (warm start)", "ppo": "PPO from BC", "es": "ES from BC",
          "imitate": "imitation of search"}  # fmt: skip


class StepFailed(Exception):
    """An optgym command that exited non-zero; the message is the reason shown in the table."""


@dataclass
class Budget:
    """What each trainer gets per seed, derived from ``passes`` compiles per train module."""

    passes: int
    train_modules: int
    train_decisions: int
    compiles: int  # passes × train modules: the common budget
    ppo_steps_per_iteration: int
    ppo_iterations: int
    es_directions: int
    es_modules: int
    es_iterations: int
    search_min_decisions: int
    search_focus: float
    searched: int  # distinct train modules with ≥ min decisions
    skipped: int  # the other distinct train modules: one start compile each
    search_budget: int  # compiles per searched module

    def planned(self) -> dict[str, int]:
        """Compiles per seed as configured (PPO's in expectation: one compile per episode)."""
        return {
            "bc": 0,
            "ppo": round(self.ppo_iterations * self.ppo_steps_per_iteration * self.train_modules
                         / self.train_decisions),
            "es": self.es_iterations * self.es_directions * 2 * self.es_modules,
            "imitate": self.searched * self.search_budget + self.skipped,
        }  # fmt: skip


@dataclass
class Outcome:
    """One trainer, one seed: its evaluation on each side, what it spent, or why it failed."""

    status: str = "ok"
    reason: str = ""
    seconds: float = 0.0  # training wall time (evaluation excluded)
    compiles: int | None = None  # actually spent, where the run records it
    sides: dict[str, dict[str, Any]] = field(default_factory=dict)


# -- running optgym ----------------------------------------------------------------------------------


def optgym(args: list[str], log: Path) -> None:
    """Run one optgym command, its output into ``log``; :class:`StepFailed` with the reason if it fails."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        out.write("$ optgym " + " ".join(args) + "\n")
        out.flush()
        env = {**os.environ, "COLUMNS": "160"}  # progress bars and tables readable in the log
        code = subprocess.run([OPTGYM, *args], stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    if code != 0:
        raise StepFailed(failure_reason(log, code))


def failure_reason(log: Path, code: int) -> str:
    """The command's own ``error:`` line, else its last line of output (a traceback's exception)."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    return (errors[-1] if errors else lines[-1] if len(lines) > 1 else f"exit status {code}")[:200]


def step(name: str, done: Path, args: list[str], logs: Path, *, output: Path | None = None) -> float:
    """Run one command unless ``done`` exists (a rerun reuses it); returns its wall seconds.

    ``output`` is removed first when it holds a half-made result, since trainers refuse a run
    directory that already holds a run (the search, which resumes itself, passes none). The seconds
    are kept beside the log, so a reused step still counts its original time."""
    seconds_file = logs / f"{name}.seconds"
    if done.exists():
        console.print(f"  [dim]{name}: reused {done}[/]", highlight=False)
        return float(seconds_file.read_text()) if seconds_file.exists() else 0.0
    if output is not None and output.is_dir():
        shutil.rmtree(output)
    console.print(f"  {name} …", highlight=False)
    start = time.monotonic()
    optgym(args, logs / f"{name}.log")
    seconds = time.monotonic() - start
    seconds_file.write_text(f"{seconds:.1f}\n")
    console.print(f"  {name}: {seconds:.0f} s", highlight=False)
    return seconds


# -- the shared part ---------------------------------------------------------------------------------


def prepare_corpus(source: Path, work: Path, test_package: str, logs: Path) -> Path:
    """``WORK/corpus``: the source's modules (hard links) with a stored split holding ``test_package`` out."""
    corpus = work / "corpus"
    if not (corpus / "corpus_description.json").exists():
        optgym(["corpus", "merge", str(source), "-o", str(corpus)], logs / "corpus-merge.log")
    split = Corpus(corpus).description.get("optgym", {}).get("split")
    if not split or split.get("test_groups") != [test_package]:
        optgym(["corpus", "split", str(corpus), "--by", "package", "--test-groups", test_package],
               logs / "corpus-split.log")  # fmt: skip
    return corpus


def plan_budget(corpus: Path, trace: Path, args: argparse.Namespace) -> Budget:
    """Turn ``--passes`` into each trainer's options (sizes read from the heuristic's trace).

    The search leaves out duplicate modules (same bitcode and flags, see ``select_modules``) and
    modules under ``--min-decisions``; its per-module budget is what is left of the common budget
    after one start compile for each skipped module."""
    meta = read_meta(trace)
    decisions = {row["module"]: row["decisions"] for row in read_modules(trace)}
    modules = len(decisions)
    compiles = args.passes * modules
    distinct, _ = select_modules(Corpus(corpus, split="train"), None)
    searched = sum(1 for m in distinct if decisions.get(m.name, 0) >= args.min_decisions)
    skipped = len(distinct) - searched
    return Budget(
        passes=args.passes, train_modules=modules, train_decisions=meta["decisions"], compiles=compiles,
        ppo_steps_per_iteration=args.ppo_steps_per_iteration,
        ppo_iterations=max(1, round(args.passes * meta["decisions"] / args.ppo_steps_per_iteration)),
        es_directions=args.es_directions, es_modules=args.es_modules,
        es_iterations=max(1, round(compiles / (2 * args.es_directions * args.es_modules))),
        search_min_decisions=args.min_decisions, search_focus=args.focus, searched=searched, skipped=skipped,
        search_budget=max(2, (compiles - skipped) // max(1, searched)),
    )  # fmt: skip


def read_report(report: Path) -> dict[str, Any]:
    data = json.loads((report / "report.json").read_text())
    return {k: data.get(k) for k in REPORT_KEYS}


def evaluate(policy: Path | str, corpus: Path, out: Path, args: argparse.Namespace, logs: Path) -> dict:
    """``optgym evaluate`` on both sides of the split: ``{side: REPORT_KEYS}``."""
    sides = {}
    for side in SIDES:
        report = out / f"eval-{side}"
        step(f"{out.name}-eval-{side}", report / "report.json",
             ["evaluate", "--corpus", str(corpus), "--policy", str(policy), "--split", side, "-o", str(report),
              "-j", str(args.workers)], logs, output=report)  # fmt: skip
        sides[side] = read_report(report)
    return sides


# -- the trainers, one seed --------------------------------------------------------------------------


def ppo_compiles(run: Path) -> int | None:
    """Episodes PPO finished (one compile each; the few cut off by the end are not counted)."""
    progress = run / "progress.csv"
    if not progress.exists():
        return None
    with progress.open(newline="") as f:
        return sum(int(float(row["results/episodes"] or 0)) for row in csv.DictReader(f))


def search_compiles(search: Path) -> int:
    summary = read_search(search)["summary"]
    return int(summary["compiles"]) + int(summary.get("verify_compiles", 0))


def run_seed(seed: int, corpus: Path, trace: Path, vocab: Path, budget: Budget, args: argparse.Namespace,
             work: Path) -> dict[str, Outcome]:  # fmt: skip
    """Every trainer with ``--seed seed``; a failure is recorded in its :class:`Outcome`, not raised."""
    root, logs = work / f"seed-{seed}", work / "logs" / f"seed-{seed}"
    j = ["-j", str(args.workers)]
    common = ["--corpus", str(corpus), "--split", "train", "--seed", str(seed), "--no-final-eval", *j]
    bc, ppo, es, search, imitate = (root / n for n in ("bc", "ppo", "es", "search", "imitate"))
    final = Path("final", "policy", "policy.json")  # what a finished run has
    # algorithm → its steps: (name, done marker, optgym arguments, output to clear before a fresh start)
    steps: dict[str, list[tuple[str, Path, list[str], Path | None]]] = {
        "bc": [("bc", bc / "policy" / "policy.json",
                ["train", "bc", "--trace", str(trace), "--vocab", str(vocab), "-o", str(bc), "--no-evaluate",
                 "--seed", str(seed), *j], bc)],
        "ppo": [("ppo", ppo / final,
                 ["train", "ppo", *common, "--warmstart", str(bc), "-o", str(ppo),
                  "--iterations", str(budget.ppo_iterations),
                  "--steps-per-iteration", str(budget.ppo_steps_per_iteration)], ppo)],
        "es": [("es", es / final,
                ["train", "es", *common, "--warmstart", str(bc), "-o", str(es),
                 "--iterations", str(budget.es_iterations), "--directions", str(budget.es_directions),
                 "--modules-per-iteration", str(budget.es_modules)], es)],
        "imitate": [("search", root / "search.done",
                     ["search", "--corpus", str(corpus), "--split", "train", "-o", str(search),
                      "--budget", str(budget.search_budget), "--focus", str(budget.search_focus),
                      "--min-decisions", str(budget.search_min_decisions), "--seed", str(seed), *j], None),
                    ("imitate", imitate / final,
                     ["train", "imitate", "--search", str(search), "-o", str(imitate), "--extras", "residual",
                      "--seed", str(seed), "--no-final-eval", *j], imitate)],
    }  # fmt: skip
    spent = {"bc": lambda: 0, "ppo": lambda: ppo_compiles(ppo), "es": lambda: budget.planned()["es"],
             "imitate": lambda: search_compiles(search)}  # fmt: skip
    policies = {"bc": bc / "policy", "ppo": ppo, "es": es, "imitate": imitate}
    outcomes: dict[str, Outcome] = {}
    for algorithm in ALGORITHMS:
        outcome = outcomes[algorithm] = Outcome()
        if algorithm in ("ppo", "es") and outcomes["bc"].status != "ok":
            outcome.status, outcome.reason = "failed", f"warm start failed: {outcomes['bc'].reason}"
            continue
        try:
            for name, done, command, output in steps[algorithm]:
                outcome.seconds += step(name, done, command, logs, output=output)
                if name == "search":
                    done.touch()  # a search directory has no marker of its own for "finished"
            outcome.compiles = spent[algorithm]()
            outcome.sides = evaluate(policies[algorithm], corpus, root / "eval" / algorithm, args, logs)
        except StepFailed as e:
            outcome.status, outcome.reason = "failed", str(e)
            console.print(f"  [red]{algorithm} failed[/]: {e}", highlight=False)
    return outcomes


# -- statistics and the table ------------------------------------------------------------------------


def summarize(per_seed: dict[int, dict[str, Outcome]], budget: Budget) -> dict[str, Any]:
    """Per algorithm: mean ± CI of each side's Berkeley-text and .text ratio, regressions, compiles, time."""
    out: dict[str, Any] = {}
    for algorithm in ALGORITHMS:
        runs = {seed: outcomes[algorithm] for seed, outcomes in per_seed.items()}
        ok = [o for o in runs.values() if o.status == "ok"]
        row: dict[str, Any] = {
            "seeds_ok": len(ok), "seeds": len(runs),
            "failures": {str(s): o.reason for s, o in runs.items() if o.status != "ok"},
            "compiles_planned": budget.planned()[algorithm],
            "compiles": mean_ci([float(o.compiles) for o in ok if o.compiles is not None]),
            "train_seconds": mean_ci([o.seconds for o in ok if o.seconds > 0]),
        }  # fmt: skip
        for side in SIDES:
            for key in ("total_ratio", "dottext_ratio", "regressed_over_1pct"):
                row[f"{side}/{key}"] = mean_ci([float(o.sides[side][key]) for o in ok])
        out[algorithm] = row
    return out


def fmt(stat: dict[str, Any], digits: int = 4) -> str:
    if stat["mean"] is None:
        return "—"
    ci = f" ± {stat['ci95']:.{digits}f}" if stat["ci95"] is not None else ""
    return f"{stat['mean']:.{digits}f}{ci}"


COLUMNS = ("trainer", "compiles / seed", "train text", "train .text", "held-out text", "held-out .text",
           "held-out >1 % worse", "train s / seed")  # fmt: skip


def table_rows(summary: dict[str, Any], heuristic: dict[str, dict[str, Any]]) -> list[list[str]]:
    """The table's rows: the heuristic (measured once), then each trainer (or why it failed)."""
    h = heuristic
    rows = [[LABELS["heuristic"], "—", f"{h['train']['total_ratio']:.4f}", f"{h['train']['dottext_ratio']:.4f}",
             f"{h['test']['total_ratio']:.4f}", f"{h['test']['dottext_ratio']:.4f}",
             f"{h['test']['regressed_over_1pct']} / {h['test']['evaluated']}", "—"]]  # fmt: skip
    evaluated = h["test"]["evaluated"]
    for algorithm in ALGORITHMS:
        s = summary[algorithm]
        label = LABELS[algorithm]
        if s["seeds_ok"] == 0:
            reason = next(iter(s["failures"].values()), "")
            rows.append([label, "—", f"failed: {reason}", "", "", "", "", ""])
            continue
        if s["failures"]:
            label += f" ({s['seeds_ok']} of {s['seeds']} seeds; failed: {'; '.join(s['failures'].values())})"
        compiles = f"{s['compiles']['mean']:.0f}" if s["compiles"]["mean"] is not None else "—"
        regressed = fmt(s["test/regressed_over_1pct"], 1) + f" / {evaluated}"
        seconds = f"{s['train_seconds']['mean']:.0f}" if s["train_seconds"]["mean"] is not None else "—"
        rows.append([label, compiles, fmt(s["train/total_ratio"]), fmt(s["train/dottext_ratio"]),
                     fmt(s["test/total_ratio"]), fmt(s["test/dottext_ratio"]), regressed, seconds])  # fmt: skip
    return rows


def markdown(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


# -- main --------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=Path("/work/corpora/demo"), help="source corpus (only read)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/cmp"), help="everything this writes goes here")
    parser.add_argument("--test-package", default="zlib", help="the package held out")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--passes", type=int, default=3, help="the budget: compiles per train module, per seed")
    parser.add_argument("--workers", "-j", type=int, default=2)
    parser.add_argument("--ppo-steps-per-iteration", type=int, default=512)
    parser.add_argument("--es-directions", type=int, default=2)
    parser.add_argument("--es-modules", type=int, default=11, help="ES modules per iteration")
    parser.add_argument("--min-decisions", type=int, default=100, help="search only modules with this many")
    parser.add_argument("--focus", type=float, default=0.05, help="search --focus")
    args = parser.parse_args()

    start = time.monotonic()
    work, logs = args.work.resolve(), args.work.resolve() / "logs"
    work.mkdir(parents=True, exist_ok=True)
    corpus = prepare_corpus(args.corpus, work, args.test_package, logs)
    trace, vocab = work / "trace-train", work / "vocab.json"
    step(
        "trace",
        trace / "trace.json",
        ["trace", "--corpus", str(corpus), "--split", "train", "-o", str(trace), "-j", str(args.workers)],
        logs,
        output=trace,
    )
    step("vocab", vocab, ["vocab", str(trace), "-o", str(vocab)], logs)  # fmt: skip
    budget = plan_budget(corpus, trace, args)
    console.print(f"budget per seed: {budget.compiles} compiles ({budget.passes} per train module); "
                  f"planned {budget.planned()}", highlight=False)  # fmt: skip
    heuristic = evaluate("heuristic", corpus, work / "heuristic", args, logs)

    per_seed: dict[int, dict[str, Outcome]] = {}
    for seed in range(args.seeds):
        console.rule(f"seed {seed}")
        per_seed[seed] = run_seed(seed, corpus, trace, vocab, budget, args, work)

    summary = summarize(per_seed, budget)
    rows = table_rows(summary, heuristic)
    wall = time.monotonic() - start
    table = Table(title=f"trainers on {args.corpus.name}, {args.test_package} held out, {args.seeds} seeds "
                  f"(mean ± 95 % CI), budget {budget.compiles} compiles / seed")  # fmt: skip
    for c in COLUMNS:
        table.add_column(c, justify="left" if c == "trainer" else "right")
    for r in rows:
        table.add_row(*r)
    console.print(table)
    console.print(
        f"wall time {wall / 60:.1f} min (this invocation; steps reused from an earlier one excluded)", highlight=False
    )
    result = {"corpus": str(args.corpus), "work": str(work), "test_package": args.test_package, "seeds": args.seeds,
              "budget": asdict(budget), "planned_compiles": budget.planned(), "heuristic": heuristic,
              "summary": summary, "per_seed": {str(s): {a: asdict(o) for a, o in out.items()}
                                               for s, out in per_seed.items()},
              "wall_seconds": wall}  # fmt: skip
    (work / "compare_trainers.json").write_text(json.dumps(result, indent=2))
    (work / "compare_trainers.md").write_text(markdown(rows))
    console.print(f"wrote {work / 'compare_trainers.json'} and {work / 'compare_trainers.md'}", highlight=False)


if __name__ == "__main__":
    main()
