"""ES with validation packages: held back from training, every snapshot compiled on them, the best one final."""

from __future__ import annotations

import json

import numpy as np
import pytest

from optgym.evaluate.benchmark import recorded_compiles
from optgym.policies.mlp import MLPPolicy
from optgym.policies.trained import snapshot_dirs
from optgym.train.es import ESConfig, train_es
from optgym.train.run import RunError
from optgym.train.validation import VALIDATION_FILE, validation_modules

GATES = ["at_most:callee_users:2", "at_least:node_count:100"]


def test_the_named_packages_are_held_back_and_a_share_is_a_fixed_draw():
    names = ["a/x.o", "a/y.o", "b/z.o", "c/w.o"]
    assert validation_modules(names, ["b"], 0.0) == ["b/z.o"]
    share = validation_modules(names, [], 34)
    assert len({n.split("/")[0] for n in share}) == 1  # whole packages
    assert validation_modules(names, [], 34) == share  # a fixed draw: every seed of a recipe validates on it
    assert validation_modules(names, [], 0.0) == []
    with pytest.raises(RunError, match="validation-groups"):
        validation_modules(names, ["nope"], 0.0)
    with pytest.raises(RunError, match="not both"):
        validation_modules(names, ["b"], 10)


def test_every_snapshot_is_validated_and_the_best_one_is_final(corpus_dir, tmp_path):
    """Two iterations on real compiles, the C module held back: each snapshot carries its figures on it alone,
    and the final policy is the snapshot with the best validation fitness (the earlier one on a tie), not
    simply the last iterate. The C++ module moves the allowance, so the snapshots differ."""
    run = tmp_path / "es"
    cfg = ESConfig(str(corpus_dir), str(run), allowance=GATES, iterations=2, directions=1, sigma=0.3,
                   learning_rate=0.2, workers=2, final_eval=False, fitness="total", snapshot_every=1,
                   validation_groups=["tree"])  # fmt: skip
    said: list[str] = []
    train_es(cfg, say=said.append)
    records = [json.loads((snap / VALIDATION_FILE).read_text()) for snap in snapshot_dirs(run)]
    assert [r["iteration"] for r in records] == [0, 1, 2]
    assert all(r["modules"] == 1 and r["failed"] == 0 for r in records)
    assert records[0]["total_ratio"] == 1.0 and records[0]["fitness"] == 0.0  # the start is clang's decisions
    best = max(records, key=lambda r: (r["fitness"], -r["iteration"]))
    params = [MLPPolicy.load(snap / "policy").parameters() for snap in snapshot_dirs(run)]
    assert not np.array_equal(params[0], params[-1])  # training moved the allowance
    assert np.array_equal(MLPPolicy.load(run / "final" / "policy").parameters(), params[best["iteration"]])
    summary = json.loads((run / "final" / VALIDATION_FILE).read_text())
    assert summary["selected"] == best and summary["snapshots"] == records
    assert any(line.startswith(f"final policy: snapshot {best['iteration']}") for line in said)
    # the benchmark's budget: 2 iterations × 1 direction × 2 × the 2 modules left to train on, and 3 validations
    assert recorded_compiles(run) == 2 * 1 * 2 * 2 + 3


def test_validation_that_takes_every_training_module_is_refused_before_the_run_exists(corpus_dir, tmp_path):
    cfg = ESConfig(str(corpus_dir), str(tmp_path / "es"), allowance=GATES, language="C++", validation_groups=["zoo"])
    with pytest.raises(RunError, match="nothing is left to train on"):
        train_es(cfg, say=lambda s: None)
    assert not (tmp_path / "es").exists()
