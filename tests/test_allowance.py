"""The allowance family: a learned margin over clang's inline threshold, and ES training only it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import recorded_decisions, traced_decisions

from optgym.policies.allowance import (
    AllowanceError,
    allowance_policy,
    check_start,
    describe,
    gates_of,
    trainable,
    unscaled,
)
from optgym.policies.mlp import MLPPolicy
from optgym.policies.trained import latest_snapshot
from optgym.problems import get_problem
from optgym.train.es import ESConfig, train_es
from optgym.train.run import RunError

PROBLEM = get_problem("inline-size")
NAMES = [s.name for s in PROBLEM.expected_features() if s.name not in PROBLEM.hidden_features]
GATES = ["at_most:callee_users:2", "at_least:node_count:100", "cxx"]


def _with(policy: MLPPolicy, bias: float, gate_weights: list[float]) -> MLPPolicy:
    """``policy`` with its allowance set: the bias and one weight per gate (what ES would have learned)."""
    theta, mask = policy.parameters(), trainable(policy)
    rows = np.flatnonzero(mask)
    theta[rows[:-1]], theta[rows[-1]] = gate_weights, bias
    return policy.with_parameters(theta)


def test_only_the_gates_and_the_bias_are_trained_and_the_normalizer_is_skipped():
    policy = allowance_policy(GATES)
    mask = trainable(policy)
    assert mask.shape == policy.parameters().shape and mask.sum() == len(GATES) + 1
    assert policy._extras_rows is not None  # no normalized feature is read: a served decision skips it
    assert [name for name, _ in describe(policy)] == ["bias", *GATES]


@pytest.mark.parametrize("gates", [[], ["margin:threshold-cost_estimate"], ["heuristic"]])
def test_gates_must_be_zero_one_inputs(gates):
    with pytest.raises(AllowanceError):
        allowance_policy(gates)


def test_every_decision_of_a_real_compile_is_clangs_or_within_the_learned_allowance(corpus_dir, toolchain):
    """On clang-22's own decisions: inline iff clang does, or the cost is within ``exp(8·a) − 1`` of the
    threshold, ``a`` the bias plus the weights of the gates that hold — here a C++-only allowance of 40."""
    allowance = math.log1p(40.5) / 8  # half a unit past 40: no decision sits on the boundary
    policy = _with(allowance_policy(GATES), -1.0, [0.0, 0.0, 1.0 + allowance])
    added = 0
    for module, f, actions, heuristic in recorded_decisions(policy, corpus_dir, toolchain):
        over = f[:, NAMES.index("cost_estimate")] - f[:, NAMES.index("threshold")]
        clangs = heuristic == 1
        within = over < 40.5 if module.language == "C++" else over < -math.expm1(1.0 * 8)
        expected = clangs | within
        assert np.array_equal(actions, expected.astype(np.int64)), module.name
        added += int((~clangs & within).sum())
    assert added > 0, "an allowance that adds no inline tests nothing"


def test_a_light_weight_on_clangs_answer_lets_a_negative_allowance_withdraw_its_inlines(corpus_dir, toolchain):
    """``heuristic_weight`` 0.25 and an allowance of −1 (no gate holds weight): where clang inlines, the site
    stays inlined only while ``0.25 + m − 1 > 0``, that is, its cost is more than ``exp(6) − 1`` under the
    threshold; nothing clang refuses is inlined. Checked decision by decision on real compiles, and some of
    clang's inlines must actually be withdrawn."""
    policy = _with(allowance_policy(GATES, heuristic_weight=0.25), -1.0, [0.0, 0.0, 0.0])
    withdrawn = kept = 0
    for _, f, actions, heuristic in recorded_decisions(policy, corpus_dir, toolchain):
        under = f[:, NAMES.index("threshold")] - f[:, NAMES.index("cost_estimate")]
        clangs = heuristic == 1
        expected = clangs & (under > math.expm1(6.0))
        assert np.array_equal(actions, expected.astype(np.int64))
        withdrawn += int((clangs & ~expected).sum())
        kept += int(expected.sum())
    assert withdrawn > 0 and kept > 0, "a test where nothing is withdrawn, or everything is, tests nothing"
    with pytest.raises(AllowanceError, match="positive"):
        allowance_policy(GATES, heuristic_weight=0.0)


def test_es_moves_only_the_allowance(corpus_dir, tmp_path):
    cfg = ESConfig(str(corpus_dir), str(tmp_path / "es"), allowance=GATES, iterations=1, directions=2, sigma=0.3,
                   learning_rate=0.1, workers=2, final_eval=False, fitness="total")  # fmt: skip
    said: list[str] = []
    train_es(cfg, say=said.append)
    start = allowance_policy(GATES)
    trained = MLPPolicy.load(tmp_path / "es" / "final" / "policy")
    moved = trained.parameters() != start.parameters()
    assert moved.any() and not (moved & (trainable(start) == 0)).any()
    assert any(line.startswith("allowance learned:") for line in said)
    assert latest_snapshot(tmp_path / "es") is not None


def test_an_annealed_run_takes_the_steps_its_schedule_gives_and_records_them(corpus_dir, tmp_path):
    """Two iterations of ``--anneal linear`` on real compiles: the learning curve records each step size, and
    the second step moves each parameter by about half the first (Adam steps by about its step size)."""
    import csv

    from optgym.train.es import step_size

    cfg = ESConfig(str(corpus_dir), str(tmp_path / "es"), allowance=GATES, iterations=2, directions=2, sigma=0.3,
                   learning_rate=0.1, workers=2, final_eval=False, fitness="total", anneal="linear",
                   snapshot_every=1)  # fmt: skip
    train_es(cfg, say=lambda s: None)
    rows = list(csv.DictReader((tmp_path / "es" / "progress.csv").open()))
    assert [float(r["es/step_size"]) for r in rows] == [step_size(0.1, i, 2, "linear") for i in (1, 2)] == [0.1, 0.05]
    thetas = [MLPPolicy.load(tmp_path / "es" / "snapshots" / f"{i:08d}" / "policy").parameters() for i in (0, 1, 2)]
    first, second = np.abs(thetas[1] - thetas[0]).max(), np.abs(thetas[2] - thetas[1]).max()
    assert first > 0 and second < 0.75 * first


def test_resume_takes_its_budget_workers_and_final_eval_and_refuses_a_new_recipe(corpus_dir, tmp_path):
    """``--resume`` continues the recipe in config.toml: a typed recipe option is refused with the run untouched;
    ``--iterations``, ``-j`` and ``--no-final-eval`` are taken (``--no-final-eval`` used to be dropped)."""
    from typer.testing import CliRunner

    from optgym.cli import app
    from optgym.train.run import read_config

    run = tmp_path / "es"
    cfg = ESConfig(str(corpus_dir), str(run), allowance=GATES, iterations=1, directions=1, sigma=0.3, workers=2,
                   final_eval=True, fitness="total")  # fmt: skip
    train_es(ESConfig(**{**cfg.__dict__, "final_eval": False}), say=lambda s: None)
    (run / "final").rename(tmp_path / "first-final")
    before = (run / "config.toml").read_text()
    refused = CliRunner().invoke(app, ["train", "es", "--resume", str(run), "--sigma", "0.5", "--seed", "3"])
    assert refused.exit_code != 0 and "--sigma, --seed" in refused.output
    assert (run / "config.toml").read_text() == before and not (run / "final").exists()

    done = CliRunner().invoke(app, ["train", "es", "--resume", str(run), "--iterations", "2", "-j", "1",
                                    "--no-final-eval"])  # fmt: skip
    assert done.exit_code == 0, done.output
    _, options, _ = read_config(run)
    assert options["iterations"] == 2 and options["workers"] == 1 and options["final_eval"] is False
    assert options["sigma"] == 0.3  # the recipe is the run's own
    assert (run / "final" / "policy").is_dir() and not list((run / "final").glob("eval-*"))


def test_es_trains_an_allowance_on_from_its_warm_start(corpus_dir, tmp_path):
    """An imitated allowance as the start: ES's first snapshot is that policy, and its steps move its gates."""
    _with(allowance_policy(GATES), -0.3, [0.5, -0.2, 0.4]).save(tmp_path / "imitated")
    start = MLPPolicy.load(tmp_path / "imitated")  # as stored (float32)
    cfg = ESConfig(str(corpus_dir), str(tmp_path / "es"), allowance=GATES, warmstart=str(tmp_path / "imitated"),
                   iterations=1, directions=2, sigma=0.3, learning_rate=0.1, workers=2, final_eval=False,
                   fitness="total", snapshot_every=1)  # fmt: skip
    train_es(cfg, say=lambda s: None)
    first = MLPPolicy.load(tmp_path / "es" / "snapshots" / "00000000" / "policy").parameters()
    assert np.array_equal(first, start.parameters())
    moved = MLPPolicy.load(tmp_path / "es" / "final" / "policy").parameters() != start.parameters()
    assert moved.any() and not (moved & (trainable(start) == 0)).any()


def test_a_warm_start_with_the_first_gates_learns_the_others_from_zero(corpus_dir, tmp_path):
    """A trained allowance given a new gate (``with_gates``): the run starts where it stood, the new weight at 0."""
    _with(allowance_policy(GATES[:2]), -0.3, [0.5, -0.2]).save(tmp_path / "fewer")
    start = MLPPolicy.load(tmp_path / "fewer")
    cfg = ESConfig(str(corpus_dir), str(tmp_path / "es"), allowance=GATES, warmstart=str(tmp_path / "fewer"),
                   iterations=1, directions=1, workers=1, final_eval=False, snapshot_every=1)  # fmt: skip
    train_es(cfg, say=lambda s: None)
    first = MLPPolicy.load(tmp_path / "es" / "snapshots" / "00000000" / "policy")
    assert gates_of(first) == list(GATES) and describe(first)[1:3] == describe(start)[1:3]
    assert describe(first)[0] == describe(start)[0] and all(w == 0 for _, w in describe(first)[3:])


@pytest.mark.parametrize(
    ("start", "message"),
    [(lambda: allowance_policy(GATES[1:]), "are not the first of"), (lambda: allowance_policy([*GATES, "cxx"]),
     "gates are"), (lambda: allowance_policy(GATES, heuristic_weight=0.25), "weighs clang's answer 0.25")],
)  # fmt: skip
def test_an_allowance_warm_start_of_another_layout_is_refused(corpus_dir, tmp_path, start, message):
    start().save(tmp_path / "other")
    cfg = ESConfig(str(corpus_dir), str(tmp_path / "es"), allowance=GATES, warmstart=str(tmp_path / "other"),
                   iterations=1, directions=1, workers=1, final_eval=False)  # fmt: skip
    with pytest.raises(RunError, match=message):
        train_es(cfg, say=lambda s: None)
    assert not (tmp_path / "es").exists()


def test_a_stored_allowance_start_keeps_its_weight_on_clangs_answer(tmp_path):
    """A stored policy holds float32 weights: a start saved with weight 0.3 on clang's answer is still one."""
    from optgym.policies.allowance import check_start

    allowance_policy(GATES, heuristic_weight=0.3).save(tmp_path / "start")
    check_start(MLPPolicy.load(tmp_path / "start"), GATES, 0.3)  # refused before the float32 comparison was fixed
    with pytest.raises(AllowanceError, match="weighs clang's answer"):
        check_start(MLPPolicy.load(tmp_path / "start"), GATES, 0.31)


def test_the_exported_graph_decides_as_the_allowance_does(trace_dir, tmp_path):
    """A trained allowance ships as ONNX: the graph's decisions on clang's real call sites are the policy's."""
    from typer.testing import CliRunner

    from optgym.cli import app
    from optgym.policies.exported import OnnxPolicy

    policy = _with(allowance_policy(GATES), 0.1, [0.4, 0.2, 0.3])
    policy_dir = policy.save(tmp_path / "policy")
    result = CliRunner().invoke(app, ["export", str(policy_dir), "-o", str(tmp_path / "a.onnx")])
    assert result.exit_code == 0, result.output
    exported = OnnxPolicy.load(tmp_path / "a.onnx")
    raw, h = traced_decisions(trace_dir, NAMES)
    ours = exported.actions(raw, h, np.ones(len(h)))
    assert np.array_equal(ours, policy.logits(raw, h, 1).argmax(-1))
    assert (ours > h).any(), "an allowance that adds no inline on the trace tests nothing"


def test_an_allowance_trained_on_cxx_decides_cxx_only(corpus_dir, tmp_path):
    """ES on the C++ modules only gives a policy that says so (``languages``), through export too, and a C
    module evaluated with it is clang's own compile — whatever the allowance would have done to C."""
    from optgym.corpus import Corpus
    from optgym.policies.export import export_policy
    from optgym.policies.exported import OnnxPolicy
    from optgym.train.evaluation import evaluate

    cfg = ESConfig(str(corpus_dir), str(tmp_path / "es"), allowance=GATES, iterations=1, directions=1, sigma=0.3,
                   workers=2, final_eval=False, language="C++")  # fmt: skip
    train_es(cfg, say=lambda s: None)
    trained = MLPPolicy.load(tmp_path / "es" / "final" / "policy")
    assert trained.languages == ["C++"]
    wide = _with(trained, 1.0, [1.0, 1.0, 1.0])  # inlines far past clang wherever it decides
    wide.save(tmp_path / "wide")
    export_policy(tmp_path / "wide", tmp_path / "wide.onnx")
    assert OnnxPolicy.load(tmp_path / "wide.onnx").languages == ["C++"]
    rows = {r.module: r for r in evaluate(str(tmp_path / "wide.onnx"), corpus_dir, workers=2, progress=False)}
    language = {m.name: m.language for m in Corpus(corpus_dir)}
    c_rows = [r for name, r in rows.items() if language[name] == "C"]
    cxx_rows = [r for name, r in rows.items() if language[name] == "C++"]
    assert c_rows and all(r.policy_text == r.heuristic_text and r.decisions_differing == 0 for r in c_rows)
    assert any(r.decisions_differing > 0 for r in cxx_rows), "an allowance that changes no C++ decision tests nothing"


def test_a_ppo_allowance_scaled_by_its_temperature_is_the_same_start_unscaled():
    """PPO's copy of an allowance carries its temperature in every inline weight (32 on clang's answer at 0.125):
    ``unscaled`` gives the family's form, the margin's weight 1, with the same decisions."""
    policy = _with(allowance_policy(GATES), -0.3, [0.5, -0.2, 0.4])
    ((weights, bias),) = policy.weights
    scaled = MLPPolicy([(weights * [1, 8], bias * [1, 8])], policy.vocab, extras=policy.extras)
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 400, size=(500, len(policy.feature_names))).astype(np.float64)
    heuristic = rng.integers(0, 2, size=500)
    back = unscaled(scaled)
    check_start(back, GATES)
    with pytest.raises(AllowanceError, match="weighs clang's answer 32"):
        check_start(scaled, GATES)
    assert np.allclose(back.parameters(), policy.parameters())
    assert np.array_equal(back.logits(raw, heuristic, 1).argmax(-1), scaled.logits(raw, heuristic, 1).argmax(-1))
