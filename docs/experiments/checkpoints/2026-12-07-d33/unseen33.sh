#!/bin/bash
# d33's unseen set, once each for the shipped AArch64 inliner, x86-64's seed 12 carried over, and the rule.
cd /work/runs/s44/wt33
for P in d33 seed12 rule; do
  case $P in d33) POL=/work/main/src/optgym/policies/pretrained/aarch64/inline-size.onnx;; seed12) POL=/work/runs/s42/d32-12;; rule) POL=rule;; esac
  echo "$(date -u +%H:%M) $P" >> /work/runs/s44/unseen33.status
  env PYTHONPATH=/work/runs/s44/wt33/src /work/main/.venv/bin/optgym evaluate --policy $POL --corpus /work/corpora/a64-unseen-cxx2 --language C++ -j 2 -o /work/runs/s44/u33-$P > /work/runs/s44/u33-$P.log 2>&1
done
echo "$(date -u +%H:%M) done" >> /work/runs/s44/unseen33.status
