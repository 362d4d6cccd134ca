"""research/module_groups.py: an evaluate report's modules summed by bundled library."""

from __future__ import annotations

import pytest

from research.module_groups import group_totals

pytestmark = pytest.mark.research


def _row(module: str, clang: int, policy: int, status: str = "ok") -> dict[str, str]:
    sizes = {
        "heuristic_text": clang,
        "policy_text": policy,
        "heuristic_dottext": clang // 2,
        "policy_dottext": policy // 2,
    }
    return {"module": module, "status": status, **{k: str(v) for k, v in sizes.items()}}


def test_modules_count_in_their_first_matching_group_and_failures_in_none():
    rows = [_row("poco/src/pcre_exec.c.o", 1000, 900), _row("poco/src/pcre_study.c.o", 100, 102),
            _row("poco/src/xmltok.c.o", 500, 505), _row("poco/src/pcre_get.c.o", 50, 10, status="timeout"),
            _row("poco/src/other.c.o", 7, 7)]  # fmt: skip
    totals = group_totals(rows, [("pcre", "/pcre_"), ("any", r"\.c\.o$")])
    assert totals["pcre"]["modules"] == 2 and totals["pcre"]["worse"] == 1  # 102 > 1.01 × 100; the timeout is out
    assert totals["pcre"]["policy_text"] / totals["pcre"]["heuristic_text"] == pytest.approx(1002 / 1100)
    assert totals["any"]["modules"] == 2  # xmltok and other: pcre's modules matched the first group already
    assert totals["any"]["worse"] == 0  # 505 is exactly 1 % above 500, not more
