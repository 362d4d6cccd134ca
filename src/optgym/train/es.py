"""``optgym train es``: evolution strategies with antithetic sampling over whole-module compiles.

MLGO's blackbox trainer, in numpy: the policy is the flat parameter vector θ of an
:class:`~optgym.policies.mlp.MLPPolicy` — or, for a problem that picks one of several candidates
(regalloc eviction), of a :class:`~optgym.policies.scorer.CandidateScorer` (for allocation
priority its log-linear form), which starts at the problem's own rule and needs no vocab. With
``companions`` every compile also has other problems decided by fixed policies (priority trained
beside the eviction scorer it would be served with), the reward their effect together. Each iteration

1. draws ``n`` directions ε_i ~ N(0, I) (from ``seed + iteration``: a resumed run draws the same);
2. compiles every module of the iteration with θ + σε_i and with θ − σε_i — one task per
   (direction, sign, module) on :func:`~optgym.parallel.run_tasks`, the policy built *inside* the
   worker — and scores each with MLGO's reward ``1 − (size + δ) / (heuristic + δ)``;
3. estimates the gradient ``g = Σ_i (F⁺_i − F⁻_i) ε_i / (2nσ)`` from the per-direction mean rewards
   (a module that failed either way is left out of that pair) and takes an Adam ascent step.
   With ``loss_weight`` w > 0 a module made larger counts ``(1 + w)`` times its (negative) reward:
   the size target caps the share of modules made worse, and a plain mean trades one module's
   loss for another's gain at par. With ``fitness="total"`` a direction's fitness is instead the bytes
   it saves over the batch (losses weighted the same way) divided by clang's bytes: the build's total,
   which is what the size target counts — a mean of ratios lets a 300-byte module steer the step as
   hard as a 30 kB one, though it holds a hundredth of the bytes. ``worse_penalty`` P > 0 then subtracts
   P × the share of the batch's modules made more than 1 % larger than clang's: bytes cannot see a small
   module's regression, yet the size target caps the share of such modules, whatever their size.
   With ``anneal="linear"`` the step size falls from ``learning_rate`` towards zero over the run.

With validation packages (``validation_groups`` or ``validation_percent``: a package-level part of the
training side that no iteration trains on), every snapshot is compiled on them and the run's final policy is
the snapshot with the best validation fitness, not the last iterate: an ES run's iterates keep moving along
directions its batches barely constrain, and a held-out package can get worse while the batches still improve
(the .NET CSE gym evaluates every snapshot for the same reason; docs/experiments/2026-11-26-validation.md).

No value function, no per-decision credit: the whole compile is one sample, which suits a reward
that only exists once the object is measured. Snapshots (θ, Adam's moments and step, the numpy
policy) are written atomically every ``snapshot_every`` iterations; ``--resume RUN`` continues.
"""

from __future__ import annotations

import functools
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from optgym.corpus import Corpus
from optgym.corpus.portable import PortableModule, local_module, portable_modules
from optgym.corpus.split import BATCHING, draw_modules
from optgym.parallel import run_tasks
from optgym.parallel.portable import PortablePath, local_path, portable_path
from optgym.policies import PolicyFactory
from optgym.policies.allowance import (
    HEURISTIC_WEIGHT,
    allowance_policy,
    describe,
    trainable,
)
from optgym.policies.mlp import MLPPolicy
from optgym.policies.scorer import CandidateScorer, ResidualScorer
from optgym.policies.trained import TrainedPolicy, latest_snapshot, load_policy_dir
from optgym.problems import problem_class
from optgym.problems.normalize import Vocab
from optgym.train.evaluation import companion_factories, more_than_1pct_worse
from optgym.train.run import (
    ProgressCSV,
    RunError,
    check_choices,
    check_language,
    config_from,
    evaluate_final,
    modules_to_train_on,
    percentiles,
    prepare_run_dir,
    read_state,
    write_config,
    write_snapshot,
)
from optgym.train.validation import Validation, record_line, to_tensorboard, write_selection
from optgym.train.warmstart import allowance_start, grown_to, warm_start_dir


@dataclass
class ESConfig:
    corpus: str
    output: str
    split: str | None = None
    test_percent: float | None = None
    vocab: str | None = None
    warmstart: str | None = None
    iterations: int = 10
    directions: int = 4  # antithetic pairs per iteration
    modules_per_iteration: int | None = None  # default: every module of the split
    sigma: float = 0.02
    learning_rate: float = 0.01
    workers: int | None = None
    snapshot_every: int = 5
    seed: int = 0
    timeout: float = 120.0
    hidden: list[int] = field(default_factory=lambda: [64, 64])
    final_eval: bool = True
    problem: str = "inline-size"
    language: str | None = None  # train on "C" or "C++" modules only (a scorer then decides only that one)
    loss_weight: float = 0.0  # a module made larger counts (1 + loss_weight) times in the fitness
    fitness: str = "mean"  # "mean": mean per-module reward; "total": bytes saved over the batch (FITNESS)
    worse_penalty: float = 0.0  # subtracted per unit of the batch's share of modules more than 1 % worse
    #: ``[problem, policy spec]`` pairs: other problems of every compile, decided by fixed policies (a priority
    #: scorer trained beside the eviction scorer it will be served with); the reward is then all of them
    #: together against clang alone
    companions: list[list[str]] = field(default_factory=list)
    #: widen a linear candidate scorer (the start, or a linear warm start) by this many hidden units before
    #: training: a :class:`~optgym.policies.scorer.ResidualScorer` that starts with the linear one's decisions
    scorer_hidden: int = 0
    #: train an allowance over clang's inline threshold (:mod:`optgym.policies.allowance`) gated by these
    #: derived inputs, from clang's own decisions or from an allowance given as ``warmstart`` (an imitated
    #: one): ES perturbs only the gates' weights and the bias
    allowance: list[str] = field(default_factory=list)
    shaping: str = "none"  # "rank": centered ranks of the directions' fitnesses (SHAPING)
    batch: str = "uniform"  # "size": each iteration's modules drawn evenly from strata of bitcode size (BATCHING)
    anneal: str = "none"  # "linear": the step size falls from learning_rate towards zero over the run (ANNEALING)
    #: packages of the training side held back to choose the final policy (VALIDATION): named, or a seeded
    #: draw of this share of them; every snapshot is compiled on them, and the best one is the run's final policy
    validation_groups: list[str] = field(default_factory=list)
    validation_percent: float = 0.0
    validation_max_worse: float | None = None  # choose within this share of modules > 1 % worse (validation.py)
    #: an allowance's fixed weight on clang's answer: 4 only adds inlines; below 1 a negative allowance also
    #: withdraws clang's inlines whose cost is just under the threshold (optgym.policies.allowance)
    heuristic_weight: float = HEURISTIC_WEIGHT


@dataclass(frozen=True)
class ESTask:
    problem: str
    source: PortableModule  # the module, or under Ray its content: see corpus.portable
    module: str
    policy_dir: PortablePath  # architecture and vocab (under Ray by content); the weights come from ``params``
    params: np.ndarray
    timeout: float
    key: tuple[int, int]  # (direction, sign)
    companions: tuple[tuple[str, PolicyFactory], ...] = ()


@functools.lru_cache(maxsize=4)
def policy_template(policy_dir: str) -> TrainedPolicy:
    """A worker's copy of a run's policy (architecture, vocab), loaded once per process: every task then builds
    its candidate with ``with_parameters``."""
    return load_policy_dir(policy_dir)


@functools.lru_cache(maxsize=4)
def problem_context(problem_name: str, companions: tuple[str, ...] = ()):
    """A worker's problem and the toolchain that has its hook (and its companions'), found once per process."""
    from optgym.problems import get_problem
    from optgym.toolchain import find_toolchain

    problem = get_problem(problem_name)
    return problem, find_toolchain((problem.hook, *(get_problem(name).hook for name in companions)))


def es_rollout(task: ESTask) -> dict[str, Any]:
    """Worker: one module compiled by the perturbed policy; its reward against the heuristic."""
    from optgym.problems import get_problem
    from optgym.rollout import baseline, rollout

    problem, toolchain = problem_context(task.problem, tuple(name for name, _ in task.companions))
    module = local_module(task.source)
    policy = policy_template(str(local_path(task.policy_dir))).with_parameters(task.params.astype(np.float64))
    companions = [(get_problem(name), factory.build()) for name, factory in task.companions]
    base = baseline(problem, module, toolchain, timeout=task.timeout)
    run = rollout(problem, module, toolchain, policy, timeout=task.timeout, companions=companions)
    out = {"module": task.module, "key": task.key, "status": run.result.status, "decisions": run.result.decisions}
    if run.result.ok and base.ok:
        out["reward"] = float(problem.reward(run.result.metrics, base.metrics))
        out["text_bytes"] = run.result.metrics["text_bytes"]
        out["heuristic_text_bytes"] = base.metrics["text_bytes"]
    elif not base.ok:
        out["status"] = f"heuristic {base.status}"
    return out


def loss_weighted(reward: float, weight: float) -> float:
    """A module's share of the fitness: its reward, a loss (reward < 0) counted ``1 + weight`` times."""
    return reward if reward >= 0 else (1 + weight) * reward


#: How a direction's compiles become one number: per-module rewards averaged, or the batch's bytes.
FITNESS = ("mean", "total")


def direction_fitness(
    outcomes: list[dict[str, Any]], fitness: str, loss_weight: float, worse_penalty: float = 0.0
) -> float:
    """One side of one direction, from its modules' ``es_rollout`` outcomes: the mean loss-weighted reward
    (``"mean"``), or the loss-weighted bytes saved per byte of clang's (``"total"``; a module's saving is
    its own, so a loss still counts ``1 + loss_weight`` times); less ``worse_penalty`` times the share of
    the modules more than 1 % larger than clang's."""
    if fitness == "total":
        saved = sum(loss_weighted(r["heuristic_text_bytes"] - r["text_bytes"], loss_weight) for r in outcomes)
        value = saved / max(sum(r["heuristic_text_bytes"] for r in outcomes), 1)
    else:
        value = float(np.mean([loss_weighted(r["reward"], loss_weight) for r in outcomes]))
    if worse_penalty:
        worse = sum(more_than_1pct_worse(r["text_bytes"], r["heuristic_text_bytes"]) for r in outcomes)
        value -= worse_penalty * worse / len(outcomes)
    return value


#: How the directions' fitnesses are turned into the weights of their perturbations (``--shaping``).
SHAPING = ("none", "rank")


def shape(fitness: list[float], shaping: str) -> np.ndarray:
    """The fitnesses as they weigh their perturbations: as they are (``"none"``), or as centered ranks in
    ``[-½, ½]`` (``"rank"``, OpenAI's ES). Why ranks: one perturbation that inlines far too much makes a
    batch several percent larger, and its raw fitness then outweighs every other direction's — the step
    flees that one disaster, and the good directions' signal is lost. A rank only says which was worse."""
    values = np.asarray(fitness, dtype=np.float64)
    if shaping == "none" or values.size < 2:
        return values
    ranks = np.empty(values.size)
    ranks[np.argsort(values, kind="stable")] = np.arange(values.size)
    return ranks / (values.size - 1) - 0.5


#: How the step size moves over a run (``--anneal``).
ANNEALING = ("none", "linear")


def step_size(learning_rate: float, iteration: int, iterations: int, anneal: str) -> float:
    """Adam's step size at ``iteration`` (1-based) of ``iterations``: ``learning_rate`` throughout (``"none"``), or
    falling linearly from it to ``learning_rate / iterations`` at the last iteration (``"linear"``, as CleanRL
    anneals PPO's). Why anneal: Adam moves every parameter by about the step size each iteration, whatever the
    gradient's size, so where the batches' noise outweighs the signal a run that stops at full step stops on a
    random walk — three seeds of one recipe ended with single weights of opposite signs and held-out totals
    0.9060-0.9156 (docs/experiments/2026-11-25-allowance.md). Falling steps let the last iterations settle. A
    resumed run that extends ``iterations`` stretches the schedule over the new total."""
    if anneal == "none":
        return learning_rate
    return learning_rate * (1 - (iteration - 1) / iterations)


class Adam:
    """Adam for gradient *ascent* on a flat vector; its state is three arrays and a step count."""

    def __init__(self, size: int, lr: float, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> None:
        self.lr, self.b1, self.b2, self.eps = lr, b1, b2, eps
        self.m, self.v, self.t = np.zeros(size), np.zeros(size), 0

    def step(self, theta: np.ndarray, grad: np.ndarray) -> np.ndarray:
        self.t += 1
        self.m = self.b1 * self.m + (1 - self.b1) * grad
        self.v = self.b2 * self.v + (1 - self.b2) * grad * grad
        m_hat, v_hat = self.m / (1 - self.b1**self.t), self.v / (1 - self.b2**self.t)
        return theta + self.lr * m_hat / (np.sqrt(v_hat) + self.eps)


def train_es(cfg: ESConfig, *, resume: bool = False, say=print, progress: bool = False) -> dict[str, Any]:
    """Run (or resume) ES for ``cfg``; returns the final results (``RUN/final/metrics.json``)."""
    from torch.utils.tensorboard import SummaryWriter

    from optgym.train.sb3 import _resolve_split, _vocab_path

    run = Path(cfg.output)
    scored = problem_class(cfg.problem).scorer_start is not None  # a candidate scorer: no vocab
    check_language(cfg.language)
    check_choices([("--fitness", cfg.fitness, FITNESS), ("--shaping", cfg.shaping, SHAPING),
                   ("--batch", cfg.batch, BATCHING), ("--anneal", cfg.anneal, ANNEALING)])  # fmt: skip
    if cfg.scorer_hidden < 0:
        raise RunError(f"--scorer-hidden {cfg.scorer_hidden}: a number of hidden units (0: none)")
    if cfg.scorer_hidden and not (scored and problem_class(cfg.problem).scorer_form == "pick"):
        raise RunError(f"--scorer-hidden widens a linear candidate scorer; {cfg.problem}'s policy is not one")
    if cfg.allowance and scored:
        raise RunError(f"--allowance is a family of inline policies; {cfg.problem} ranks candidates")
    if not resume:
        cfg.corpus = str(Path(cfg.corpus).resolve())
        _resolve_split(cfg)  # type: ignore[arg-type]
        if not scored and not cfg.allowance:  # an allowance reads no normalized feature: no vocab
            cfg.vocab = _vocab_path(cfg)  # type: ignore[arg-type]
    split_side = Corpus(cfg.corpus, split=cfg.split)  # the training and the validation modules
    corpus = modules_to_train_on(split_side, cfg.language)
    total = functools.partial(direction_fitness, fitness="total", loss_weight=cfg.loss_weight,
                              worse_penalty=cfg.worse_penalty)  # fmt: skip
    validation = Validation.held_back_from(
        split_side, [m.name for m in corpus], cfg.validation_groups, cfg.validation_percent, problem=cfg.problem,
        workers=cfg.workers, timeout=cfg.timeout, fitness=total, companions=[(n, s) for n, s in cfg.companions],
        max_worse=cfg.validation_max_worse,
    )  # fmt: skip
    if validation:
        validating = set(validation.modules)
        corpus = [m for m in corpus if m.name not in validating]
    if cfg.allowance and cfg.warmstart and not resume:  # a start of another layout, too
        allowance_start(cfg.warmstart, cfg.problem, cfg.allowance, cfg.heuristic_weight)
    # a companion that cannot be loaded refuses the run before its directory exists, too
    with_policies = companion_factories(cfg.problem, [(name, spec) for name, spec in cfg.companions], cfg.workers)
    prepare_run_dir(run, resume=resume)
    write_config(run, "es", asdict(cfg))  # a resume may extend the budget (--iterations)
    modules = [m.name for m in corpus]
    sources = dict(zip(modules, portable_modules(corpus, cfg.workers), strict=True))  # under Ray: by content
    module_sizes = {m.name: m.bitcode.stat().st_size for m in corpus} if cfg.batch == "size" else None

    # θ and the optimizer: from the latest snapshot, the warm start, or a fresh small network
    last = latest_snapshot(run) if resume else None
    if last is not None:
        policy = load_policy_dir(last / "policy")
        with np.load(last / "es_state.npz") as z:
            theta = z["theta"].copy()
            adam = Adam(theta.size, cfg.learning_rate)
            adam.m, adam.v, adam.t = z["m"].copy(), z["v"].copy(), int(z["t"])
        iteration = read_state(last)["iteration"]
        say(f"resuming {run} from snapshot {last.name}")
    else:
        if cfg.warmstart:
            found = warm_start_dir(cfg.warmstart, cfg.problem, run)
            if found is None:
                raise RunError(f"--warmstart {cfg.warmstart} holds no policy")
            policy = load_policy_dir(found)
            if cfg.allowance:
                policy = grown_to(policy, cfg.allowance)  # type: ignore[arg-type]
        elif scored:
            policy = CandidateScorer.initial(cfg.problem)
        elif cfg.allowance:
            policy = allowance_policy(cfg.allowance, cfg.problem, heuristic_weight=cfg.heuristic_weight)
        else:
            policy = MLPPolicy.initial(Vocab.load(cfg.vocab), cfg.hidden, seed=cfg.seed, problem=cfg.problem)  # type: ignore[arg-type]
        if cfg.scorer_hidden and not isinstance(policy, ResidualScorer):
            if not isinstance(policy, CandidateScorer):
                raise RunError(f"--scorer-hidden extends a candidate scorer: --warmstart {cfg.warmstart} is not one")
            policy = ResidualScorer.extending(policy, cfg.scorer_hidden, seed=cfg.seed)
        theta = policy.parameters()
        adam = Adam(theta.size, cfg.learning_rate)
        iteration = 0
    if not resume:  # it decides what it was trained on (a C-only warm start trained on both decides both)
        policy.languages = [cfg.language] if cfg.language else None

    # what ES perturbs: every parameter, or an allowance's gates and bias
    mask = trainable(policy) if cfg.allowance else np.ones(theta.size)  # type: ignore[arg-type]

    def save(it: int, th: np.ndarray) -> None:
        def fill(tmp: Path) -> None:
            policy.with_parameters(th).save(tmp / "policy")
            np.savez(tmp / "es_state.npz", theta=th, m=adam.m, v=adam.v, t=adam.t)

        snapshot = write_snapshot(run, it, fill, {"time": time.time()})
        if validation:
            record = validation.snapshot(snapshot)
            say(record_line(record))
            to_tensorboard(writer, record)

    writer = SummaryWriter(str(run))
    if last is None:
        save(0, theta)  # a resume point before the first interval
    # the template the workers build perturbed policies from (architecture + vocab)
    template = run / "template"
    if not (template / "policy.json").exists():
        policy.save(template)
    shipped = portable_path(str(template), cfg.workers)

    score = functools.partial(direction_fitness, fitness=cfg.fitness, loss_weight=cfg.loss_weight,
                              worse_penalty=cfg.worse_penalty)  # fmt: skip
    csv = ProgressCSV(run / "progress.csv", resumed_at=("iteration", iteration))
    failures = 0
    while iteration < cfg.iterations:
        iteration += 1
        rng = np.random.default_rng([cfg.seed, iteration])
        batch = draw_modules(modules, cfg.modules_per_iteration, rng, cfg.batch, module_sizes)
        eps = rng.standard_normal((cfg.directions, theta.size)) * mask
        tasks = [
            ESTask(cfg.problem, sources[m], m, shipped, (theta + sign * cfg.sigma * eps[i]).astype(np.float32),
                   cfg.timeout, (i, sign), with_policies)
            for i in range(cfg.directions) for sign in (1, -1) for m in batch
        ]  # fmt: skip
        start = time.perf_counter()
        results: dict[tuple[int, int], dict[str, dict]] = {}
        for _, r in run_tasks(es_rollout, tasks, workers=cfg.workers, description=f"es {iteration}", progress=progress):
            results.setdefault(r["key"], {})[r["module"]] = r
        elapsed = time.perf_counter() - start

        # fitness per direction, over the modules that compiled both ways
        pairs: list[tuple[int, float, float]] = []  # (direction, F⁺, F⁻)
        rewards, sizes, heuristic = [], 0, 0
        for i in range(cfg.directions):
            plus, minus = results.get((i, 1), {}), results.get((i, -1), {})
            both = [m for m in batch if "reward" in plus.get(m, {}) and "reward" in minus.get(m, {})]
            failures += sum(1 for side in (plus, minus) for r in side.values() if "reward" not in r)
            if not both:
                continue
            pairs.append((i, score([plus[m] for m in both]), score([minus[m] for m in both])))
            for side in (plus, minus):
                rewards += [side[m]["reward"] for m in both]
                sizes += sum(side[m]["text_bytes"] for m in both)
                heuristic += sum(side[m]["heuristic_text_bytes"] for m in both)
        fitness = [f for _, f_plus, f_minus in pairs for f in (f_plus, f_minus)]
        shaped = shape(fitness, cfg.shaping)
        grad = np.zeros_like(theta)
        for k, (i, _, _) in enumerate(pairs):
            grad += (shaped[2 * k] - shaped[2 * k + 1]) * eps[i]
        grad /= 2 * cfg.directions * cfg.sigma
        adam.lr = step_size(cfg.learning_rate, iteration, cfg.iterations, cfg.anneal)
        theta = adam.step(theta, grad)

        decisions = sum(r["decisions"] for side in results.values() for r in side.values())
        row: dict[str, Any] = {
            "iteration": iteration,
            "reward/mean": float(np.mean(rewards)) if rewards else float("nan"),
            "results/vs_heuristic": sizes / heuristic if heuristic else float("nan"),
            "results/compile_failures": failures,
            "time/decisions_per_second": decisions / max(elapsed, 1e-9),
            "es/gradient_norm": float(np.linalg.norm(grad)),
            "es/fitness_spread": float(np.std(fitness)) if fitness else 0.0,
            "es/step_size": adam.lr,
        }
        row.update({f"reward/{k}": v for k, v in percentiles(rewards).items()})
        for key, value in row.items():
            if key != "iteration":
                writer.add_scalar(key, value, iteration)
        writer.flush()
        csv.write(row)
        say(f"iter {iteration:4d}  {len(tasks)} compiles  {row['time/decisions_per_second']:7.0f} dec/s  "
            f"vs heuristic {row['results/vs_heuristic']:.4f}  reward {row['reward/mean']:+.4f}"
            + (f"  failures {failures}" if failures else ""))  # fmt: skip
        if iteration % cfg.snapshot_every == 0 or iteration == cfg.iterations:
            save(iteration, theta)
    if validation:  # every snapshot validated: the best one is final
        chosen, best, records = validation.choose(run)
        with np.load(chosen / "es_state.npz") as z:
            theta = z["theta"].copy()
        say(f"final policy: snapshot {best['iteration']}, {validation.why(best)} (fitness {best['fitness']})")
    writer.close()
    policy = policy.with_parameters(theta)
    policy.save(run / "final" / "policy")
    if validation:
        write_selection(run, best, records)
    if cfg.allowance:
        say("allowance learned: " + ", ".join(f"{name} {w:+.3f}" for name, w in describe(policy)))  # type: ignore[arg-type]
    head = {"algorithm": "es", "iterations": cfg.iterations, "directions": cfg.directions}
    return evaluate_final(run, cfg.corpus, cfg.split, head, enabled=cfg.final_eval, workers=cfg.workers,
                          timeout=cfg.timeout, problem=cfg.problem, say=say)  # fmt: skip


def config_from_run(path: Path) -> ESConfig:
    return config_from(path, ESConfig, ["es"], "an ES one")


__all__ = [
    "ANNEALING",
    "FITNESS",
    "SHAPING",
    "Adam",
    "ESConfig",
    "config_from_run",
    "direction_fitness",
    "es_rollout",
    "loss_weighted",
    "shape",
    "step_size",
    "train_es",
]
