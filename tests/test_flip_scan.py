"""research/flip_scan.py on real compiles: every flip is the decision it claims, and a rerun measures the same."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCAN = [sys.executable, "-m", "research.flip_scan"]  # run from the repository root
pytestmark = pytest.mark.research


def _scan(corpus_dir: Path, out: Path, *extra: str) -> list[dict]:
    result = subprocess.run([*SCAN, str(corpus_dir), "--split", "all", "--language", "C++",
                             "--modules", "1", "--max-flips", "4", "--hi", "1000", "-j", "1", "-o", str(out), *extra],
                            capture_output=True, text=True, timeout=300, cwd=ROOT)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "callee users" in result.stdout  # the summary table
    out.with_name(out.name + ".stdout").write_text(result.stdout)
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_flips_to_inline_are_candidates_and_reproduce(corpus_dir, tmp_path):
    rows = _scan(corpus_dir, tmp_path / "a.jsonl")
    assert 1 <= len(rows) <= 4
    for r in rows:
        over = r["cost_estimate"] - r["threshold"]
        assert r["to"] == 1 and 1 <= over <= 1000 and r["decision"] < r["decisions"]
        assert r["delta_text"] == int(r["delta_text"]) and r["base_text"] > 0
    assert _scan(corpus_dir, tmp_path / "b.jsonl") == rows  # each flip is one deterministic compile


def test_undo_flips_clangs_own_inlines(corpus_dir, tmp_path):
    rows = _scan(corpus_dir, tmp_path / "u.jsonl", "--undo", "--policy", "heuristic")
    assert rows and all(r["to"] == 0 and r["heuristic"] == 1 for r in rows)
    assert all(-1000 <= r["cost_estimate"] - r["threshold"] <= -1 for r in rows)


def test_an_unknown_policy_is_a_clear_error(corpus_dir, tmp_path):
    result = subprocess.run([*SCAN, str(corpus_dir), "--split", "all", "--policy", "nope",
                             "-o", str(tmp_path / "x.jsonl")],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)  # fmt: skip
    assert result.returncode != 0 and "nope" in result.stderr
    assert not (tmp_path / "x.jsonl").exists()


def test_a_compile_that_times_out_is_reported_not_counted(corpus_dir, tmp_path):
    rows = _scan(corpus_dir, tmp_path / "t.jsonl", "--timeout", "0.001")
    assert rows == []
    assert "compiles failed" in (tmp_path / "t.jsonl.stdout").read_text()


def test_where_keeps_only_call_sites_within_the_bounds(corpus_dir, tmp_path):
    everything = _scan(corpus_dir, tmp_path / "all.jsonl", "--max-flips", "1000")
    users = sorted({r["callee_users"] for r in everything})
    assert len(users) > 1, "the test module needs callees with different user counts"
    bound = users[0]
    kept = _scan(corpus_dir, tmp_path / "w.jsonl", "--max-flips", "1000", "--where", f"callee_users<={bound}")
    assert kept == [r for r in everything if r["callee_users"] <= bound]


def test_a_malformed_where_is_a_clear_error(corpus_dir, tmp_path):
    result = subprocess.run([*SCAN, str(corpus_dir), "--where", "no_such_feature<=2",
                             "-o", str(tmp_path / "x.jsonl")],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)  # fmt: skip
    assert result.returncode != 0 and "no_such_feature" in result.stderr
