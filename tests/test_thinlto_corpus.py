"""tools/thinlto_corpus.py on a real -flto=thin build: each module is the distributed backend compile."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from optgym.corpus import Corpus
from optgym.policies import resolve_policy
from optgym.problems import get_problem
from optgym.problems.inline_size import FEATURES
from optgym.rollout import rollout

TOOL = Path(__file__).resolve().parents[1] / "tools" / "thinlto_corpus.py"
LIB = "int scale(int x) { return 3 * x + 1; }\nint twice(int x) { return 2 * scale(x); }\n"
MAIN = "int twice(int);\nint main(int argc, char **argv) { return twice(argc) + twice(argc + 1); }\n"


def test_each_module_compiles_to_its_thinlto_backend_and_its_imports_are_decisions(toolchain, tmp_path):
    clang = str(toolchain.clang)
    for name, source in (("lib", LIB), ("main", MAIN)):
        (tmp_path / f"{name}.c").write_text(source)
        subprocess.run([clang, "-Oz", "-flto=thin", "-c", f"{name}.c", "-o", f"{name}.o"], cwd=tmp_path, check=True)
    corpus_dir = tmp_path / "corpus"
    result = subprocess.run([sys.executable, str(TOOL), "lib.o", "main.o", "-o", str(corpus_dir)],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0 and "2 modules" in result.stdout, result.stderr
    corpus = Corpus(corpus_dir)
    assert sorted(m.name for m in corpus) == ["lib", "main"]

    problem = get_problem("inline-size")
    for module in corpus:
        # the same backend as the driver's distributed ThinLTO compile, byte for byte
        bitcode = corpus_dir / f"{module.name}.bc"
        driver = [clang, "-Oz", "-x", "ir", str(bitcode), f"-fthinlto-index={bitcode}.thinlto.bc", "-c"]
        subprocess.run([*driver, "-o", str(tmp_path / "driver.o")], check=True, timeout=120)
        subprocess.run(module.argv(toolchain.clang, (), tmp_path / "corpus.o"), check=True, timeout=120)
        assert (tmp_path / "corpus.o").read_bytes() == (tmp_path / "driver.o").read_bytes(), module.name
    # main's backend imported `twice` from lib: the channel asks about it, and never-inline changes the object
    main = corpus.module("main")
    heuristic = rollout(problem, main, toolchain, resolve_policy("heuristic").build(), timeout=120,
                        record_features=True)  # fmt: skip
    never = rollout(problem, main, toolchain, resolve_policy("never").build(), timeout=120)
    assert heuristic.result.ok and never.result.ok
    imported = heuristic.trajectory.features[:, FEATURES.index("is_callee_avail_external")]
    assert 1 in imported and 1 in heuristic.trajectory.heuristic, "an imported callee, and clang inlines one"
    assert heuristic.result.metrics["text_bytes"] != never.result.metrics["text_bytes"]


def test_objects_that_are_not_bitcode_are_refused(toolchain, tmp_path):
    (tmp_path / "x.c").write_text(LIB)
    subprocess.run([str(toolchain.clang), "-Oz", "-c", "x.c", "-o", "x.o"], cwd=tmp_path, check=True)
    result = subprocess.run([sys.executable, str(TOOL), "x.o", "-o", "c"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert result.returncode != 0 and "is not bitcode: compile with -flto=thin" in result.stderr
    assert not (tmp_path / "c").exists()


def test_a_failed_link_leaves_no_corpus_behind(toolchain, tmp_path):
    (tmp_path / "lib.c").write_text(LIB)
    for out in ("a.o", "b.o"):  # the same definitions twice: the link fails on a duplicate symbol
        subprocess.run([str(toolchain.clang), "-Oz", "-flto=thin", "-c", "lib.c", "-o", out], cwd=tmp_path, check=True)
    result = subprocess.run([sys.executable, str(TOOL), "a.o", "b.o", "-o", "c"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode != 0 and "the index-only link failed" in result.stderr, result.stderr
    assert "duplicate symbol" in result.stderr
    assert not (tmp_path / "c").exists()
