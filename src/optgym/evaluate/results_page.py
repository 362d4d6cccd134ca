"""The results page (``docs/results.md``), generated from the files the package ships with its policies.

Every figure comes from ``src/optgym/policies/pretrained/*.provenance.json``, ``portfolio-c.json`` and
``thinlto.json`` as ``maintainer/ship_pretrained.py``, ``maintainer/portfolio.py measure --record`` and
``maintainer/thinlto_plan.py --write/--record`` wrote them; nothing is typed by
hand, so the page changes only when those files do (``optgym results-page -o docs/results.md``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

PRETRAINED_DIR = Path(__file__).resolve().parents[1] / "policies" / "pretrained"
PORTFOLIO = "portfolio-c.json"
THINLTO_PLAN = "thinlto.json"
COMMAND = "optgym results-page -o docs/results.md"
LANGUAGES = ("C", "C++")

SIZES = """\
**What these figures are.** Every ratio here is a *per-object sum*: each module of a set is compiled to one
object file with the policy and with clang-22 `-Oz`, and the ratio is the sum of the objects' sizes with the
policy over their sum with clang (below 1: smaller). **Berkeley text** is `llvm-size`'s `text` — every
allocated section that is executable or read-only (`.text*`, `.rodata*`, `.eh_frame`, `.gcc_except_table*`),
the figure MLGO rewards; **.text** is the objects' `.text*` sections alone, also summed per object. None of
them is a linked binary's `.text`: per-object sums count template copies and tables the linker may remove or
keep, so linked ratios differ — those are measured on whole projects (`optgym compare-build`; before it,
`bench/heldout_linked.sh`) and are in the [research log](experiments/). **> 1 % worse**: objects more
than 1 % larger than clang's. **2 kB guard**: what `optgym-cc` builds by default, where an object under 2 kB of
text that the policy made is compiled again by clang and the smaller kept (`OPTGYM_GUARD_BELOW`);
**guarded**: every object the smaller of the two (`OPTGYM_GUARD=1`)."""


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.4f}"


def _share(part: int, whole: int) -> str:
    return f"{part} ({100 * part / whole:.1f} %)" if whole else str(part)


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return [*lines, ""]


def _language_rows(label: str, figures: dict[str, Any]) -> list[list[Any]]:
    """One row per language with modules: the figures ``optgym.evaluate.summarize`` recorded."""
    rows = []
    for language in LANGUAGES:
        f = figures.get(language)
        if not f or not f.get("evaluated"):
            continue
        below = f.get("guarded_below_ratio")
        rows.append([
            label, language, f["evaluated"], _ratio(f["total_ratio"]), _ratio(f["dottext_ratio"]),
            _share(f["regressed_over_1pct"], f["evaluated"]), _ratio(f.get("guarded_ratio")),
            "—" if below is None else f"{_ratio(below)}, {f.get('guarded_below_over_1pct', '—')} worse",
        ])  # fmt: skip
    return rows


FIGURE_HEADER = ["set", "language", "modules", "Berkeley text", ".text", "> 1 % worse", "guarded", "2 kB guard"]


def _provenances(directory: Path) -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(directory.glob("*.provenance.json"))}


def _baselines() -> dict[str, str]:
    """The provenance files of the named baselines, each with its spec: shipped, but no default build serves them."""
    from optgym.policies import BASELINES

    return {
        str(Path(file).with_suffix(".provenance.json")): spec
        for spec, files in BASELINES.items()
        for file in files.values()
    }


def _shipped(provenances: dict[str, dict[str, Any]], portfolio: dict[str, Any] | None) -> list[str]:
    baselines = _baselines()
    rows = [
        [f"`{p['policy']}`" + (f" (baseline: `--policy {baselines[name]}`)" if name in baselines else ""),
         p["problem"], p["algorithm"], p["created"][:10], f"`{p['command']}`"]
        for name, p in provenances.items()
    ]  # fmt: skip
    if portfolio:
        chosen = portfolio["chosen_on"]
        rows.append([f"`{PORTFOLIO}`", f"portfolio for {portfolio['family']}",
                     f"{len(portfolio['candidates'])} candidates, a build compiles {portfolio['default_candidates']}",
                     "—", f"`{chosen['command']}`"])  # fmt: skip
    compilers = sorted({p["compiler"] for p in provenances.values()})
    return [
        "## The shipped files",
        "",
        *_table(["file", "problem", "trained by", "created", "command"], rows),
        f"Compiler: {', '.join(compilers)}.",
        "",
    ]


#: The file of the policy that decides C++ by default: sets measured before it shipped were another inliner's.
INLINER = "inline-size.provenance.json"


def _unseen_sets(provenances: dict[str, dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], dict[str, list[str]]]:
    """Every record of a set outside the training list, each once (the files record the same measurement, every
    shipped policy together), in the order first met; and per file, the sets it records (a policy shipped later
    records only the sets measured since)."""
    entries: dict[str, dict[str, Any]] = {}
    recorded: dict[str, list[str]] = {}
    for name, p in provenances.items():
        for entry in p["figures"].get("unseen_packages_with_shipped_policies") or []:
            entries.setdefault(json.dumps(entry, sort_keys=True), entry)
            recorded.setdefault(name, []).append(entry["corpus"])
    return entries, recorded


def _decided_by_this_inliner(entry: dict[str, Any], language: str, recorded: dict[str, list[str]]) -> bool:
    """Whether ``entry``'s ``language`` figures are today's default's: C++ only in the sets the shipped inliner
    was measured on (it decides C++; an earlier inliner's sets were another policy's), C in every set (the inline
    policies leave C to clang, and a C set pools only with sets built by as many portfolio candidates)."""
    return language != "C++" or INLINER not in recorded or entry["corpus"] in recorded[INLINER]


def _unseen(provenances: dict[str, dict[str, Any]]) -> list[str]:
    """The sets of packages outside the training list, each once; pooled per language over the sets today's
    default build was measured on."""
    entries, recorded = _unseen_sets(provenances)
    if not entries:
        return []
    every = {e["corpus"] for e in entries.values()}
    partial = [f"`{n}` records only {', '.join(sets)}" for n, sets in recorded.items() if set(sets) != every]
    first = next(iter(entries.values()))
    out = [
        "## Packages outside the training list",
        "",
        f"Every shipped policy together ({', '.join(first['with'])}), C compiled as `optgym-cc` builds it by "
        "default (`candidates`: how many of the portfolio's candidates each C object was compiled by). "
        f"Recorded in {', '.join(f'`{n}`' for n in recorded)}"
        + (f" ({'; '.join(partial)}: its policy shipped after the others were measured)." if partial else "."),
        "",
    ]
    rows = []
    for e in entries.values():
        for row in _language_rows(e["corpus"], e):
            rows.append([*row[:1], e["measured"][:10], e.get("candidates", "—"), *row[1:]])
    for language in LANGUAGES:  # pooled: each set's ratio weighted by clang's bytes (.text bytes unrecorded)
        # C objects are compiled by `candidates` of the portfolio, so C sets pool only with sets built the same
        # way (a total over 2-candidate and 1-candidate builds is neither build's); a C++ object is one compile.
        pools: dict[Any, list[dict[str, Any]]] = {}
        for e in entries.values():
            if e.get(language, {}).get("evaluated") and _decided_by_this_inliner(e, language, recorded):
                pools.setdefault(e.get("candidates", "—") if language == "C" else "", []).append(e[language])
        for candidates, sets in pools.items():
            rows.append(_pooled_row(f"all {_count(len(sets), 'set')}", candidates, language, sets))
    header = [FIGURE_HEADER[0], "measured", "candidates", *FIGURE_HEADER[1:]]
    out += _table(header, rows)
    out += ["Packages (Debian bookworm versions are in the files):", ""]
    out += [f"- {e['corpus']}: {', '.join(sorted(e['packages']))}" for e in entries.values()]
    out.append("")
    return out


def _by_bytes(ratios_and_bytes: Iterable[tuple[float, int]]) -> float:
    """Sets' ratios pooled: each weighted by clang's bytes in its set, as if the sets were one."""
    pairs = list(ratios_and_bytes)
    return sum(ratio * weight for ratio, weight in pairs) / sum(weight for _, weight in pairs)


def _pooled_row(label: str, candidates: Any, language: str, sets: list[dict[str, Any]]) -> list[Any]:
    """One row of ``sets`` (a language's figures of several sets) pooled: each ratio weighted by clang's bytes."""
    modules = sum(f["evaluated"] for f in sets)
    pooled = {k: _ratio(_by_bytes((f[k], f["heuristic_text_bytes"]) for f in sets))
              for k in ("total_ratio", "guarded_ratio", "guarded_below_ratio")}  # fmt: skip
    worse, below = (sum(f[k] for f in sets) for k in ("regressed_over_1pct", "guarded_below_over_1pct"))
    return [label, "", candidates, language, modules, pooled["total_ratio"], "—", _share(worse, modules),
            pooled["guarded_ratio"], f"{pooled['guarded_below_ratio']}, {below} worse"]  # fmt: skip


def _per_policy(
    provenances: dict[str, dict[str, Any]], title: str = "## Each policy's own record", with_unseen: bool = False
) -> list[str]:
    """A section per provenance: its held-out and training figures, and with ``with_unseen`` its sets outside the
    training list too (another target's inliner, whose sets the x86-64 pooling above leaves out)."""
    sections = {
        "heldout": "held-out split, this policy alone",
        "heldout_with_shipped_policies": "held-out split, every shipped policy together",
        "heldout_with_thinlto_policies": "held-out ThinLTO backends, with the other ThinLTO scorer",
        "training_sample": "training sample, this policy alone",
        "fresh_packages_with_shipped_policies": "fresh packages, every policy shipped then",
    }
    out = [title, ""] if provenances else []
    for p in provenances.values():
        figures = p["figures"]
        out += [f"### `{p['policy']}` ({p['problem']}, created {p['created'][:10]})", ""]
        held = ", ".join(sorted(p.get("heldout_packages", {})))
        if held:
            out += [f"Held-out packages (never trained on): {held}.", ""]
        rows = [row for key, label in sections.items() if key in figures for row in _language_rows(label, figures[key])]
        for entry in figures.get("unseen_packages_with_shipped_policies", []) if with_unseen else []:
            rows += _language_rows(f"{entry['corpus']} (outside the training list)", entry)
        alone = figures.get("unseen_scorers_alone", [])  # maintainer/ship_pretrained.py --scorers-alone
        for entry in alone:
            for key, label in ((p["problem"], "this policy alone"), ("together", "the scorers together")):
                rows += _language_rows(f"{entry['corpus']} (outside the training list), {label}", entry[key])
        out += _table(FIGURE_HEADER, rows)
        for entry in alone:
            out += [_largest_packages(entry, p["problem"]), ""]
        fresh = figures.get("fresh_packages_with_shipped_policies", {}).get("packages")
        if fresh:
            out += [f"Fresh packages: {', '.join(sorted(fresh))}.", ""]
        out += _linked_builds(figures.get("linked_builds", []))
        training = figures.get("training", {})
        if training.get("candidates"):
            out += _candidates(training)
    return out


def _linked_builds(entries: Sequence[dict[str, Any]]) -> list[str]:
    """The policy's linked builds (``maintainer/ship_pretrained.py --linked``): per package, optgym ÷ plain clang."""
    if not entries:
        return []
    rows = []
    for e in entries:
        ratio = {f: _ratio(e["optgym"][f] / e["plain"][f]) for f in ("text", "dottext", "file")}
        side = "held out" if e["side"] == "heldout" else "outside the training list"
        cpu = f"{e['build_cpu_ratio']:.2f}×" if e.get("build_cpu_ratio") else "—"
        rows.append([f"{e['source']} ({side})", e["outputs"], ratio["text"], ratio["dottext"], ratio["file"],
                     " / ".join(e["tests"][v] for v in ("plain", "optgym")), cpu])  # fmt: skip
    header = ["package", "linked outputs", "Berkeley text", "`.text`", "file", "tests plain / optgym", "build CPU"]
    return ["Linked builds, `optgym compare-build SRC --test` with this policy served by default, optgym ÷ plain "
            "clang-22 `-Oz` over every linked executable and shared library:", "", *_table(header, rows)]  # fmt: skip


def _largest_packages(entry: dict[str, Any], problem: str) -> str:
    """The line under a ``--scorers-alone`` entry: its packages, and the one grown most alone and together."""
    grown = []
    for key, label in ((problem, "alone"), ("together", "together")):
        largest = entry[key]["largest_package"]
        grown.append(f"{label}: {largest['package']} {_ratio(largest['ratio'])}")
    return (f"{entry['corpus']}, with clang's inlining and no portfolio ({', '.join(sorted(entry['packages']))}); "
            f"the package grown most, its bytes over clang's: {'; '.join(grown)}.")  # fmt: skip


def _candidates(training: dict[str, Any]) -> list[str]:
    """``optgym train threshold``'s candidates: the chosen rule per language and every candidate's figures."""
    tuned = training.get("tuned_on", {})
    chosen = "; ".join(f"{language}: `{rule}`" for language, rule in training.get("chosen", {}).items())
    rows = []
    for c in training["candidates"]:
        for language in LANGUAGES:
            f = c.get(language)
            if not f:
                continue
            samples = " · ".join(
                f"{_ratio(s['total_ratio'])}, {100 * s['regressed_share']:.1f} %" for s in f.get("samples", [])
            )
            share = f"{100 * f['regressed_share']:.1f} %"
            rows.append([f"`{c['up']}`", language, f["evaluated"], _ratio(f["total_ratio"]),
                         _ratio(f["dottext_ratio"]), share, samples or "—"])  # fmt: skip
    return [
        f"Chosen by `optgym train threshold` ({chosen}) on {tuned.get('modules', '?')} modules of the training "
        f"side ({tuned.get('samples', 1)} samples at sampling rate {tuned.get('sampling_rate', '?')}):",
        "",
        *_table(["candidate", "language", "modules", "Berkeley text", ".text", "> 1 % worse", "per sample"], rows),
    ]


def _portfolio(portfolio: dict[str, Any], target: str = "") -> list[str]:
    """The section of one portfolio: x86-64's, or (``target``: its directory's name) another target's."""
    chosen = portfolio["chosen_on"]
    training = {f["candidate"]: f for f in chosen["figures"]}
    rows = []
    for n, c in enumerate(portfolio["candidates"], 1):
        f = training.get(c["name"], {})
        figure = f"{_ratio(f['alone'])} alone" if "alone" in f else _ratio(f.get("best_of"))
        flags = " ".join(c.get("flags", [])) or "—"
        rows.append([n, c["name"], f"`{flags}`" if c.get("flags") else flags, figure])
    where = f"{target}/{PORTFOLIO}" if target else PORTFOLIO
    out = [
        f"## The C portfolio for {target} (`{where}`)" if target else f"## The C portfolio (`{where}`)",
        "",
        f"A C object is compiled by the first N candidates and the smallest object kept; a default build compiles "
        f"N = {portfolio['default_candidates']} (`OPTGYM_CANDIDATES`). Chosen on {chosen['modules']} modules of "
        f"`{chosen['corpus']}` (split `{chosen['split']}`): each candidate's training figure is the total with the "
        "candidates up to it, per module the smallest (the first: alone), in "
        f"{chosen.get('metric', 'Berkeley text')}. The file records no dates.",
        "",
        *_table(["N", "candidate", "flags", "training sample"], rows),
    ]
    measured = portfolio.get("measured", {})
    count = max((len(m["prefixes"]) for m in measured.values()), default=0)
    rows = []
    for name, m in measured.items():
        prefixes = m["prefixes"]
        cells = [
            f"{_ratio(p['total_ratio'])}"
            + (f", {p['over_1pct']} worse" if p["over_1pct"] else "")
            + (f" (text + data {_ratio(p['text_and_data_ratio'])})" if "text_and_data_ratio" in p else "")
            for p in prefixes
        ]
        modules = prefixes[0]["modules"] if prefixes else 0
        rows.append([f"`{name}`", modules, *cells, *["—"] * (count - len(cells))])
    unseen = [m for name, m in measured.items() if not name.endswith("(test)")]
    clang = sum(m["clang_text_bytes"] for m in unseen)
    if clang and len(unseen) > 1:  # one set's pooled row would repeat its own
        pooled = [
            _ratio(_by_bytes((m["prefixes"][i]["total_ratio"], m["clang_text_bytes"]) for m in unseen))
            + (f", {worse} worse" if (worse := sum(m["prefixes"][i]["over_1pct"] for m in unseen)) else "")
            for i in range(min(len(m["prefixes"]) for m in unseen))
        ]
        modules = sum(m["prefixes"][0]["modules"] for m in unseen)
        rows.append([f"the {_count(len(unseen), 'set')} outside the training list", modules, *pooled])
    out += [
        "Berkeley text against clang-22 `-Oz` with the first N candidates (`maintainer/portfolio.py measure --record`; "
        "`CORPUS (test)` is that corpus's held-out split), and Berkeley text + data where the record has it (a pass "
        "option can move constants from text into data: [log](experiments/2026-11-28-bytes-moved-to-data.md)):",
        "",
        *_table(["set", "modules", *(f"N = {i}" for i in range(1, count + 1))], rows),
    ]
    rows = []
    for name, m in measured.items():
        first = m["prefixes"][0] if m["prefixes"] else {}
        bounds = first.get("guard_bounds", {})
        if not bounds:
            continue
        cells = [f"{_ratio(b['total_ratio'])}, {b['over_1pct']} worse, {100 * b['second_compile']:.0f} %"
                 for b in bounds.values()]  # fmt: skip
        rows.append([f"`{name}`", f"{_ratio(first.get('guarded_below_ratio'))}, "
                     f"{first.get('guarded_below_over_1pct')} worse", *cells])  # fmt: skip
    if rows:
        bounds = next(iter(m["prefixes"][0].get("guard_bounds", {}) for m in measured.values()))
        out += [
            "One compile (N = 1) with clang's compile only after an object under the bound (`OPTGYM_GUARD_BELOW`): "
            "total, modules > 1 % worse, and the share of the first compile's time given to the second:",
            "",
            *_table(["set", "2 kB guard", *(f"below {b} B" for b in bounds)], rows),
        ]
    out += ["Packages:", ""]
    out += [f"- `{name}`: {', '.join(m['packages'])}" for name, m in measured.items()]
    return [*out, ""]


def _thinlto_plan(plan: dict[str, Any], target: str = "") -> list[str]:
    """The section of a ThinLTO plan (``thinlto.json``: x86-64's, or with ``target``, its directory's name, another
    target's): what it sets, how it was chosen, and the linked figures of each set of packages outside the
    training list it was measured on."""
    options = [f"`{flag}`" for flag in plan.get("link_flags", [])] + [
        f"`-mllvm {option}`" for option in plan.get("llvm_options", [])
    ]
    figures = plan.get("figures", {})
    where = f"{target}/{THINLTO_PLAN}" if target else THINLTO_PLAN
    allocation = (
        f"So does their register allocation: no ThinLTO scorers ship for {target}. "
        if target
        else "Their register allocator's evictions are decided by the ThinLTO eviction scorer shipped beside it "
        "(`regalloc-evict-thinlto.onnx`, below), by default since the thirty-second session: sets measured before "
        "then, with no `OPTGYM_LTO_*` variable in their command, ran the plan alone. The priority scorer "
        "(`regalloc-priority-thinlto.onnx`) is asked for with `OPTGYM_LTO_PRIORITY_POLICY=pretrained`; each set's "
        "command below says which ran. "
    )
    out = [
        f"## ThinLTO links for {target} (`{where}`)" if target else f"## ThinLTO links (`{where}`)",
        "",
        f"A ThinLTO link {f'for {target} ' if target else ''}through `optgym-cc` takes the plan **{plan['name']}**: "
        f"{', '.join(options)}, before the build's own link flags. The backends' inlining stays clang's (no ThinLTO "
        f"inline policy beats it yet). {allocation}"
        "Chosen by `" + plan.get("chosen_by", "?") + "` on linked training packages "
        f"({', '.join(plan.get('packages', []))}): linked `.text` and Berkeley text of every linked output, "
        "optgym ÷ plain clang-22 ThinLTO:",
        "",
        *_table(["candidate", "`.text`", "text", "packages larger", "built and tested"],
                [[name, _ratio(row["dottext"]), _ratio(row["text"]), ", ".join(row["larger"]) or "none",
                  "yes" if row["ok"] else "no"] for name, row in figures.get("candidates", {}).items()]),
    ]  # fmt: skip
    for name, measured in figures.get("unseen", {}).items():
        out += _linked_set(name, measured, "")
    for earlier in figures.get("earlier", []):
        for name, measured in earlier["unseen"].items():
            out += _linked_set(name, measured, f" with the earlier plan **{earlier['name']}**")
    return [*out, ""]


def _linked_set(name: str, measured: dict[str, Any], plan: str) -> list[str]:
    """One unseen set's linked figures (``maintainer/thinlto_plan.py --record``): per package and in total."""
    rows = []
    for package, row in measured["packages"].items():
        if not row["built"]:
            rows.append([package, "did not build", "", "", ""])
            continue
        ratio = {f: row["optgym"][f] / row["plain"][f] for f in ("dottext", "text")}
        tests = " / ".join(str(row["tests"][v]) for v in ("plain", "optgym"))
        wall = (row.get("build_ratio") or {}).get("wall")
        rows.append([package, _ratio(ratio["dottext"]), _ratio(ratio["text"]), tests,
                     f"{wall:.2f}×" if wall else "—"])  # fmt: skip
    total = measured["total"]
    ratios = [f"**{_ratio(total['optgym'][f] / total['plain'][f])}**" for f in ("dottext", "text")]
    rows.append(["**total**", *ratios, "", ""])
    return [
        f"Packages outside the training list, `{name}`{plan}{_served_beside(measured)} "
        f"(measured once: `{measured['command']}`), "
        "built with `-Oz -flto=thin -fuse-ld=lld`, optgym ÷ plain clang-22 ThinLTO:",
        "",
        *_table(["package", "`.text`", "text", "tests plain / optgym", "build wall (one build, as loaded)"], rows),
    ]


def _per_target(directory: Path, name: str) -> list[tuple[str, dict[str, Any]]]:
    """Every shipped copy of the file ``name``, read: x86-64's in ``directory`` itself (target ``""``) first, then
    each other target's in its own subdirectory (target: the subdirectory's name)."""
    paths = [directory / name, *sorted(directory.glob(f"*/{name}"))]
    return [("" if path.parent == directory else path.parent.name, json.loads(path.read_text()))
            for path in paths if path.is_file()]  # fmt: skip


def results_page(directory: Path = PRETRAINED_DIR) -> str:
    """The Markdown of ``docs/results.md`` from the provenance files and the portfolios in ``directory`` (x86-64's,
    and each other target's in its own subdirectory)."""
    provenances = _provenances(directory)
    portfolios = _per_target(directory, PORTFOLIO)
    portfolio = next((data for target, data in portfolios if not target), None)
    lines = [
        "# Results",
        "",
        f"<!-- Generated by `{COMMAND}` from src/optgym/policies/pretrained/*.provenance.json and "
        f"{PORTFOLIO}. Do not edit by hand. -->",
        "",
        "What the shipped policies do against clang-22 `-Oz`, as the files shipped with them record it. How "
        "each was trained and chosen, and the figures measured along the way (linked binaries, build times, "
        "test suites), are in the [research log](experiments/).",
        "",
        SIZES,
        "",
        *_shipped(provenances, portfolio),
        *_unseen({name: p for name, p in provenances.items() if name not in _baselines()}),
        *(line for target, data in portfolios for line in _portfolio(data, target)),
        *(line for target, plan in _per_target(directory, THINLTO_PLAN) for line in _thinlto_plan(plan, target)),
        *_per_policy(provenances),
        *_per_policy(
            {f"{target}/{INLINER}": data for target, data in _per_target(directory, INLINER) if target},
            "## Other targets' inliners",
            with_unseen=True,
        ),
    ]
    return "\n".join(lines).rstrip("\n") + "\n"


#: The README's results block lies between these two lines; ``optgym results-page --readme README.md`` rewrites it.
README_BEGIN = "<!-- results: generated by `optgym results-page --readme README.md` from the shipped files -->"
README_END = "<!-- /results -->"
#: Each target directory's name as a reader knows the target.
TARGET_NAMES = {"": "x86-64", "aarch64": "AArch64", "thumbv7em": "Cortex-M4"}


def _with_worse(ratio: float, worse: int, modules: int) -> str:
    share = f"{100 * worse / modules:.1f} %" if worse else "none"
    return f"**{_ratio(ratio)}** ({modules} modules; {share} > 1 % worse)"


def _pooled(figures: Sequence[dict[str, Any]]) -> str:
    """Sets' figures of one language (``evaluate``'s summaries) pooled: ratios weighted by clang's bytes."""
    ratio = _by_bytes((f["total_ratio"], f["heuristic_text_bytes"]) for f in figures)
    return _with_worse(ratio, sum(f["regressed_over_1pct"] for f in figures), sum(f["evaluated"] for f in figures))


def _portfolio_row(target: str, portfolio: dict[str, Any], later: Sequence[dict[str, Any]] = ()) -> list[str]:
    """A target's C portfolio in the README: its default build, held out and on the sets outside the training list
    (pooled by clang's bytes where there are several); ``later``: the sets measured since with every shipped
    policy, built as by default (as the shipped files record them), pooled beside."""
    n = portfolio["default_candidates"]
    measured = portfolio.get("measured", {})
    held = next((m for name, m in measured.items() if name.endswith("(test)")), None)
    unseen = [(name.split(" (")[0], m) for name, m in measured.items() if not name.endswith("(test)")]
    held_cell = "—"
    if held:
        p = held["prefixes"][n - 1]
        held_cell = _with_worse(p["total_ratio"], p["over_1pct"], p["modules"])
        if "text_and_data_ratio" in p:
            held_cell += f", text + data {_ratio(p['text_and_data_ratio'])}"
    unseen_cell = "none measured yet"
    if unseen:
        ratio = _by_bytes((m["prefixes"][n - 1]["total_ratio"], m["clang_text_bytes"]) for _, m in unseen)
        worse = sum(m["prefixes"][n - 1]["over_1pct"] for _, m in unseen)
        modules = sum(m["prefixes"][n - 1]["modules"] for _, m in unseen)
        sets = ", ".join(f"`{name}`" for name, _ in unseen)
        unseen_cell = f"{_with_worse(ratio, worse, modules)}: {sets}"
    if later:
        unseen_cell += f"; {_count(len(later), 'more set')}, with every shipped policy: {_pooled(later)}"
    compiles = "one compile" if n == 1 else f"{n} compiles, the smallest kept"
    return [f"{TARGET_NAMES.get(target, target)} C", f"the C portfolio ({compiles})", "per object", held_cell,
            unseen_cell]  # fmt: skip


def _count(n: int, noun: str) -> str:
    """``1 set``, ``2 sets``: a count a reader reads as English."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _inliner_row(provenance: dict[str, Any], target: str = "") -> list[str]:
    """A target's C++ (x86-64's: ``target`` ""): its shipped inline policy, held out and pooled over every set
    outside the training list."""
    held = provenance["figures"]["heldout"]["C++"]
    sets = [e for e in provenance["figures"].get("unseen_packages_with_shipped_policies", [])
            if e.get("C++", {}).get("evaluated")]  # fmt: skip
    unseen_cell = "none measured yet"
    if sets:
        named = f"`{sets[0]['corpus']}`" if len(sets) == 1 else f"{len(sets)} sets, the newest `{sets[-1]['corpus']}`"
        unseen_cell = f"{_pooled([e['C++'] for e in sets])}: {named}"
    return [f"{TARGET_NAMES.get(target, target)} C++",
            f"the inline policy `{provenance['policy']}` (`optgym train {provenance['algorithm']}`)",
            "per object",
            _with_worse(held["total_ratio"], held["regressed_over_1pct"], held["evaluated"]), unseen_cell]  # fmt: skip


def _inliner_linked_row(provenance: dict[str, Any], linked: Sequence[dict[str, Any]]) -> list[str]:
    """x86-64 C++ linked: the inliner's recorded builds, pooled by plain clang's bytes, held out and unseen."""
    return ["x86-64 C++", f"the inline policy `{provenance['policy']}`",
            "linked, default build: Berkeley `text` (`.text`), against plain clang",
            _linked_cell([e for e in linked if e["side"] == "heldout"]),
            _linked_cell([e for e in linked if e["side"] != "heldout"])]  # fmt: skip


def _linked_cell(entries: Sequence[dict[str, Any]]) -> str:
    """Linked builds pooled by plain clang's bytes (a package's weight is its size, as in a per-object total)."""
    if not entries:
        return "none measured yet"
    text, dottext = (_ratio(sum(e["optgym"][f] for e in entries) / sum(e["plain"][f] for e in entries))
                     for f in ("text", "dottext"))  # fmt: skip
    names = ", ".join(sorted(e["package"] for e in entries))
    return f"**{text}** (`.text` {dottext}): {names}, tests passing"


def _thinlto_row(
    target: str, plan: dict[str, Any], directory: Path, lto_defaults: Sequence[tuple[str, str]]
) -> list[str]:
    """A target's ThinLTO plan: linked ``.text`` of its newest set outside the training list, then every earlier
    set measured with the same plan (each set's first record: the build as ``optgym-cc`` made it by default), so
    no set is left out of the README."""
    figures = plan.get("figures", {})
    unseen = [(name, m) for name, m in figures.get("unseen", {}).items() if "(" not in name]
    unseen_cell = "none measured yet"
    if unseen:
        name, measured = unseen[-1]
        tests = all(row["tests"]["plain"] == row["tests"]["optgym"] == "passed"
                    for row in measured["packages"].values() if row["built"])  # fmt: skip
        passing = "passing" if tests else "NOT all passing"
        unseen_cell = f"**{_dottext(measured)}**: `{name}`, {len(measured['packages'])} packages, tests {passing}"
        if len(unseen) > 1:  # a set that served nothing beside the plan says so where the newest did
            alone = " (the plan alone)" if measured.get("served") else ""
            unseen_cell += "; earlier: " + ", ".join(
                f"`{n}`{'' if m.get('served') else alone} {_dottext(m)}" for n, m in reversed(unseen[:-1])
            )
    training = figures.get("linked_training_packages", {})
    served = _served_by_default(directory / target, lto_defaults)
    decided = "the ThinLTO plan (`thinlto.json`)" + "".join(f" and {noun} (`{name}`)" for noun, name in served)
    training_cell = "—"
    if training.get("dottext"):  # the plan's choice measures the plan alone: say so where a default serves more
        training_cell = f"{_ratio(training['dottext'])} (training packages{', the plan alone' if served else ''})"
    return [f"{TARGET_NAMES.get(target, target)} ThinLTO", decided, "linked `.text`, against plain ThinLTO",
            training_cell, unseen_cell]  # fmt: skip


def _served_by_default(directory: Path, lto_defaults: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """Of ``lto_defaults`` (the launcher's ``served_by_default()``: (problem, file) pairs), those whose file ships
    in ``directory`` (a target's), as (what it decides, its file)."""
    nouns = {"inline-size": "the inline policy", "regalloc-evict": "the eviction scorer",
             "regalloc-priority": "the priority scorer"}  # fmt: skip
    return [(nouns[problem], shipped) for problem, shipped in lto_defaults if (directory / shipped).is_file()]


def _served_beside(measured: dict[str, Any]) -> str:
    """What a linked set's builds served beside the plan, as a phrase (nothing if only the plan)."""
    served = measured.get("served")
    return f", {' and '.join(f'`{name}`' for name in served)} served beside the plan," if served else ""


def _dottext(measured: dict[str, Any]) -> str:
    """A linked set's total ``.text``, optgym ÷ plain clang-22."""
    return _ratio(measured["total"]["optgym"]["dottext"] / measured["total"]["plain"]["dottext"])


def readme_results(directory: Path = PRETRAINED_DIR, lto_defaults: Sequence[tuple[str, str]] = ()) -> str:
    """The README's results block: one row per thing ``optgym-cc`` decides by default, each with its held-out and
    its outside-the-training-list figure, read from the same files as the results page. ``lto_defaults``: the
    learned ThinLTO policies a default link serves where they ship (``optgym_cc.thinlto.served_by_default()``, which
    this layer may not import; the command passes it)."""
    provenances = _provenances(directory)
    inliner = provenances.get(INLINER)
    rows = [_inliner_row(inliner)] if inliner else []
    if inliner and (linked := inliner["figures"].get("linked_builds")):
        rows.append(_inliner_linked_row(inliner, linked))
    rows += [_inliner_row(data, target) for target, data in _per_target(directory, INLINER) if target]
    sets, _ = _unseen_sets(provenances)
    for target, portfolio in _per_target(directory, PORTFOLIO):
        # x86-64's C sets measured with every shipped policy, as a default build of that time compiled them
        later = [] if target else [
            e["C"] for e in sets.values()
            if e.get("C", {}).get("evaluated") and e.get("candidates") == portfolio["default_candidates"]]  # fmt: skip
        rows.append(_portfolio_row(target, portfolio, later))
    rows += [
        _thinlto_row(target, plan, directory, lto_defaults) for target, plan in _per_target(directory, THINLTO_PLAN)
    ]
    header = ["code", "decided by (default build)", "measure", "held-out split", "packages outside the training list"]
    return "\n".join([README_BEGIN, "", *_table(header, rows), README_END])


def with_readme_results(
    readme: str, directory: Path = PRETRAINED_DIR, lto_defaults: Sequence[tuple[str, str]] = ()
) -> str:
    """``readme`` with its results block (between :data:`README_BEGIN` and :data:`README_END`) regenerated (see
    :func:`readme_results`)."""
    start, end = readme.find(README_BEGIN), readme.find(README_END)
    if start < 0 or end < start:
        raise ValueError(f"the README has no results block: a line {README_BEGIN!r}, later a line {README_END!r}")
    return readme[:start] + readme_results(directory, lto_defaults) + readme[end + len(README_END) :]
