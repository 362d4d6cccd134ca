"""docs/results.md is generated from the shipped provenance files, and the committed page is that output."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from optgym.evaluate.results_page import (
    PORTFOLIO,
    PRETRAINED_DIR,
    README_BEGIN,
    README_END,
    THINLTO_PLAN,
    readme_results,
    results_page,
    with_readme_results,
)
from optgym.policies import BASELINES as BASELINES_BY_SPEC
from optgym.policies import shipped_provenance
from optgym_cc.thinlto import served_by_default

ROOT = Path(__file__).resolve().parents[1]
PROVENANCES = sorted(PRETRAINED_DIR.glob("*.provenance.json"))
#: The policies of ThinLTO links' backends: measured on held-out backends and on linked programs (thinlto.json).
THINLTO = [p for p in PROVENANCES if p.name.endswith("-thinlto.provenance.json")]
#: The named baselines (``--policy rule``): shipped, served by no default build, so no default build's set names them.
BASELINES = [shipped_provenance(spec, problem) for spec, files in BASELINES_BY_SPEC.items() for problem in files]
PER_OBJECT = [p for p in PROVENANCES if p not in THINLTO and p not in BASELINES]


def _table_rows(page: str) -> list[list[str]]:
    """The cells of every table row of ``page``."""
    return [[c.strip() for c in line.strip("|").split("|")] for line in page.splitlines() if line.startswith("| ")]


def _readme_rows(block: str) -> dict[str, list[str]]:
    """The README table's rows by their code, the per-object or ThinLTO row of each (not the inliner's linked one)."""
    return {r[0]: r for r in _table_rows(block) if not r[2].startswith("linked, default build")}


def _rows(page: str, first_cell: str) -> list[list[str]]:
    """The cells of every table row of ``page`` whose first cell is ``first_cell``."""
    return [r for r in _table_rows(page) if r[0] == first_cell]


def test_the_shipped_policies_have_provenance():
    assert {p.name for p in PROVENANCES} >= {
        "inline-size.provenance.json",
        "regalloc-evict.provenance.json",
        "regalloc-priority.provenance.json",
    }
    assert (PRETRAINED_DIR / PORTFOLIO).is_file()


def test_a_baseline_is_listed_as_one_and_named_by_no_default_builds_set():
    page = results_page()
    for path in BASELINES:
        policy = json.loads(path.read_text())["policy"]
        assert f"`{policy}` (baseline: `--policy " in page and f"### `{policy}`" in page
        assert f"`{path.name}`" not in page


def test_every_unseen_set_appears_with_its_figures():
    page = results_page()
    for path in PER_OBJECT:
        provenance = json.loads(path.read_text())
        entries = provenance["figures"]["unseen_packages_with_shipped_policies"]
        assert entries, path.name
        assert f"`{path.name}`" in page  # named as a file that records them
        for entry in entries:
            rows = {r[3]: r for r in _rows(page, entry["corpus"])}  # language → row
            assert len(_rows(page, entry["corpus"])) == len(rows)  # once, however many files record the set
            for language in ("C", "C++"):
                figures = entry[language]
                if not figures["evaluated"]:
                    assert language not in rows
                    continue
                row = rows[language]
                assert row[1] == entry["measured"][:10] and row[2] == str(entry["candidates"])
                assert row[4] == str(figures["evaluated"])
                assert row[5] == f"{figures['total_ratio']:.4f}"
                assert row[6] == f"{figures['dottext_ratio']:.4f}"
                assert row[7].startswith(f"{figures['regressed_over_1pct']} (")
                assert row[9] == f"{figures['guarded_below_ratio']:.4f}, {figures['guarded_below_over_1pct']} worse"
            for package in entry["packages"]:
                assert package in page


def _every_set(provenances: list[Path]) -> list[dict]:
    """Each record of a set outside the training list once, over ``provenances``, in the order first met."""
    entries: dict[str, dict] = {}
    for path in provenances:
        for entry in json.loads(path.read_text())["figures"].get("unseen_packages_with_shipped_policies", []):
            entries.setdefault(json.dumps(entry, sort_keys=True), entry)
    return list(entries.values())


def test_c_sets_pool_only_with_sets_built_by_as_many_candidates():
    """A C total over builds of one and of two compiles per object is neither build's: one pooled C row per
    candidate count, each the byte-weighted total of exactly its sets; C++ (one compile an object) pools once."""
    page = results_page()
    entries = _every_set(PER_OBJECT)
    pooled = [r for r in _table_rows(page) if r[0].startswith("all ") and r[3] == "C"]
    counts = {e["candidates"] for e in entries if e["C"]["evaluated"]}
    assert sorted(r[2] for r in pooled) == sorted(str(n) for n in counts)
    for row in pooled:
        sets = [e["C"] for e in entries if e["C"]["evaluated"] and str(e["candidates"]) == row[2]]
        clang = sum(f["heuristic_text_bytes"] for f in sets)
        assert row[0] == f"all {len(sets)} sets" and row[4] == str(sum(f["evaluated"] for f in sets))
        assert row[5] == f"{sum(f['total_ratio'] * f['heuristic_text_bytes'] for f in sets) / clang:.4f}"
    assert len([r for r in _table_rows(page) if r[0].startswith("all ") and r[3] == "C++"]) == 1


def test_a_new_inliner_pools_cxx_over_its_own_sets_and_c_over_all(tmp_path):
    """An inliner shipped after some sets were measured records only the sets since: C++ pools over those (the
    earlier sets were another inliner's), while C, which the inline policies leave to clang, still pools over
    every set, on the page and in the README's x86-64 C row."""
    root = tmp_path / "pretrained"
    shutil.copytree(PRETRAINED_DIR, root, ignore=shutil.ignore_patterns("*.onnx"))
    path = root / "inline-size.provenance.json"
    inliner = json.loads(path.read_text())
    every = _every_set(sorted(root.glob("*.provenance.json")))
    newest = inliner["figures"]["unseen_packages_with_shipped_policies"][-1]
    inliner["figures"]["unseen_packages_with_shipped_policies"] = [newest]
    path.write_text(json.dumps(inliner))
    page = results_page(root)
    pooled = {(r[2], r[3]): r for r in _table_rows(page) if r[0].startswith("all ")}
    assert pooled[("", "C++")][0] == "all 1 set" and pooled[("", "C++")][5] == f"{newest['C++']['total_ratio']:.4f}"
    c_sets = [e for e in every if e["C"]["evaluated"]]
    assert sum(int(r[0].split()[1]) for (_, language), r in pooled.items() if language == "C") == len(c_sets)
    rows = _readme_rows(readme_results(root))
    assert rows["x86-64 C++"][4].endswith(f": `{newest['corpus']}`")
    assert rows["x86-64 C"] == _readme_rows(readme_results(PRETRAINED_DIR))["x86-64 C"]


def test_held_out_figures_of_every_policy():
    page = results_page()
    for path in PROVENANCES:
        provenance = json.loads(path.read_text())
        section = page.split(f"### `{provenance['policy']}`", 1)[1].split("\n### ", 1)[0]
        heldout = provenance["figures"]["heldout"]
        measured = [language for language in ("C", "C++") if heldout.get(language, {}).get("evaluated")]
        assert "C" in measured, path.name  # every shipped policy decides C; a C-only corpus holds out no C++
        for language in measured:
            figures = heldout[language]
            row = next(r for r in _rows(section, "held-out split, this policy alone") if r[1] == language)
            assert row[2:5] == [
                str(figures["evaluated"]),
                f"{figures['total_ratio']:.4f}",
                f"{figures['dottext_ratio']:.4f}",
            ]
        assert provenance["command"] in page


def test_the_thinlto_scorers_and_their_held_out_backends():
    """Each ThinLTO scorer's section: its held-out backends with the other ThinLTO scorer, as a link serves them."""
    assert {p.name for p in THINLTO} == {"regalloc-evict-thinlto.provenance.json",
                                         "regalloc-priority-thinlto.provenance.json"}  # fmt: skip
    page = results_page()
    for path in THINLTO:
        provenance = json.loads(path.read_text())
        section = page.split(f"### `{provenance['policy']}`", 1)[1].split("\n### ", 1)[0]
        label = "held-out ThinLTO backends, with the other ThinLTO scorer"
        for language in ("C", "C++"):
            together = provenance["figures"]["heldout_with_thinlto_policies"][language]
            row = next(r for r in _rows(section, label) if r[1] == language)
            assert row[2:4] == [str(together["evaluated"]), f"{together['total_ratio']:.4f}"]


def test_portfolio_prefixes_and_pooled_total():
    page = results_page()
    portfolio = json.loads((PRETRAINED_DIR / PORTFOLIO).read_text())
    assert portfolio["chosen_on"]["command"] in page
    for name, measured in portfolio["measured"].items():
        row = _rows(page, f"`{name}`")[0]
        default = measured["prefixes"][portfolio["default_candidates"] - 1]
        assert row[1] == str(default["modules"])
        assert row[1 + default["compiles"]].startswith(f"{default['total_ratio']:.4f}")
    # the sets outside the training list pooled by clang's bytes: the README's headline figure for C; one set is
    # its own row, not repeated as a pooled one
    unseen_names = [name for name in portfolio["measured"] if not name.endswith("(test)")]
    unseen = [portfolio["measured"][name] for name in unseen_names]
    pooled_label = f"the {len(unseen)} sets outside the training list"
    assert "| the set outside the training list |" not in page
    pooled = _rows(page, pooled_label if len(unseen) > 1 else f"`{unseen_names[0]}`")[0]
    clang = sum(m["clang_text_bytes"] for m in unseen)
    n = portfolio["default_candidates"]
    expected = sum(m["prefixes"][n - 1]["total_ratio"] * m["clang_text_bytes"] for m in unseen) / clang
    assert pooled[1 + n].startswith(f"{expected:.4f}")


def test_the_page_follows_the_files(tmp_path):
    """A figure changed in a provenance file changes the page: nothing in it is typed by hand."""
    shutil.copytree(PRETRAINED_DIR, tmp_path / "pretrained", ignore=shutil.ignore_patterns("*.onnx"))
    path = tmp_path / "pretrained" / "regalloc-evict.provenance.json"
    provenance = json.loads(path.read_text())
    provenance["figures"]["heldout"]["C"]["total_ratio"] = 0.12344
    path.write_text(json.dumps(provenance))
    page = results_page(tmp_path / "pretrained")
    modules = provenance["figures"]["heldout"]["C"]["evaluated"]
    assert f"| held-out split, this policy alone | C | {modules} | 0.1234 |" in page
    assert page != results_page()


def test_committed_results_page_is_the_generated_one():
    committed = (ROOT / "docs" / "results.md").read_text()
    assert committed == results_page(), "docs/results.md is stale: run `optgym results-page -o docs/results.md`"


def test_committed_readme_results_are_the_generated_ones():
    readme = (ROOT / "README.md").read_text()
    assert README_BEGIN in readme and README_END in readme
    stale = "README.md's results are stale: run `optgym results-page --readme README.md`"
    assert with_readme_results(readme, PRETRAINED_DIR, served_by_default()) == readme, stale


def test_the_readme_stays_a_users_page():
    """The README is for users and holds at most 10 KB (10 000 bytes); reference pages live in docs/. A results
    table that grows a row, or a section that grows a paragraph, shows up here instead of at review."""
    size = len((ROOT / "README.md").read_bytes())
    assert size <= 10_000, f"README.md is {size} bytes; move reference material into docs/"


def test_the_readme_results_follow_the_files(tmp_path):
    """Each row of the README's table is read from a shipped file: a portfolio's held-out figure, the inliner's
    pooled sets, a ThinLTO plan's newest set and every earlier one; a target whose portfolio records no outside
    set says so."""
    shutil.copytree(PRETRAINED_DIR, tmp_path / "pretrained", ignore=shutil.ignore_patterns("*.onnx"))
    root = tmp_path / "pretrained"
    path = root / "aarch64" / PORTFOLIO
    portfolio = json.loads(path.read_text())
    held = next(name for name in portfolio["measured"] if name.endswith("(test)"))
    portfolio["measured"] = {held: portfolio["measured"][held]}
    portfolio["measured"][held]["prefixes"][portfolio["default_candidates"] - 1]["total_ratio"] = 0.12344
    path.write_text(json.dumps(portfolio))
    rows = _readme_rows(readme_results(root, served_by_default()))
    assert rows["AArch64 C"][3].startswith("**0.1234**") and rows["AArch64 C"][4] == "none measured yet"
    inliner = json.loads((PRETRAINED_DIR / "inline-size.provenance.json").read_text())
    sets = [e for e in inliner["figures"]["unseen_packages_with_shipped_policies"] if e.get("C++", {}).get("evaluated")]
    modules = sum(e["C++"]["evaluated"] for e in sets)
    named = f"`{sets[0]['corpus']}`" if len(sets) == 1 else f"{len(sets)} sets, the newest `{sets[-1]['corpus']}`"
    assert f"({modules} modules;" in rows["x86-64 C++"][4] and rows["x86-64 C++"][4].endswith(named)
    assert {"x86-64 C", "Cortex-M4 C", "x86-64 ThinLTO", "AArch64 ThinLTO"} <= rows.keys()
    plan = json.loads((PRETRAINED_DIR / THINLTO_PLAN).read_text())
    unseen = [(name, m) for name, m in plan["figures"].get("unseen", {}).items() if "(" not in name]
    if not unseen:  # a plan just chosen, not yet measured outside the training list
        assert rows["x86-64 ThinLTO"][4] == "none measured yet"
    newest_served = bool(unseen and unseen[-1][1].get("served"))
    for position, (name, measured) in enumerate(unseen):  # the newest in bold, and no set of this plan left out
        ratio = f"{measured['total']['optgym']['dottext'] / measured['total']['plain']['dottext']:.4f}"
        alone = " (the plan alone)" if newest_served and not measured.get("served") else ""  # served nothing more
        shown = f"**{ratio}**: `{name}`" if position == len(unseen) - 1 else f"`{name}`{alone} {ratio}"
        assert shown in rows["x86-64 ThinLTO"][4]
    # what a default link serves beside the plan: the learned ThinLTO scorers that ship for the target
    assert rows["x86-64 ThinLTO"][1] == "the ThinLTO plan (`thinlto.json`)"  # this copy ships no .onnx
    (root / "regalloc-evict-thinlto.onnx").write_bytes(b"")
    (root / "regalloc-priority-thinlto.onnx").write_bytes(b"")  # asked for, not the default: not named
    rows = _readme_rows(readme_results(root, served_by_default()))
    assert rows["x86-64 ThinLTO"][1].endswith("and the eviction scorer (`regalloc-evict-thinlto.onnx`)")
    assert "scorer" not in rows["AArch64 ThinLTO"][1]
    with pytest.raises(ValueError, match="no results block"):
        with_readme_results("# a README without the block\n", root)


def test_results_page_command(tmp_path):
    out = tmp_path / "results.md"
    proc = subprocess.run(
        [sys.executable, "-m", "optgym.cli", "results-page", "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert out.read_text() == results_page()
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n{README_BEGIN}\n{README_END}\n")
    proc = subprocess.run([sys.executable, "-m", "optgym.cli", "results-page", "--readme", str(readme)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "regenerated" in proc.stdout and "# Results" not in proc.stdout  # not the page as well
    empty = f"# x\n{README_BEGIN}\n{README_END}\n"
    assert readme.read_text() == with_readme_results(empty, PRETRAINED_DIR, served_by_default())


def test_the_thinlto_plan_and_its_linked_figures():
    """The ThinLTO plan's section: the chosen options, every candidate's linked ratios, and each unseen set's
    packages and total — the plan's own sets and those of the plans it replaced — all from ``thinlto.json``."""
    plan = json.loads((PRETRAINED_DIR / THINLTO_PLAN).read_text())
    page = results_page()
    assert plan["name"] in page and plan["chosen_by"] in page
    for flag in plan["link_flags"]:
        assert f"`{flag}`" in page
    for name, row in plan["figures"]["candidates"].items():
        assert _rows(page, name)[0][1:3] == [f"{row['dottext']:.4f}", f"{row['text']:.4f}"]
    earlier = [m for replaced in plan["figures"].get("earlier", []) for m in replaced["unseen"].values()]
    for measured in [*plan["figures"].get("unseen", {}).values(), *earlier]:
        for package in measured["packages"]:
            assert _rows(page, package)
        total = measured["total"]
        cells = _rows(page, "**total**")
        expected = [f"**{total['optgym'][f] / total['plain'][f]:.4f}**" for f in ("dottext", "text")]
        assert any(cells_row[1:3] == expected for cells_row in cells)


def test_each_targets_thinlto_plan_has_its_section():
    """Another target's plan (``pretrained/<target>/thinlto.json``) gets a section of its own, with its options and
    its candidates' figures, apart from x86-64's."""
    plans = sorted(PRETRAINED_DIR.glob(f"*/{THINLTO_PLAN}"))
    assert plans, "no target ships a ThinLTO plan of its own"
    page = results_page()
    for path in plans:
        plan, target = json.loads(path.read_text()), path.parent.name
        assert f"## ThinLTO links for {target} (`{target}/{THINLTO_PLAN}`)" in page
        assert plan["chosen_by"] in page
        for name, row in plan["figures"]["candidates"].items():
            assert [f"{row['dottext']:.4f}", f"{row['text']:.4f}"] in [cells[1:3] for cells in _rows(page, name)]


def test_the_scorers_alone_on_unseen_code_appear_under_each_scorer():
    """``ship_pretrained --scorers-alone``: each allocator scorer's section shows it alone and the scorers together on
    each recorded set, from the file, with the package grown most (issue 31's bar: no package > 1 % larger)."""
    page = results_page()
    recorded = 0
    for path in PER_OBJECT:
        provenance = json.loads(path.read_text())
        section = page.split(f"### `{provenance['policy']}`", 1)[1].split("\n### ", 1)[0]
        for entry in provenance["figures"].get("unseen_scorers_alone", []):
            recorded += 1
            for key, label in ((provenance["problem"], "this policy alone"), ("together", "the scorers together")):
                (row,) = _rows(section, f"{entry['corpus']} (outside the training list), {label}")
                figures = entry[key]["C"]
                assert row[1:5] == ["C", str(figures["evaluated"]), f"{figures['total_ratio']:.4f}",
                                    f"{figures['dottext_ratio']:.4f}"]  # fmt: skip
                largest = entry[key]["largest_package"]
                assert f"{largest['package']} {largest['ratio']:.4f}" in section
    assert recorded  # the shipped scorers carry at least one such set


def test_the_inliners_linked_builds_are_a_readme_row_pooled_by_plain_bytes_and_a_table_on_the_page(tmp_path):
    """Linked builds recorded in the inliner's provenance (``ship_pretrained --linked``): the README pools each side's
    packages by plain clang's bytes, Berkeley text first and ``.text`` beside it; the page lists every package."""
    root = tmp_path / "pretrained"
    shutil.copytree(PRETRAINED_DIR, root, ignore=shutil.ignore_patterns("*.onnx"))
    path = root / "inline-size.provenance.json"
    inliner = json.loads(path.read_text())

    def build(package: str, side: str, plain: int, mine: int) -> dict:
        sizes = {"text": plain, "dottext": plain // 2, "file": plain * 2}
        return {"package": package, "source": f"{package}-1.0", "side": side, "build_system": "cmake", "outputs": 2,
                "plain": sizes, "optgym": {"text": mine, "dottext": mine // 2, "file": mine * 2},
                "tests": {"plain": "passed", "optgym": "passed"}, "build_cpu_ratio": 1.2}  # fmt: skip

    inliner["figures"]["linked_builds"] = [
        build("held", "heldout", 1000, 900),
        build("aaa", "unseen", 3000, 2400),
        build("zzz", "unseen", 1000, 1000),
    ]
    path.write_text(json.dumps(inliner))
    rows = [r for r in _table_rows(readme_results(root)) if r[0] == "x86-64 C++" and r[2].startswith("linked")]
    assert len(rows) == 1
    assert rows[0][3] == "**0.9000** (`.text` 0.9000): held, tests passing"
    assert rows[0][4] == "**0.8500** (`.text` 0.8500): aaa, zzz, tests passing"  # 3400 of 4000 bytes, not a mean
    page_rows = {r[0]: r for r in _table_rows(results_page(root))}
    assert page_rows["aaa-1.0 (outside the training list)"][2:5] == ["0.8000", "0.8000", "0.8000"]
    assert page_rows["held-1.0 (held out)"][5] == "passed / passed"


def test_another_targets_inliner_is_its_own_row_and_its_sets_stay_out_of_x86_64s(tmp_path):
    """An inliner shipped for AArch64 (pretrained/aarch64/inline-size.provenance.json): the README's AArch64 C++ row
    reads its held-out figure and its own sets outside the training list; x86-64's C++ row does not change."""
    root = tmp_path / "pretrained"
    shutil.copytree(PRETRAINED_DIR, root, ignore=shutil.ignore_patterns("*.onnx"))
    path = root / "aarch64" / "inline-size.provenance.json"
    x86 = _readme_rows(readme_results(root))["x86-64 C++"]
    if not path.is_file():  # a package that ships none for AArch64: the test's own
        shutil.copy(root / "inline-size.provenance.json", path)
    provenance = json.loads(path.read_text())
    held = provenance["figures"]["heldout"]["C++"]
    figures = {
        "evaluated": 10,
        "total_ratio": 0.81234,
        "dottext_ratio": 0.8,
        "regressed_over_1pct": 0,
        "heuristic_text_bytes": 1000,
    }
    provenance["figures"]["unseen_packages_with_shipped_policies"] = [{"corpus": "a64-new", "C++": figures}]
    sizes = {"text": 1000, "dottext": 500, "file": 2000}
    provenance["figures"]["linked_builds"] = [
        {"package": "tool", "source": "tool-1.0", "side": "heldout", "target": "aarch64-linux-gnu", "outputs": 1,
         "plain": sizes, "optgym": {**sizes, "text": 950}, "tests": {"plain": "passed", "optgym": "passed"}}
    ]  # fmt: skip
    path.write_text(json.dumps(provenance))
    rows = _readme_rows(readme_results(root))
    assert rows["AArch64 C++"][3].startswith(f"**{held['total_ratio']:.4f}** ({held['evaluated']} modules;")
    assert rows["AArch64 C++"][4] == "**0.8123** (10 modules; none > 1 % worse): `a64-new`"
    assert rows["x86-64 C++"] == x86
    page = results_page(root)
    assert "| a64-new (outside the training list) | C++ | 10 | 0.8123 |" in page
    targets = page.split("## Other targets")[1]
    assert "| tool-1.0 (held out) | 1 | 0.9500 | 1.0000 | 1.0000 | passed / passed | — |" in targets
