"""Evaluation against the heuristic: exact, deterministic, cached, and honest about failures."""

from __future__ import annotations

import json
import shutil

import pytest

from optgym.corpus import Corpus
from optgym.evaluate import evaluate, summarize
from optgym.evaluate.report import write_report
from optgym.train.evaluation import GUARD_BELOW

IDENTITY = {"policy": "p", "problem": "inline-size", "corpus": "c", "compiler": "clang"}


def test_heuristic_evaluates_to_exactly_one(corpus, tmp_path):
    rows = evaluate("heuristic", corpus, workers=1, progress=False)
    s = summarize(rows)
    assert s["total_ratio"] == 1.0 and s["geomean_ratio"] == 1.0
    assert (s["improved"], s["regressed"], s["same"], s["failed"]) == (0, 0, 3, 0)
    assert s["decisions_differing"] == 0


def test_never_inline_is_worse_on_cxx(corpus):
    rows = {r.module: r for r in evaluate("never", corpus, workers=1, progress=False)}
    assert rows["zoo"].policy_text > rows["zoo"].heuristic_text
    assert rows["zoo"].decisions_differing > 0
    assert rows["leaf"].ratio == 1.0  # no call site: nothing to decide
    s = summarize(list(rows.values()))
    assert s["total_ratio"] > 1.0 and s["guarded_ratio"] == 1.0  # the guard keeps clang's object wherever never loses
    # guarding only objects under a bound: zoo's never-inline object is over 2 kB of text, so it stays
    zoo = rows["zoo"]
    assert zoo.policy_text > GUARD_BELOW and zoo.guarded_below(GUARD_BELOW) == zoo.policy_text
    assert zoo.guarded_below(zoo.policy_text + 1) == zoo.heuristic_text
    assert s["guarded_below_ratio"] > 1.0 and s["guarded_below_over_1pct"] == (zoo.ratio > 1.01)


def test_report_is_deterministic_apart_from_timing(corpus, tmp_path):
    reports = []
    for i in range(2):
        rows = evaluate("random:7", corpus, workers=2, progress=False)
        report = write_report(tmp_path / str(i), rows, IDENTITY)
        report.pop("timing")
        reports.append(report)
        csv = (tmp_path / str(i) / "modules.csv").read_text().splitlines()
        assert csv[0].startswith("module,heuristic_text,policy_text,heuristic_dottext,policy_dottext,ratio")
    assert reports[0] == reports[1]
    on_disk = json.loads((tmp_path / "0" / "report.json").read_text())
    assert on_disk["format_version"] == 1 and on_disk["improved"] + on_disk["regressed"] + on_disk["same"] == 3
    assert (tmp_path / "0" / "ratio_histogram.png").stat().st_size > 1000
    assert "10 worst modules" in (tmp_path / "0" / "report.md").read_text()


def test_results_are_cached(corpus, monkeypatch):
    evaluate("always", corpus, workers=1, progress=False)

    def boom(*a, **k):
        raise AssertionError("a cached evaluation must not compile")

    monkeypatch.setattr("optgym.train.evaluation.rollout", boom)
    rows = evaluate("always", corpus, workers=1, progress=False)
    assert all(r.ok for r in rows)


def test_failed_module_is_counted_and_the_rest_goes_on(corpus, tmp_path):
    root = tmp_path / "c"
    shutil.copytree(corpus.root, root)
    (root / "tree.bc").write_bytes(b"garbage")
    rows = evaluate("never", Corpus(root), workers=1, progress=False)
    report = write_report(tmp_path / "r", rows, IDENTITY)
    assert report["failed"] == 1 and report["evaluated"] == 2
    (failure,) = report["failures"]
    assert failure["module"] == "tree" and "compile_error" in failure["status"]
    assert "tree" in (tmp_path / "r" / "report.md").read_text()


def test_bad_mode_is_refused(corpus):
    with pytest.raises(ValueError, match="mode"):
        evaluate("never", corpus, mode="greedy")


def test_all_snapshots_gives_the_snapshot_curve(corpus_dir, tmp_path):
    import subprocess
    import sys

    import numpy as np

    from optgym.policies.mlp import MLPPolicy
    from optgym.problems.inline_size import FEATURES
    from optgym.problems.normalize import build_vocab

    rng = np.random.default_rng(0)
    vocab = build_vocab({name: rng.integers(0, 100, 500) for name in FEATURES}, num_buckets=16)
    run = tmp_path / "run"
    for i in range(3):
        MLPPolicy.initial(vocab, hidden=(8,), seed=i).save(run / "snapshots" / f"{i:08d}" / "policy")
    out = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-m", "optgym.cli", "evaluate", "--corpus", str(corpus_dir), "--policy",
                           str(run), "--all-snapshots", "-o", str(out), "--json", "-j", "1"],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert [s["snapshot"] for s in report["snapshots"]] == ["00000000", "00000001", "00000002"]
    assert all(s["modules"] == 3 and s["failed"] == 0 for s in report["snapshots"])
    # the run itself means its latest snapshot
    assert report["policy_text_bytes"] == report["snapshots"][-1]["policy_text_bytes"]
    assert (out / "snapshots.png").exists() and "## Snapshots" in (out / "report.md").read_text()
