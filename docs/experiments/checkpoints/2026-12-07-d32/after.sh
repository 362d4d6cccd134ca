#!/bin/bash
# After d32's five seeds: gates per seed, gate 2's interval, then set d29 once per seed and for the rule.
set -u
R=/work/runs/s42
cd /work/main
while ! grep -q "seed 13 done" $R/d32.status; do sleep 30; done
PY=/work/main/.venv/bin/python
$PY - <<'PY' > $R/gates.txt 2>&1
import json, sys
from pathlib import Path
R = Path("/work/runs/s42")
ok = True
for s in range(9, 14):
    for g, bar in ((1, 0.91826), (2, 0.90926)):
        r = json.loads((R / f"d32-gate{g}-{s}" / "report.json").read_text())
        holds = r["total_ratio"] < bar and r["regressed_over_1pct"] <= 0.02 * r["evaluated"] and r["failed"] == 0
        ok &= holds
        print(s, g, r["total_ratio"], r["regressed_over_1pct"], r["evaluated"], r["failed"], "holds" if holds else "FAILS")
sys.exit(0 if ok else 1)
PY
GATES=$?
$PY -m research.seed_interval $R/d32-gate2-{9,10,11,12,13} --bar 0.90926 > $R/interval.txt 2>&1
INTERVAL=$?
echo "$(date -u +%H:%M) gates=$GATES interval=$INTERVAL" >> $R/d32.status
[ $GATES = 0 ] && [ $INTERVAL = 0 ] || exit 0
for P in rule 9 10 11 12 13; do
  if [ $P = rule ]; then POL=rule; else POL=$R/d32-$P; fi
  OUT=$R/d29-$P
  [ -f $OUT/report.json ] && continue
  echo "$(date -u +%H:%M) d29 $P" >> $R/d32.status
  (cd $R/wt32c && env PYTHONPATH=$R/wt32c/src /work/main/.venv/bin/optgym evaluate --policy $POL --corpus /work/corpora/set-d29 --language C++ -j 2 -o $OUT) >> $R/d29-eval.log 2>&1
done
echo "$(date -u +%H:%M) d29 done" >> $R/d32.status
