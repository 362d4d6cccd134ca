"""Register-allocation eviction on real clang-22: the stream's shape, masks, refused actions, size reward."""

from __future__ import annotations

import numpy as np
import pytest

import optgym
from optgym.policies import resolve_policy
from optgym.policies.mlp import PolicyFileError
from optgym.policies.scorer import CandidateScorer, ResidualScorer
from optgym.problems import get_problem
from optgym.problems.regalloc_evict import CANDIDATES, NOTHING
from optgym.rollout import plain_compile, rollout
from optgym.rollout.rollout import DecisionPoint
from optgym.toolchain import find_toolchain
from optgym.train.evaluation import evaluate, summarize
from optgym.train.run import read_config

#: Many values live across a loop: at -Oz on x86-64 the greedy allocator runs out of free registers and
#: asks the eviction advisor (the test corpora's small programs never do).
PRESSURE_SOURCE = r"""
extern void use(long, long, long, long, long, long, long, long);
void pressure(long *a, int n) {
  long s0 = a[0], s1 = a[1], s2 = a[2], s3 = a[3], s4 = a[4], s5 = a[5], s6 = a[6], s7 = a[7];
  long s8 = a[8], s9 = a[9], s10 = a[10], s11 = a[11], s12 = a[12], s13 = a[13], s14 = a[14], s15 = a[15];
  for (int i = 0; i < n; i++) {
    s0 += a[i] * s15; s1 ^= s0 + s14; s2 += s1 * s13; s3 ^= s2 + s12; s4 += s3 * s11; s5 ^= s4 + s10;
    s6 += s5 * s9; s7 ^= s6 + s8; s8 += s7 * i; s9 ^= s8 + s0; s10 += s9 * s1; s11 ^= s10 + s2;
    s12 += s11 * s3; s13 ^= s12 + s4; s14 += s13 * s5; s15 ^= s14 + s6;
    if (s0 & 1) use(s0, s1, s2, s3, s4, s5, s6, s7);
  }
  use(s8, s9, s10, s11, s12, s13, s14, s15);
  use(s0, s1, s2, s3, s4, s5, s6, s7);
}
"""


#: The default advisor's rule, roughly: evict what interferes with the lightest heaviest live range, unless the
#: register being allocated is lighter still.
START = CandidateScorer.initial("regalloc-evict")


@pytest.fixture(scope="module")
def pressure_corpus(toolchain, tmp_path_factory):
    from conftest import _corpus

    return _corpus(toolchain, tmp_path_factory.mktemp("pressure"), {"pressure": (".c", PRESSURE_SOURCE)})


def test_stream_has_the_expected_features_and_masks(pressure_corpus, toolchain, no_leftovers):
    problem = get_problem("regalloc-evict")
    masks = []

    def record(point: DecisionPoint) -> int:
        masks.append(point.features()["mask"].ravel().copy())
        return START(point)[0]

    out = rollout(problem, pressure_corpus["pressure"], toolchain, record)
    assert out.result.ok and out.result.decisions == len(masks) > 0
    assert all(m.shape == (CANDIDATES,) for m in masks)
    assert all(m.any() for m in masks)  # every decision has a legal answer
    assert any(m[:NOTHING].any() for m in masks)  # some offer a register to evict
    assert (out.trajectory.heuristic == -1).all()  # the stream carries no default answer
    plain = plain_compile(problem, pressure_corpus["pressure"], toolchain)
    assert plain.metrics["text_bytes"] > 0 and out.result.metrics["text_bytes"] > 0


def test_a_masked_action_is_refused_not_sent(pressure_corpus, toolchain, no_leftovers):
    """clang crashes (SIGSEGV) on an index whose mask is 0; the episode stops the compile instead."""
    problem = get_problem("regalloc-evict")

    def masked(point: DecisionPoint) -> int:
        mask = point.features()["mask"].ravel()
        return int(np.flatnonzero(mask == 0)[0])

    out = rollout(problem, pressure_corpus["pressure"], toolchain, masked)
    assert out.result.status == "invalid_action"
    assert "not valid at this decision" in out.result.detail and str(NOTHING) in out.result.detail
    assert out.result.decisions == 0  # refused before anything was sent


def test_env_observations_masks_and_size_reward(pressure_corpus, no_leftovers):
    env = optgym.make("regalloc-evict", corpus=pressure_corpus.root, report_timing=False)
    assert env.action_space.n == CANDIDATES and env.observation_space["mask"].shape == (1, CANDIDATES)
    obs, info = env.reset(options={"module": "pressure"})
    assert "heuristic_action" not in info
    assert info["action_mask"].dtype == bool and info["action_mask"].any()
    steps = 0
    while True:  # the last legal candidate at every decision
        assert env.observation_space.contains(obs)  # gymnasium's check_env would step unmasked random actions
        obs, reward, terminated, truncated, info = env.step(int(np.flatnonzero(info["action_mask"])[-1]))
        steps += 1
        if terminated or truncated:
            break
    assert steps == info["decisions"] and info["status"] in ("ok", "compile_error")  # clang may run out of registers
    if terminated:
        expected = 1 - (info["policy_text_bytes"] + 0.01) / (info["heuristic_text_bytes"] + 0.01)
        assert reward == pytest.approx(expected) and info["heuristic_text_bytes"] > 0
    env.close()


def test_env_step_with_a_masked_action_truncates_the_episode(pressure_corpus, no_leftovers):
    env = optgym.make("regalloc-evict", corpus=pressure_corpus.root)
    _, info = env.reset(options={"module": "pressure"})
    invalid = int(np.flatnonzero(~info["action_mask"])[0])
    _, reward, terminated, truncated, info = env.step(invalid)
    assert truncated and not terminated and reward == 0.0 and info["status"] == "invalid_action"
    env.close()


def test_the_starting_scorer_follows_its_rule(pressure_corpus, toolchain, no_leftovers):
    problem = get_problem("regalloc-evict")
    checked = []

    def check(point: DecisionPoint) -> int:
        f = point.features()
        action = START(point)[0]
        valid = f["mask"].ravel() != 0
        weight = f["use_def_density"].ravel()
        assert valid[action] and weight[action] == weight[valid].min()  # a lightest valid column, nothing else
        checked.append(action)
        return action

    assert rollout(problem, pressure_corpus["pressure"], toolchain, check).result.ok
    assert len(checked) > 0 and any(a != NOTHING for a in checked)


SCORER_RUNS = [
    ("regalloc-evict", "a candidate scorer", "mean", 0),
    ("regalloc-priority", "a log-linear scorer", "total", 0),
    ("regalloc-evict", "a residual scorer", "total", 3),
]


@pytest.mark.parametrize(("problem", "shape", "fitness", "hidden"), SCORER_RUNS)
def test_es_trains_a_scorer_that_evaluate_loads(
    problem, shape, fitness, hidden, pressure_corpus, tmp_path, no_leftovers
):
    """Every scorer form: eviction's candidate scorer, the log-linear scorer of allocation priority, and the
    residual scorer ``--scorer-hidden`` widens eviction's into (each with one of the two fitnesses); exported,
    each decides as trained."""
    from typer.testing import CliRunner

    from optgym.cli import app

    start = CandidateScorer.initial(problem)
    if hidden:
        start = ResidualScorer.extending(start, hidden)
    run = tmp_path / "run"
    args = ["train", "es", "--problem", problem, "--language", "C", "--corpus", str(pressure_corpus.root),
            "-o", str(run), "--iterations", "2", "--directions", "2", "--sigma", "0.5", "-j", "1",
            "--loss-weight", "1", "--fitness", fitness, "--scorer-hidden", str(hidden), "--no-final-eval"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert read_config(run)[1]["fitness"] == fitness
    assert "4 compiles" in result.output  # 2 directions × 2 signs × 1 module, each iteration
    scorer = resolve_policy(str(run)).build()
    assert type(scorer) is type(start) and scorer.features == start.features
    assert scorer.languages == ["C"]  # trained on C modules only, it decides C only
    assert scorer.parameters().shape == start.parameters().shape
    assert not np.array_equal(scorer.parameters(), start.parameters())  # two steps moved it
    spec = get_problem(problem)
    out = rollout(spec, pressure_corpus["pressure"], find_toolchain((spec.hook,)), scorer)
    assert out.result.ok and out.result.decisions > 0
    rows = evaluate(str(run), pressure_corpus, problem=problem, workers=1, progress=False)
    assert [r.status for r in rows] == ["ok"] and rows[0].decisions == out.result.decisions
    assert rows[0].policy_text == out.result.metrics["text_bytes"] and rows[0].never_text is None
    assert summarize(rows)["never_inline_text_bytes"] is None  # no never-inline row in the report
    exported = CliRunner().invoke(app, ["export", str(run), "-o", str(tmp_path / "scorer.onnx")])
    assert exported.exit_code == 0 and shape in exported.output, exported.output
    again = evaluate(str(tmp_path / "scorer.onnx"), pressure_corpus, problem=problem, workers=1, progress=False)
    assert again[0].policy_text == rows[0].policy_text  # the export decides as the run's policy
    other = [*args[:-1], "--language", "C++", "-o", str(tmp_path / "none")]
    assert "no modules to train on" in CliRunner().invoke(app, other).output
    bogus = CliRunner().invoke(app, [*args[:-1], "--fitness", "median", "-o", str(tmp_path / "bogus")])
    assert bogus.exit_code == 1 and "--fitness 'median'" in bogus.output and not (tmp_path / "bogus").exists()


def test_a_residual_scorer_starts_with_the_linear_scorers_decisions(pressure_corpus, toolchain, tmp_path):
    """``ResidualScorer.extending`` adds hidden units whose output weights are 0: at every real eviction decision
    it picks what the linear scorer picks; once ES moves ``v`` the units change decisions; saved and loaded it
    scores the same; a damaged hidden layer is refused as a policy file error."""
    rng = np.random.default_rng(5)
    linear = START.with_parameters(START.parameters() + rng.normal(0, 0.3, START.parameters().size))
    residual = ResidualScorer.extending(linear, 4, seed=1)
    flat = residual.parameters()
    moved = residual.with_parameters(np.concatenate([flat[:-4], rng.normal(0, 5.0, 4)]))  # v: the last 4
    picks: list[tuple[int, int, int]] = []

    def all_three(point: DecisionPoint) -> int:
        picks.append((linear(point)[0], residual(point)[0], moved(point)[0]))
        return picks[-1][0]

    assert rollout(get_problem("regalloc-evict"), pressure_corpus["pressure"], toolchain, all_three).result.ok
    assert picks and all(a == b for a, b, _ in picks)
    assert any(a != c for a, _, c in picks)  # the hidden units decide once their output weights are not 0
    loaded = CandidateScorer.load(moved.save(tmp_path / "residual"))
    assert type(loaded) is ResidualScorer and np.array_equal(loaded.parameters(), moved.parameters())
    table = {f: rng.integers(-4, 900, 33).astype(np.float64) for f in moved.features} | {"mask": np.ones(33)}
    assert np.array_equal(loaded.scores(table), moved.scores(table))
    text = (tmp_path / "residual" / "policy.json").read_text().replace('"v": [', '"v": [1.0, ')
    (tmp_path / "residual" / "policy.json").write_text(text)
    with pytest.raises(PolicyFileError, match="hidden layer"):
        CandidateScorer.load(tmp_path / "residual")


def test_scorer_hidden_is_refused_for_a_problem_without_a_linear_candidate_scorer(pressure_corpus, tmp_path):
    from typer.testing import CliRunner

    from optgym.cli import app

    args = ["train", "es", "--problem", "regalloc-priority", "--corpus", str(pressure_corpus.root),
            "-o", str(tmp_path / "run"), "--scorer-hidden", "4", "-j", "1"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1 and "--scorer-hidden" in result.output and not (tmp_path / "run").exists()


def test_a_scorer_exported_to_onnx_decides_as_trained(pressure_corpus, toolchain, tmp_path, no_leftovers):
    """``optgym export`` of a scorer: optgym serves its embedded weights, and the graph — what any other ONNX
    runtime runs — picks the same candidate as the trained scorer at every real eviction decision."""
    from optgym.policies.export import export_policy
    from optgym.policies.exported import ACTION, INPUT, MASK, _session, read_policy_bytes

    rng = np.random.default_rng(5)
    trained = START.with_parameters(START.parameters() + rng.normal(0, 0.3, START.parameters().size))
    trained.languages = ["C"]
    metadata = export_policy(trained.save(tmp_path / "scorer"), tmp_path / "scorer.onnx")
    assert metadata["form"] == "candidate-scorer" and metadata["languages"] == ["C"]
    served = resolve_policy(str(tmp_path / "scorer.onnx"), "regalloc-evict").build()
    assert isinstance(served, CandidateScorer) and served.languages == ["C"]
    assert np.array_equal(served.weights, trained.weights)
    graph = _session(read_policy_bytes(tmp_path / "scorer.onnx"), tmp_path / "scorer.onnx")
    chosen: list[tuple[int, int, int]] = []

    def all_three(point: DecisionPoint) -> int:
        rows = point.rows([*trained.features, trained.mask]).astype(np.float64)
        (by_graph,) = graph.run([ACTION], {INPUT: rows[:-1], MASK: rows[-1]})
        chosen.append((trained(point)[0], served(point)[0], int(by_graph[0])))
        return chosen[-1][1]

    problem = get_problem("regalloc-evict")
    run = rollout(problem, pressure_corpus["pressure"], toolchain, all_three)
    assert run.result.ok and len(chosen) == run.result.decisions > 0
    assert all(a == b == c for a, b, c in chosen) and len({a for a, _, _ in chosen}) > 1, chosen


def test_evaluate_leaves_a_language_the_scorer_does_not_decide_to_the_other_policies(corpus, tmp_path):
    """As ``optgym-cc`` serves it: a scorer trained for C opens no channel in a C++ compile, so ``evaluate``
    measures that module as clang alone compiles it — or as the companions that do decide it do."""
    noise = np.random.default_rng(3).normal(0, 0.3, START.parameters().size)
    scorer = START.with_parameters(START.parameters() + noise)
    scorer.languages = ["C"]
    spec = str(scorer.save(tmp_path / "scorer"))
    alone = {r.module: r for r in evaluate(spec, corpus, problem="regalloc-evict", workers=1, progress=False)}
    assert alone["zoo"].policy_text == alone["zoo"].heuristic_text and alone["zoo"].decisions == 0
    never = {r.module: r for r in evaluate("never", corpus, workers=1, progress=False)}
    paired = {r.module: r for r in evaluate(spec, corpus, problem="regalloc-evict", workers=1, progress=False,
                                            companions=[("inline-size", "never")])}  # fmt: skip
    assert paired["zoo"].policy_text == never["zoo"].policy_text != paired["zoo"].heuristic_text
    assert paired["zoo"].decisions == never["zoo"].decisions > 0  # the inliner's decisions only
