#!/usr/bin/env python3
"""Choose the ThinLTO plan a target ships: link options and LLVM options measured on linked training packages.

    .venv/bin/python -m maintainer.thinlto_plan SRC... -o runs/plan [--test] [--target TRIPLE] [-j 2] [--write PATH]
    .venv/bin/python -m maintainer.thinlto_plan --record SET --plan PATH REPORT_DIR...

Why a plan beside the inline policy: in a ThinLTO link the backends' inlining has little room left (the search
bound on the training backends is 0.99 of clang's, and no learned policy has kept any of it on held-out backends:
docs/experiments/2026-11-25-thinlto.md), while the link itself makes choices that decide how much code is
duplicated or kept: how much ThinLTO imports into each backend (``-import-instr-limit``), whether identical
functions are folded (lld's ``--icf=safe``, which folds only functions whose address no one takes) and whether
unreferenced sections are dropped (``--gc-sections``). Each is a knob of something a link runs anyway; none
switches on a pass clang keeps off.

Every candidate below is measured by ``optgym compare-build SRC --lto thin`` on every source tree given (the
training packages': never a set reported as unseen), with ``OPTGYM_LTO_PLAN`` set to the candidate. The chosen
plan has the smallest total linked ``.text`` (to four places; then Berkeley text) among those that make no
package's ``.text`` or Berkeley text larger (and, with ``--test``, fail no test). ``--write`` stores it, its
figures and the command inside, as the file ``optgym-cc`` ships (``src/optgym/policies/pretrained/thinlto.json``
for x86-64).

``--record SET`` stores, in the plan file, what ``optgym compare-build SRC --lto thin --test`` reports (one
directory each) for a set of packages outside the training list measured with the shipped plan: per package and
in total, linked ``.text`` and Berkeley text, tests on both builds, build wall and CPU time. The results page
(``optgym results-page``) renders it from there.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from optgym_cc.thinlto import PLAN_FORMAT

#: name → (lld options, LLVM options for the thin link and every backend)
CANDIDATES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "fold identical code": (("--icf=safe",), ()),
    "fold identical code, drop unreferenced sections": (("--icf=safe", "--gc-sections"), ()),
    "no cross-module import": ((), ("-import-instr-limit=0",)),
    "no cross-module import, fold, drop": (("--icf=safe", "--gc-sections"), ("-import-instr-limit=0",)),
    "import up to 10 instructions, fold, drop": (("--icf=safe", "--gc-sections"), ("-import-instr-limit=10",)),
    "import up to 3 instructions, fold, drop": (("--icf=safe", "--gc-sections"), ("-import-instr-limit=3",)),
    "import up to 30 instructions, fold, drop": (("--icf=safe", "--gc-sections"), ("-import-instr-limit=30",)),
    "import up to 10 instructions, fold, drop, merge string tails": (
        ("--icf=safe", "--gc-sections", "-O2"),
        ("-import-instr-limit=10",),
    ),
    "import up to 10 instructions, fold, drop, tail merge from 2 instructions": (
        ("--icf=safe", "--gc-sections"),
        ("-import-instr-limit=10", "-tail-merge-size=2"),
    ),
    "import up to 10 instructions, fold, drop, tail merge from 2 instructions, merge string tails": (
        ("--icf=safe", "--gc-sections", "-O2"),
        ("-import-instr-limit=10", "-tail-merge-size=2"),
    ),
}
#: The twelfth session's candidates: the lto2 plan (:data:`LTO2_PLAN`) plus the backend code-generation options
#: the C portfolio compiles with per object (``portfolio-c.json``'s first candidate), one at a time and together.
#: Each is a knob of a pass clang runs anyway, or turns off a pass (loop strength reduction, block placement): any
#: setting gives a correct program.
LTO2_PLAN = "import up to 10 instructions, fold, drop, tail merge from 2 instructions, merge string tails"
_LTO2_LINK, _LTO2_LLVM = CANDIDATES[LTO2_PLAN]
CANDIDATES |= {
    f"the lto2 plan, {name}": (_LTO2_LINK, (*_LTO2_LLVM, *options))
    for name, options in {
        "no loop strength reduction": ("-disable-lsr",),
        "no block placement": ("-disable-block-placement",),
        "jump tables from 8 cases": ("-min-jump-table-entries=8",),
        "no block placement, no loop strength reduction, jump tables from 8 cases": (
            "-disable-block-placement",
            "-disable-lsr",
            "-min-jump-table-entries=8",
        ),
        # the thirtieth session's: block placement kept, laid out by its size-aware ext-TSP model instead of turned
        # off (turning it off made an unseen package's string-compare chains 37 % larger: 2026-11-28-lto7.md)
        "size-aware block layout, no loop strength reduction, jump tables from 8 cases": (
            "-apply-ext-tsp-for-size",
            "-disable-lsr",
            "-min-jump-table-entries=8",
        ),
        "size-aware block layout, no loop strength reduction": ("-apply-ext-tsp-for-size", "-disable-lsr"),
        # the thirty-first session's: ext-TSP is superlinear in a function's blocks (cmark's utf8.c: 0.42 s → 1.62 s
        # a compile; cmark's ThinLTO build 1.57× plain), so functions of more blocks keep clang's own placement
        "size-aware block layout up to 1000 blocks, no loop strength reduction": (
            "-apply-ext-tsp-for-size",
            "-ext-tsp-block-placement-max-blocks=1000",
            "-disable-lsr",
        ),
    }.items()
}


def plan_file(name: str, link_flags: tuple[str, ...], llvm_options: tuple[str, ...]) -> dict:
    return {"format": PLAN_FORMAT, "name": name, "link_flags": list(link_flags), "llvm_options": list(llvm_options)}


def measure(source: Path, plan: Path, outdir: Path, test: bool, jobs: int, target: str | None = None) -> dict:
    """One ``optgym compare-build --lto thin`` of ``source`` with ``plan``: its report's totals and tests. A
    report already in ``outdir`` from the same plan is reused, so candidates can be added to a finished run."""
    kept = outdir / "plan.json"
    if not (kept.is_file() and kept.read_text() == plan.read_text() and (outdir / "report.json").is_file()):
        _compare_build(source, plan, outdir, test, jobs, target)
        kept.write_text(plan.read_text())
    return _summary(outdir)


def _compare_build(source: Path, plan: Path, outdir: Path, test: bool, jobs: int, target: str | None) -> None:
    optgym = Path(sys.executable).parent / "optgym"
    command = [str(optgym), "compare-build", str(source), "--lto", "thin", "-j", str(jobs), "-o", str(outdir),
               *(["--target", target] if target else [])]  # fmt: skip
    env = {**os.environ, "OPTGYM_LTO_PLAN": str(plan)}
    with open(outdir.parent / f"{outdir.name}.log", "w") as log:
        subprocess.run([*command, *(["--test"] if test else [])], env=env, stdout=log, stderr=log)


def _summary(outdir: Path) -> dict:
    """A compare-build report's totals and tests; ``ok``: both builds built and no test failed only in optgym's."""
    report_path = outdir / "report.json"
    report = json.loads(report_path.read_text()) if report_path.is_file() else {}
    if "totals" not in report:  # a build failed: nothing to compare
        return {"ok": False, "problems": report.get("problems", ["no report"])}
    tests = report.get("tests") or {}
    ok = not report.get("problems") and not tests.get("fail_only_in_optgym")
    return {"ok": ok, "totals": report["totals"], "tests": tests}


#: The command an unseen set is recorded as built with, unless ``--command`` says otherwise.
RECORDED_COMMAND = "optgym compare-build SRC --lto thin --test -j 2"


def record(
    plan_path: Path, name: str, reports: list[Path], command: str = RECORDED_COMMAND, served: Sequence[str] = ()
) -> dict:
    """Add ``figures.unseen[name]`` to the plan file from ``optgym compare-build`` report directories; ``served``:
    the learned ThinLTO policies (their files) the builds served beside the plan, if any."""
    rows = {}
    for directory in reports:
        report = json.loads((directory / "report.json").read_text())
        totals, tests = report.get("totals"), report.get("tests") or {}
        rows[report["name"]] = {
            "built": totals is not None,
            **({variant: totals[variant] for variant in ("plain", "optgym")} if totals else {}),
            "tests": {variant: (tests.get(variant) or {}).get("status") for variant in ("plain", "optgym")},
            "build_ratio": report.get("build_ratio"),
        }
    built = [row for row in rows.values() if row["built"]]
    total = {variant: {field: sum(row[variant][field] for row in built) for field in ("text", "dottext")}
             for variant in ("plain", "optgym")}  # fmt: skip
    plan = json.loads(plan_path.read_text())
    plan.setdefault("figures", {}).setdefault("unseen", {})[name] = {
        "command": command,
        **({"served": list(served)} if served else {}),
        "packages": rows,
        "total": total,
    }
    plan_path.write_text(json.dumps(plan, indent=1) + "\n")
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sources", type=Path, nargs="+", help="source trees of training-list packages, or with "
                        "--record the report directories of optgym compare-build")  # fmt: skip
    parser.add_argument("--record", metavar="SET", help="record the reports as the unseen set SET in --plan")
    parser.add_argument("--plan", type=Path, help="with --record: the plan file")
    parser.add_argument(
        "--command",
        default=RECORDED_COMMAND,
        help="with --record: the command the set was built with (its OPTGYM_* settings too)",
    )
    parser.add_argument("--served", action="append", default=[], metavar="FILE",
                        help="with --record: a learned ThinLTO policy the builds served beside the plan")  # fmt: skip
    parser.add_argument("-o", "--output", type=Path)
    parser.add_argument("--test", action="store_true", help="run each package's test suite in both builds")
    parser.add_argument("--target", help="cross-build for this triple (its plan ships as pretrained/<family>/)")
    parser.add_argument("--only", action="append", choices=list(CANDIDATES), default=[])
    parser.add_argument("--write", type=Path, help="store the chosen plan here")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    if args.record:
        if not args.plan:
            parser.error("--record needs --plan")
        print(json.dumps(record(args.plan, args.record, args.sources, args.command, args.served)))
        return
    if not args.output:
        parser.error("choosing a plan needs -o/--output")
    args.output.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, dict]] = {}
    for name in args.only or CANDIDATES:
        plan = args.output / f"{name.replace(' ', '-').replace(',', '')}.json"
        plan.write_text(json.dumps(plan_file(name, *CANDIDATES[name]), indent=1) + "\n")
        results[name] = {}
        for source in args.sources:
            results[name][source.name] = measure(source, plan, args.output / f"{plan.stem}--{source.name}",
                                                 args.test, args.jobs, args.target)  # fmt: skip
            print(name, source.name, json.dumps(results[name][source.name].get("totals", {}).get("ratio")), flush=True)
    summary = summarize(results)
    (args.output / "summary.json").write_text(json.dumps({"results": results, "summary": summary}, indent=1) + "\n")
    for name, row in summary.items():
        print(f"{name:48} .text {row['dottext']:.4f}  text {row['text']:.4f}  larger {row['larger']}  ok {row['ok']}")
    eligible = {name: row for name, row in summary.items() if row["ok"] and not row["larger"]}
    if not eligible:
        sys.exit("no candidate builds every package without making one larger")
    chosen = min(eligible, key=lambda name: (round(eligible[name]["dottext"], 4), eligible[name]["text"]))
    print("chosen:", chosen)
    if args.write:
        plan = plan_file(chosen, *CANDIDATES[chosen]) | {
            "chosen_by": "python -m maintainer.thinlto_plan " + " ".join(sys.argv[1:]),
            "packages": sorted(results[chosen]),
            "figures": {"linked_training_packages": summary[chosen], "candidates": summary},
        }
        if args.write.is_file():
            plan["figures"]["earlier"] = earlier_plans(json.loads(args.write.read_text()))
        args.write.write_text(json.dumps(plan, indent=1) + "\n")


def earlier_plans(replaced: dict) -> list[dict]:
    """What a plan being replaced was measured at on unseen sets, kept in its successor (``figures.earlier``):
    those figures belong to the old options, not the new ones, and the results page shows them apart."""
    figures = replaced.get("figures", {})
    entry = {key: replaced.get(key) for key in ("name", "link_flags", "llvm_options")}
    measured = [entry | {"unseen": figures["unseen"]}] if figures.get("unseen") else []
    return [*figures.get("earlier", []), *measured]


def summarize(results: dict[str, dict[str, dict]]) -> dict[str, dict]:
    """Per candidate: total linked ratios (``.text``, Berkeley text), the packages it makes larger, whether every
    build (and test suite) passed."""
    summary = {}
    for name, packages in results.items():
        ok = all(r["ok"] for r in packages.values())
        measured = [r["totals"] for r in packages.values() if "totals" in r]
        ratios = {field: sum(t["optgym"][field] for t in measured) / sum(t["plain"][field] for t in measured)
                  if measured else float("nan") for field in ("text", "dottext")}  # fmt: skip
        larger = sorted(
            package
            for package, r in packages.items()
            if "totals" in r and any((r["totals"]["ratio"][f] or 1.0) > 1.0 for f in ("text", "dottext"))
        )
        summary[name] = {"ok": ok and bool(measured), "larger": larger, **ratios}
    return summary


if __name__ == "__main__":
    main()
