"""``optgym train ppo|a2c|dqn``: stable-baselines3 on the compiler env, with snapshots and resume.

The loop, top to bottom:

1. the corpus side to train on (``--split train``; ``--test-percent`` makes a split if none is stored);
2. P env workers (``SubprocVecEnv``), each ``optgym.make(…, on_error="skip")`` → never-inline size
   at episode end (cached) → :class:`NormalizeFeatures` → :class:`FlattenFeatures` → ``Monitor``; when
   the warm start reads derived inputs (BC trained with ``--extras``, the learned allowance),
   :class:`PolicyInputsObservation` gives them instead of the last two;
3. the SB3 model with an actor of the warm start's shape (BC's 2×64 tanh; none, a linear map, for the
   allowance), warm-started from ``--warmstart``;
4. ``learn()`` with :class:`TrainingCallback`, which at every iteration boundary logs the results
   (TensorBoard + progress.csv) and every ``snapshot_every`` iterations writes a snapshot
   atomically: SB3's zip (weights, optimizer state, step count) + the numpy policy workers run;
5. the final policy in ``RUN/final/policy``: the last iterate, or with validation packages (``--validation-percent``)
   the snapshot that saves the most bytes there (:mod:`optgym.train.validation`); when the corpus has a test
   side, its evaluation.

An *iteration* is ``steps_per_iteration`` decisions summed over the workers: for PPO and A2C one
rollout and one update (``n_steps = steps_per_iteration / workers``); for DQN, that many steps of
its own collect/train cycle. ``--resume RUN`` reloads the latest snapshot (weights, optimizer state,
step count; DQN's replay buffer is not kept) and trains to the configured total: a kill loses at most
one snapshot interval. Rewards are sparse (MLGO's, at an episode's last decision), so γ = 1 and the
returns are plain Monte-Carlo (``gae_lambda = 1``) by default.

Why PPO from BC lost ground, and the options that answer it (docs/experiments/2026-11-26-ppo.md):

* BC of a deterministic heuristic is near-certain: about 10⁻⁴ nats of entropy per decision, so sampled
  episodes almost never leave clang's decisions and their rewards are exactly 0. With a randomly
  initialized critic and SB3's per-batch advantage normalization, those zeros become unit-sized
  advantages of pure critic noise (explained variance −1 to −10¹³), and the actor is updated on them: the
  greedy decisions near BC's boundary drift, whatever the rewards say. ``--critic heuristic`` removes the
  noise. The reward is already measured against clang's own compile of the same module, so that compile
  *is* the per-module baseline: the value head starts at 0 and stays there (``vf_coef = 0``), and the
  advantages keep their units (no normalization), so an episode equal to clang's moves nothing.
* Then nothing explores. ``--temperature T`` divides the warm start's action logits by ``T``: greedy
  decisions are unchanged, and sampling flips the decisions BC is least sure of. At ``T = 4``, a few
  per thousand decisions on the demo corpus.
* Then a terminal reward blames every decision of a bad episode, BC's sure ones too, and entropy runs away.
  ``--credit deviations`` keeps the reward for the decisions that left the greedy policy.
* The MLP still carries a lucky flip to unrelated call sites. From the learned allowance's start, the actor is
  linear over the allowance's inputs and only the allowance trains (:func:`train_allowance_only`), as in ES.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import gymnasium as gym
import numpy as np

from optgym.corpus import Corpus
from optgym.corpus.cache import ResultCache
from optgym.corpus.split import apply_split
from optgym.policies.mlp import MLPPolicy
from optgym.policies.trained import latest_snapshot, policy_dir_of
from optgym.problems.inputs import reads_linkage
from optgym.problems.normalize import Vocab
from optgym.train.run import (
    ProgressCSV,
    RunError,
    check_choices,
    check_language,
    config_from,
    evaluate_final,
    modules_to_train_on,
    of_language,
    percentiles,
    prepare_run_dir,
    read_state,
    write_config,
    write_snapshot,
)
from optgym.train.validation import Validation, bytes_saved, record_line, to_tensorboard, write_selection
from optgym.train.warmstart import allowance_start

if TYPE_CHECKING:
    from optgym.env.compiler_env import CompilerEnv

log = logging.getLogger(__name__)
ALGORITHMS = ("ppo", "a2c", "dqn")
CRITICS = ("learned", "heuristic")
CREDITS = ("all", "deviations")


@dataclass
class SB3Config:
    algorithm: str
    corpus: str
    output: str
    split: str | None = None
    test_percent: float | None = None  # make a split (by package, seed) when the corpus has none
    vocab: str | None = None  # default: the warm start's vocab
    warmstart: str | None = None
    iterations: int = 20
    steps_per_iteration: int = 512
    workers: int = 2
    snapshot_every: int = 5
    seed: int = 0
    timeout: float = 120.0
    hidden: list[int] = field(default_factory=lambda: [64, 64])
    learning_rate: float = 3e-4
    gamma: float = 1.0
    hyperparameters: dict[str, Any] = field(default_factory=dict)  # passed to the SB3 constructor as is
    final_eval: bool = True
    problem: str = "inline-size"
    optimal_decision: bool = False  # OptimalDecision's look-ahead reward: 2 extra compiles per decision
    critic: str = "learned"  # "heuristic": V ≡ 0, clang's own compile of the module is the baseline (above)
    temperature: float = 1.0  # the warm start's action logits ÷ T: sampling explores, greedy decisions unchanged
    credit: str = "all"  # "deviations": only decisions that left the greedy policy share the reward (above)
    extras: list[str] = field(default_factory=list)  # the warm start's derived inputs, which the env then gives
    allowance: list[str] = field(default_factory=list)  # start from the learned allowance with these gates
    language: str | None = None  # train on "C" or "C++" modules only (the policy then decides only that one)
    #: packages of the training side held back to choose the final policy (optgym.train.validation): named, or
    #: a fixed draw of this share of them; no episode trains on them, every snapshot is compiled on them, and the
    #: best one (the warm start included) is the run's final policy
    validation_groups: list[str] = field(default_factory=list)
    validation_percent: float = 0.0
    validation_max_worse: float | None = None  # choose within this share of modules > 1 % worse (validation.py)


# -- the env each worker builds --------------------------------------------------------------------


class NeverInlineSize(gym.Wrapper):
    """Adds ``never_text_bytes`` to the last step's info (computed once per module, cached on disk)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.cache = ResultCache("never-inline")

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if terminated and "policy_text_bytes" in info:
            size = self._never(info["module"])
            if size is not None:
                info["never_text_bytes"] = size
        return obs, reward, terminated, truncated, info

    def _never(self, name: str) -> float | None:
        from optgym.rollout import rollout
        from optgym.rollout.simple import never

        base = cast("CompilerEnv", self.env.unwrapped)
        module = base.corpus[name]
        problem, toolchain = base.problem, base.toolchain
        key = self.cache.key([module.digest, problem.name, *problem.compile_flags(), toolchain.identity])
        if (hit := self.cache.get(key)) is not None:
            return hit["text_bytes"]
        result = rollout(problem, module, toolchain, never, timeout=base.timeout).result
        if not result.ok:
            return None
        self.cache.put(key, {"text_bytes": result.metrics["text_bytes"]})
        return result.metrics["text_bytes"]


def make_env(cfg: dict[str, Any], rank: int) -> gym.Env:
    """One training env (runs inside a ``SubprocVecEnv`` worker)."""
    from stable_baselines3.common.monitor import Monitor

    import optgym
    from optgym.env.wrappers import FlattenFeatures, NormalizeFeatures, PolicyInputsObservation

    corpus = Corpus(cfg["corpus"], split=cfg.get("split"))
    validating = set(cfg.get("held_back", ()))  # the validation packages: no episode trains on them
    modules = [m.name for m in of_language(corpus, cfg.get("language")) if m.name not in validating]
    linkage = reads_linkage(cfg.get("extras") or ())  # the env learns each module's callee linkage first
    env: gym.Env = optgym.make(cfg.get("problem", "inline-size"), corpus=corpus, on_error="skip",
                               timeout=cfg["timeout"], modules=modules, callee_linkage=linkage)  # fmt: skip
    if cfg.get("optimal_decision"):
        from optgym.env.wrappers import OptimalDecision

        env = OptimalDecision(env)
    env = NeverInlineSize(env)
    vocab = Vocab.load(cfg["vocab"])
    if cfg.get("extras"):  # a warm start with derived inputs (clang's answer, margins, gates) sees them here too
        env = PolicyInputsObservation(env, vocab, list(cfg["extras"]))
    else:
        env = FlattenFeatures(NormalizeFeatures(env, vocab))
    env = Monitor(env)
    env.reset(seed=cfg["seed"] + 1000 * rank)
    return env


class _EnvFactory:
    """Picklable ``lambda: make_env(cfg, rank)`` for ``SubprocVecEnv``."""

    def __init__(self, cfg: dict[str, Any], rank: int) -> None:
        self.cfg, self.rank = cfg, rank

    def __call__(self) -> gym.Env:
        return make_env(self.cfg, self.rank)


# -- the SB3 model and the numpy policy inside it -------------------------------------------------------


def _algorithm_class(name: str):
    from stable_baselines3 import A2C, DQN, PPO

    return {"ppo": PPO, "a2c": A2C, "dqn": DQN}[name]


def actor_layers(model) -> list:
    """The linear layers that map features to action logits (Q-values for DQN), in order."""
    from optgym.policies.torch_mlp import linear_layers

    if hasattr(model.policy, "q_net"):
        return linear_layers(model.policy.q_net.q_net)
    return [*linear_layers(model.policy.mlp_extractor.policy_net), model.policy.action_net]


def build_model(cfg: SB3Config, env):
    """A new SB3 model for ``cfg`` (its actor shaped like the BC network)."""
    from torch import nn

    cls = _algorithm_class(cfg.algorithm)
    n_steps = max(1, cfg.steps_per_iteration // cfg.workers)
    common: dict[str, Any] = {"learning_rate": cfg.learning_rate, "gamma": cfg.gamma, "seed": cfg.seed,
                              "device": "cpu", "verbose": 0}  # fmt: skip
    if cfg.algorithm == "dqn":
        kwargs = {**common, "policy_kwargs": {"net_arch": list(cfg.hidden), "activation_fn": nn.Tanh},
                  "learning_starts": min(200, cfg.steps_per_iteration), "buffer_size": 100_000,
                  "exploration_fraction": 0.3, "target_update_interval": 500}  # fmt: skip
    else:
        arch = {"pi": list(cfg.hidden), "vf": list(cfg.hidden) or [64, 64]}  # a linear actor keeps a real critic
        kwargs = {**common, "n_steps": n_steps, "gae_lambda": 1.0,
                  "policy_kwargs": {"net_arch": arch, "activation_fn": nn.Tanh}}  # fmt: skip
        if cfg.algorithm == "ppo":
            kwargs |= {"batch_size": min(64, n_steps * cfg.workers), "n_epochs": 4, "ent_coef": 0.0}
        if cfg.critic == "heuristic":  # rewards are against clang's compile: advantages keep their units
            kwargs |= {"vf_coef": 0.0, "normalize_advantage": False}
    kwargs |= cfg.hyperparameters
    model = cls("MlpPolicy", env, **kwargs)
    if cfg.critic == "heuristic":
        import torch

        with torch.no_grad():  # V ≡ 0: every module's baseline is clang's own compile of it
            model.policy.value_net.weight.zero_()
            model.policy.value_net.bias.zero_()
    return model


def credit_deviations_only(model) -> None:
    """Zero the advantage of every decision the rollout took as the greedy policy would (``--credit deviations``).

    The reward compares the module with clang's own compile. While the greedy policy is still clang's, only the
    sampled decisions that left it can explain that difference, yet a terminal reward credits all of the
    episode's decisions alike. At 100–1 000 decisions a module, the agreeing ones then take as much of the
    gradient as the few that mattered, and push BC's sure decisions whichever way the episode went. Runs after
    SB3 computes the advantages and before it trains on them; the policy is the one that sampled the rollout."""
    import torch

    buffer = model.rollout_buffer
    observations = torch.as_tensor(buffer.observations.reshape(-1, *buffer.obs_shape), dtype=torch.float32)
    with torch.no_grad():
        greedy = model.policy.get_distribution(observations).distribution.probs.argmax(-1).numpy()
    agreed = buffer.actions.reshape(-1).astype(np.int64) == greedy
    buffer.advantages[agreed.reshape(buffer.advantages.shape)] = 0.0


def train_allowance_only(model, policy: MLPPolicy) -> None:
    """Let PPO move only what ES moves in an allowance ``policy`` (the model's actor as a numpy policy):
    :func:`~optgym.policies.allowance.trainable`, the gates' weights and the bias of the inline logit.

    The same linear actor also reads the ~150 normalized features at weight 0. PPO with all of them free wrecked
    the allowance within 20 iterations on the demo corpus (the policy 36 % larger): normalized values up to ~20
    swamp the margin. Gradient hooks zero every other entry, so Adam never moves them. Call again after a
    resume, because hooks are not saved."""
    import torch

    from optgym.policies.allowance import trainable

    layer = actor_layers(model)[-1]
    mask = trainable(policy)
    weights = policy.weights[0][0].size  # parameters(): the weights (inputs × 2), then the bias; torch's is W.T
    weight_mask = torch.as_tensor(mask[:weights].reshape(policy.weights[0][0].shape).T, dtype=layer.weight.dtype)
    bias_mask = torch.as_tensor(mask[weights:], dtype=layer.bias.dtype)
    layer.weight.register_hook(lambda grad: grad * weight_mask)
    layer.bias.register_hook(lambda grad: grad * bias_mask)


def check_config(cfg: SB3Config) -> None:
    """Refuse a recipe SB3 cannot run, before the run directory exists."""
    check_choices([("algorithm", cfg.algorithm, ALGORITHMS), ("--critic", cfg.critic, CRITICS),
                   ("--credit", cfg.credit, CREDITS)])  # fmt: skip
    check_language(cfg.language)
    if not cfg.temperature > 0:
        raise RunError(f"--temperature must be positive, not {cfg.temperature}")
    if cfg.algorithm == "dqn" and (cfg.critic != "learned" or cfg.temperature != 1.0):
        raise RunError("--critic and --temperature are for PPO and A2C: DQN has no critic head and acts greedily")
    if cfg.credit == "deviations" and (cfg.critic != "heuristic" or cfg.algorithm == "dqn"):
        raise RunError("--credit deviations needs --critic heuristic (PPO/A2C): advantages in the reward's units")
    if cfg.allowance and (cfg.algorithm == "dqn" or cfg.problem != "inline-size"):
        raise RunError("--allowance trains an inline allowance with PPO/A2C: inline-size, not DQN")
    if cfg.allowance and not (cfg.vocab or cfg.warmstart):
        raise RunError("--allowance needs --vocab: the env normalizes the features the allowance reads at weight 0")
    if cfg.allowance and cfg.warmstart:  # the start must be an allowance with the first of these gates
        allowance_start(cfg.warmstart, cfg.problem, cfg.allowance)
    if cfg.temperature != 1.0 and not (cfg.warmstart or cfg.allowance):
        raise RunError("--temperature softens a warm start's logits: give --warmstart")


def warmstart(model, policy: MLPPolicy, temperature: float = 1.0) -> None:
    """Copy a BC (or any exported) policy into the model's actor, its action logits divided by
    ``temperature`` (the argmax, so every greedy decision, is unchanged); DQN's target net follows."""
    import torch

    from optgym.policies.torch_mlp import load_numpy_weights

    layers = actor_layers(model)
    load_numpy_weights(layers, policy)
    with torch.no_grad():
        layers[-1].weight /= temperature
        layers[-1].bias /= temperature
    if hasattr(model, "q_net_target"):
        model.q_net_target.load_state_dict(model.q_net.state_dict())


def export_policy(model, vocab: Vocab, cfg: SB3Config, directory: Path) -> MLPPolicy:
    from optgym.policies.torch_mlp import to_numpy_policy

    policy = to_numpy_policy(actor_layers(model), vocab, activation="tanh", problem=cfg.problem, extras=cfg.extras,
                             source={"algorithm": cfg.algorithm, "timesteps": int(model.num_timesteps)})  # fmt: skip
    policy.languages = [cfg.language] if cfg.language else None  # it decides what it was trained on
    policy.save(directory)
    return policy


# -- logging and snapshots ------------------------------------------------------------------------------


def _csv_writer(path: Path, timesteps: int):
    from stable_baselines3.common.logger import KVWriter

    class CSVWriter(KVWriter):
        """SB3 logger output that appends to ``progress.csv`` (resumes continue the file)."""

        def __init__(self) -> None:
            self.csv = ProgressCSV(path, resumed_at=("timesteps", timesteps))

        def write(self, key_values: dict[str, Any], key_excluded: dict[str, Any], step: int = 0) -> None:
            row: dict[str, Any] = {"timesteps": step}
            row.update({k: v for k, v in key_values.items() if isinstance(v, int | float | np.number)})
            self.csv.write(row)

        def close(self) -> None:
            pass

    return CSVWriter()


class TrainingCallback:
    """Per-iteration results, console line and snapshots; built lazily on SB3's ``BaseCallback``."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        from stable_baselines3.common.callbacks import BaseCallback

        class _Callback(BaseCallback):
            def __init__(self, cfg: SB3Config, run: Path, vocab: Vocab, iteration: int, say) -> None:
                super().__init__()
                self.cfg, self.run, self.vocab, self.iteration, self.say = cfg, run, vocab, iteration, say
                self._reset_window()
                self.failures = 0

            def _reset_window(self) -> None:
                self.episodes: list[dict[str, Any]] = []
                self.window_start, self.window_steps = time.perf_counter(), 0
                self.window_failures = 0

            def _on_step(self) -> bool:
                self.window_steps += self.training_env.num_envs
                for done, info in zip(self.locals["dones"], self.locals["infos"], strict=True):
                    if not done:
                        continue
                    if "policy_text_bytes" in info:
                        self.episodes.append(info)
                    elif info.get("status", "ok") != "ok":
                        self.window_failures += 1
                return True

            def _on_rollout_end(self) -> None:
                if self.cfg.credit == "deviations":
                    credit_deviations_only(self.model)

            def _on_rollout_start(self) -> None:
                done = self.num_timesteps // self.cfg.steps_per_iteration
                if done > self.iteration:
                    self.iteration = done
                    self.end_iteration()

            def end_iteration(self) -> None:
                eps = self.episodes
                elapsed = max(1e-9, time.perf_counter() - self.window_start)
                self.failures += self.window_failures
                record = self.logger.record
                record("time/iteration", self.iteration)
                record("time/decisions_per_second", self.window_steps / elapsed)
                record("results/compile_failures", self.failures)
                record("results/episodes", len(eps))
                infos = self.model.ep_info_buffer or ()
                buffer = [e["r"] for e in infos]
                if buffer:
                    record("rollout/ep_rew_mean", float(np.mean(buffer)))
                    record("rollout/ep_len_mean", float(np.mean([e["l"] for e in infos])))
                line = (
                    f"iter {self.iteration:4d}  steps {self.num_timesteps:8d}  {self.window_steps / elapsed:7.0f} dec/s"
                )
                if eps:
                    rewards = [e["episode"]["r"] for e in eps if "episode" in e]
                    policy = sum(e["policy_text_bytes"] for e in eps)
                    heuristic = sum(e["heuristic_text_bytes"] for e in eps)
                    record("results/vs_heuristic", policy / heuristic)
                    never = [e for e in eps if "never_text_bytes" in e]
                    if never:
                        never_total = sum(e["never_text_bytes"] for e in never)
                        record("results/vs_no_inline", sum(e["policy_text_bytes"] for e in never) / never_total)
                    for name, value in percentiles(rewards).items():
                        record(f"reward/{name}", value)
                    if rewards:
                        record("reward/mean", float(np.mean(rewards)))
                    line += f"  episodes {len(eps):3d}  vs heuristic {policy / heuristic:.4f}"
                    if rewards:
                        line += f"  reward {np.mean(rewards):+.4f}"
                if self.failures:
                    line += f"  failures {self.failures}"
                self.logger.dump(self.num_timesteps)
                self.say(line)
                if self.iteration % self.cfg.snapshot_every == 0 or self.iteration >= self.cfg.iterations:
                    snapshot(self.model, self.run, self.iteration, self.vocab, self.cfg, self.failures)
                self._reset_window()

        return _Callback(*args, **kwargs)


def snapshot(model, run: Path, iteration: int, vocab: Vocab, cfg: SB3Config, failures: int = 0) -> Path:
    """Write ``RUN/snapshots/<iteration>`` (model.zip with optimizer state, policy/, state.json) atomically."""

    def fill(tmp: Path) -> None:
        model.save(tmp / "model.zip")
        export_policy(model, vocab, cfg, tmp / "policy")

    state = {"num_timesteps": int(model.num_timesteps), "failures": failures, "time": time.time()}
    return write_snapshot(run, iteration, fill, state)


# -- the whole run ------------------------------------------------------------------------------------


def _resolve_split(cfg: SB3Config) -> None:
    """``--test-percent`` makes a split when the corpus has none; a stored split means training on its train side."""
    if cfg.test_percent is not None:
        description = Corpus(cfg.corpus).description
        if "split" not in description.get("optgym", {}):
            # by package when there are several (a package's modules share headers and templates), else by module
            by = "package" if len(description.get("optgym", {}).get("packages") or {}) > 1 else "module"
            record = apply_split(Path(cfg.corpus), test_percent=cfg.test_percent, seed=cfg.seed, by=by)
            log.warning("made a split of %s: %d train / %d test modules", cfg.corpus,
                        record["train_modules"], record["test_modules"])  # fmt: skip
        cfg.split = cfg.split or "train"
    if cfg.split is None and "split" in Corpus(cfg.corpus).description.get("optgym", {}):
        cfg.split = "train"  # a stored split decides what is trained on; the test side stays unseen
    corpus = Corpus(cfg.corpus, split=cfg.split)  # a clear error if the split is missing
    modules_to_train_on(corpus, cfg.language)


def _vocab_path(cfg: SB3Config) -> str:
    if cfg.vocab:
        return cfg.vocab
    if cfg.warmstart:
        found = policy_dir_of(Path(cfg.warmstart))
        if found is None:
            raise RunError(f"--warmstart {cfg.warmstart} holds no policy (policy.json + weights.npz)")
        return str((found / "vocab.json").resolve())
    raise RunError("a vocab is needed: pass --vocab (optgym vocab) or --warmstart (a BC directory carries its vocab)")


def train_sb3(cfg: SB3Config, *, resume: bool = False, say=print) -> dict[str, Any]:
    """Train (or resume) ``cfg``; returns the final results (also in ``RUN/final/metrics.json``)."""
    import torch
    from stable_baselines3.common.logger import Logger, TensorBoardOutputFormat
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    from optgym.policies.allowance import allowance_policy, is_allowance
    from optgym.policies.torch_mlp import to_numpy_policy

    check_config(cfg)
    run = Path(cfg.output)
    start: MLPPolicy | None = None  # a new run's warm start (a resume continues from its snapshot instead)
    torch.set_num_threads(1)  # the learner shares 2 cores with the compilers
    if resume:
        prepare_run_dir(run, resume=True)
        write_config(run, cfg.algorithm, asdict(cfg))  # a resume may extend the budget (--iterations)
        validation = validation_of(cfg)
    else:
        cfg.corpus = str(Path(cfg.corpus).resolve())
        _resolve_split(cfg)
        cfg.vocab = _vocab_path(cfg)
        if cfg.allowance and cfg.warmstart:  # an allowance given the gates it lacks (callee_survives …) at weight 0
            start = allowance_start(cfg.warmstart, cfg.problem, cfg.allowance)
        elif cfg.allowance:  # unknown gates are refused here, before the run exists
            start = allowance_policy(cfg.allowance, cfg.problem, Vocab.load(cfg.vocab))
        elif cfg.warmstart:
            start = MLPPolicy.load(policy_dir_of(Path(cfg.warmstart)))  # type: ignore[arg-type]
        if start is not None:  # the actor takes the start's shape and inputs
            cfg.hidden, cfg.extras = list(start.hidden), list(start.extras)
        validation = validation_of(cfg)  # packages that would leave nothing to train on: refused here
        prepare_run_dir(run, resume=False)
        if cfg.allowance and start is not None:  # kept in the run: the warm start a resume or a rerun finds
            cfg.warmstart = str(start.save(run / "start"))
        write_config(run, cfg.algorithm, asdict(cfg))
    vocab = Vocab.load(cfg.vocab)  # type: ignore[arg-type]
    env_cfg = {"corpus": cfg.corpus, "split": cfg.split, "vocab": cfg.vocab, "seed": cfg.seed, "extras": cfg.extras,
               "timeout": cfg.timeout, "problem": cfg.problem, "optimal_decision": cfg.optimal_decision,
               "language": cfg.language, "held_back": validation.modules if validation else []}  # fmt: skip
    factories: list[Callable[[], gym.Env]] = [_EnvFactory(env_cfg, rank) for rank in range(cfg.workers)]
    venv = SubprocVecEnv(factories, start_method="forkserver") if cfg.workers > 1 else DummyVecEnv(factories)
    try:
        cls = _algorithm_class(cfg.algorithm)
        last = latest_snapshot(run) if resume else None
        if last is not None:
            model = cls.load(last / "model.zip", env=venv, device="cpu")
            iteration = read_state(last)["iteration"]
            say(f"resuming {run} from snapshot {last.name} ({model.num_timesteps} steps)")
        else:
            model = build_model(cfg, venv)
            if start is None and cfg.warmstart:  # a resume killed before its first snapshot starts over
                start = MLPPolicy.load(policy_dir_of(Path(cfg.warmstart)))  # type: ignore[arg-type]
            if start is not None:
                warmstart(model, start, cfg.temperature)
            iteration = 0
            snapshot(model, run, 0, vocab, cfg)  # a resume point before the first interval
        actor = to_numpy_policy(actor_layers(model), vocab, problem=cfg.problem, extras=cfg.extras)
        if is_allowance(actor):
            train_allowance_only(model, actor)
        model.set_logger(
            Logger(
                str(run),
                [TensorBoardOutputFormat(str(run)), _csv_writer(run / "progress.csv", int(model.num_timesteps))],
            )
        )
        callback = TrainingCallback(cfg, run, vocab, iteration, say)
        total = cfg.iterations * cfg.steps_per_iteration
        remaining = total - int(model.num_timesteps)
        if remaining > 0:
            model.learn(remaining, callback=callback, log_interval=10**9, reset_num_timesteps=False,
                        progress_bar=False)  # fmt: skip
            if callback.iteration < cfg.iterations:  # the last iteration ends with learn(), not a rollout start
                callback.iteration = cfg.iterations
                callback.end_iteration()
        export_policy(model, vocab, cfg, run / "final" / "policy")
    finally:
        venv.close()
    if validation:
        choose_on_validation(run, validation, say)
    return final_results(cfg, run, say)


def validation_of(cfg: SB3Config) -> Validation | None:
    """The run's validation packages, if it has any: the training side's modules of its language held back
    (refused before the run exists when they would take all of it), ranked by the bytes a snapshot saves over
    them, as the size target counts a build's total."""
    side = Corpus(cfg.corpus, split=cfg.split)
    training = [m.name for m in of_language(side, cfg.language)]
    return Validation.held_back_from(side, training, cfg.validation_groups, cfg.validation_percent,
                                     problem=cfg.problem, workers=cfg.workers, timeout=cfg.timeout,
                                     fitness=bytes_saved, max_worse=cfg.validation_max_worse)  # fmt: skip


def choose_on_validation(run: Path, validation: Validation, say=print) -> None:
    """Every snapshot (the warm start's, snapshot 0, included) compiled on the validation packages; the best
    one's policy replaces ``RUN/final/policy``, and ``RUN/final/validation.json`` says which and why. Its curve
    goes to TensorBoard beside the training's (``validation/*``)."""
    from torch.utils.tensorboard import SummaryWriter

    chosen, best, records = validation.choose(run)
    with SummaryWriter(str(run)) as writer:
        for record in records:
            say(record_line(record))
            to_tensorboard(writer, record)
    final = run / "final" / "policy"
    MLPPolicy.load(chosen / "policy").save(final)
    write_selection(run, best, records)
    say(f"final policy: snapshot {best['iteration']}, {validation.why(best)} (fitness {best['fitness']})")


def final_results(cfg: SB3Config, run: Path, say=print) -> dict[str, Any]:
    """The final policy compiled greedily on each side of the corpus; ``RUN/final/metrics.json``."""
    head = {"algorithm": cfg.algorithm, "iterations": cfg.iterations,
            "decisions": cfg.iterations * cfg.steps_per_iteration}  # fmt: skip
    return evaluate_final(run, cfg.corpus, cfg.split, head, enabled=cfg.final_eval, workers=cfg.workers,
                          timeout=cfg.timeout, problem=cfg.problem, say=say)  # fmt: skip


def config_from_run(path: Path, output: Path | None = None) -> SB3Config:
    cfg = config_from(path, SB3Config, ALGORITHMS, "an SB3 one")
    if output is not None:
        cfg.output = str(output)
    return cfg


__all__ = [
    "ALGORITHMS",
    "CREDITS",
    "CRITICS",
    "SB3Config",
    "check_config",
    "config_from_run",
    "export_policy",
    "make_env",
    "train_allowance_only",
    "train_sb3",
    "warmstart",
]
