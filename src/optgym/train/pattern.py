"""``optgym train pattern``: the inline allowance fitted by pattern search to the build's own objective.

Why another trainer for the same dozen numbers. ES trains the allowance (:mod:`optgym.policies.allowance`) on a
penalized fitness averaged over small random batches, and on its own training modules it ends level with the hand
rule at best (docs/experiments/2026-11-27-imitated-allowance.md): its iterates drift along directions a batch
barely constrains, and its fitness is not what a size target counts. What a target counts is the **total bytes
of a fixed set of modules, with at most a given share of them more than 1 % larger than clang's**. This trainer
minimizes exactly that, on a fixed seeded sample of training modules, by compass search. That is a
derivative-free method, and the objective is piecewise constant, so all it promises is a weak local optimum: it
stops at a point that no single coordinate step improves.

1. start at clang's decisions (every weight 0), or at ``warmstart``, an allowance learned another way (the
   imitated fit of a search: ``optgym train imitate --allowance``), with a step of ``step`` on every coordinate
   (the bias and each gate's weight);
2. per sweep, in a seeded order (in sweep 1 a warm start's coordinates at 0 first: :func:`sweep_order`), move
   each coordinate one step, first in the direction its last kept move took
   (up at first), then the other way; the first move that lowers the sample's total and keeps the regressions
   under the cap is kept, and that coordinate's step doubles (a start past the cap keeps its own count as the
   cap, lowered as moves cut it: :func:`improves`); when neither is kept, the step halves. (The first
   runs tried both directions and kept the better; taking the first improvement saves the second direction's
   compiles wherever the first pays, the usual rule of compass search).
   With ``order="ranked"`` a sweep has no order to seed: every coordinate is first probed from the sweep's
   starting point (a step halves where neither direction improves on it), then the improving moves are taken in
   :func:`ranking`'s order, each measured again from where the moves before it left the search, and kept if it
   still improves. Why: under a binding cap the seeded order decides where a search ends. Three seeds of one
   recipe on the same 888 modules, differing only in that order, ended at 0.9256, 0.9331 and 0.9577 of clang's
   bytes, each stuck at the cap by its own path (registrations.md, d26). Ranked, the seed draws only the sample,
   so seeds differ by the code they learn from, and a sweep costs about one more measure per kept move.
   With ``repair`` (ranked only), a sweep past the cap whose probes hold no improving move takes the probe that
   removes regressions at the fewest bytes each (:func:`repair_move`), its steps left as they were;
3. stop when every step is below ``min_step``, after ``sweeps`` sweeps, or when ``max_compiles`` are spent;
4. with ``restarts`` R, do 1–3 R times, each on its own seeded sample, and keep the allowance with the fewest bytes
   on the pool the samples were drawn from (:func:`train_pattern` says why).

**Why it is affordable: replay.** An allowance's decision at a call site is a function of the inputs it reads
there (clang's answer, the cost margin, the gates), and clang is deterministic, so a compile is fully described by
its trajectory of (inputs, decision). Each compile's trajectory is kept. A candidate that gives every recorded
state of a module the decision recorded there would reach the same states and the same object, so its size is
known without compiling. Only the modules where a candidate changes a decision are compiled, and a small step
changes few. The trajectories are also kept on disk (:class:`TrajectoryStore`), so a second seed, or a run resumed
in a new process, replays what earlier runs compiled; the store is counted as compiles where the run would have
compiled, so it changes only how long a run takes. The replay is checked: a compiled trajectory that its own
policy would not reproduce is counted (``replay_mismatches``) and not stored, and the figures a claim rests on come
from ``optgym evaluate``, never from the cache.

Steps are powers of two, so every weight is a dyadic fraction that float32 (how a policy is stored) holds
exactly: the saved policy decides as the searched one did. A warm start's weights are first snapped to multiples
of 2⁻¹², which keeps that true.

A run directory holds ``config.toml``, ``progress.csv`` (one row per candidate: its coordinate, value, total and
regressions, whether it was kept, compiles spent), TensorBoard scalars, ``snapshots/<sweep>/`` (the policy and
the search state) and ``final/policy``; ``--resume RUN`` continues from the latest sweep. With restarts, it holds
``config.toml``, one such run per search under ``restarts/<r>/``, ``restarts.csv`` (each search's allowance on the
pool, and which was kept) and ``final/policy``; ``--resume RUN`` continues the first search not finished.
"""

from __future__ import annotations

import hashlib
import io
import time
from collections.abc import Callable, Sequence
from csv import DictWriter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from optgym.corpus import Corpus, Module
from optgym.corpus.cache import ResultCache
from optgym.corpus.portable import PortableModule, local_module, portable_modules
from optgym.corpus.split import draw_by_size, group_of
from optgym.files import atomic_write_bytes
from optgym.parallel import run_tasks
from optgym.parallel.portable import PortablePath, local_path, portable_path
from optgym.policies.allowance import DEFAULT_GATES, allowance_policy, describe, trainable
from optgym.policies.mlp import MLPPolicy
from optgym.policies.trained import latest_snapshot
from optgym.rollout import DEFAULT_TIMEOUT, baseline, rollout
from optgym.rollout.decider import DecisionPoint
from optgym.rollout.linkage import linkage_key
from optgym.toolchain.language import is_cxx
from optgym.train.es import policy_template, problem_context
from optgym.train.evaluation import more_than_1pct_worse
from optgym.train.run import (
    CONFIG,
    ProgressCSV,
    RunError,
    check_language,
    check_share,
    config_from,
    evaluate_final,
    every_kth,
    modules_to_train_on,
    prepare_run_dir,
    read_state,
    write_config,
    write_snapshot,
)
from optgym.train.warmstart import allowance_start

SAMPLE_STREAM = 11  # the random stream of the sample's draw, apart from the coordinate order's
HALVES_STREAM = 13  # the random stream of the packages' order when the sample is halved
ORDERS = ("seeded", "ranked")
GRID = 2.0**-12  # a warm start's weights are snapped to this grid: with power-of-two steps, float32 still holds them


@dataclass
class PatternConfig:
    corpus: str
    output: str
    # None (every module) is each option's default: config.toml cannot hold None, so a resumed run reads it back so
    split: str | None = None
    language: str | None = None
    sample: int | None = None  # modules drawn evenly over four strata of bitcode size
    hold_out_every: int | None = None  # leave out every K-th module by name (what `optgym evaluate --every K` checks)
    gates: list[str] = field(default_factory=lambda: list(DEFAULT_GATES))
    warmstart: str | None = None  # an allowance with these gates to start from (default: clang's decisions)
    step: float = 0.25  # the first step on every coordinate, in margin units (allowance a: exp(8a) − 1 cost units)
    min_step: float = 1 / 64
    max_worse: float = 0.02  # largest share of the sample's modules more than 1 % larger than clang's
    halves: bool = False  # keep a move only if neither half of the sample (split by package) grows: :func:`improves`
    repair: bool = False  # ranked: a start past the cap that no move improves takes :func:`repair_move`'s probe
    order: str = "seeded"  # seeded: each coordinate in turn, in a seeded order; ranked: probe all, take best first
    store: bool = True  # replay other runs' trajectories of the same modules and layout (TrajectoryStore)
    sweeps: int = 8
    max_compiles: int = 8000
    workers: int | None = None
    seed: int = 0
    timeout: float = DEFAULT_TIMEOUT
    final_eval: bool = True
    problem: str = "inline-size"
    restarts: int = 1  # searches, each on its own seeded sample; the one with the fewest bytes on the pool is kept
    restart: int = 0  # which of its run's searches this one is: the sample's draw (0: the run's seed alone)


# -- one compile, recorded -------------------------------------------------------------------------------------


class InputRecorder:
    """Wraps an allowance policy to keep the derived inputs it read at each decision (clang's answer, the margin,
    the gates): what a later candidate's decisions along the same trajectory are computed from."""

    def __init__(self, policy: MLPPolicy) -> None:
        self.policy = policy
        self.rows: list[list[float]] = []
        self.reads_callee_linkage = policy.reads_callee_linkage  # the episode learns the linkage for it

    def __call__(self, point: DecisionPoint) -> tuple[int, float]:
        raw = np.asarray(point.vector(), dtype=np.float64)
        survives = point.callee_survives if self.reads_callee_linkage else None
        self.rows.append(self.policy.inputs.extras_of_one(raw, point.heuristic, is_cxx(point.language), survives))
        return self.policy(point)


@dataclass(frozen=True)
class PatternTask:
    problem: str
    source: PortableModule  # the module, or under Ray its content: see corpus.portable
    module: str
    policy_dir: PortablePath  # the allowance's layout; the weights come from ``params``
    params: np.ndarray
    timeout: float
    baseline: bool = True  # clang's own size too; the driver asks once per module (the cache re-hashes the bitcode)


def compile_recorded(task: PatternTask) -> dict[str, Any]:
    """Worker: one module compiled by a candidate, with its trajectory of inputs and decisions and clang's size."""
    problem, toolchain = problem_context(task.problem)
    module = local_module(task.source)
    policy = policy_template(str(local_path(task.policy_dir))).with_parameters(task.params)
    assert isinstance(policy, MLPPolicy)  # the template is an allowance
    recorder = InputRecorder(policy)
    base = baseline(problem, module, toolchain, timeout=task.timeout) if task.baseline else None
    run = rollout(problem, module, toolchain, recorder, timeout=task.timeout)
    out: dict[str, Any] = {"module": task.module, "status": run.result.status}
    if base is not None and not base.ok:
        out["status"] = f"heuristic {base.status}"
    elif run.result.ok:
        out["text_bytes"] = int(run.result.metrics["text_bytes"])
        if base is not None:
            out["heuristic_text_bytes"] = int(base.metrics["text_bytes"])
        out["inputs"] = np.asarray(recorder.rows, dtype=np.float64).reshape(len(recorder.rows), len(policy.extras))
        out["actions"] = run.trajectory.actions.astype(np.int8)
    return out


# -- what replay knows -------------------------------------------------------------------------------------------


@dataclass
class Recorded:
    inputs: np.ndarray  # [T, E] the allowance's derived inputs at each decision
    actions: np.ndarray  # [T] the decisions taken
    text_bytes: int
    heuristic_text_bytes: int  # clang's own size of the module


def inline_logit(policy: MLPPolicy) -> tuple[np.ndarray, float]:
    """The allowance's inline logit as ``inputs @ weights + bias`` over its derived inputs (its normalized features
    have weight 0, and the other action's logit is 0)."""
    ((weights, bias),) = policy.weights
    return weights[policy.normalizer.width :, 1], float(bias[1])


def replays(record: Recorded, weights: np.ndarray, bias: float) -> bool:
    """Whether a candidate with these inline weights takes every decision of ``record`` as recorded there."""
    return bool(np.array_equal(record.inputs @ weights + bias > 0.0, record.actions == 1))


@dataclass(frozen=True)
class Trajectory:
    """A recorded trajectory as a module's :class:`Trajectories` hold it: its rows as indices into their table."""

    rows: np.ndarray  # [T] each decision's inputs, a row of the module's table
    inline: np.ndarray  # [T] bool, the decisions taken
    text_bytes: int
    heuristic_text_bytes: int


class Trajectories:
    """Every trajectory of one module that a search knows, each distinct row of inputs held once.

    Why: a module's trajectories differ in a few decisions, so their rows repeat. In 1 843 stored trajectories of
    40 modules, 3.1 million rows held 4 621 distinct ones. Held whole, the 74 000 trajectories of the store after
    eight seeds took 13 GB of a search's memory, a share that grows with every run; held as indices, a few hundred
    MB. The check gets cheaper the same way: a candidate's decision is computed once per distinct row, and a
    trajectory replays when the decisions at its rows are its own. Per row the product is the one
    :func:`replays` computes, so the answer is the same."""

    def __init__(self) -> None:
        self.index: dict[bytes, int] = {}  # a row's bytes → its row in the table
        self.rows: list[np.ndarray] = []
        self.table = np.zeros((0, 0))  # the rows stacked, when a candidate is decided on them
        self.decided: tuple[bytes, int, np.ndarray] | None = None  # (weights and bias, table rows, decisions)

    def add(self, record: Recorded) -> Trajectory:
        """``record`` with its rows entered in the table."""
        inputs = np.ascontiguousarray(record.inputs, dtype=np.float64)
        distinct, where = np.unique(inputs, axis=0, return_inverse=True)
        at = np.empty(len(distinct), dtype=np.int32)
        for i, row in enumerate(distinct):
            at[i] = self.index.setdefault(row.tobytes(), len(self.rows))
            if at[i] == len(self.rows):
                self.rows.append(row)
        return Trajectory(at[np.ravel(where)], np.asarray(record.actions) == 1, record.text_bytes,
                          record.heuristic_text_bytes)  # fmt: skip

    def first_replayed(self, known: Sequence[Trajectory], weights: np.ndarray, bias: float) -> Trajectory | None:
        """The first of ``known`` (trajectories of this module) that a candidate with these weights replays."""
        if not known:
            return None
        key = weights.tobytes() + np.float64(bias).tobytes()
        if self.decided is None or self.decided[:2] != (key, len(self.rows)):
            if self.table.shape != (len(self.rows), len(weights)):
                self.table = np.stack(self.rows) if self.rows else np.zeros((0, len(weights)))
            self.decided = (key, len(self.rows), self.table @ weights + bias > 0.0)
        inline = self.decided[2]
        return next((t for t in known if np.array_equal(inline[t.rows], t.inline)), None)


class TrajectoryStore:
    """Every compiled trajectory of a module under one allowance layout, kept on disk beside the other caches
    (``<cache>/trajectories``), so that another run (a second seed, a resumed run) replays what this one compiled.

    It changes how long a search takes, never what it finds: a trajectory taken from the store is counted as a
    compile, exactly where the run would have compiled it without the store (:meth:`Sample.measure`), so the
    budget runs out at the same candidate. The key holds what a trajectory depends on: the module's bitcode, the
    problem's flags, the compiler, and the layout of the inputs the allowance reads."""

    def __init__(self, policy: MLPPolicy, problem_name: str, root: Path | None = None) -> None:
        problem, toolchain = problem_context(problem_name)
        self.cache = ResultCache("trajectories", root)
        self.parts = [problem.name, *problem.compile_flags(), toolchain.identity, *policy.extras,
                      *linkage_key(policy.reads_callee_linkage, toolchain),
                      f"languages={policy.languages}"]  # fmt: skip
        self.loaded: dict[str, list[Trajectory]] = {}

    def _directory(self, digest: str) -> Path:
        return self.cache.sharded(self.cache.key([digest, *self.parts]))

    def records(self, digest: str, into: Trajectories) -> list[Trajectory]:
        """The module's stored trajectories, their rows entered in ``into`` (read once per run)."""
        if digest not in self.loaded:
            found = []
            for path in sorted(self._directory(digest).glob("*.npz")):
                try:
                    with np.load(path) as f:
                        found.append(into.add(Recorded(f["inputs"], f["actions"], int(f["text_bytes"]),
                                                       int(f["heuristic_text_bytes"]))))  # fmt: skip
                except (OSError, ValueError, KeyError):  # a file cut short by a kill: compiled again instead
                    continue
            self.loaded[digest] = found
        return self.loaded[digest]

    def add(self, digest: str, record: Recorded, trajectory: Trajectory) -> None:
        """``record`` written to the store; ``trajectory``, its form in the module's table, joins what was read."""
        name = hashlib.sha256(record.actions.tobytes() + record.inputs.tobytes()).hexdigest()[:24]
        buf = io.BytesIO()
        np.savez_compressed(buf, inputs=record.inputs, actions=record.actions, text_bytes=record.text_bytes,
                            heuristic_text_bytes=record.heuristic_text_bytes)  # fmt: skip
        atomic_write_bytes(self._directory(digest) / f"{name}.npz", buf.getvalue())
        if digest in self.loaded:
            self.loaded[digest].append(trajectory)


@dataclass
class Measured:
    """A candidate on the sample: its bytes and clang's, the modules it makes > 1 % larger, compiles it cost."""

    text_bytes: int
    heuristic_text_bytes: int
    worse: int
    compiles: int
    failed: int
    halves: tuple[int, int] = (0, 0)  # text bytes in each half of the sample (:func:`sample_halves`)

    @property
    def ratio(self) -> float:
        return self.text_bytes / self.heuristic_text_bytes


class Sample:
    """The fixed training sample and every trajectory compiled on it so far."""

    def __init__(self, cfg: PatternConfig, modules: list[Module], template: PortablePath, policy: MLPPolicy):
        self.cfg, self.template, self.policy = cfg, template, policy
        self.names = [m.name for m in modules]
        self.half = sample_halves(self.names, cfg.seed)
        self.sources = dict(zip(self.names, portable_modules(modules, cfg.workers), strict=True))
        self.digests = {m.name: m.digest for m in modules}
        self.store = TrajectoryStore(policy, cfg.problem) if cfg.store else None
        self.recorded: dict[str, list[Trajectory]] = {name: [] for name in self.names}  # this run's own
        self.tables = {name: Trajectories() for name in self.names}  # the rows of its own and the store's
        self.heuristic: dict[str, int] = {}
        self.compiles = 0  # what the run would have compiled without the store, the budget's count
        self.from_store = 0  # of those, the trajectories the store held
        self.mismatches = 0

    def measure(self, params: np.ndarray, say: Callable[[str], Any]) -> Measured:
        """``params`` on every module of the sample: replayed where a recorded trajectory fits, compiled elsewhere."""
        candidate = self.policy.with_parameters(params)
        weights, bias = inline_logit(candidate)
        sizes: dict[str, int] = {}
        for name in self.names:
            hit = self.tables[name].first_replayed(self.recorded[name], weights, bias)
            if hit is not None:
                sizes[name] = hit.text_bytes
        missing = [name for name in self.names if name not in sizes]
        self.compiles += len(missing)  # a trajectory from the store too: the budget ends where it would without it
        compile_now = []
        for name in missing:
            stored = self.store.records(self.digests[name], self.tables[name]) if self.store else []
            hit = self.tables[name].first_replayed(stored, weights, bias)
            if hit is None:
                compile_now.append(name)
                continue
            self.from_store += 1
            self.heuristic.setdefault(name, hit.heuristic_text_bytes)
            self.recorded[name].append(hit)
            sizes[name] = hit.text_bytes
        tasks = [PatternTask(self.cfg.problem, self.sources[name], name, self.template, params, self.cfg.timeout,
                             baseline=name not in self.heuristic) for name in compile_now]  # fmt: skip
        failed = 0
        for _, out in run_tasks(compile_recorded, tasks, workers=self.cfg.workers, progress=False) if tasks else ():
            name = out["module"]
            if "text_bytes" not in out:  # counted at clang's size, as a served build falls back to clang's object
                failed += 1
                say(f"{name}: {out['status']}")
                continue
            if "heuristic_text_bytes" in out:  # the module's first compile
                self.heuristic[name] = out["heuristic_text_bytes"]
            record = Recorded(out["inputs"], out["actions"], out["text_bytes"], self.heuristic[name])
            trajectory = self.tables[name].add(record)
            if not replays(record, weights, bias):
                self.mismatches += 1
            elif self.store:  # a trajectory its own weights would not take again is not worth keeping
                self.store.add(self.digests[name], record, trajectory)
            self.recorded[name].append(trajectory)
            sizes[name] = record.text_bytes
        known = [name for name in self.names if name in self.heuristic]
        total = sum(sizes.get(name, self.heuristic[name]) for name in known)
        clang = sum(self.heuristic[name] for name in known)
        worse = sum(more_than_1pct_worse(sizes[name], self.heuristic[name]) for name in known if name in sizes)

        def half(h: int) -> int:
            return sum(sizes.get(name, self.heuristic[name]) for name in known if self.half[name] == h)

        return Measured(total, clang, worse, len(missing), failed, (half(0), half(1)))


def sample_halves(names: Sequence[str], seed: int) -> dict[str, int]:
    """Each sampled module's half (0 or 1), whole packages to a half: the packages in a seeded order, each to the
    half with fewer modules so far. Halves that share no package ask a move's saving to hold on two separate
    bodies of code."""
    packages: dict[str, list[str]] = {}
    for name in names:
        packages.setdefault(group_of(name, "package"), []).append(name)
    order = np.random.default_rng([seed, HALVES_STREAM]).permutation(sorted(packages)).tolist()
    half: dict[str, int] = {}
    counts = [0, 0]
    for package in order:
        h = int(counts[1] < counts[0])
        counts[h] += len(packages[package])
        half.update(dict.fromkeys(packages[package], h))
    return half


# -- the search ----------------------------------------------------------------------------------------------------


def improves(candidate: Measured, current: Measured, cap: int, halves: bool = False) -> bool:
    """The target's own rule: fewer bytes in total, with at most ``cap`` modules more than 1 % larger than clang's.
    A byte saved never buys a regression past the cap, however many bytes it is.

    A warm start can be past the cap (imitated fits and PPO's finals leave 2–9 % of a size-stratified sample
    worse). Then the cap is a ratchet: the bound is the current point's own count, and it falls with every kept
    move that leaves fewer modules worse. So the search never trades bytes for fewer regressions either. The
    earlier rule took any move with fewer regressions, whatever its bytes, and walked a PPO start from 0.921 of
    clang's bytes to 0.99 in one sweep before the move that cuts both (docs/experiments/2026-11-27-callee-linkage.md).
    At equal bytes, fewer regressions is progress.

    With ``halves``, a move must also leave neither half of the sample larger. A sample total is dominated by its
    largest modules, and a move that pays on a few of them can cost everywhere else: on one seed, one step of the
    ≥ 256-function gate took the sample from 0.979 to 0.943 of clang's bytes, and the search ended at 0.979 on the
    gate sample, where its start gave 0.956 (docs/experiments/2026-11-28-wide-search.md)."""
    if candidate.worse > max(cap, current.worse):
        return False
    if halves and any(c > k for c, k in zip(candidate.halves, current.halves, strict=True)):
        return False
    fewer_bytes = candidate.text_bytes < current.text_bytes
    return fewer_bytes or (candidate.text_bytes == current.text_bytes and candidate.worse < current.worse)


def repair_move(probes: Sequence[Measured], current: Measured) -> int | None:
    """The probe a search past its cap takes when none improves (``repair``): the one that leaves fewer modules
    worse at the fewest bytes added per module it brings back within 1 % of clang's; ``None`` when no probe
    leaves fewer worse. Ties go to the earlier probe (the lower coordinate).

    Why. :func:`improves` never buys regressions back with bytes, so a start past the cap is held there for good
    whenever every move that saves bytes also costs a module. d33 started d35 at 29 of 800 modules worse, over its
    cap of 8; sweep 1 found no move that kept 29, while one probe left 6 worse at 0.75 % more bytes
    (registrations.md, d35). Spending bytes only where each buys back the most regressions is the cheapest way
    under the cap. (Before its ratchet, :func:`improves` took any move with fewer regressions first, whatever it
    cost, and walked a PPO start from 0.921 of clang's bytes to 0.99 in one sweep.)"""
    costs = [((probe.text_bytes - current.text_bytes) / (current.worse - probe.worse), i)
             for i, probe in enumerate(probes) if probe.worse < current.worse]  # fmt: skip
    return min(costs)[1] if costs else None


def ranking(candidate: Measured, current: Measured) -> tuple[int, int]:
    """The order a ranked sweep takes its improving moves in: those that leave no more modules worse first, then
    the fewest bytes. The cap on regressions is a budget that a kept move spends for good (:func:`improves` never
    buys one back with bytes), so it goes last, to the moves that still pay after every free one is taken."""
    return candidate.worse - current.worse, candidate.text_bytes


def sweep_order(seed: int, sweep: int, count: int, first: Sequence[int] | np.ndarray = ()) -> list[int]:
    """The order a sweep moves the coordinates in: seeded per sweep, with ``first`` ahead of the rest (each part in
    the seeded order). Sweep 1 of a warm start puts its coordinates at 0 first: the gates a start was grown with,
    or ones its trainer never moved. Its other weights sit where their own trainer left them, at a local optimum of
    its objective, so a first step on them seldom pays; and a budget that ends mid-sweep (3 000 compiles run out
    after about 10 of a 22-move sweep) would otherwise try the new inputs only by chance."""
    order = np.random.default_rng([seed, sweep]).permutation(count).tolist()
    ahead = set(int(k) for k in first)
    return [k for k in order if k in ahead] + [k for k in order if k not in ahead]


def training_sample(cfg: PatternConfig) -> list[Module]:
    """The modules searched: the training side's (of ``language``), without every ``hold_out_every``-th by name,
    then a seeded draw of ``sample`` of them, even over four strata of size. Refused before the run directory
    exists when nothing is left."""
    side = Corpus(cfg.corpus, split=cfg.split)
    modules = modules_to_train_on(side, cfg.language)
    if cfg.hold_out_every:
        held_out = set(every_kth([m.name for m in modules], cfg.hold_out_every))
        modules = [m for m in modules if m.name not in held_out]
    if not modules:
        raise RunError(f"--hold-out-every {cfg.hold_out_every} leaves no module to train on")
    stream = [cfg.seed, SAMPLE_STREAM] + ([cfg.restart] if cfg.restart else [])  # restart 0 draws as a lone search
    return draw_by_size(modules, cfg.sample, np.random.default_rng(stream))


def check_config(cfg: PatternConfig) -> None:
    check_language(cfg.language)
    if not 0 < cfg.min_step <= cfg.step:
        raise RunError(f"--step {cfg.step}, --min-step {cfg.min_step}: 0 < min-step ≤ step")
    for name, value in (("--step", cfg.step), ("--min-step", cfg.min_step)):
        if not np.log2(value).is_integer():
            raise RunError(f"{name} {value}: a power of two (1, 0.5, 0.25 …), which float32 weights hold exactly")
    check_share("--max-worse", cfg.max_worse, "the sample's modules")
    if cfg.sample is not None and cfg.sample < 1:
        raise RunError(f"--sample {cfg.sample}: at least one module")
    if cfg.order not in ORDERS:
        raise RunError(f"--order {cfg.order}: one of {', '.join(ORDERS)}")
    if cfg.repair and cfg.order != "ranked":
        raise RunError("--repair needs --order ranked: a repair compares every coordinate's probe from one point")
    if cfg.restarts < 1:
        raise RunError(f"--restarts {cfg.restarts}: at least one search")
    if cfg.hold_out_every is not None and cfg.hold_out_every < 2:
        raise RunError(f"--hold-out-every {cfg.hold_out_every}: 2 or more (1 would hold out every module)")


def train_pattern(cfg: PatternConfig, *, resume: bool = False, say: Callable[[str], Any] = print) -> dict[str, Any]:
    """Run (or resume) ``cfg``: one compass search, or with ``restarts`` R, R searches each on its own seeded sample
    (``RUN/restarts/<r>/``, each an ordinary run) and the one whose allowance gives the fewest bytes, under the cap,
    on the whole pool the samples were drawn from (``RUN/restarts.csv``). Returns the final results
    (``RUN/final/metrics.json``).

    Why restarts. Run to convergence, a search stops at a point no single step improves, and where the cap on
    regressions binds that point depends on the path: one module more or less in the sample lets a move in or keeps
    it out for good. One seed in six of the converged recipe settled at 0.952 of clang's bytes where the others
    ended between 0.906 and 0.924 (registrations.md, d31): a move on a gate that holds in most modules spent the cap
    early, and the deletion gates' moves, each one regression past it, were never taken. Independent samples reach
    such a point independently, so keeping the better of R searches, measured on modules that every one of them
    is judged on alike, leaves a poor optimum only when all R reach one. The choice reads training modules only."""
    if cfg.restarts == 1:
        return search(cfg, resume=resume, say=say)
    check_config(cfg)
    if not resume:
        cfg.corpus = str(Path(cfg.corpus).resolve())
    run = prepare_run_dir(Path(cfg.output), resume=resume)
    write_config(run, "pattern", asdict(cfg))
    finals: list[MLPPolicy] = []
    for r in range(cfg.restarts):
        one = replace(cfg, output=str(run / "restarts" / str(r)), restarts=1, restart=r, final_eval=False)
        final = Path(one.output) / "final" / "policy"
        if not (final / "policy.json").exists():  # a finished search is kept as it is, even when resumed
            say(f"search {r + 1} of {cfg.restarts}")
            search(one, resume=(Path(one.output) / CONFIG).exists(), say=say)
        finals.append(MLPPolicy.load(final))
    rows = measure_on_pool(cfg, run, finals, say)
    chosen = min(rows, key=lambda row: (row["past_cap"], row["text_bytes"], row["restart"]))
    for row in rows:
        row["kept"] = int(row is chosen)
    table = io.StringIO()
    writer = DictWriter(table, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_bytes(run / "restarts.csv", table.getvalue().encode())
    best = finals[chosen["restart"]]
    best.save(run / "final" / "policy")
    say(f"kept search {chosen['restart'] + 1}: {chosen['total_ratio']:.4f} of clang's bytes on the pool's "
        f"{chosen['modules']} modules, {chosen['worse']} worse")  # fmt: skip
    head = {"algorithm": "pattern", "restarts": cfg.restarts, "kept_restart": chosen["restart"],
            "pool_ratio": chosen["total_ratio"], "pool_worse": chosen["worse"],
            "pool_modules": chosen["modules"]}  # fmt: skip
    return evaluate_final(run, cfg.corpus, cfg.split, head, enabled=cfg.final_eval, workers=cfg.workers,
                          timeout=cfg.timeout, problem=cfg.problem, say=say)  # fmt: skip


def measure_on_pool(cfg: PatternConfig, run: Path, finals: list[MLPPolicy], say: Callable[[str], Any]) -> list[dict]:
    """Each search's allowance on every module its sample was drawn from (``cfg`` without ``sample``): replayed
    where its own search, or the store, holds the trajectory, compiled elsewhere. One row per search."""
    pool = training_sample(replace(cfg, sample=None, restart=0))
    policy = allowance_policy(cfg.gates, cfg.problem)
    template = run / "template"
    if not (template / "policy.json").exists():
        policy.save(template)
    on_pool = Sample(cfg, pool, portable_path(str(template), cfg.workers), policy)
    cap = int(np.floor(cfg.max_worse * len(pool)))
    rows = []
    for r, final in enumerate(finals):
        measured = on_pool.measure(final.parameters(), say)
        rows.append({"restart": r, "modules": len(pool), "total_ratio": measured.ratio, "worse": measured.worse,
                     "past_cap": max(measured.worse - cap, 0), "text_bytes": measured.text_bytes,
                     "heuristic_text_bytes": measured.heuristic_text_bytes, "failed": measured.failed})  # fmt: skip
        say(f"search {r + 1} on the pool: {measured.ratio:.4f} of clang's bytes, {measured.worse} worse (cap {cap})")
    return rows


def search(cfg: PatternConfig, *, resume: bool = False, say: Callable[[str], Any] = print) -> dict[str, Any]:
    """One compass search for ``cfg`` (the module's steps 1–3), run or resumed."""
    from torch.utils.tensorboard import SummaryWriter

    check_config(cfg)
    if not resume:
        cfg.corpus = str(Path(cfg.corpus).resolve())
    modules = training_sample(cfg)
    policy = allowance_policy(cfg.gates, cfg.problem)
    theta = policy.parameters()
    coordinates = np.flatnonzero(trainable(policy))  # the gates' weights, then the bias
    untried: np.ndarray = np.zeros(0, dtype=int)  # a warm start's coordinates at 0: sweep 1 tries them first
    if cfg.warmstart:  # refused, before the run directory exists, unless it has these gates
        warm = np.round(allowance_start(cfg.warmstart, cfg.problem, cfg.gates).parameters()[coordinates] / GRID) * GRID
        untried = np.flatnonzero(warm == 0)
        if not resume:
            theta[coordinates] = warm
    run = prepare_run_dir(Path(cfg.output), resume=resume)
    write_config(run, "pattern", asdict(cfg))
    policy.languages = [cfg.language] if cfg.language else None
    names = [*cfg.gates, "bias"]
    steps = np.full(len(coordinates), cfg.step)
    signs = np.ones(len(coordinates))  # per coordinate, the direction of its last kept move
    sweep, spent_before = 0, 0
    last = latest_snapshot(run) if resume else None
    if last is not None:
        state = read_state(last)
        theta[coordinates] = state["params"]
        steps, sweep, spent_before = np.asarray(state["steps"]), state["iteration"], state["compiles"]
        signs = np.asarray(state.get("signs", signs))
        say(f"resuming {run} after sweep {sweep}")
    template = run / "template"
    if not (template / "policy.json").exists():
        policy.save(template)
    sample = Sample(cfg, modules, portable_path(str(template), cfg.workers), policy)
    writer = SummaryWriter(str(run))
    csv = ProgressCSV(run / "progress.csv", resumed_at=("sweep", sweep))

    def spent() -> int:
        return spent_before + sample.compiles

    def save(at: int) -> None:
        state = {"params": theta[coordinates].tolist(), "steps": steps.tolist(), "signs": signs.tolist(),
                 "compiles": spent(), "total_ratio": current.ratio, "worse": current.worse}  # fmt: skip

        def fill(tmp: Path) -> None:
            policy.with_parameters(theta).save(tmp / "policy")

        write_snapshot(run, at, fill, state)

    start = time.perf_counter()
    current = sample.measure(theta, say)
    cap = int(np.floor(cfg.max_worse * len(modules)))
    say(f"{len(modules)} modules, at most {cap} of them > 1 % worse; start {current.ratio:.4f} of clang's bytes "
        f"({current.worse} worse), {current.compiles} compiles")  # fmt: skip
    if last is None:
        save(0)
    evaluation = 0

    def try_move(k: int, sign: float, phase: str) -> tuple[np.ndarray, Measured, bool]:
        """Coordinate ``k`` moved one step ``sign``-wards from the current point: the trial, its measure, and
        whether it improves on the current point (a row of progress.csv either way)."""
        trial = theta.copy()
        trial[coordinates[k]] += sign * steps[k]
        measured = sample.measure(trial, say)
        better = improves(measured, current, cap, cfg.halves)
        record(k, trial, measured, phase, better, kept=better and phase != "probe")
        return trial, measured, better

    def record(k: int, trial: np.ndarray, measured: Measured, phase: str, better: bool, kept: bool) -> None:
        nonlocal evaluation
        evaluation += 1
        csv.write({"sweep": sweep, "evaluation": evaluation, "phase": phase, "coordinate": names[k],
                   "value": float(trial[coordinates[k]]), "total_ratio": measured.ratio, "worse": measured.worse,
                   "better": int(better), "kept": int(kept), "compiles": spent(), "failed": measured.failed,
                   "replay_mismatches": sample.mismatches, "from_store": sample.from_store})  # fmt: skip

    def keep(k: int, sign: float, trial: np.ndarray, measured: Measured) -> None:
        nonlocal theta, current
        theta, current, signs[k] = trial, measured, sign
        steps[k] *= 2  # a move that paid is tried further next time

    def live(k: int) -> bool:
        return steps[k] >= cfg.min_step and spent() < cfg.max_compiles

    while sweep < cfg.sweeps and steps.max() >= cfg.min_step and spent() < cfg.max_compiles:
        sweep += 1
        if cfg.order == "seeded":
            for k in sweep_order(cfg.seed, sweep, len(coordinates), untried if sweep == 1 else ()):
                if not live(k):
                    continue
                for sign in (signs[k], -signs[k]):  # the direction that paid last on this coordinate first
                    trial, measured, better = try_move(k, sign, "move")
                    if better:  # the first improvement is taken: the other direction's compiles are saved
                        keep(k, sign, trial, measured)
                        break
                else:
                    steps[k] /= 2
        else:  # ranked: every coordinate probed from the same point, then the moves taken best first
            found: list[tuple[int, float, np.ndarray, Measured]] = []
            probes: list[tuple[int, float, np.ndarray, Measured]] = []
            steps_before = steps.copy()
            for k in range(len(coordinates)):
                if not live(k):
                    continue
                for sign in (signs[k], -signs[k]):
                    trial, measured, better = try_move(k, sign, "probe")
                    probes.append((k, sign, trial, measured))
                    if better:
                        found.append((k, sign, trial, measured))
                        break
                else:
                    steps[k] /= 2
            repair = cfg.repair and not found and current.worse > cap
            if repair and (chosen := repair_move([p[3] for p in probes], current)) is not None:
                k, sign, trial, measured = probes[chosen]
                record(k, trial, measured, "repair", better=False, kept=True)
                theta, current, signs[k] = trial, measured, sign
                steps[:] = steps_before  # the probes that failed were measured from the point just left
            found.sort(key=lambda f: (*ranking(f[3], current), f[0]))  # ties: the coordinate
            for rank, (k, sign, trial, measured) in enumerate(found):
                if rank == 0:  # measured from the current point: taken without another compile
                    record(k, trial, measured, "apply", better=True, kept=True)
                    keep(k, sign, trial, measured)
                    continue
                if spent() >= cfg.max_compiles:
                    break
                trial, measured, better = try_move(k, sign, "apply")  # from the point the moves before it left
                if better:
                    keep(k, sign, trial, measured)
        writer.add_scalar("pattern/total_ratio", current.ratio, spent())
        writer.add_scalar("pattern/worse", current.worse, spent())
        writer.flush()
        save(sweep)
        weights = ", ".join(f"{n} {w:+.4f}" for n, w in zip(names, theta[coordinates], strict=True))
        say(f"sweep {sweep}: {current.ratio:.4f} of clang's bytes, {current.worse} worse, {spent()} compiles "
            f"({sample.from_store} from the store), {time.perf_counter() - start:.0f} s; {weights}")  # fmt: skip
    writer.close()
    final = policy.with_parameters(theta)
    final.save(run / "final" / "policy")
    say("allowance learned: " + ", ".join(f"{name} {w:+.4f}" for name, w in describe(final)))
    if current.worse > cap:
        say(f"it ends past the cap: {current.worse} modules > 1 % worse, the cap {cap}")
    head = {"algorithm": "pattern", "sweeps": sweep, "compiles": spent(), "sample_ratio": current.ratio,
            "sample_worse": current.worse, "sample_modules": len(modules),
            "replay_mismatches": sample.mismatches, "from_store": sample.from_store}  # fmt: skip
    return evaluate_final(run, cfg.corpus, cfg.split, head, enabled=cfg.final_eval, workers=cfg.workers,
                          timeout=cfg.timeout, problem=cfg.problem, say=say)  # fmt: skip


def config_from_run(path: Path) -> PatternConfig:
    return config_from(path, PatternConfig, ["pattern"], "a pattern search")


__all__ = ["PatternConfig", "config_from_run", "measure_on_pool", "repair_move", "search", "train_pattern"]
