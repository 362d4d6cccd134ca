"""Mean and 95 % confidence interval over a few seeds — the one statistic optgym's comparisons report.

Student's t, because comparisons here run 3–5 seeds, where the normal's 1.96 would understate the
interval by half; the quantiles are tabulated (scipy is not a dependency for one function).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

#: Student t, 0.975 quantile, by degrees of freedom; beyond 30 the normal's.
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
        10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042}  # fmt: skip


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (the table's next smaller df)."""
    if df > 30:
        return 1.96
    return T975[max(k for k in T975 if k <= df)]


def mean_ci(values: Sequence[float]) -> dict[str, Any]:
    """Mean and the half-width of its 95 % confidence interval (``None`` with fewer than two values)."""
    values = [float(v) for v in values]
    if not values:
        return {"n": 0, "mean": None, "ci95": None}
    mean = statistics.fmean(values)
    half = t975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None
    return {"n": len(values), "mean": mean, "ci95": half, "values": values}


__all__ = ["mean_ci", "t975"]
