"""research/seed_interval.py: a registered claim's three checks, read from the seeds' evaluate reports."""

from __future__ import annotations

import json

import pytest

from research.seed_interval import main

pytestmark = pytest.mark.research


def _reports(tmp_path, seeds):
    dirs = []
    for k, (total, worse) in enumerate(seeds):
        report = tmp_path / f"seed{k}"
        report.mkdir()
        report.joinpath("report.json").write_text(
            json.dumps({"total_ratio": total, "regressed_over_1pct": worse, "evaluated": 141})
        )
        dirs.append(str(report))
    return dirs


def test_three_seeds_each_below_can_still_miss_on_the_interval(tmp_path, capsys):
    reports = _reports(tmp_path, [(0.8862, 0), (0.8912, 0), (0.8998, 2)])  # d30's held-out totals
    assert main([*reports, "--bar", "0.90926"]) == 1
    assert "[0.8753, 0.9095]" in capsys.readouterr().out  # mean ± 4.303·sd/√3
    assert main([*reports, "--bar", "0.9100"]) == 0


def test_a_seed_over_the_share_of_worse_modules_fails_the_claim(tmp_path):
    reports = _reports(tmp_path, [(0.88, 0), (0.881, 3), (0.882, 0)])  # 3 of 141 is over 2 %
    assert main([*reports, "--bar", "0.90926"]) == 1
    assert main([*reports, "--bar", "0.90926", "--max-worse-share", "0.03"]) == 0
