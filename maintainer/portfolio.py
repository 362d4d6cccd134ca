#!/usr/bin/env python3
"""Choose a portfolio for C on training modules; measure a portfolio on any corpus.

    .venv/bin/python -m maintainer.portfolio choose CORPUS -o DIR [--wide] [--size-passes] [--combine K] [--default N]
        [--size 7] [--allocator shipped|clang] [--scorers DIR] [--max-worse F] [--sample-every 7] [-j 2]
    .venv/bin/python -m maintainer.portfolio measure CORPUS [--split test] [--portfolio FILE] [--record]
        [--allocator shipped|clang] [-j 2]

The shipped portfolio: ``choose corpora/train -o OUT --wide --combine 4 --default 2 --size 10 -j 2``. A target with
no scorers of its own (AArch64's, Cortex-M4's: ``--allocator clang --sample-every 1 --wide --size-passes``) chooses
among pass options with clang's allocator; its candidates then name no policy (a build of that target serves none),
and its file goes into the target's directory of ``pretrained/`` (docs/targets.md). A target whose scorers were
trained on its own code (``optgym train es --problem regalloc-evict`` on its corpus) names them with ``--scorers
DIR`` (``DIR/regalloc-evict`` and ``DIR/regalloc-priority``, policy directories): they take the shipped pair's
place in every entry and are perturbed like it, and the file names them under ``portfolio-c/``, so a build of that
target serves them inside its C compiles only.

Why: every channel of an unmodified clang-22 is nearly spent for C by the shipped allocator scorers, but
which of a few nearby ways compiles a given object smallest is per-object luck a build can buy with
compile time (``OPTGYM_CANDIDATES``; :mod:`optgym.policies.portfolio`). ``choose`` writes the portfolio
that ships, from training modules only:

1. the pool: the shipped scorer pair; the pair with each of ``research/levers.py``'s pass thresholds (passes
   ``-Oz`` runs anyway) and, with ``--wide``, each of :data:`MORE_THRESHOLDS`, with ``--size-passes`` each of
   :data:`SIZE_PASSES` (passes LLVM has for size that ``-Oz`` leaves off); eight seeded perturbations of
   the shipped eviction scorer (each weight plus 0.3 · mean |w| · N(0, 1), seed 26) and eight of the
   priority scorer (0.1 · N(0, 1), the bias's ten times that, seed 27), each with the other shipped scorer;
2. every pool entry compiles the fixed training sample (the corpus's C training modules by name, every 7th
   from the 4th: 404 modules on the training corpus; evaluate's cache makes a second run instant);
3. the first candidate is the entry smallest in total on its own — with ``--combine K``, that entry with up
   to K pass options more in the same compile, added greedily while each lowers the sample's total alone by
   ``MIN_GAIN`` (:func:`combine`); clang's own compile is the second (no object grows from two compiles on);
   ``--max-worse F`` lets only entries and combinations that leave at most a share F of the sample's modules more
   than 1 % larger than clang's be the first candidate, for a build that compiles it alone (``--default 1``);
   then, greedily, the entry that most lowers the sample's total when each module keeps its smallest object
   — until ``--size`` compiles or an entry that saves nothing. ``--default N`` is how many of them a build
   compiles unless told (the file's ``default_candidates``).

``DIR`` receives ``portfolio-c.json``, the chosen perturbed scorers (ONNX) under ``portfolio-c/`` and the
sample's figures, for ``src/optgym/policies/pretrained/``. ``measure`` prints, for a portfolio (default:
the shipped one), the total against clang's ``-Oz`` of every prefix of its candidates on a corpus's C
modules — the figures of the README's portfolio table; ``--record`` writes them into the portfolio file.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from optgym.corpus import Corpus
from optgym.corpus.split import group_of
from optgym.policies import pretrained_path, resolve_policy
from optgym.policies.embedded import load_embedded
from optgym.policies.export import export_policy
from optgym.policies.portfolio import FORMAT, PASS_OPTIONS, PRETRAINED_PORTFOLIO, Candidate, load_portfolio
from optgym.policies.scorer import CandidateScorer
from optgym.train.evaluation import GUARD_BELOW, ModuleRow, by_package, evaluate, evaluate_portfolio, summarize

SHIPPED = {"regalloc-evict": "pretrained", "regalloc-priority": "pretrained"}
#: ``--wide``: more options of passes ``-Oz`` runs anyway (thresholds, or one such pass skipped), each checked to
#: be known to clang-22; none switches on a pass clang keeps off.
MORE_THRESHOLDS: dict[str, tuple[str, ...]] = {
    name: ("-mllvm", option)
    for name, option in {
        "no common-code hoisting in simplifycfg": "-simplifycfg-hoist-common=false",
        "no common-code sinking in simplifycfg": "-simplifycfg-sink-common=false",
        "common-code hoisting in every simplifycfg": "-hoist-common-insts=true",
        "common-code sinking in every simplifycfg": "-sink-common-insts=true",
        "tail duplication up to 1 instruction": "-tail-dup-size=1",
        "tail duplication up to 4 instructions": "-tail-dup-size=4",
        "no bonus instructions in branch folding": "-bonus-inst-threshold=0",
        "2 bonus instructions in branch folding": "-bonus-inst-threshold=2",
        "phi folding threshold 1": "-phi-node-folding-threshold=1",
        "two-entry phi folding threshold 2": "-two-entry-phi-node-folding-threshold=2",
        "callee-saved register cost 5": "-regalloc-csr-first-time-cost=5",
        "callee-saved register cost 20": "-regalloc-csr-first-time-cost=20",
        "no loop strength reduction": "-disable-lsr",
        "loop strength reduction by registers, not instructions": "-lsr-insns-cost=false",
        "no loop-rotation header copies": "-rotation-max-header-size=0",
        "no critical-edge splitting in machine sinking": "-machine-sink-split=false",
        "no tail merging": "-enable-tail-merge=false",
        "tail merge from 4 instructions": "-tail-merge-size=4",
        "no speculation in simplifycfg": "-max-speculation-depth=0",
        "no loop-simplifycfg terminator folding": "-enable-loop-simplifycfg-term-folding=false",
        "no block placement": "-disable-block-placement",
        "licm use-scan limit 0": "-licm-max-num-uses-traversed=0",
        "no machine scheduler": "-enable-misched=false",
        "no post-RA scheduler": "-enable-post-misched=false",
        "jump threading threshold 0": "-jump-threading-threshold=0",
    }.items()
}
#: LLVM's ext-TSP layout for size is superlinear in a function's blocks (cmark's utf8.c: 0.42 s → 1.62 s a compile,
#: its build 1.9× plain: docs/experiments/2026-11-29-c-layout.md), so functions of more blocks keep clang's own
#: placement, as in the ThinLTO plan
MORE_THRESHOLDS["size-aware block layout up to 1000 blocks"] = (
    "-mllvm", "-apply-ext-tsp-for-size", "-mllvm", "-ext-tsp-block-placement-max-blocks=1000",
)  # fmt: skip
#: ``--size-passes``: passes LLVM has for code size that clang's ``-Oz`` leaves off, each checked to be known to
#: clang-22. Measured one by one on AArch64's C training modules (docs/experiments/2026-11-25-targets.md), the
#: merging of constant globals took 1.4 % off the total and GVN hoisting 0.9 %, each at clang's compile time. The
#: IR outliner (``-ir-outliner``) took 3.1 % there and 7.4 % on Cortex-M4 — but 2.4 times clang's compile time on
#: the training sample, and 24 times on one file of libjpeg-turbo, so it is not in the pool: a build that accepts
#: that names it in its own portfolio (``OPTGYM_PORTFOLIO``).
SIZE_PASSES: dict[str, tuple[str, ...]] = {
    "global merge of constants": ("-mllvm", "-enable-global-merge", "-mllvm", "-global-merge-on-const"),
    "GVN hoisting": ("-mllvm", "-enable-gvn-hoist"),
    "GVN sinking": ("-mllvm", "-enable-gvn-sink"),
}
#: The policies of a default optgym-cc build (the inliner's channel is open in C compiles too, answering
#: clang's decisions there): measured with them, so the figures and ``optgym evaluate``'s share one cache.
BUILD = [("inline-size", "pretrained"), *SHIPPED.items()]
#: per scorer perturbed: (seed, σ, whether σ is relative to the mean |weight|); the log-linear scorer's bias
#: gets ten times its σ (see ``perturbed``)
PERTURBATIONS = {"regalloc-evict": (26, 0.3, True), "regalloc-priority": (27, 0.1, False)}
VARIANTS = 8
#: ``--combine``: the options tried together with the first entry (the smallest alone), and the least an
#: option must lower the training sample's total by to join it
SHORTLIST, MIN_GAIN = 8, 0.0010


def perturbed(problem: str, directory: Path, base: str = "pretrained") -> list[Path]:
    """Eight seeded perturbations of the scorer ``base`` for ``problem`` (the shipped one by default), saved under
    ``directory``."""
    seed, sigma, relative = PERTURBATIONS[problem]
    shipped = load_scorer(problem, base)
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(VARIANTS):
        theta = shipped.parameters()
        if relative:
            noise = sigma * np.abs(theta).mean() * rng.standard_normal(theta.size)
        else:
            noise = sigma * rng.standard_normal(theta.size)
            noise[-1] *= 10  # the log-linear scorer's bias lives on another scale (~13.6)
        paths.append(shipped.with_parameters(theta + noise).save(directory / f"{problem}-{i}"))
    return paths


#: ``--allocator``: the register allocator's policies of every pool entry, and the prefix naming them.
ALLOCATORS = {
    "shipped": (SHIPPED, "shipped scorers"),
    "clang": ({}, "pass options alone"),  # no policy named: clang's allocator, and a target with no scorers fits
}

#: ``--scorers``: the prefix of every pool entry decided by a target's own scorer pair.
TARGET_SCORERS = "target scorers"


def load_scorer(problem: str, spec: str) -> CandidateScorer:
    """The candidate scorer ``spec`` names for ``problem``: ``pretrained``, an exported ONNX file (the training
    policy it embeds) or a training run's policy directory."""
    path = pretrained_path(problem) if spec == "pretrained" else Path(spec).resolve()
    scorer = load_embedded(path) if path.suffix == ".onnx" else resolve_policy(str(path), problem).build()
    if not isinstance(scorer, CandidateScorer):
        sys.exit(f"{spec} is not a {problem} candidate scorer")
    return scorer


def target_scorers(directory: Path) -> dict[str, str]:
    """``--scorers DIR``: the scorer pair trained for a target, ``DIR/regalloc-evict`` and ``DIR/regalloc-priority``
    (policy directories, as ``optgym train es`` writes them) or ``DIR/regalloc-evict.onnx`` and
    ``DIR/regalloc-priority.onnx`` (exported, as a shipped target portfolio holds them under ``portfolio-c/``). The
    file exports each under ``portfolio-c/``."""
    pair = {}
    for problem in PERTURBATIONS:
        found = [path for path in (directory / problem, directory / f"{problem}.onnx") if path.exists()]
        if not found:
            sys.exit(f"--scorers {directory}: neither a policy directory {problem} nor {problem}.onnx in it")
        pair[problem] = str(found[0].absolute())  # its name names the exported file
    return pair


def pool(
    directory: Path,
    wide: bool = False,
    allocator: str = "shipped",
    size_passes: bool = False,
    scorers: dict[str, str] | None = None,
    exclude: Sequence[str] = (),
) -> dict[str, tuple[dict[str, str], tuple[str, ...]]]:
    """Every entry: name → (policies by problem, extra clang flags). With clang's allocator the first entry is
    clang's own compile, and no scorer is perturbed. ``scorers`` (:func:`target_scorers`) replace the shipped
    pair; the pass options named in ``exclude`` stay out."""
    policies, prefix = (scorers, TARGET_SCORERS) if scorers else ALLOCATORS[allocator]
    entries: dict[str, tuple[dict[str, str], tuple[str, ...]]] = {prefix: (policies, ())}
    options = {**PASS_OPTIONS, **(MORE_THRESHOLDS if wide else {}), **(SIZE_PASSES if size_passes else {})}
    if unknown := sorted(set(exclude) - set(options)):
        sys.exit(f"--exclude {', '.join(unknown)}: not a pass option of this pool ({', '.join(options)})")
    options = {name: flags for name, flags in options.items() if name not in exclude}
    for name, flags in options.items():
        entries[f"{prefix}, {name}"] = (policies, flags)
    if allocator != "shipped" and not scorers:
        return entries
    for problem in PERTURBATIONS:
        short = problem.removeprefix("regalloc-")
        for i, path in enumerate(perturbed(problem, directory, policies[problem])):
            entries[f"{short} scorer {short[0]}{i}"] = ({**policies, problem: str(path)}, ())
    return entries


def sizes(corpus: Corpus, modules: list[str], policies: dict[str, str], flags, workers) -> dict[str, ModuleRow]:
    (problem, spec), *companions = Candidate("entry", tuple(policies.items()), tuple(flags)).measured_policies([])
    rows = evaluate(spec, corpus, problem=problem, modules=modules, workers=workers, companions=companions,
                    flags=flags, progress=True)  # fmt: skip
    return {row.module: row for row in rows}


def combine(first, entries, table, ok, base, steps, log, compile_sample, allowed=lambda name: True) -> str:
    """``--combine``: the ``first`` entry with up to ``steps`` pass options more, all in one compile. Of the
    :data:`SHORTLIST` options smallest alone (``first``'s own excluded), the one whose addition gives the
    sample's smallest total is added, while that lowers the total by at least :data:`MIN_GAIN` (a combination
    that fails to compile a sample module, or that ``allowed`` refuses, is not taken). Each combination tried
    becomes an entry of ``entries`` and ``table``, so the rest of the portfolio is chosen around the result;
    ``log`` gets one line per combination tried; ``compile_sample(policies, flags)`` gives the sample's rows of one
    such compile.
    Why: options of different passes mostly save on different code, so one compile with several keeps most
    of their savings, which a portfolio otherwise buys a compile each."""
    policies, flags = entries[first]
    options = [n for n, (p, f) in entries.items() if f and p == policies and n != first]

    def total(name: str) -> float | None:
        rows = table[name]
        return sum(rows[m].images[1] for m in ok) / base if all(rows[m].ok for m in ok) and allowed(name) else None

    alone = {n: t for n in options if (t := total(n)) is not None}
    shortlist = sorted(alone, key=alone.__getitem__)[:SHORTLIST]
    current, taken = total(first), []
    for _ in range(steps):
        tried = {}
        for option in (n for n in shortlist if n not in taken):
            name = f"{first} + {' + '.join(_short(n) for n in [*taken, option])}"
            entries[name] = (policies, (*flags, *(f for n in [*taken, option] for f in entries[n][1])))
            table[name] = compile_sample(*entries[name])
            tried[option] = total(name)
            log.append({"combination": name, "alone": tried[option]})
            if tried[option] is None:  # not a candidate: it failed somewhere
                del entries[name], table[name]
        tried = {n: t for n, t in tried.items() if t is not None}
        if not tried or current - min(tried.values()) < MIN_GAIN:
            break
        taken.append(option := min(tried, key=tried.__getitem__))
        current = tried[option]
        print(f"combined: + {_short(option)}, {current:.4f} alone")
    return f"{first} + {' + '.join(_short(n) for n in taken)}" if taken else first


def worse_share(rows: dict[str, ModuleRow], clang: dict[str, int]) -> float:
    """The share of the modules of ``clang`` (module → clang's bytes) that ``rows`` compile more than 1 % larger."""
    return sum(rows[m].images[1] > 1.01 * bytes_ for m, bytes_ in clang.items()) / len(clang)


def _short(entry: str) -> str:
    prefixes = [prefix for _, prefix in ALLOCATORS.values()] + [TARGET_SCORERS]
    return next((entry.removeprefix(f"{prefix}, ") for prefix in prefixes if entry.startswith(prefix)), entry)


def choose(args: argparse.Namespace) -> int:
    corpus = Corpus(args.corpus, split="train")
    every = args.sample_every
    sample = sorted(m.name for m in corpus if m.family == "C")[(every - 1) // 2 :: every]
    if not sample:
        sys.exit(f"{args.corpus} has no C training modules")
    out = args.output
    scorers = target_scorers(args.scorers) if args.scorers else None
    entries = pool(out / "pool", args.wide, args.allocator, args.size_passes, scorers, args.exclude)
    table = {name: sizes(corpus, sample, policies, flags, args.workers) for name, (policies, flags) in entries.items()}
    ok = [m for m in sample if all(rows[m].ok for rows in table.values())]
    # every size here is Berkeley text + data: an option that moves constants into writable sections (global merge
    # of constants, in position-independent code) must not look like a saving (optgym.toolchain.sizes)
    clang = {m: table[next(iter(entries))][m].images[0] for m in ok}
    base = sum(clang.values())

    def total(chosen: list[str]) -> int:
        return sum(min([clang[m], *(table[name][m].images[1] for name in chosen)]) for m in ok)

    def allowed(name: str) -> bool:  # --max-worse: few enough sample modules > 1 % worse, for a compile alone
        return args.max_worse is None or worse_share(table[name], clang) <= args.max_worse

    eligible = [name for name in entries if allowed(name)]
    if not eligible:
        sys.exit(f"no entry leaves at most {args.max_worse} of the sample's modules > 1 % worse (--max-worse)")
    first = min(eligible, key=lambda name: sum(table[name][m].images[1] for m in ok))
    if first == next(iter(entries)) and args.allocator != "shipped" and not scorers:
        sys.exit("no pass option compiles the training sample smaller than clang: nothing to choose")
    combined: list[dict] = []
    if args.combine:
        first = combine(first, entries, table, ok, base, args.combine, combined,
                        lambda policies, flags: sizes(corpus, sample, policies, flags, args.workers),
                        allowed=allowed)  # fmt: skip
    chosen, figures = [first], [{"candidate": first, "alone": sum(table[first][m].images[1] for m in ok) / base}]
    figures.append({"candidate": "clang", "best_of": total(chosen) / base})
    while len(chosen) + 1 < args.size:
        pick = min((n for n in entries if n not in chosen), key=lambda n: total([*chosen, n]))
        if total([*chosen, pick]) >= total(chosen):
            break
        chosen.append(pick)
        figures.append({"candidate": pick, "best_of": total(chosen) / base})
    for line in figures:
        print(f"{line['candidate']:<50} {line.get('alone', line.get('best_of')):.4f}")
    candidates, files = [], out / "portfolio-c"
    files.mkdir(parents=True, exist_ok=True)
    for name in [first, "clang", *chosen[1:]]:
        if name == "clang":
            candidates.append({"name": "clang"})
            continue
        policies, flags = entries[name]
        spec = {}
        for problem, policy in policies.items():
            if policy not in ("pretrained", "heuristic"):
                target = files / f"{Path(policy).name.removesuffix('.onnx')}.onnx"
                if policy.endswith(".onnx"):
                    shutil.copyfile(policy, target)
                else:
                    export_policy(Path(policy), target)
                policy = f"portfolio-c/{target.name}"
            spec[problem] = policy
        candidates.append({"name": name, "policies": spec, **({"flags": list(flags)} if flags else {})})
    portfolio = {"format": FORMAT, "family": "C", "candidates": candidates, "default_candidates": args.default,
                 "chosen_on": {"command": shlex.join(["python", "-m", "maintainer.portfolio", *sys.argv[1:]]),
                               "corpus": str(args.corpus), "split": "train", "modules": len(ok),
                               "clang_text_and_data_bytes": base, "metric": "Berkeley text + data",
                               "figures": figures,
                               **({"combined": combined} if combined else {})}}  # fmt: skip
    (out / "portfolio-c.json").write_text(json.dumps(portfolio, indent=1) + "\n")
    print(f"{out / 'portfolio-c.json'}: {len(candidates)} candidates, training sample {total(chosen) / base:.4f}")
    return 0


def measure(args: argparse.Namespace) -> int:
    corpus = Corpus(args.corpus, split=None if args.split == "all" else args.split)
    portfolio = load_portfolio(args.portfolio)
    modules = sorted(m.name for m in corpus if m.family == portfolio.family)
    if not modules:
        sys.exit(f"{args.corpus} has no {portfolio.family} modules on the {args.split} side")
    print(f"{args.corpus} ({args.split}), {len(modules)} {portfolio.family} modules; portfolio {args.portfolio}")
    figures: list[dict] = []
    build = BUILD if args.allocator == "shipped" else []  # a target that ships no policy serves none
    for count in range(1, len(portfolio.candidates) + 1):
        rows = evaluate_portfolio(corpus, portfolio, count, modules, policies=build, workers=args.workers)
        rows = [r for r in rows if r.ok]
        totals = summarize(rows)
        clang, ratio, worse = totals["heuristic_text_bytes"], totals["total_ratio"], totals["regressed_over_1pct"]
        both = totals["text_and_data_ratio"]  # None where a row's record predates data
        name = portfolio.candidates[count - 1].name
        default = " — the default build" if count == portfolio.default_count else ""
        print(f"{count} compiles (+ {name}): {ratio:.4f}, {worse} of {len(rows)} modules > 1 % worse"
              f"{f'; text + data {both:.4f}' if both else ''}{default}")  # fmt: skip
        figures.append({"compiles": count, "total_ratio": ratio, "over_1pct": worse, "modules": len(rows),
                        **({"text_and_data_ratio": both} if both else {})})  # fmt: skip
        if default:
            print_packages(rows)
        if count == 1:  # one compile with the suggested guard (OPTGYM_GUARD_BELOW): small objects get clang's too
            two_kb = guarded(rows, GUARD_BELOW)
            print(f"  with OPTGYM_GUARD_BELOW={GUARD_BELOW}: {two_kb['total_ratio']:.4f}, "
                  f"{two_kb['over_1pct']} > 1 % worse")  # fmt: skip
            bounds = {str(bound): guarded(rows, bound) for bound in GUARD_BOUNDS}
            for bound, f in bounds.items():
                print(f"  guarded below {bound} B: {f['total_ratio']:.4f}, {f['over_1pct']} > 1 % worse, clang's "
                      f"compile too for {f['second_compile']:.0%} of the compile time")  # fmt: skip
            figures[-1] |= {"guarded_below_ratio": two_kb["total_ratio"],
                            "guarded_below_over_1pct": two_kb["over_1pct"], "guard_bounds": bounds}  # fmt: skip
    if args.record:  # into the portfolio file itself: one entry per corpus and split, replaced when measured again
        data = json.loads(args.portfolio.read_text())
        key = f"{args.corpus.resolve().name} ({args.split})"
        packages = sorted({group_of(name, "package") for name in modules})
        data.setdefault("measured", {})[key] = {"clang_text_bytes": clang, "packages": packages, "prefixes": figures}
        tmp = args.portfolio.with_name(f".{args.portfolio.name}.tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(args.portfolio)
        print(f"recorded in {args.portfolio} under {key!r}")
    return 0


def print_packages(rows: list[ModuleRow]) -> None:
    """Each package's total (a module's name starts with its package): a set's total can hide one package that
    grows, and issue bars count packages too."""
    for package, group in by_package(rows).items():
        totals = summarize(group)
        print(f"  {package}: {totals['total_ratio']:.4f} of {totals['heuristic_text_bytes']} B, "
              f"{totals['regressed_over_1pct']} of {len(group)} modules > 1 % worse")  # fmt: skip


#: the bounds above the 2 kB default that ``measure`` tries for one compile guarded below them
#: (``OPTGYM_CANDIDATES=1 OPTGYM_GUARD_BELOW=N``): the middle ways between one compile of C and two
GUARD_BOUNDS = (4096, 8192, 16384)


def guarded(rows: list[ModuleRow], bound: int) -> dict[str, float]:
    """One compile (the first candidate), guarded below ``bound``: the total against clang, the modules > 1 %
    worse, and the share of the compile seconds spent on objects that get clang's compile too (what the guard
    costs, against the two compiles of every object)."""
    clang, seconds = sum(r.heuristic_text or 0 for r in rows), sum(r.compile_seconds for r in rows) or 1.0
    kept = [r.guarded_below(bound) for r in rows]
    twice = sum(r.compile_seconds for r in rows if (r.policy_text or 0) < bound)
    worse = sum(k > 1.01 * (r.heuristic_text or 0) for k, r in zip(kept, rows, strict=True))
    return {"total_ratio": sum(kept) / clang, "over_1pct": worse, "second_compile": twice / seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    c = commands.add_parser("choose", help="choose a portfolio on the training sample")
    c.add_argument("corpus", type=Path)
    c.add_argument("-o", "--output", type=Path, required=True)
    c.add_argument("--size", type=int, default=7, help="compiles at most, clang's own included")
    c.add_argument("--wide", action="store_true", help="more pass options in the pool (MORE_THRESHOLDS)")
    c.add_argument("--size-passes", action="store_true", help="passes for size -Oz leaves off, too (SIZE_PASSES)")
    c.add_argument(
        "--default",
        type=int,
        default=1,
        metavar="N",
        help="how many candidates a build compiles unless told (the file's default_candidates)",
    )
    c.add_argument(
        "--combine",
        type=int,
        default=0,
        metavar="K",
        help="the first candidate: the smallest entry with up to K pass options more (combine)",
    )
    c.add_argument("--allocator", choices=sorted(ALLOCATORS), default="shipped",
                   help="the allocator's policies of every entry: the shipped scorers, or clang's own (a target "
                   "with no scorers)")  # fmt: skip
    c.add_argument("--scorers", type=Path, default=None, metavar="DIR",
                   help="a target's own trained scorer pair (DIR/regalloc-evict, DIR/regalloc-priority) in place "
                   "of the shipped one; the file names them under portfolio-c/")  # fmt: skip
    c.add_argument("--exclude", action="append", default=[], metavar="OPTION",
                   help="leave this pass option out of the pool (repeatable), e.g. \"global merge of constants\" for a "
                   "position-independent target, where its merged constants need relocations and move into "
                   ".data.rel.ro: RAM after relocation, not a saving")  # fmt: skip
    c.add_argument("--max-worse", type=float, default=None, metavar="F",
                   help="the first candidate leaves at most this share of the sample's modules > 1 %% "
                   "worse")  # fmt: skip
    c.add_argument("--sample-every", type=int, default=7, metavar="K",
                   help="the training sample: every K-th C module (1: all, for a small corpus)")  # fmt: skip
    c.add_argument("-j", "--workers", type=int, default=None)
    m = commands.add_parser("measure", help="every prefix of a portfolio on a corpus's modules")
    m.add_argument("corpus", type=Path)
    m.add_argument("--split", default="all", help="train | test | all")
    m.add_argument("--portfolio", type=Path, default=PRETRAINED_PORTFOLIO)
    m.add_argument("--record", action="store_true", help="write the figures into the portfolio file too")
    m.add_argument(
        "--allocator",
        choices=sorted(ALLOCATORS),
        default="shipped",
        help="the build's policies: x86-64's shipped ones, or none (a target that ships none)",
    )
    m.add_argument("-j", "--workers", type=int, default=None)
    args = parser.parse_args()
    return choose(args) if args.command == "choose" else measure(args)


if __name__ == "__main__":
    raise SystemExit(main())
