"""research/levers.py on real compiles: each alternative is the compile it names, and the table adds up."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from optgym.toolchain import object_sizes
from research import levers

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.research


def test_each_alternative_is_the_compile_it_names(corpus, corpus_dir, toolchain, tmp_path):
    sizes = levers.compile_alternatives(levers.LeverTask(str(corpus_dir), None, "zoo", 120.0))
    module = corpus.module("zoo")
    for name, (policy, flags) in levers.ALTERNATIVES.items():
        if policy != "heuristic":
            continue
        out = tmp_path / "plain.o"
        assert subprocess.run(module.argv(toolchain.clang, flags, out), timeout=120).returncode == 0
        plain = object_sizes(out)
        assert sizes[name] == (plain.text_bytes, plain.dottext_bytes), name  # the channel changes nothing else
    assert sizes["basic register allocator"] != sizes["-Oz"]  # the flags reach the backend
    assert sizes["never inline"][0] > sizes["-Oz"][0]  # every decision answered "no" (worse on this module)
    table = levers.table([sizes, sizes])
    assert table[0].startswith("2 modules (0 with a failed compile") and len(table) == 3 + len(levers.ALTERNATIVES)
    thresholds = min(sizes[name][0] for name in ("-Oz", *levers.THRESHOLDS)) / sizes["-Oz"][0]
    assert table[-1].startswith("-Oz and thresholds, smallest") and table[-1].endswith(f"{thresholds:.4f}")


def test_the_command_prints_the_table_for_the_chosen_alternatives(corpus_dir):
    result = subprocess.run([sys.executable, "-m", "research.levers", str(corpus_dir), "--split", "all",
                             "--language", "C++", "--modules", "1", "--only", "module inliner", "-j", "1"],
                            capture_output=True, text=True, timeout=300, cwd=ROOT)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    lines = lines[next(i for i, line in enumerate(lines) if line.startswith("1 modules")) :]  # after the progress bar
    assert lines[2].startswith("module inliner") and lines[3].startswith("all, smallest") and len(lines) == 4
