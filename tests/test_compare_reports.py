"""research/compare_reports.py: per-group totals of two evaluate reports, over the modules both compiled."""

from __future__ import annotations

import pytest

from research.compare_reports import grouped, size_bin

pytestmark = pytest.mark.research


def _row(clang: int, policy: int) -> dict[str, int]:
    half = {"heuristic_dottext": clang // 2, "policy_dottext": policy // 2}
    return {"heuristic_text": clang, "policy_text": policy, **half}


def test_groups_sum_sizes_before_dividing_and_skip_modules_only_one_side_compiled():
    baseline = {"a/x.o": _row(1000, 900), "a/y.o": _row(3000, 3000), "b/z.o": _row(50000, 40000), "b/w.o": _row(10, 9)}
    candidate = {"a/x.o": _row(1000, 800), "a/y.o": _row(3000, 3300), "b/z.o": _row(50000, 45000)}
    by_package = grouped(baseline, candidate, lambda name: name.split("/")[0])
    assert by_package["a"]["modules"] == 2 and by_package["b"]["modules"] == 1  # b/w.o: the candidate failed it
    assert by_package["a"]["baseline"] == pytest.approx((900 + 3000) / 4000)
    assert by_package["a"]["candidate"] == pytest.approx((800 + 3300) / 4000)  # not the mean of 0.8 and 1.1
    assert by_package["b"]["candidate_dottext"] == pytest.approx(22500 / 25000)
    by_size = grouped(baseline, candidate, lambda name: size_bin(baseline[name]["heuristic_text"]))
    assert set(by_size) == {"under 2 kB", "2-20 kB", "20 kB or more"}
