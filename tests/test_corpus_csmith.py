"""csmith corpora (``optgym corpus csmith``) and the ``--max-decisions`` module filter.

Seed 15 is chosen because two of its first three programs are tiny (2 and 4 KB of C, the other 100 KB;
a typical csmith program is 100-250 KB), which keeps these tests at seconds; any seed would do.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import live_children, runtime_leftovers

import optgym
from optgym.corpus import Corpus
from optgym.corpus.csmith import (
    CsmithTask,
    build_csmith_corpus,
    csmith_version,
    derive_seed,
    make_program,
    module_name,
)
from optgym.corpus.extract import extract, over_limit_reason
from optgym.corpus.info import SizeTask
from optgym.corpus.merge import merge_corpora
from optgym.errors import CorpusError
from optgym.rollout.heuristic import heuristic_decisions

SEED = 15


def _bytes(corpus: Corpus) -> dict[str, tuple[bytes, bytes]]:
    return {m.name: (m.bitcode.read_bytes(), m.command.read_bytes()) for m in corpus}


@pytest.fixture(scope="module")
def csmith_corpus(toolchain, tmp_path_factory) -> Corpus:
    root = tmp_path_factory.mktemp("csmith") / "corpus"
    report = build_csmith_corpus(toolchain, root, count=3, seed=SEED, workers=2, progress=False)
    assert report.failed == [] and report.new == 3 and report.modules == 3
    return Corpus(root)


def test_csmith_corpus_records_its_provenance(csmith_corpus):
    assert [m.name for m in csmith_corpus] == [module_name(SEED, i) for i in range(3)]
    meta = csmith_corpus.description["optgym"]["csmith"]
    assert meta["version"] == csmith_version() and meta["version"].startswith("2.")
    assert meta["seed"] == SEED and meta["count"] == 3 and meta["failed"] == {}
    assert meta["seeds"] == {module_name(SEED, i): derive_seed(SEED, i) for i in range(3)}
    assert meta["config"]["opt"] == "-Oz" and "-fembed-bitcode=all" in meta["config"]["flags"]
    assert csmith_corpus.description["optgym"]["provenance"]["tool"] == "optgym corpus csmith"
    assert not (csmith_corpus.root / ".optgym-work").exists()  # the work area is gone once the corpus is in place
    # the replayed command carries no temporary path (it would make two builds of one seed differ)
    assert all("/tmp/" not in " ".join(m.cc1_args) for m in csmith_corpus)


def test_seeds_differ_between_programs_and_corpora():
    seeds = {derive_seed(s, i) for s in range(3) for i in range(100)}
    assert len(seeds) == 300 and all(1 <= s < 2**32 for s in seeds)


def test_same_seed_same_bytes_and_a_larger_n_adds_only_the_rest(csmith_corpus, toolchain, tmp_path):
    root = tmp_path / "grown"
    first = build_csmith_corpus(toolchain, root, count=2, seed=SEED, workers=2, progress=False)
    assert (first.new, first.reused, first.modules) == (2, 0, 2)
    inode = (root / f"{module_name(SEED, 0)}.bc").stat().st_ino
    proc = subprocess.run([sys.executable, "-m", "optgym.cli", "corpus", "csmith", "-n", "3", "--seed", str(SEED),
                           "-o", str(root), "-j", "2"], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "1 new, 2 reused" in " ".join(proc.stdout.split())
    assert (root / f"{module_name(SEED, 0)}.bc").stat().st_ino == inode  # linked over, not rebuilt
    assert _bytes(Corpus(root)) == _bytes(csmith_corpus)  # deterministic: same seed, same bitcode and command


def _compilers_left() -> list[list[str]]:
    """Live descendants other than multiprocessing's forkserver and resource tracker (the corpus fixture's pool
    starts them; they outlive it by design and never run a compiler)."""
    return [c.cmdline() for c in live_children() if "multiprocessing" not in " ".join(c.cmdline())]


def test_csmith_modules_run_through_the_env(csmith_corpus):
    env = optgym.make("inline-size", corpus=csmith_corpus.root, on_error="raise")
    env.action_space.seed(0)
    try:
        for module in csmith_corpus:
            obs, info = env.reset(options={"module": module.name})
            steps, done = 0, False
            while not done:
                assert env.observation_space.contains(obs)
                obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
                steps += 1
                done = terminated or truncated
            assert terminated and info["status"] == "ok" and info["decisions"] == steps
            assert math.isfinite(reward) and info["policy_text_bytes"] > 0
    finally:
        env.close()
    assert not _compilers_left() and not runtime_leftovers()


def test_a_directory_that_is_not_a_csmith_corpus_is_not_replaced(corpus_dir, toolchain, tmp_path):
    with pytest.raises(CorpusError, match="not made by `optgym corpus csmith`"):
        build_csmith_corpus(toolchain, corpus_dir, count=1, seed=SEED, progress=False)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(CorpusError, match="is not a corpus"):
        build_csmith_corpus(toolchain, tmp_path, count=1, seed=SEED, progress=False)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_merge_with_max_decisions_keeps_modules_within_the_limit(csmith_corpus, tmp_path):
    counts = {m.name: heuristic_decisions(SizeTask(m, "inline-size", 300))["decisions"] for m in csmith_corpus}
    limit = sorted(counts.values())[1]  # the middle one: at least one module on each side
    merged = merge_corpora([csmith_corpus.root], tmp_path / "small", max_decisions=limit, workers=2)
    kept = {m.name for m in merged}
    assert kept == {n for n, c in counts.items() if c <= limit} and 0 < len(kept) < 3
    record = merged.description["optgym"]["max_decisions"]
    assert record["limit"] == limit
    assert record["left_out"] == {n: over_limit_reason(limit) for n in counts if n not in kept}
    with pytest.raises(CorpusError, match="max-decisions"):
        merge_corpora([csmith_corpus.root], tmp_path / "none", max_decisions=-1)


def test_extract_with_max_decisions_reports_what_it_left_out(toolchain, tmp_path):
    """``a`` has no call site; ``b`` calls a helper several times, so it has decisions."""
    clang = str(toolchain.clang)
    (tmp_path / "a.c").write_text("int a(int x) { return x + 1; }\n")
    (tmp_path / "b.c").write_text(
        "static int h(int x) { return x * x + 3; }\nint b(int x) { return h(x) + h(x + 1) + h(h(x)); }\n"
    )
    database = []
    for name in ("a", "b"):
        argv = [clang, "-Oz", "-Xclang", "-fembed-bitcode=all", "-c", f"{name}.c", "-o", f"{name}.o"]
        subprocess.run(argv, cwd=tmp_path, check=True)
        database.append({"directory": str(tmp_path), "file": f"{name}.c", "arguments": argv})
    (tmp_path / "compile_commands.json").write_text(json.dumps(database))
    report = extract(toolchain, tmp_path / "compile_commands.json", tmp_path / "corpus", max_decisions=0, workers=2)
    assert report.modules == ["a.o"]
    assert dict(report.skipped)["b.o"] == over_limit_reason(0)
    assert not Path(tmp_path / "corpus" / "b.o.bc").exists()
    assert Corpus(tmp_path / "corpus").description["optgym"]["provenance"]["skipped"] == {over_limit_reason(0): 1}


def test_a_second_run_on_the_same_corpus_is_refused_while_the_first_runs(toolchain, tmp_path):
    from optgym.corpus.csmith import _exclusive

    dest = tmp_path / "busy"
    with _exclusive(dest), pytest.raises(CorpusError, match="another `optgym corpus csmith` is writing"):
        build_csmith_corpus(toolchain, dest, count=1, seed=SEED, progress=False)


def test_a_program_clang_fails_on_is_reported_with_its_source_kept(tmp_path):
    """A missing csmith.h stands in for a clang bug: the result names the status and where the source is."""
    task = CsmithTask(
        0, derive_seed(SEED, 0), "p", str(tmp_path / "work"), "/nonexistent", "-Oz", str(tmp_path / "logs")
    )
    result = make_program(task)
    assert result.status == "compile_error" and "csmith.h" in result.detail
    assert (tmp_path / "logs" / "p.c").read_text().startswith("/*\n * This is a RANDOMLY GENERATED PROGRAM.")
    assert not (tmp_path / "work" / "p.bc").exists()
