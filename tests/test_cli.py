"""The command line, run as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from optgym.corpus.embedded import corpus_from_sources
from optgym.protocol.transcript import read_transcript


def optgym(*args: str, check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "optgym.cli", *args], capture_output=True, text=True, timeout=300, env=env
    )
    if check:
        assert proc.returncode == 0, proc.stderr + proc.stdout
    return proc


def test_doctor_reports_clang_and_hooks():
    # 40 columns: shorter than the lines with paths in them, which rich would wrap unless doctor keeps one per line
    # (CI's checkout path once split "runs clang-22" off its line)
    out = optgym("doctor", env={**os.environ, "COLUMNS": "40"}).stdout
    assert "clang version 22." in out
    assert "inliner" in out and "yes" in out
    compilers = [line for line in out.splitlines() if line.startswith("compiler ")]
    assert len(compilers) == 2 and all(line.endswith("runs clang-22") for line in compilers), out
    lanes = next(line for line in out.splitlines() if line.startswith("lanes "))
    assert Path(lanes.split()[1]).is_file(), out  # the library a served ThinLTO link preloads into lld, built here


def test_doctor_says_what_the_cache_holds_part_by_part(tmp_path, monkeypatch):
    """Nothing trims the cache (the trajectory store grows with every pattern search), so doctor shows each part's
    size, largest first, and an empty cache as empty."""
    from optgym.cli import _cache_summary
    from optgym.files import cache_usage

    monkeypatch.setenv("OPTGYM_CACHE_DIR", str(tmp_path))
    assert _cache_summary().endswith("empty")
    (tmp_path / "evaluate").mkdir()
    (tmp_path / "evaluate" / "a.json").write_bytes(b"x" * 2_000)
    (tmp_path / "trajectories" / "ab").mkdir(parents=True)
    (tmp_path / "trajectories" / "ab" / "t.npz").write_bytes(b"x" * 3_000_000)
    (tmp_path / "lanes").mkdir()
    assert cache_usage() == {"trajectories": 3_000_000, "evaluate": 2_000, "lanes": 0}
    assert _cache_summary() == f"{tmp_path}  3 MB (trajectories 3 MB, evaluate 2 kB); any part may be deleted, " + (
        "at the price of recompiling it"
    )


def test_evaluate_never_vs_heuristic_json(corpus_dir, tmp_path):
    out = optgym("evaluate", "--corpus", str(corpus_dir), "--policy", "never", "-j", "2", "-o", str(tmp_path), "--json")
    report = json.loads(out.stdout)
    assert report == json.loads((tmp_path / "report.json").read_text())
    assert report["modules"] == 3 and report["failed"] == 0
    assert report["policy_text_bytes"] > report["heuristic_text_bytes"] > 0
    assert report["never_inline_text_bytes"] == report["policy_text_bytes"]


def test_evaluate_one_language(corpus_dir, tmp_path):
    out = optgym("evaluate", "--corpus", str(corpus_dir), "--language", "C", "-j", "1", "-o", str(tmp_path), "--json")
    report = json.loads(out.stdout)
    assert report["modules"] == 2 and report["language"] == "C"  # tree.c and leaf.c, not zoo.cpp
    bad = optgym("evaluate", "--corpus", str(corpus_dir), "--language", "Fortran", check=False)
    assert bad.returncode != 0 and "C or C++" in bad.stderr + bad.stdout


def test_evaluate_every_kth_module_is_a_fixed_sample_by_name(corpus_dir, tmp_path):
    """``--every 2``: the first and third module by name, compiled for real; with ``--language C`` the step is
    taken over the C modules only. A step below 1 is refused."""
    from optgym.corpus import Corpus

    names = sorted(m.name for m in Corpus(corpus_dir))
    assert len(names) == 3, "the test needs a three-module corpus"
    sampled = tmp_path / "a"
    out = optgym("evaluate", "--corpus", str(corpus_dir), "--every", "2", "-j", "2", "-o", str(sampled), "--json")
    report = json.loads(out.stdout)
    assert report["modules"] == 2 and report["every"] == 2
    rows = (sampled / "modules.csv").read_text().splitlines()[1:]
    assert sorted(row.split(",")[0] for row in rows) == names[::2]
    c_only = sorted(m.name for m in Corpus(corpus_dir) if m.family == "C")
    out = optgym("evaluate", "--corpus", str(corpus_dir), "--language", "C", "--every", "2", "-j", "1", "-o",
                 str(tmp_path / "c"), "--json")  # fmt: skip
    rows = (tmp_path / "c" / "modules.csv").read_text().splitlines()[1:]
    assert [row.split(",")[0] for row in rows] == c_only[::2] and json.loads(out.stdout)["modules"] == 1
    bad = optgym("evaluate", "--corpus", str(corpus_dir), "--every", "0", check=False)
    assert bad.returncode != 0 and "--every 0" in bad.stderr + bad.stdout


def test_evaluate_heuristic_table(corpus_dir, tmp_path):
    out = optgym("evaluate", "--corpus", str(corpus_dir), "--parallel", "1", "--report", str(tmp_path)).stdout
    assert "1.0000" in next(line for line in out.splitlines() if "Berkeley text" in line)
    assert "improved 0, regressed 0, same 3, failed 0" in out
    assert (tmp_path / "report.md").exists() and (tmp_path / "modules.csv").exists()


def test_evaluate_on_missing_corpus_is_a_clear_error(tmp_path):
    proc = optgym("evaluate", "--corpus", str(tmp_path / "nope"), check=False)
    assert proc.returncode == 1 and "not a corpus" in proc.stderr


def test_evaluate_of_a_corpus_without_code_is_an_error_not_a_ratio(toolchain, tmp_path):
    source = tmp_path / "table.c"
    source.write_text("int table[4] = {1, 2, 3, 4};\nint counter;\n")  # data only: Berkeley text 0
    corpus_from_sources(toolchain, {"table": source}, tmp_path / "corpus", flags=("-Oz",))
    proc = optgym("evaluate", "--corpus", str(tmp_path / "corpus"), "-j", "1", "-o", str(tmp_path / "r"), check=False)
    assert proc.returncode == 1 and "compiled to an object without code" in proc.stderr
    assert json.loads((tmp_path / "r" / "report.json").read_text())["evaluated"] == 1  # the report is kept


def test_evaluate_unknown_policy_is_a_clear_error(corpus_dir):
    proc = optgym("evaluate", "--corpus", str(corpus_dir), "--policy", "clever", check=False)
    assert proc.returncode == 1 and "unknown policy 'clever'" in proc.stderr


def test_transcript_flag_and_replay(corpus_dir, tmp_path):
    args = ["--policy", "random", "-j", "1", "--transcript", str(tmp_path / "t"), "-o", str(tmp_path / "r")]
    optgym("evaluate", "--corpus", str(corpus_dir), *args)
    path = tmp_path / "t" / "zoo.transcript"
    t = read_transcript(path)
    assert t.complete and len(t.answers) > 10
    out = optgym("replay", str(path), "--limit", "3").stdout
    assert "39 features" in out and "inlining_default" in out
    assert "#0 " in out and "#3 " not in out
    assert f"answers {len(t.answers)}" in out and '"status": "ok"' in out


def test_replay_of_a_truncated_transcript_says_so(corpus_dir, tmp_path):
    optgym("evaluate", "--corpus", str(corpus_dir), "-j", "1", "--transcript", str(tmp_path / "t"), "-o", str(tmp_path))
    path = tmp_path / "t" / "zoo.transcript"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    out = optgym("replay", str(path)).stdout
    assert "ends abruptly" in out


@pytest.mark.parametrize("args", [["evaluate", "--help"], ["replay", "--help"], ["demo", "--help"]])
def test_help(args):
    assert "Usage" in optgym(*args).stdout


def test_error_messages_print_text_verbatim(tmp_path):
    """A message is printed as written: rich would otherwise turn ``:a:`` in a path or a usage hint into 🅰."""
    missing = tmp_path / "corpus:a:1"
    proc = optgym("evaluate", "--corpus", str(missing), "--policy", "heuristic", "-o", str(tmp_path / "r"), check=False)
    assert proc.returncode != 0
    assert "corpus:a:1" in proc.stderr + proc.stdout


def test_extras_shorthand_expands_among_other_inputs():
    from optgym.problems.inputs import RESIDUAL_EXTRAS
    from optgym.train.cli import parse_extras_option

    assert parse_extras_option("residual,cxx") == [*RESIDUAL_EXTRAS, "cxx"]
    assert parse_extras_option("cxx, residual") == ["cxx", *RESIDUAL_EXTRAS]
    assert parse_extras_option("none") == [] and parse_extras_option("heuristic") == ["heuristic"]
