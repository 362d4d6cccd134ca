#!/bin/bash
# d32 driver (registration 1cfe90f, amendments 8122788 and 84e4368): train each seed, then gates 1 and 2.
# A seed whose config.toml exists is resumed; finished steps are skipped.
set -u
WT=/work/runs/s42/wt32c
R=/work/runs/s42
C=/work/corpora/train-cxx
OG="env PYTHONPATH=$WT/src /work/main/.venv/bin/optgym"
cd $WT
for S in "$@"; do
  RUN=$R/d32-$S
  if [ ! -f $RUN/final/policy/policy.json ]; then
    if [ -f $RUN/config.toml ]; then
      echo "$(date -u +%H:%M) seed $S resume" >> $R/d32.status
      $OG train pattern --resume $RUN -j 2 >> $R/d32-$S.log 2>&1 || { echo "$(date -u +%H:%M) seed $S train failed" >> $R/d32.status; continue; }
    else
      echo "$(date -u +%H:%M) seed $S train" >> $R/d32.status
      $OG train pattern --corpus $C --split train --language C++ --sample 800 --hold-out-every 6 \
        --allowance default,deletes:1,deletes:2,deletes:4,deletes:8 --max-worse 0.01 --order ranked \
        --seed $S --restarts 2 --sweeps 64 --max-compiles 100000 --no-final-eval -j 2 -o $RUN >> $R/d32-$S.log 2>&1 \
        || { echo "$(date -u +%H:%M) seed $S train failed" >> $R/d32.status; continue; }
    fi
  fi
  for G in 1 2; do
    OUT=$R/d32-gate$G-$S
    [ -f $OUT/report.json ] && continue
    if [ $G = 1 ]; then SPLIT="--split train --every 6"; else SPLIT="--split test"; fi
    echo "$(date -u +%H:%M) seed $S gate $G" >> $R/d32.status
    $OG evaluate --policy $RUN --corpus $C $SPLIT --language C++ -j 2 -o $OUT >> $R/d32-$S.log 2>&1
  done
  echo "$(date -u +%H:%M) seed $S done" >> $R/d32.status
done
