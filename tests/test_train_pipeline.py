"""The training chain on a tiny real corpus: trace → vocab → bc → ppo → resume → es, and the pieces between.

Everything runs real clang-22 compiles; budgets are tiny (a few hundred decisions per algorithm) so
the whole file takes about a minute on 2 cores.
"""

from __future__ import annotations

import csv
import itertools
import json
import shutil

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import optgym
from optgym.cli import app
from optgym.corpus.split import draw_modules
from optgym.env.wrappers import FlattenFeatures, NormalizeFeatures, OptimalDecision
from optgym.policies import resolve_policy
from optgym.policies.mlp import MLPPolicy
from optgym.policies.trained import latest_snapshot, snapshot_dirs
from optgym.problems import get_problem
from optgym.problems.inputs import RESIDUAL_EXTRAS
from optgym.problems.normalize import Normalizer, Vocab, VocabError, build_vocab
from optgym.rollout import rollout
from optgym.train.bc import BCConfig, train_bc
from optgym.train.es import ESConfig, direction_fitness, loss_weighted, shape, step_size, train_es
from optgym.train.run import read_config
from optgym.train.sb3 import SB3Config, train_sb3
from optgym.train.trace import TraceError, read_meta, read_modules, sample_modules, trace
from optgym.train.vocab import vocab_from_trace

runner = CliRunner()


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("train")


@pytest.fixture(scope="module")
def bc_dir(trace_dir, vocab_path, work):
    out = work / "bc"
    metrics = train_bc(BCConfig(str(trace_dir), str(vocab_path), str(out), epochs=40, workers=1), progress=False)
    assert json.loads((out / "metrics.json").read_text()) == metrics
    return out


def test_trace_records_the_heuristic(trace_dir, corpus):
    meta = read_meta(trace_dir)
    assert meta["mode"] == "record" and meta["features"][0] == "sroa_savings" and len(meta["features"]) == 38
    table = pq.read_table(trace_dir / meta["shards"][0])
    assert table.num_rows == meta["decisions"] > 0
    assert (table.column("action").to_numpy() == table.column("heuristic").to_numpy()).all()
    assert set(table.column("module").to_pylist()) == {"tree", "zoo"}  # leaf has no call site
    steps = table.filter(pc.equal(table["module"], "tree"))
    assert steps.column("step").to_pylist() == list(range(steps.num_rows))
    modules = {r["module"]: r for r in read_modules(trace_dir)}
    assert set(modules) == {m.name for m in corpus}
    assert all(r["text_bytes"] == r["heuristic_text_bytes"] > 0 for r in modules.values())
    assert meta["summary"]["size_ratio"] == 1.0
    assert not list(trace_dir.glob(".*")), "no temporary shard left behind"


def test_trace_modes_and_sampling(corpus_dir, work, trace_dir):
    out = work / "collect"
    meta = trace(corpus_dir, out, mode="collect", policy="random", modules=["tree"], workers=1, progress=False, seed=3)
    table = pq.read_table(out / meta["shards"][0])
    assert meta["mode"] == "collect" and set(table.column("action").to_pylist()) <= {0, 1}
    assert read_modules(out)[0]["heuristic_text_bytes"] == read_modules(trace_dir)[0]["heuristic_text_bytes"]
    with pytest.raises(TraceError, match="not empty"):
        trace(corpus_dir, out, mode="collect", policy="random", workers=1, progress=False)
    with pytest.raises(TraceError, match="record"):
        trace(corpus_dir, work / "x", mode="record", policy="never", workers=1, progress=False)
    names = [f"m{i}" for i in range(200)]
    assert sample_modules(names, 0.25, 1) == sample_modules(names, 0.25, 1)
    assert 20 < len(sample_modules(names, 0.25, 1)) < 80 and len(sample_modules(names[:1], 0.01, 0)) == 1


def test_vocab_quantiles_and_format(trace_dir, vocab_path):
    vocab = Vocab.load(vocab_path)
    assert vocab.names == read_meta(trace_dir)["features"]
    assert all(len(b) == 1000 and b == sorted(b) for b in vocab.features.values())
    half = vocab_from_trace(trace_dir, sampling_fraction=0.5, seed=1)
    assert 0 < half.samples < vocab.samples and half.sampling_fraction == 0.5
    data = json.loads(vocab_path.read_text())
    data["format_version"] = 99
    with pytest.raises(VocabError, match="format"):
        Vocab.from_json(json.dumps(data))
    result = runner.invoke(app, ["vocab", str(trace_dir), "-o", str(vocab_path.with_name("v2.json"))])
    assert result.exit_code == 0, result.output
    assert Vocab.load(vocab_path.with_name("v2.json")).features == vocab.features


def test_normalizer_matches_a_plain_bucketize():
    rng = np.random.default_rng(0)
    columns = {f"f{i}": rng.integers(-50, 10 ** (i % 7 + 1), 3000) for i in range(12)}
    vocab = build_vocab(columns, num_buckets=100)
    raw = np.stack(list(columns.values()), axis=1)[:500].astype(np.float64)
    raw[0] = -1e9  # below and above every boundary
    raw[1] = 1e12
    expected = np.stack(
        [np.searchsorted(np.asarray(vocab.features[n]), raw[:, i], side="right") for i, n in enumerate(vocab.names)],
        axis=1,
    )
    fast = Normalizer(vocab)
    assert fast._joined is not None and (fast.buckets(raw) == expected).all()
    out = fast(raw).reshape(500, 12, 4)
    assert np.allclose(out[..., 0], expected / 100) and np.allclose(out[..., 1], (expected / 100) ** 2)
    assert np.isfinite(out).all()
    assert np.allclose(fast(raw[7]), fast(raw)[7])


def test_wrappers_give_the_policys_input(corpus_dir, vocab_path, bc_dir):
    policy = MLPPolicy.load(bc_dir / "policy")
    env = FlattenFeatures(NormalizeFeatures(optgym.make("inline-size", corpus=corpus_dir), str(vocab_path)))
    obs, _ = env.reset(seed=0, options={"module": "tree"})
    episode = env.unwrapped._episode
    raw = episode.view.vector(episode.observation)
    assert env.observation_space.shape == (152,) and obs.dtype == np.float32
    assert np.array_equal(obs, policy.normalizer(raw))
    env.close()


def test_optimal_decision_reward(corpus_dir):
    env = OptimalDecision(optgym.make("inline-size", corpus=corpus_dir, modules=["tree"]))
    _, info = env.reset(seed=0)
    steps = 0
    while True:
        chosen = info["heuristic_action"]
        _, _, terminated, truncated, info = env.step(chosen)
        steps += 1
        assert info["optimal_action"] in (0, 1)
        if info["optimal_action"] == chosen:
            assert info["look_ahead_reward"] >= 0
        else:
            assert info["look_ahead_reward"] <= 0
        if terminated or truncated:
            break
    assert terminated and steps >= 1
    env.close()


def test_bc_clones_the_heuristic(bc_dir, corpus_dir):
    metrics = json.loads((bc_dir / "metrics.json").read_text())
    assert metrics["holdout_agreement"] >= 0.9 and metrics["train_agreement"] >= 0.95
    assert metrics["size_ratio"] is not None and abs(metrics["size_ratio"] - 1) < 0.05
    assert (bc_dir / "progress.csv").read_text().count("\n") == 41
    assert list(bc_dir.glob("events.out.tfevents.*"))
    algorithm, options, versions = read_config(bc_dir)
    assert algorithm == "bc" and options["epochs"] == 40 and "clang" in versions and versions["git"]
    # the resolver: a BC directory, its policy directory and the numpy policy inside a worker
    for spec in (bc_dir, bc_dir / "policy"):
        factory = resolve_policy(str(spec))
        assert factory.identity.startswith("mlp:")
    policy = resolve_policy(str(bc_dir)).build()
    problem = get_problem("inline-size")
    from optgym.corpus import Corpus
    from optgym.toolchain import find_toolchain

    result = rollout(problem, Corpus(corpus_dir)["tree"], find_toolchain((problem.hook,)), policy)
    assert result.result.ok and result.trajectory.log_probs is not None
    sampled = policy.stochastic(seed=1)
    assert sampled.greedy is False and sampled(_Point(np.zeros(38, np.float32)))[0] in (0, 1)


class _Point:
    heuristic = language = None

    def __init__(self, vector):
        self._v = vector

    def vector(self):
        return self._v


def test_bc_with_the_heuristic_as_input_learns_it_and_saves_it(trace_dir, vocab_path, work, corpus_dir):
    """The derived inputs reach the network: given clang's own decision, cloning clang is (nearly) exact
    after a few epochs of a 16-unit net, and the saved policy (format 2, its extras named) compiles the
    corpus to clang's size."""
    out = work / "bc-residual"
    metrics = train_bc(BCConfig(str(trace_dir), str(vocab_path), str(out), epochs=40, workers=1, hidden=[16],
                                extras=list(RESIDUAL_EXTRAS)), progress=False)  # fmt: skip
    assert metrics["holdout_agreement"] >= 0.99 and metrics["train_agreement"] >= 0.99
    assert abs(metrics["size_ratio"] - 1.0) < 0.02
    meta = json.loads((out / "policy" / "policy.json").read_text())
    assert meta["format_version"] == 2 and meta["extras"] == list(RESIDUAL_EXTRAS)
    policy = MLPPolicy.load(out / "policy")
    assert policy.weights[0][0].shape[0] == 38 * 4 + 2
    with pytest.raises(VocabError, match="heuristic"):
        policy(_Point(np.zeros(38, np.float32)))  # a point without the heuristic's decision: a clear error


def _column(run, name: str) -> list[str]:
    """One column of a run's ``progress.csv``, row by row."""
    with (run / "progress.csv").open(newline="") as f:
        return [row[name] for row in csv.DictReader(f)]


def test_ppo_warmstart_snapshots_and_resume(corpus_dir, bc_dir, work):
    run = work / "ppo"
    cfg = SB3Config("ppo", str(corpus_dir), str(run), warmstart=str(bc_dir), iterations=2, steps_per_iteration=128,
                    workers=2, snapshot_every=1, final_eval=False)  # fmt: skip
    train_sb3(cfg, say=lambda s: None)
    assert [p.name for p in snapshot_dirs(run)] == ["00000000", "00000001", "00000002"]
    first = MLPPolicy.load(run / "snapshots" / "00000000" / "policy")
    bc = MLPPolicy.load(bc_dir / "policy")
    assert all(np.allclose(a[0], b[0], atol=1e-6) for a, b in zip(first.weights, bc.weights, strict=True))
    header = (run / "progress.csv").read_text().splitlines()[0].split(",")
    for column in ("rollout/ep_rew_mean", "results/vs_heuristic", "results/compile_failures",
                   "time/decisions_per_second", "train/value_loss"):  # fmt: skip
        assert column in header, column
    assert list(run.glob("events.out.tfevents.*")) and (run / "final" / "policy" / "policy.json").exists()
    assert resolve_policy(str(run)).args[0].endswith("final/policy")
    # lose the last interval as a kill would, then resume: back to iteration 2, same step count
    shutil.rmtree(run / "snapshots" / "00000002")
    shutil.rmtree(run / "final")
    steps_before = _column(run, "timesteps")
    train_sb3(SB3Config(**{**cfg.__dict__}), resume=True, say=lambda s: None)
    state = json.loads((latest_snapshot(run) / "state.json").read_text())
    assert state["iteration"] == 2 and state["num_timesteps"] == 256
    assert _column(run, "timesteps") == steps_before  # the lost interval's rows once, as before the loss
    with pytest.raises(Exception, match="already holds a run"):
        train_sb3(SB3Config(**{**cfg.__dict__}), say=lambda s: None)


def test_with_clangs_compile_as_baseline_ppo_moves_only_on_rewards(corpus_dir, bc_dir, work):
    """Why PPO lost ground from BC (docs/experiments/2026-11-26-ppo.md), both ways. When every sampled episode is
    clang's own (reward 0), ``--critic heuristic`` leaves the actor exactly as warm-started, with the value head
    at 0. SB3's learned critic moves the actor anyway, because the normalized advantages of its noise drive it."""
    moved = {}
    for critic in ("heuristic", "learned"):
        run = work / f"ppo-critic-{critic}"
        cfg = SB3Config("ppo", str(corpus_dir), str(run), warmstart=str(bc_dir), iterations=2, critic=critic,
                        steps_per_iteration=128, workers=1, snapshot_every=2, final_eval=False)  # fmt: skip
        train_sb3(cfg, say=lambda s: None)
        ratios = [float(x) for x in _column(run, "results/vs_heuristic") if x]
        assert ratios and all(r == 1.0 for r in ratios), f"a sampled episode left clang's decisions: {ratios}"
        start, end = (MLPPolicy.load(d) for d in (run / "snapshots" / "00000000" / "policy", run / "final" / "policy"))
        moved[critic] = max(float(np.abs(a[0] - b[0]).max()) for a, b in zip(start.weights, end.weights, strict=True))
        if critic == "heuristic":
            from stable_baselines3 import PPO

            value_head = PPO.load(latest_snapshot(run) / "model.zip", device="cpu").policy.value_net
            assert not value_head.weight.abs().sum() and not value_head.bias.abs().sum()
    assert moved["heuristic"] == 0.0 and moved["learned"] > 0.0, moved


def test_temperature_softens_the_warm_start_and_keeps_every_greedy_decision(corpus_dir, bc_dir, work):
    run = work / "ppo-temperature"
    cfg = SB3Config("ppo", str(corpus_dir), str(run), warmstart=str(bc_dir), iterations=1, steps_per_iteration=64,
                    workers=1, final_eval=False, critic="heuristic", temperature=4.0)  # fmt: skip
    train_sb3(cfg, say=lambda s: None)
    start, bc = MLPPolicy.load(run / "snapshots" / "00000000" / "policy"), MLPPolicy.load(bc_dir / "policy")
    (w_start, b_start), (w_bc, b_bc) = start.weights[-1], bc.weights[-1]
    assert np.allclose(w_start, w_bc / 4, atol=1e-6) and np.allclose(b_start, b_bc / 4, atol=1e-6)
    from optgym.corpus import Corpus
    from optgym.toolchain import find_toolchain

    problem = get_problem("inline-size")
    toolchain = find_toolchain((problem.hook,))
    for module in Corpus(corpus_dir):  # real compiles: the softened start decides every call site as BC does
        softened, cloned = (rollout(problem, module, toolchain, p).trajectory.actions for p in (start, bc))
        assert softened.tolist() == cloned.tolist(), module.name


def test_credit_deviations_keeps_the_reward_only_where_the_rollout_left_the_greedy_policy(toolchain, bc_dir, work):
    """``--credit deviations`` on a real rollout: the advantage of each decision sampled as the greedy policy
    would have taken it becomes 0, and each other decision keeps its own."""
    import torch
    from conftest import C_SOURCE, FANOUT_SOURCE, _corpus
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.logger import configure
    from stable_baselines3.common.vec_env import DummyVecEnv

    from optgym.train.sb3 import build_model, credit_deviations_only, make_env, warmstart

    # short episodes, so that many end inside one rollout, and inlining changes their size
    short = _corpus(toolchain, work / "short", {"tree": (".c", C_SOURCE), "fanout": (".c", FANOUT_SOURCE)}).root
    cfg = SB3Config("ppo", str(short), str(work / "unused"), warmstart=str(bc_dir), steps_per_iteration=512,
                    workers=1, critic="heuristic", temperature=8.0, credit="deviations")  # fmt: skip
    env_cfg = {"corpus": str(short), "vocab": str(bc_dir / "policy" / "vocab.json"), "seed": 0, "timeout": 120}
    venv = DummyVecEnv([lambda: make_env(env_cfg, 0)])
    model = build_model(cfg, venv)
    warmstart(model, MLPPolicy.load(bc_dir / "policy"), cfg.temperature)
    seen: dict[str, np.ndarray] = {}

    class Capture(BaseCallback):
        def _on_step(self) -> bool:
            return True

        def _on_rollout_end(self) -> None:
            buffer = self.model.rollout_buffer
            observations = torch.as_tensor(buffer.observations.reshape(len(buffer.actions), -1))
            with torch.no_grad():
                greedy = self.model.policy.get_distribution(observations).distribution.probs.argmax(-1).numpy()
            seen["deviated"] = buffer.actions.reshape(-1) != greedy
            seen["before"] = buffer.advantages.reshape(-1).copy()
            credit_deviations_only(self.model)
            seen["after"] = buffer.advantages.reshape(-1).copy()

    # a logger of its own: learn() would otherwise make SB3's default one, a directory left in /tmp per run
    model.set_logger(configure(str(work / "sb3-log"), []))
    try:
        model.learn(512, callback=Capture())
    finally:
        venv.close()
    deviated, before, after = seen["deviated"], seen["before"], seen["after"]
    assert deviated.any() and (~deviated).any() and before[~deviated].any(), "the rollout must hold both kinds"
    assert not after[~deviated].any() and np.array_equal(after[deviated], before[deviated])


def test_the_env_gives_a_derived_input_policy_the_vector_it_computes_when_served(corpus_dir, toolchain):
    """PolicyInputsObservation on real compiles: acting on its vector with the allowance's weights gives, call
    site by call site, the decisions that policy makes when it is served in a compile."""
    from optgym.corpus import Corpus
    from optgym.env.wrappers import PolicyInputsObservation
    from optgym.policies.allowance import allowance_policy, trainable

    start = allowance_policy()
    policy = start.with_parameters(start.parameters() + 0.05 * trainable(start))  # a few units above clang's
    ((weights, bias),) = policy.weights
    problem = get_problem("inline-size")
    compared: list[int] = []
    for module in Corpus(corpus_dir):
        served = rollout(problem, module, toolchain, policy).trajectory.actions.tolist()
        if not served:
            continue
        env = PolicyInputsObservation(optgym.make("inline-size", corpus=corpus_dir), policy.vocab,
                                      list(policy.extras))  # fmt: skip
        vector, _ = env.reset(options={"module": module.name})
        acted, done = [], False
        while not done:
            acted.append(int(np.argmax(vector.astype(np.float64) @ weights + bias)))
            vector, _, terminated, truncated, _ = env.step(acted[-1])
            done = terminated or truncated
        env.close()
        assert acted == served, module.name
        compared.extend(served)
    assert 0 in compared and 1 in compared, "both answers must be compared"


def test_ppo_trains_the_learned_allowance_from_its_start(corpus_dir, vocab_path, toolchain, work):
    """``optgym train ppo --allowance default``: the allowance's start, kept in the run, gives PPO a linear actor
    over its derived inputs, and what PPO exports reads them too; at a sharp temperature it starts as the
    allowance decides."""
    from optgym.corpus import Corpus
    from optgym.policies.allowance import allowance_policy

    start = allowance_policy()
    run = work / "ppo-allowance"
    command = ["train", "ppo", "--corpus", str(corpus_dir), "--allowance", "default", "--vocab", str(vocab_path),
               "-o", str(run), "--iterations", "1", "--steps-per-iteration", "64", "-j", "1", "--no-final-eval",
               "--critic", "heuristic", "--temperature", "0.125"]  # fmt: skip
    result = runner.invoke(app, command)
    assert result.exit_code == 0, result.output
    options = read_config(run)[1]
    assert options["extras"] == start.extras and options["hidden"] == []
    assert options["warmstart"] == str(run / "start") and MLPPolicy.load(run / "start").extras == start.extras
    first = MLPPolicy.load(run / "snapshots" / "00000000" / "policy")
    assert first.extras == start.extras and first.hidden == []
    assert np.allclose(first.weights[0][0], start.weights[0][0] * 8, atol=1e-5)
    problem = get_problem("inline-size")
    for module in Corpus(corpus_dir):
        decided = [rollout(problem, module, toolchain, p).trajectory.actions.tolist() for p in (first, start)]
        assert decided[0] == decided[1], module.name
    assert MLPPolicy.load(run / "final" / "policy").extras == start.extras


def test_ppo_moves_only_the_allowance_as_es_does(toolchain, work):
    """From the allowance's start, PPO moves the gates' weights and the inline bias and nothing else (not the
    weights of the normalized features, which it read at 0): the parameters ES trains (allowance.trainable)."""
    from conftest import C_SOURCE, FANOUT_SOURCE, _corpus

    from optgym.policies.allowance import allowance_policy, trainable

    short = _corpus(toolchain, work / "short-allowance", {"tree": (".c", C_SOURCE), "fanout": (".c", FANOUT_SOURCE)})
    start = allowance_policy()
    start.save(work / "allowance-start-2")
    run = work / "ppo-allowance-moves"
    cfg = SB3Config("ppo", str(short.root), str(run), warmstart=str(work / "allowance-start-2"), iterations=2,
                    steps_per_iteration=128, workers=1, final_eval=False, critic="heuristic",
                    learning_rate=0.05)  # fmt: skip
    train_sb3(cfg, say=lambda s: None)
    moved = MLPPolicy.load(run / "final" / "policy").parameters() - start.parameters()
    free = trainable(start).astype(bool)
    assert np.abs(moved[free]).max() > 0, "PPO learned nothing: the test needs a rollout with a reward"
    assert not moved[~free].any(), "PPO moved a parameter outside the allowance"


def test_ppo_on_one_language_rolls_out_its_modules_and_decides_only_it(corpus_dir, vocab_path, work, env_modules):
    """``train ppo --language C++``: the env worker the run builds compiles the C++ modules only, and what PPO
    exports decides C++ only (a C compile keeps clang's decisions), as ES's ``--language`` does."""
    from optgym.corpus import Corpus
    from optgym.policies.allowance import DEFAULT_GATES

    run = work / "ppo-cxx"
    cfg = SB3Config("ppo", str(corpus_dir), str(run), vocab=str(vocab_path), allowance=list(DEFAULT_GATES),
                    iterations=1, steps_per_iteration=64, workers=1, final_eval=False, critic="heuristic",
                    temperature=0.125, language="C++")  # fmt: skip
    train_sb3(cfg, say=lambda s: None)
    assert {m.family for m in Corpus(corpus_dir)} == {"C", "C++"}, "a one-language corpus tests nothing"
    assert [{m.family for m in modules} for modules in env_modules] == [{"C++"}]
    assert read_config(run)[1]["language"] == "C++"
    assert MLPPolicy.load(run / "final" / "policy").languages == ["C++"]


@pytest.mark.parametrize(
    ("changes", "message"),
    [({"critic": "value"}, "unknown --critic"), ({"temperature": 0.0}, "must be positive"),
     ({"algorithm": "dqn", "temperature": 2.0}, "for PPO and A2C"), ({"warmstart": None}, "give --warmstart"),
     ({"credit": "deviations"}, "needs --critic heuristic"), ({"credit": "some"}, "unknown --credit"),
     ({"allowance": ["at_most:callee_users:2"]}, "not an allowance policy"),
     ({"allowance": ["at_most:callee_users:2"], "warmstart": None}, "needs --vocab"),
     ({"language": "Rust"}, "C or C\\+\\+")],
)  # fmt: skip
def test_a_bad_ppo_recipe_is_refused_before_the_run_exists(bc_dir, tmp_path, changes, message):
    fields = {"algorithm": "ppo", "corpus": str(tmp_path), "output": str(tmp_path / "run"),
              "warmstart": str(bc_dir), "temperature": 2.0, **changes}  # fmt: skip
    with pytest.raises(Exception, match=message):
        train_sb3(SB3Config(**fields), say=lambda s: None)
    assert not (tmp_path / "run").exists()


def test_es_runs_snapshots_and_resumes(corpus_dir, bc_dir, work):
    run = work / "es"
    cfg = ESConfig(str(corpus_dir), str(run), warmstart=str(bc_dir), iterations=2, directions=1, workers=2,
                   snapshot_every=1, final_eval=True)  # fmt: skip
    results = train_es(cfg, say=lambda s: None)
    assert results["all"]["modules_ok"] == 3 and results["all"]["size_ratio"] > 0
    assert [p.name for p in snapshot_dirs(run)] == ["00000000", "00000001", "00000002"]
    with np.load(run / "snapshots" / "00000002" / "es_state.npz") as z:
        assert int(z["t"]) == 2
    shutil.rmtree(run / "snapshots" / "00000002")
    train_es(ESConfig(**{**cfg.__dict__, "final_eval": False}), resume=True, say=lambda s: None)
    with np.load(latest_snapshot(run) / "es_state.npz") as z:
        assert int(z["t"]) == 2
    assert _column(run, "iteration") == ["1", "2"]  # iteration 2 once: the resumed run's row replaced the lost one


def test_cli_chain_and_config_reproduces(corpus_dir, work):
    t, v, bc = work / "cli-trace", work / "cli-vocab.json", work / "cli-bc"
    result = runner.invoke(app, ["trace", "--corpus", str(corpus_dir), "-o", str(t), "-j", "1"])
    assert result.exit_code == 0 and "decisions" in result.output, result.output
    assert runner.invoke(app, ["vocab", str(t), "-o", str(v)]).exit_code == 0
    result = runner.invoke(app, ["train", "bc", "--trace", str(t), "--vocab", str(v), "-o", str(bc), "--epochs", "5",
                                 "--no-evaluate"])  # fmt: skip
    assert result.exit_code == 0 and "agreement" in result.output, result.output
    result = runner.invoke(app, ["train", "--config", str(bc / "config.toml"), "-o", str(work / "cli-bc2")])
    assert result.exit_code == 0, result.output
    assert read_config(work / "cli-bc2")[1]["epochs"] == 5
    assert (work / "cli-bc2" / "policy" / "weights.npz").exists()
    result = runner.invoke(app, ["train", "ppo", "--corpus", str(corpus_dir), "-o", str(work / "cli-ppo")])
    assert result.exit_code == 1 and "vocab" in result.output


def test_loss_weight_ranks_a_direction_that_regresses_below_an_even_one():
    """Two perturbations with the same mean reward: the one that makes a module larger loses once
    losses count double — the trade ES then stops making."""
    even, uneven = [0.005, 0.005], [0.03, -0.02]
    assert np.mean(even) == pytest.approx(np.mean(uneven))
    assert [loss_weighted(r, 0.0) for r in uneven] == uneven  # weight 0: the plain reward
    assert loss_weighted(-0.02, 1.0) == pytest.approx(-0.04) and loss_weighted(0.03, 1.0) == 0.03
    assert np.mean([loss_weighted(r, 1.0) for r in even]) > np.mean([loss_weighted(r, 1.0) for r in uneven])


def _outcome(heuristic: int, size: int) -> dict[str, float]:
    """An ``es_rollout`` outcome with MLGO's reward (δ = 0)."""
    return {"heuristic_text_bytes": heuristic, "text_bytes": size, "reward": 1 - size / heuristic}


def test_total_fitness_follows_the_bytes_where_the_mean_follows_the_modules():
    """One direction saves 5 % of a 300-byte module and loses 0.5 % of a 30 kB one; the other the reverse
    trade in bytes. The mean of ratios prefers the first, the build's total — what the size target counts —
    the second; a loss still counts ``1 + w`` times in bytes."""
    small_win = [_outcome(300, 285), _outcome(30_000, 30_150)]  # −15 B, +150 B
    big_win = [_outcome(300, 306), _outcome(30_000, 29_850)]  # +6 B, −150 B
    assert direction_fitness(small_win, "mean", 0.0) > direction_fitness(big_win, "mean", 0.0)
    assert direction_fitness(small_win, "total", 0.0) < direction_fitness(big_win, "total", 0.0)
    assert direction_fitness(big_win, "total", 0.0) == pytest.approx(144 / 30_300)
    assert direction_fitness(big_win, "total", 1.0) == pytest.approx(138 / 30_300)


def test_worse_penalty_counts_modules_more_than_1pct_worse_whatever_their_bytes():
    """``big_win`` makes its 300-byte module 2 % larger: 6 bytes, invisible in the batch's total, one module
    of two over the size target's bar. The penalty takes P × 1/2 off; a module 1 % larger exactly is not over."""
    big_win = [_outcome(300, 306), _outcome(30_000, 29_850)]
    plain = direction_fitness(big_win, "total", 0.0)
    assert direction_fitness(big_win, "total", 0.0, worse_penalty=0.1) == pytest.approx(plain - 0.05)
    assert direction_fitness(big_win, "mean", 0.0, worse_penalty=0.1) == pytest.approx(
        direction_fitness(big_win, "mean", 0.0) - 0.05
    )
    at_the_bar = [_outcome(300, 303), _outcome(30_000, 29_850)]
    assert direction_fitness(at_the_bar, "total", 0.0, worse_penalty=0.1) == direction_fitness(at_the_bar, "total", 0.0)


def test_rank_shaping_keeps_one_disastrous_direction_from_drowning_the_others():
    """Direction 0 saves a little either way round; direction 1's ``+`` side inlines far too much. Raw
    fitnesses give direction 1's difference 500 times direction 0's weight; centered ranks bound every
    difference by 1, so direction 0 still counts."""
    raw = [0.012, 0.010, -5.0, 0.011]  # (F⁺₀, F⁻₀, F⁺₁, F⁻₁)
    ranks = shape(raw, "rank")
    assert sorted(ranks) == pytest.approx([-0.5, -1 / 6, 1 / 6, 0.5]) and ranks.sum() == pytest.approx(0.0)
    assert abs(raw[2] - raw[3]) > 100 * abs(raw[0] - raw[1])
    assert abs(ranks[2] - ranks[3]) <= 1.0 and ranks[0] - ranks[1] > 0
    assert list(shape(raw, "none")) == raw


def test_a_size_stratified_batch_holds_modules_of_every_size():
    """40 modules, mostly small: a uniform draw of 8 often holds none of the 10 largest; ``size`` draws 2 from
    each quartile, every iteration. ``uniform`` is the draw ES always made (a seed's batches are unchanged)."""
    sizes = {f"m{i:02d}": (i + 1) * 100 for i in range(40)}
    modules = sorted(sizes)
    largest = set(modules[-10:])
    for iteration in range(20):
        batch = draw_modules(modules, 8, np.random.default_rng([3, iteration]), "size", sizes)
        assert len(batch) == len(set(batch)) == 8
        assert [sum(modules.index(m) // 10 == q for m in batch) for q in range(4)] == [2, 2, 2, 2]
    uniform = [draw_modules(modules, 8, np.random.default_rng([3, it])) for it in range(20)]
    assert any(not largest & set(b) for b in uniform)  # what the strata are for
    assert uniform[0] == sorted(np.random.default_rng([3, 0]).choice(modules, 8, replace=False).tolist())
    # the remainder goes to the larger strata, and a batch of all is every module
    odd = draw_modules(modules, 10, np.random.default_rng(0), "size", sizes)
    assert [sum(modules.index(m) // 10 == q for m in odd) for q in range(4)] == [2, 2, 3, 3]
    assert draw_modules(modules, None, np.random.default_rng(0), "size", sizes) == modules
    # fewer modules than strata: the draw still takes as many as asked (a short stratum's share moves up)
    few = {"a": 1, "b": 2, "c": 3}
    assert len(draw_modules(sorted(few), 1, np.random.default_rng(0), "size", few)) == 1
    assert len(draw_modules(sorted(few), 2, np.random.default_rng(0), "size", few)) == 2


@pytest.mark.parametrize("option, value", [("--batch", "largest"), ("--anneal", "cosine")])
def test_an_unknown_batching_or_annealing_is_refused_before_the_run_exists(tmp_path, option, value):
    result = CliRunner().invoke(app, ["train", "es", "--corpus", str(tmp_path), "-o", str(tmp_path / "run"),
                                      option, value])  # fmt: skip
    assert result.exit_code != 0 and f"{option} '{value}'" in result.output
    assert not (tmp_path / "run").exists()


def test_linear_annealing_falls_every_iteration_to_a_small_last_step():
    steps = [step_size(0.05, i, 20, "linear") for i in range(1, 21)]
    assert steps[0] == 0.05 and steps[-1] == pytest.approx(0.05 / 20)
    assert all(later < earlier for earlier, later in itertools.pairwise(steps))
    assert {step_size(0.05, i, 20, "none") for i in range(1, 21)} == {0.05}


def test_resume_reads_each_trainers_own_config_and_refuses_anothers(tmp_path):
    """``--resume`` rebuilds a trainer's options from the run's config.toml: an option this optgym no longer has is
    left out (an older run still resumes), and a run of another trainer is refused by name."""
    from optgym.train import es, imitate, pattern, sb3
    from optgym.train.run import RunError, write_config

    write_config(tmp_path, "es", {"corpus": "c", "output": "o", "iterations": 7, "an_option_since_removed": 1})
    assert es.config_from_run(tmp_path).iterations == 7
    for module, kind in ((pattern, "not a pattern search"), (imitate, "not an imitate one"), (sb3, "not an SB3")):
        with pytest.raises(RunError, match=f"is a es run, {kind}"):
            module.config_from_run(tmp_path)
    write_config(tmp_path, "pattern", {"corpus": "c", "output": "o", "sweeps": 5, "an_option_since_removed": 1})
    assert pattern.config_from_run(tmp_path).sweeps == 5
    write_config(tmp_path, "ppo", {"algorithm": "ppo", "corpus": "c", "output": "o", "iterations": 3})
    assert sb3.config_from_run(tmp_path, output=tmp_path / "out").output == str(tmp_path / "out")
