"""An ``optgym evaluate`` report's modules summed by groups of their names (a bundled library inside a package).

Why: a package such as poco bundles other projects' C sources (pcre, expat, zlib, sqlite3). Some of those are
training or held-out packages here, so a claim about unseen code must count the groups apart.

    python research/module_groups.py REPORT_DIR GROUP=REGEX [GROUP=REGEX …]

Berkeley text and ``.text`` per group (policy ÷ clang), and the modules more than 1 % worse.
"""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path


def main() -> None:
    report, specs = Path(sys.argv[1]), [arg.split("=", 1) for arg in sys.argv[2:]]
    rows = list(csv.DictReader((report / "modules.csv").open()))
    totals = {name: [0, 0, 0, 0, 0, 0] for name, _ in specs}
    for row in rows:
        if row["status"] != "ok":
            continue
        for name, pattern in specs:
            if re.search(pattern, row["module"]):
                t = totals[name]
                h, p = int(row["heuristic_text"]), int(row["policy_text"])
                t[0] += h
                t[1] += p
                t[2] += int(row["heuristic_dottext"])
                t[3] += int(row["policy_dottext"])
                t[4] += 1
                t[5] += p > 1.01 * h
                break
    for name, (h, p, hd, pd, n, worse) in totals.items():
        if n:
            print(f"{name:12s} {n:3d} modules  text {p / h:.4f}  .text {pd / hd:.4f}  > 1 % worse {worse}  ({h} B)")
    h = sum(t[0] for t in totals.values())
    p = sum(t[1] for t in totals.values())
    print(f"{'together':12s} {sum(t[4] for t in totals.values()):3d} modules  text {p / h:.4f}")


if __name__ == "__main__":
    main()
