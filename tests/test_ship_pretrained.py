"""maintainer/ship_pretrained.py --unseen on real compiles: every shipped policy's figures on a corpus land in every
shipped provenance, one entry per corpus, and nothing else of the provenance changes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from maintainer import ship_pretrained
from optgym.corpus.info import raw_cc1_args
from optgym.corpus.target import module_triple
from optgym.policies import PRETRAINED_NAMES, pretrained_provenance
from optgym.policies.portfolio import load_portfolio


def test_unseen_figures_go_into_every_shipped_provenance(corpus, tmp_path, monkeypatch):
    tool = ship_pretrained
    copies = {}
    for problem in PRETRAINED_NAMES:
        copies[problem] = tmp_path / f"{problem}.provenance.json"
        shutil.copy(pretrained_provenance(problem), copies[problem])
    before = {problem: json.loads(path.read_text()) for problem, path in copies.items()}
    monkeypatch.setattr(tool, "pretrained_provenance", lambda problem="inline-size": copies[problem])
    shipped = pretrained_provenance("inline-size").read_bytes()

    assert tool.add_unseen([corpus.root], workers=1) == 0
    assert tool.add_unseen([corpus.root], workers=1) == 0  # measured again: the entry is replaced, not added
    for problem, path in copies.items():
        after = json.loads(path.read_text())
        entries = after["figures"].pop(tool.UNSEEN)
        (entry,) = [e for e in entries if e["corpus"] == corpus.root.name]
        assert entry["with"] == ["inline-size", *tool.shipped_scorers()]
        assert entry["candidates"] == load_portfolio().default_count  # what optgym-cc compiles a C object by default
        assert entry["all"]["evaluated"] == len(corpus) and entry["all"]["failed"] == 0
        assert entry["C"]["evaluated"] + entry["C++"]["evaluated"] == len(corpus)
        assert [e for e in entries if e is not entry] == before[problem]["figures"].pop(tool.UNSEEN, [])
        assert after == before[problem]  # nothing else of the provenance changed
    assert pretrained_provenance("inline-size").read_bytes() == shipped  # the package's own files untouched


def test_scorers_alone_go_into_each_scorer_provenance(corpus, tmp_path, monkeypatch):
    """``--scorers-alone``: each allocator scorer alone and the scorers together, on the corpus's C modules only,
    into the scorers' provenances (not the inliner's); measured again, the corpus's entry is replaced."""
    tool = ship_pretrained
    copies = {problem: tmp_path / f"{problem}.provenance.json" for problem in PRETRAINED_NAMES}
    for problem, path in copies.items():
        shutil.copy(pretrained_provenance(problem), path)
    before = {problem: json.loads(path.read_text()) for problem, path in copies.items()}
    monkeypatch.setattr(tool, "pretrained_provenance", lambda problem="inline-size": copies[problem])

    assert tool.add_scorers_alone([corpus.root], workers=1) == 0
    assert tool.add_scorers_alone([corpus.root], workers=1) == 0
    scorers = tool.shipped_scorers()
    c_modules = [m for m in corpus if m.family == "C"]
    assert scorers == ["regalloc-evict", "regalloc-priority"] and len(c_modules) == 2
    for problem in scorers:
        after = json.loads(copies[problem].read_text())
        entries = after["figures"].pop(tool.ALONE)
        (entry,) = [e for e in entries if e["corpus"] == corpus.root.name]
        assert [e for e in entries if e is not entry] == before[problem]["figures"].pop(tool.ALONE, [])  # kept
        assert entry["scorers"] == scorers
        for configuration in (*scorers, "together"):
            figures = entry[configuration]
            assert figures["C"]["evaluated"] == 2 and figures["C++"]["evaluated"] == 0  # C only: the scorers' language
            largest = figures["largest_package"]
            assert largest["package"] in {m.name for m in c_modules}  # a module here is its own package
            assert largest["ratio"] >= figures["C"]["total_ratio"] - 1e-9  # the most of ratios the total averages
        assert after == before[problem]  # nothing else changed
    assert json.loads(copies["inline-size"].read_text()) == before["inline-size"]  # the inliner's is not a scorer's


def test_the_largest_package_is_the_one_whose_bytes_grew_most():
    """Sums per package, not a module's ratio: one small module made larger does not make its package the largest."""
    from optgym.train.evaluation import ModuleRow

    def row(module: str, clang: int, policy: int) -> ModuleRow:
        return ModuleRow(module, clang, policy, clang, policy, None, policy / clang if clang else None, 1, 1, 0.1, "ok")

    rows = [row("a/small.o", 100, 150), row("a/big.o", 10_000, 9_000), row("b/one.o", 1_000, 1_020),
            row("c/empty.o", 0, 0)]  # fmt: skip
    assert ship_pretrained.largest_package(rows) == {"package": "b", "ratio": 1.02}


def test_a_targets_inliner_is_measured_by_its_own_file_into_its_own_provenance(toolchain, tmp_path, monkeypatch):
    """``--unseen --target aarch64`` measures the inliner shipped for AArch64 (by its path, not x86-64's
    ``pretrained``) on an AArch64 corpus, and records the set in that file's provenance only, replacing an entry of
    the same set."""
    from conftest import FANOUT_SOURCE, _corpus

    shipped = ship_pretrained.target_path("aarch64")
    if not shipped.is_file():
        pytest.skip("this optgym ships no AArch64 inliner")
    source = FANOUT_SOURCE.replace("extern void sink", 'extern "C" void sink')
    a64 = _corpus(toolchain, tmp_path / "a64", {"fanout": (".cpp", source)}, ("-Oz", "--target=aarch64-linux-gnu"))
    assert [module_triple(raw_cc1_args(m)) for m in a64] == ["aarch64-unknown-linux-gnu"]
    copy = tmp_path / "aarch64" / "inline-size.onnx"
    copy.parent.mkdir()
    shutil.copy(shipped, copy)
    shutil.copy(shipped.with_suffix(".provenance.json"), copy.with_suffix(".provenance.json"))
    x86 = pretrained_provenance("inline-size").read_bytes()
    monkeypatch.setattr(ship_pretrained, "target_path", lambda target: copy)
    for _ in range(2):
        assert ship_pretrained.add_target_unseen("aarch64", [a64.root], workers=1) == 0
    entries = json.loads(copy.with_suffix(".provenance.json").read_text())["figures"][ship_pretrained.UNSEEN]
    (entry,) = [e for e in entries if e["corpus"] == a64.root.name]
    assert entry["with"] == ["inline-size"] and entry["C++"]["evaluated"] == 1
    assert entry["C++"]["policy_text_bytes"] < entry["C++"]["heuristic_text_bytes"]  # the deleting inline
    assert pretrained_provenance("inline-size").read_bytes() == x86  # x86-64's provenance untouched


def test_every_shipped_policy_file_is_installed_with_the_package():
    """An install that is not editable (a wheel) carries only the files pyproject's package data names: AArch64's
    inliner (pretrained/aarch64/inline-size.onnx) was left out, so optgym-cc had nothing to serve for it there."""
    import tomllib

    root = Path(__file__).resolve().parents[1]
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    package = root / "src" / "optgym" / "policies"
    installed = {path for pattern in patterns["optgym.policies"] for path in package.glob(pattern)}
    shipped = {p for p in (package / "pretrained").rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert shipped, "the package ships policy files"
    assert sorted(str(p.relative_to(package)) for p in shipped - installed) == []
