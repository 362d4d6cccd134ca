"""Validation packages for PPO (optgym.train.validation): held back from every episode, every snapshot compiled on
them, and the best snapshot, the warm start included, is the run's final policy."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from optgym.corpus import Corpus
from optgym.policies.allowance import allowance_policy
from optgym.policies.mlp import MLPPolicy
from optgym.policies.trained import snapshot_dirs
from optgym.train.run import RunError, write_snapshot
from optgym.train.sb3 import SB3Config, choose_on_validation, train_sb3
from optgym.train.validation import VALIDATION_FILE, Validation, bytes_saved


def test_ppo_never_trains_on_the_validation_package_and_keeps_its_best_snapshot(toolchain, tmp_path, env_modules):
    """Two PPO iterations on real compiles, the ``tree`` module held back: the env rolls out only ``fanout``,
    every snapshot (the allowance's start as snapshot 0) carries its figures on ``tree`` alone, and the final
    policy is the snapshot with the most bytes saved there."""
    from conftest import C_SOURCE, FANOUT_SOURCE, _corpus

    corpus = _corpus(toolchain, tmp_path / "corpus", {"tree": (".c", C_SOURCE), "fanout": (".c", FANOUT_SOURCE)})
    start = allowance_policy()
    start.save(tmp_path / "start")
    run = tmp_path / "ppo"
    cfg = SB3Config("ppo", str(corpus.root), str(run), warmstart=str(tmp_path / "start"), iterations=2,
                    steps_per_iteration=128, workers=1, snapshot_every=1, final_eval=False, critic="heuristic",
                    learning_rate=0.05, validation_groups=["tree"])  # fmt: skip
    said: list[str] = []
    train_sb3(cfg, say=said.append)
    assert [[m.name.split(".")[0] for m in modules] for modules in env_modules] == [["fanout"]]
    records = [json.loads((snap / VALIDATION_FILE).read_text()) for snap in snapshot_dirs(run)]
    assert [r["iteration"] for r in records] == [0, 1, 2]
    assert all(r["modules"] == 1 and r["failed"] == 0 for r in records)
    assert records[0]["total_ratio"] == 1.0 and records[0]["fitness"] == 0.0  # the start is clang's decisions
    best = max(records, key=lambda r: (r["fitness"], -r["iteration"]))
    chosen = MLPPolicy.load(run / "snapshots" / f"{best['iteration']:08d}" / "policy").parameters()
    assert np.array_equal(MLPPolicy.load(run / "final" / "policy").parameters(), chosen)
    assert json.loads((run / "final" / VALIDATION_FILE).read_text()) == {"selected": best, "snapshots": records}
    rule = "the most bytes saved on validation"
    assert f"final policy: snapshot {best['iteration']}, {rule} (fitness {best['fitness']})" in said


def _snapshots(run, fitnesses, worse_shares=None):
    """Snapshots whose policies differ (bias = iteration) and whose validation records are already written, as a
    resumed run finds them: choosing among them compiles nothing."""
    for iteration, fitness in enumerate(fitnesses):
        share = worse_shares[iteration] if worse_shares else 0.0
        policy = allowance_policy()
        policy.weights[-1][1][1] = float(iteration)

        def fill(tmp, policy=policy, iteration=iteration, fitness=fitness, share=share):
            policy.save(tmp / "policy")
            record = {"iteration": iteration, "fitness": fitness, "total_ratio": 1.0, "worse": round(share * 100),
                      "worse_share": share, "modules": 100, "failed": 0 if fitness is not None else 1}  # fmt: skip
            (tmp / VALIDATION_FILE).write_text(json.dumps(record))

        write_snapshot(run, iteration, fill, {})
    allowance_policy().save(run / "final" / "policy")  # the last iterate, as training leaves it


@pytest.mark.parametrize(
    ("fitnesses", "expected"),
    [([0.0, 0.02, 0.01], 1), ([0.0, -0.03, -0.01], 0), ([0.01, 0.02, 0.02], 1), ([None, -0.01, None], 1)],
    ids=["a-middle-one", "the-warm-start", "a-tie-keeps-the-earlier", "nothing-compiled-ranks-last"],
)
def test_the_final_policy_is_the_best_validated_snapshot(corpus_dir, tmp_path, fitnesses, expected):
    run = tmp_path / "run"
    _snapshots(run, fitnesses)
    validation = Validation(Corpus(corpus_dir), ["tree.c.o"], "inline-size", 1, 60.0, bytes_saved)
    choose_on_validation(run, validation, say=lambda s: None)
    assert MLPPolicy.load(run / "final" / "policy").weights[-1][1][1] == expected
    assert json.loads((run / "final" / VALIDATION_FILE).read_text())["selected"]["iteration"] == expected


@pytest.mark.parametrize(
    ("fitnesses", "worse_shares", "expected"),
    [
        ([0.0, 0.05, 0.03], [0.01, 0.10, 0.02], 2),
        ([0.0, 0.05, 0.03], [0.05, 0.10, 0.04], 2),
        ([0.0, 0.05, 0.03], [0.04, 0.04, 0.06], 1),
        ([None, 0.05, 0.03], [0.0, 0.10, 0.10], 1),
    ],
    ids=["best-under-the-cap", "none-under-it-fewest-worse", "a-tie-in-worse-goes-to-bytes", "nothing-compiled-last"],
)
def test_a_capped_validation_chooses_as_the_size_target_counts(corpus_dir, tmp_path, fitnesses, worse_shares,
                                                               expected):  # fmt: skip
    """With ``--validation-max-worse 0.02`` a snapshot that wins on bytes by making 10 % of modules worse is
    passed over for the best one within the cap; with none within it, the fewest modules worse wins."""
    run = tmp_path / "run"
    _snapshots(run, fitnesses, worse_shares)
    validation = Validation(Corpus(corpus_dir), ["tree.c.o"], "inline-size", 1, 60.0, bytes_saved, max_worse=0.02)
    said: list[str] = []
    choose_on_validation(run, validation, say=said.append)
    assert MLPPolicy.load(run / "final" / "policy").weights[-1][1][1] == expected
    past = "none on validation within 2.0% of modules > 1 % worse: the fewest"
    assert any(line.startswith(f"final policy: snapshot {expected}, ") for line in said)
    assert any(past in line for line in said) == (worse_shares[expected] > 0.02)


def test_a_cap_that_is_no_share_is_refused(corpus_dir):
    with pytest.raises(RunError, match="validation-max-worse 2"):
        Validation.held_back_from(Corpus(corpus_dir), ["tree.c.o"], ["tree"], 0.0, problem="inline-size", workers=1,
                                  timeout=60.0, fitness=bytes_saved, max_worse=2)  # fmt: skip


def test_a_cap_without_validation_packages_is_refused_not_ignored(corpus_dir):
    with pytest.raises(RunError, match="needs validation packages"):
        Validation.held_back_from(Corpus(corpus_dir), ["tree.c.o"], [], 0.0, problem="inline-size", workers=1,
                                  timeout=60.0, fitness=bytes_saved, max_worse=0.05)  # fmt: skip
    assert Validation.held_back_from(Corpus(corpus_dir), ["tree.c.o"], [], 0.0, problem="inline-size", workers=1,
                                     timeout=60.0, fitness=bytes_saved) is None  # fmt: skip


def test_bytes_saved_counts_the_total():
    outcomes = [{"heuristic_text_bytes": 1000, "text_bytes": 900}, {"heuristic_text_bytes": 100, "text_bytes": 150}]
    assert bytes_saved(outcomes) == pytest.approx(50 / 1100)


def test_a_validation_that_takes_every_training_module_is_refused_before_the_run_exists(corpus_dir, vocab_path,
                                                                                         tmp_path):  # fmt: skip
    cfg = SB3Config("ppo", str(corpus_dir), str(tmp_path / "ppo"), vocab=str(vocab_path),
                    allowance=["at_most:callee_users:2"], language="C++", validation_groups=["zoo"])  # fmt: skip
    with pytest.raises(RunError, match="nothing is left to train on"):
        train_sb3(cfg, say=lambda s: None)
    assert not (tmp_path / "ppo").exists()
    uncapped = dataclasses.replace(cfg, validation_groups=[], validation_max_worse=0.05)
    with pytest.raises(RunError, match="needs validation packages"):
        train_sb3(uncapped, say=lambda s: None)
    assert not (tmp_path / "ppo").exists()
