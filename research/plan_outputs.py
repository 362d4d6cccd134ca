#!/usr/bin/env python3
"""Which linked outputs does each ThinLTO plan make larger? One plain build per package, one optgym build per plan.

    .venv/bin/python -m research.plan_outputs SRC... --plan NAME=FILE [--plan NAME=FILE ...] -o DIR [-j 2]

Why: ``maintainer/thinlto_plan.py`` chooses a plan by package totals, and the shipped plan's
``-disable-block-placement`` made an unseen package 9 % larger through two functions of one library
(docs/experiments/2026-11-28-lto7.md) while helping every training package in total. A package total hides an
output that grows; this looks at every linked output of every training package under each plan, against the same
plain ThinLTO build (a plan changes only the links, so the plain build is made once per package and shared).

Printed per plan: total linked ``.text`` and Berkeley text against plain, the outputs of at least ``--min-text``
bytes of ``.text`` that grow by more than ``--grow`` in ``.text`` or Berkeley text, and per pair of plans the
outputs where one is larger than the other by more than ``--grow``. Everything goes to ``DIR/outputs.json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from optgym.evaluate.build_compare import (
    TREES,
    CompareOptions,
    Tools,
    _build_variant,
    compare_outputs,
    detect_build_system,
    variant_env,
    variant_tools,
)

FIELDS = ("dottext", "text")


def thinlto_setup(source: Path, outdir: Path, variant: str, jobs: int) -> tuple[CompareOptions, Tools, dict[str, str]]:
    """What compare-build gives one variant's ThinLTO build (``-Oz -flto=thin -fuse-ld=lld``) into ``outdir``:
    its options, compilers and environment (``outdir`` made)."""
    opts = CompareOptions(source=source.resolve(), outdir=outdir.resolve(), lto="thin", jobs=jobs)
    tools = variant_tools(variant)
    outdir.mkdir(parents=True, exist_ok=True)
    return opts, tools, variant_env(opts, variant, tools, None)


def build(source: Path, outdir: Path, variant: str, jobs: int, plan: Path | None = None) -> Path | None:
    """One ThinLTO build of ``source`` into ``outdir``; its tree, or ``None``."""
    opts, tools, env = thinlto_setup(source, outdir, variant, jobs)
    if plan is not None:
        env["OPTGYM_LTO_PLAN"] = str(plan.resolve())
    record, tree = _build_variant(detect_build_system(opts.source), opts, variant, tools, env, lambda _: None)
    return tree if record["ok"] else None


def growing(rows: list[dict], a: str, b: str, grow: float, min_text: int) -> list[dict]:
    """Outputs whose ``b`` figures exceed ``a``'s by more than ``grow`` in ``.text`` or Berkeley text."""
    found = []
    for row in rows:
        if row[a] is None or row[b] is None or row[a]["dottext"] < min_text:
            continue
        ratios = {f: row[b][f] / row[a][f] for f in FIELDS if row[a][f]}
        if any(r > 1 + grow for r in ratios.values()):
            found.append({"path": row["path"], "dottext": row[a]["dottext"], **ratios})
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", type=Path, nargs="+")
    parser.add_argument("--plan", action="append", required=True, help="NAME=FILE, a ThinLTO plan file")
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument("--grow", type=float, default=0.01, help="an output this much larger is reported")
    parser.add_argument("--min-text", type=int, default=2048, help="outputs with less .text are not reported")
    args = parser.parse_args()
    plans = {name: Path(path) for name, path in (p.split("=", 1) for p in args.plan)}
    results_path = args.output / "outputs.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    for source in args.sources:
        done = results.get(source.name, {})
        missing = [name for name in plans if name not in done]
        if not missing:
            continue
        kept = args.output / source.name / "plain" / TREES["plain"]  # a plan added later reuses the plain build
        plain = kept if done and kept.is_dir() else build(source, kept.parent, "plain", args.jobs)
        if plain is None:
            print(f"{source.name}: the plain build failed", flush=True)
            continue
        for name in missing:
            plan = plans[name]
            tree = build(source, args.output / source.name / name, "optgym", args.jobs, plan)
            done[name] = compare_outputs(plain, tree)["outputs"] if tree else None
            print(source.name, name, "built" if tree else "FAILED", flush=True)
        results[source.name] = done
        results_path.write_text(json.dumps(results, indent=1) + "\n")
    report(results, list(plans), args.grow, args.min_text)


def report(results: dict, plans: list[str], grow: float, min_text: int) -> None:
    """Totals per plan, outputs each plan grows against plain, and outputs where one plan beats another."""
    for name in plans:
        rows = [r for package in results.values() if package.get(name) for r in package[name]]
        both = [r for r in rows if r["plain"] and r["optgym"]]
        totals = {f: sum(r["optgym"][f] for r in both) / sum(r["plain"][f] for r in both) for f in FIELDS}
        grown = growing(both, "plain", "optgym", grow, min_text)
        print(f"{name}: .text {totals['dottext']:.4f}, Berkeley text {totals['text']:.4f}, "
              f"{len(both)} outputs, {len(grown)} grow > {grow:.0%}")  # fmt: skip
        for g in grown:
            print(f"    {g}")
    for a in plans:
        for b in plans:
            if a == b:
                continue
            pairs = []
            for package, per_plan in results.items():
                if not (per_plan.get(a) and per_plan.get(b)):
                    continue
                by_path = {r["path"]: r["optgym"] for r in per_plan[b]}
                rows = [
                    {"path": f"{package}/{r['path']}", a: r["optgym"], b: by_path.get(r["path"])} for r in per_plan[a]
                ]
                pairs += growing(rows, a, b, grow, min_text)
            print(f"{b} larger than {a} by > {grow:.0%}: {len(pairs)}")
            for g in pairs:
                print(f"    {g}")


if __name__ == "__main__":
    main()
