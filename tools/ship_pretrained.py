#!/usr/bin/env python3
"""Ship a trained policy as optgym's ``pretrained`` one, with its provenance beside it.

    .venv/bin/python tools/ship_pretrained.py RUN --corpus CORPUS [-j N]

1. ``optgym export RUN`` into ``src/optgym/policies/pretrained/inline-size.onnx`` — the file
   ``--policy pretrained`` and ``optgym-cc``'s default load;
2. the exported file, as shipped, compiled on the held-out side of ``CORPUS``'s stored split (packages
   the run never saw), figures per language;
3. ``inline-size.provenance.json`` beside it: the training packages and their exact Debian versions,
   the held-out ones, the command that reproduces the run, the compiler, the figures on the training
   side (the run's own) and on the held-out packages.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import sys
from pathlib import Path

from optgym.corpus import Corpus
from optgym.corpus.corpus import atomic_write_bytes
from optgym.evaluate.evaluation import evaluate
from optgym.policies import PRETRAINED, PRETRAINED_PROVENANCE
from optgym.policies.export import export_policy
from optgym.train.threshold import summary_figures

FIGURES = ("evaluated", "failed", "total_ratio", "dottext_ratio", "geomean_ratio", "improved", "regressed",
           "regressed_over_1pct", "heuristic_text_bytes", "policy_text_bytes", "guarded_ratio")  # fmt: skip


def by_language(rows: list, corpus: Corpus) -> dict[str, dict]:
    """The evaluation summary over all modules and per language (C++ includes ObjC++)."""
    lang = {r.module: corpus.module(r.module).family for r in rows}
    out = {"all": summary_figures(rows, FIGURES)}
    for name in ("C", "C++"):
        out[name] = summary_figures([r for r in rows if lang[r.module] == name], FIGURES)
    return out


def training_figures(run: Path, metadata: dict) -> dict:
    """The run's own figures on its training side: its final metrics and, for a tuned run (``train
    threshold``), every candidate's figures on the tuning sample."""
    figures = dict(metadata["provenance"].get("metrics") or {})
    candidates = run / "candidates.json"
    if candidates.is_file():
        figures["candidates"] = json.loads(candidates.read_text())["candidates"]
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="the trained run (or policy directory) to ship")
    parser.add_argument("--corpus", type=Path, required=True, help="the corpus whose test side is held out")
    parser.add_argument("-j", "--workers", type=int, default=None)
    args = parser.parse_args()

    metadata = export_policy(args.run, PRETRAINED)
    print(f"exported {args.run} → {PRETRAINED} ({PRETRAINED.stat().st_size} bytes)")
    description = Corpus(args.corpus).description["optgym"]
    split = description.get("split")
    if not split:
        sys.exit(f"{args.corpus} has no stored split: the held-out packages are its test side")
    heldout_corpus = Corpus(args.corpus, split="test")
    rows = evaluate(str(PRETRAINED), heldout_corpus, workers=args.workers, progress=True)
    heldout = by_language(rows, heldout_corpus)
    packages = description.get("packages", {})
    test_groups = set(split["test_groups"])
    provenance = {
        "policy": PRETRAINED.name,
        "sha256": hashlib.sha256(PRETRAINED.read_bytes()).hexdigest(),
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "problem": metadata["problem"],
        "compiler": metadata.get("compiler"),
        "algorithm": metadata["provenance"].get("algorithm"),
        "command": metadata["provenance"].get("command"),
        "run_config": metadata["provenance"].get("config"),
        "corpus": {"path": str(args.corpus.resolve()), "distribution": description.get("provenance", {}).get(
            "distribution"), "split": {k: split[k] for k in ("by", "test_groups", "train_modules", "test_modules")}},
        "training_packages": {p: v.get("version") for p, v in sorted(packages.items()) if p not in test_groups},
        "heldout_packages": {p: v.get("version") for p, v in sorted(packages.items()) if p in test_groups},
        "figures": {"training": training_figures(args.run, metadata), "heldout": heldout},
    }  # fmt: skip
    atomic_write_bytes(PRETRAINED_PROVENANCE, json.dumps(provenance, indent=2).encode())
    for name in ("all", "C", "C++"):
        f = heldout[name]
        if not f["evaluated"]:
            continue
        print(
            f"held-out {name:3s}: {f['evaluated']} modules, Berkeley text {f['total_ratio']:.4f}, "
            f".text {f['dottext_ratio']:.4f}, {f['regressed_over_1pct']} > 1 % worse; "
            f"guarded (OPTGYM_GUARD=1) {f['guarded_ratio']:.4f}"
        )
    print(f"provenance → {PRETRAINED_PROVENANCE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
