"""An ``optgym evaluate`` report's modules summed by groups of their names (a bundled library inside a package).

Why: a package such as poco bundles other projects' C sources (pcre, expat, zlib, sqlite3). Some of those are
training or held-out packages here, so a claim about unseen code must count the groups apart.

    python research/module_groups.py REPORT_DIR GROUP=REGEX [GROUP=REGEX …]

Berkeley text and ``.text`` per group (policy ÷ clang), and the modules more than 1 % worse. A module counts in
the first group whose pattern it matches, and in none when it matches none.
"""

from __future__ import annotations

import csv
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from optgym.train.evaluation import more_than_1pct_worse

FIELDS = ("heuristic_text", "policy_text", "heuristic_dottext", "policy_dottext")


def group_totals(rows: Iterable[dict[str, str]], groups: Sequence[tuple[str, str]]) -> dict[str, dict[str, int]]:
    """Per group: the four byte sums of its compiled modules, their count and how many are more than 1 % worse.
    Sums, not means of ratios: a group's ratio is its bytes over clang's."""
    totals = {name: dict.fromkeys((*FIELDS, "modules", "worse"), 0) for name, _ in groups}
    for row in rows:
        if row["status"] != "ok":
            continue
        name = next((name for name, pattern in groups if re.search(pattern, row["module"])), None)
        if name is None:
            continue
        t = totals[name]
        for field in FIELDS:
            t[field] += int(row[field])
        t["modules"] += 1
        t["worse"] += more_than_1pct_worse(int(row["policy_text"]), int(row["heuristic_text"]))
    return totals


def main() -> None:
    report, groups = Path(sys.argv[1]), [tuple(arg.split("=", 1)) for arg in sys.argv[2:]]
    totals = group_totals(csv.DictReader((report / "modules.csv").open()), groups)  # type: ignore[arg-type]
    for name, t in totals.items():
        if t["modules"]:
            print(f"{name:12s} {t['modules']:3d} modules  text {_ratio(t['policy_text'], t['heuristic_text'])}  "
                  f".text {_ratio(t['policy_dottext'], t['heuristic_dottext'])}  > 1 % worse {t['worse']}  "
                  f"({t['heuristic_text']} B)")  # fmt: skip


def _ratio(policy: int, clang: int) -> str:
    """policy ÷ clang, or "—" for a group whose objects hold no code (gperf's getopt compiles to none)."""
    return f"{policy / clang:.4f}" if clang else "—"


if __name__ == "__main__":
    main()
