"""``optgym search``: per module, decision sequences that compile smaller than clang's heuristic.

Every candidate is a compile, and every candidate is *deterministic*: a candidate is an action vector
``v`` and a length ``r`` — answer decisions ``0..r-1`` with ``v`` (by decision index) and every later
one with the *base policy* (clang's heuristic, or a trained policy when DAgger searches from the
states it reaches). A prefix answered the same way reaches the same states, so a candidate always
compiles to the same object, and the trajectory a candidate's compile records — the actions actually
taken — replays it exactly. That trajectory is what is stored, never the recipe that produced it.

Moves, in the order the budget (compiles per module) is spent:

1. **greedy passes of single flips**, decision 0 to the end: flip decision ``i`` of the best
   trajectory; an improvement is accepted at once and the pass continues at ``i + 1`` on the new
   best's recorded trajectory. The first pass continues after the flip with the base policy (``r =
   i + 1``: "the recorded prefix, one flip, then the heuristic"). Later passes replay the rest of the
   best's actions by index (``r = len(v)``): with the base policy after the flip, a flip early in the
   trajectory would discard every improvement accepted after it — measured on the demo's
   ``shapes.cpp``, a second pass found nothing that way and took the module from 0.675 to 0.548 of
   the heuristic this way (replaying only the best's deviations from the heuristic: 0.637).
2. when a pass improves nothing, **every call of one callee** (``--groups``, needs a problem that names
   its decisions: for inlining, clang's optimization record names each decision's callee): for each
   callee with two or more calls answered "no", answer "yes" at all of them — the move that can delete
   a function, which no single flip can (the first inlined call only adds a copy). See
   :meth:`ModuleSearch.groups`.
3. then **evolution**: a (1+1) evolutionary algorithm whose mutation flips
   ``1 + Poisson(1)`` uniformly chosen decisions of the best (replayed by index); it stops after
   ``patience`` compiles without an improvement (``converged``; default: max(50, decisions)) or
   when the budget is spent.

Every accepted improvement is compiled once more, replaying its recorded actions, and must give the
byte-identical object (SHA-256) before it is accepted; that compile also records the raw features of
every state, so the stored states are those of a verified compile. Failed compiles (timeouts, crashes)
are counted, never accepted.

A search directory ``S``::

    search.json                 format version, problem, corpus, compiler, start policy, options,
                                summary (rewritten at the end of every run)
    modules.parquet             one row per module: status, decisions, heuristic / best sizes,
                                compiles (rewritten at the end of every run)
    modules/<name>.json         per module, written as it goes (atomically): sizes, the best
                                trajectory's actions, compiles spent, where the search stands,
                                accepted improvements
    modules/<name>.parquet      the best trajectory's states: ``step``, every feature (raw int64),
                                ``heuristic``, ``action``, ``log_prob``, ``examined``, and ``subject``
                                (the callee) when the problem names its decisions

Modules under ``--min-decisions`` are ``skipped``: their record and states hold the start policy's
compile, unsearched. ``examined`` marks the states whose flip was tried with the state exactly as
stored (a rejected flip says the stored action is at least as good there; an accepted one made it
so); DAgger keeps only those states of its searches. A rerun skips finished modules, continues
interrupted ones where their last checkpoint left them, and extends modules whose ``--budget`` grew.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import json
import math
import re
import shutil
import tempfile
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from optgym.corpus import Corpus, Module
from optgym.corpus.portable import PortableModule, local_module, portable_modules
from optgym.corpus.split import draw_by_size
from optgym.errors import OptgymError
from optgym.files import atomic_write_bytes, read_versioned
from optgym.parallel import ray_backend_address, run_tasks
from optgym.policies import PolicyFactory, resolve_policy
from optgym.policies.portable import portable_policy
from optgym.problems import Problem, get_problem
from optgym.rollout import DEFAULT_TIMEOUT, baseline, rollout
from optgym.rollout.decider import PolicyInfo
from optgym.rollout.rollout import DecisionPoint, Policy
from optgym.toolchain import find_toolchain
from optgym.toolchain.llvm import Toolchain
from optgym.toolchain.process import private_dir
from optgym.toolchain.remarks import read_remarks, record_flags
from optgym.train.run import of_language

SEARCH_FORMAT_VERSION = 1
SEARCH_KIND = "optgym-search"
META = "search.json"
MODULES_TABLE = "modules.parquet"
MODULES_DIR = "modules"
CHECKPOINT_EVERY = 25  # compiles between two checkpoints of a module's record
MUTATION_RATE = 1.0  # evolution flips 1 + Poisson(MUTATION_RATE) decisions
MAX_GROUP_STEPS = 8  # compiles a group move may spend taking one callee's calls
SAMPLE_STREAM = 7  # the random stream of --sample, apart from the evolution's (seed alone)


class SearchError(OptgymError):
    """A search directory that cannot be created, resumed or read."""


@dataclass
class SearchConfig:
    corpus: str
    output: str
    budget: int = 1000  # compiles per module, the first (the start policy's) included
    workers: int | None = None
    modules: str | None = None  # glob over module names
    module_names: list[str] | None = None  # or exactly these modules (DAgger: the modules a search covered)
    sample: int | None = None  # search a seeded draw of this many of them, evenly over four strata of size
    language: str | None = None  # only "C" or only "C++" modules (ObjC and ObjC++ with them)
    split: str | None = None
    min_decisions: int = 1  # modules with fewer decisions are not searched
    start: str = "heuristic"  # policy spec: the starting trajectory and the answers after a flip
    focus: float = 1.0  # with a policy that gives log-probs: try only its deviations + this least-sure fraction
    patience: int | None = None  # evolution stops after this many compiles without improvement
    evolve: bool = True  # after a pass of single flips that improves nothing (DAgger: no, it labels no state)
    groups: bool = True  # "take every call of one callee" moves between the single flips and evolution
    seed: int = 0
    timeout: float = DEFAULT_TIMEOUT
    problem: str = "inline-size"


@dataclass(frozen=True)
class ModuleTask:
    """What a worker needs to search one module (picklable)."""

    source: PortableModule  # the module, or under Ray its content: see corpus.portable
    module: str
    record: str  # the module's record path without suffix (on the driver: see DetachedTask)
    problem: str
    start: PolicyFactory
    budget: int
    min_decisions: int
    focus: float
    patience: int | None
    evolve: bool
    seed: int
    timeout: float
    groups: bool = True


# -- candidates and compiles -------------------------------------------------------------------------


class Candidate:
    """The policy of one candidate: ``actions[i]`` for decisions ``i < replay``, the base policy after.

    With ``score=True`` the base policy is asked at every decision (it must return ``(action,
    log_prob)``) and the log-probability *of the action taken* under the base policy is returned with
    it — a policy's confidence along the stored trajectory, which DAgger's focus reads.
    """

    def __init__(self, actions: np.ndarray, replay: int, base: Policy, *, score: bool = False) -> None:
        self.actions, self.replay, self.base, self.score = actions, replay, base, score
        # the base decides after the replay: if it reads the callee's linkage, the compile must learn it
        self.reads_callee_linkage = PolicyInfo.of(base).reads_callee_linkage

    def __call__(self, point: DecisionPoint) -> int | tuple[int, float]:
        i = point.index
        if not self.score:
            return int(self.actions[i]) if i < self.replay else self.base(point)  # type: ignore[return-value]
        base_action, log_prob = self.base(point)  # type: ignore[misc]
        action = int(self.actions[i]) if i < self.replay else int(base_action)
        if action != base_action:
            log_prob = math.log(max(1e-12, -math.expm1(log_prob)))  # binary: log(1 - p)
        return action, float(log_prob)


@dataclass
class Outcome:
    """One compile of a candidate."""

    ok: bool
    status: str
    text_bytes: int = 0
    dottext_bytes: int = 0
    actions: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))
    heuristic: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))
    log_probs: np.ndarray | None = None
    digest: str = ""  # SHA-256 of the object
    features: dict[str, np.ndarray] | None = None  # raw, one [T] array per feature
    seconds: float = 0.0
    subjects: list[str] | None = None  # what each decision was about (the callee), from clang's record


class _FeatureRecorder:
    """Wraps a policy to keep each state's raw features (int64, unlike ``vector()``'s float32)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.rows: list[dict[str, np.ndarray]] = []
        self.reads_callee_linkage = PolicyInfo.of(policy).reads_callee_linkage  # passed on, as Candidate does

    def __call__(self, point: DecisionPoint):
        self.rows.append(point.features())
        return self.policy(point)

    def columns(self) -> dict[str, np.ndarray]:
        if not self.rows:
            return {}
        return {n: np.stack([r[n] for r in self.rows]).reshape(len(self.rows), -1)[:, 0] for n in self.rows[0]}


class Compiler:
    """Compiles candidates of one module, keeping each object just long enough to hash it."""

    def __init__(self, problem: Problem, module: Module, toolchain: Toolchain, base: Policy, score: bool) -> None:
        self.problem, self.module, self.toolchain, self.base, self.score = problem, module, toolchain, base, score
        # a run directory named after this process: a worker ended by os._exit (its driver died) cannot
        # remove it, and the next host's private_dir sweeps it (optgym.toolchain.process)
        self._tmp = private_dir()
        self.timeout = DEFAULT_TIMEOUT

    def close(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)

    @property
    def object_path(self) -> Path:
        """The last candidate's object, kept until the next :meth:`run` (its symbols name what it defines)."""
        return self._tmp / "object.o"

    def run(self, actions: np.ndarray, replay: int, *, features: bool = False) -> Outcome:
        """Compile one candidate; with ``features``, also every state's raw features and, when the
        problem names its decisions (``Problem.decision_subject``), each decision's subject."""
        policy: Policy = Candidate(actions, replay, self.base, score=self.score)
        recorder = _FeatureRecorder(policy) if features else None
        obj, record = self.object_path, self._tmp / "record.yaml"
        obj.unlink(missing_ok=True)
        record.unlink(missing_ok=True)
        subject = self.problem.decision_subject if features else None
        run = rollout(self.problem, self.module, self.toolchain, recorder or policy, timeout=self.timeout,
                      keep_object=obj, extra_flags=record_flags(record, subject[0]) if subject else ())  # fmt: skip
        res, traj = run.result, run.trajectory
        if not res.ok:
            return Outcome(False, res.status, seconds=res.compile_seconds)
        subjects = None
        if subject and record.exists():
            subjects = [r.get(subject[1], "") for r in read_remarks(record, subject[0])]
            subjects = subjects if len(subjects) == len(traj.actions) else None  # cannot align: none
        return Outcome(
            True,
            "ok",
            int(res.metrics["text_bytes"]),
            int(res.metrics["dottext_bytes"]),
            traj.actions.astype(np.int8),
            traj.heuristic.astype(np.int8),
            traj.log_probs,
            hashlib.sha256(obj.read_bytes()).hexdigest(),
            recorder.columns() if recorder else None,
            res.compile_seconds,
            subjects,
        )


# -- one module's search -------------------------------------------------------------------------------


def _bits(a: np.ndarray) -> str:
    return "".join("1" if x else "0" for x in a.tolist())


def _unbits(s: str) -> np.ndarray:
    return np.frombuffer(s.encode(), dtype=np.uint8).astype(np.int8) - ord("0") if s else np.zeros(0, np.int8)


def _stored_examined(rec: dict[str, Any], n: int) -> np.ndarray:
    examined = _unbits(rec["best"].get("examined", ""))
    return examined if len(examined) == n else np.zeros(n, np.int8)


def record_stem(root: Path, name: str) -> Path:
    """``root/modules/<readable name>-<hash>``: module names hold slashes and dots (``…/x.cpp.o``); the
    stem holds neither, so ``.json``/``.parquet`` suffixes are plain, and the hash keeps names apart."""
    readable = re.sub(r"[^A-Za-z0-9_-]+", "_", name)[-80:]
    return Path(root) / MODULES_DIR / f"{readable}-{hashlib.sha256(name.encode()).hexdigest()[:10]}"


class ModuleSearch:
    """The search of one module: its record (what is stored) and the moves that spend its budget.

    ``record`` is the module's JSON record; the best trajectory lives in ``self.best`` (actions,
    heuristic, log-probs, features, examined) and is written to ``<stem>.parquet`` with every
    accepted improvement.
    """

    def __init__(self, task: ModuleTask, compiler: Compiler, record: dict[str, Any]) -> None:
        self.task, self.compiler, self.record = task, compiler, record
        self.stem = Path(task.record)
        self.best: dict[str, Any] = {}
        self.tried: set[bytes] = set()
        self._last_checkpoint = record.get("compiles", 0)
        self._started = time.perf_counter()

    # -- storage ----------------------------------------------------------------------------------

    def save(self, *, states: bool = False) -> None:
        """Write the record (and, with ``states``, the best trajectory's states first)."""
        rec = self.record
        rec["seconds"] = round(rec.get("seconds", 0.0) + time.perf_counter() - self._started, 2)
        self._started = time.perf_counter()
        if self.best:
            rec["best"]["actions"] = _bits(self.best["actions"])
            rec["best"]["examined"] = _bits(self.best["examined"])
        if states and self.best.get("features") is not None:
            write_states(self.stem.with_suffix(".parquet"), self.best)
        atomic_write_bytes(self.stem.with_suffix(".json"), json.dumps(rec, indent=1).encode())
        self._last_checkpoint = rec["compiles"]

    def load_best(self) -> bool:
        """The best trajectory from ``<stem>.parquet``; ``False`` if it is missing or not the record's."""
        path = self.stem.with_suffix(".parquet")
        if not path.exists():
            return False
        table = pq.read_table(path)
        actions = table.column("action").to_numpy().astype(np.int8)
        if _bits(actions) != self.record["best"]["actions"] or table.schema.metadata is None:
            return False
        if table.schema.metadata.get(b"digest", b"").decode() != self.record["best"]["digest"]:
            return False
        names = json.loads(table.schema.metadata[b"features"])
        log_probs = table.column("log_prob").to_numpy()
        self.best = {
            "actions": actions,
            "heuristic": table.column("heuristic").to_numpy().astype(np.int8),
            "log_probs": None if np.isnan(log_probs).all() else log_probs,
            "features": {n: table.column(n).to_numpy() for n in names},
            "subjects": table.column("subject").to_pylist() if "subject" in table.column_names else None,
            "examined": _stored_examined(self.record, len(actions)),
            "digest": self.record["best"]["digest"],
        }
        return True

    # -- moves ------------------------------------------------------------------------------------

    def accept(self, out: Outcome, move: str, changed_from: int) -> bool:
        """Verify ``out`` by a fresh compile of its recorded actions; make it the best if byte-identical."""
        rec = self.record
        check = self.compiler.run(out.actions, len(out.actions), features=True)
        rec["verify_compiles"] = rec.get("verify_compiles", 0) + 1
        if not check.ok or check.digest != out.digest or not np.array_equal(check.actions, out.actions):
            rec["irreproducible"] = rec.get("irreproducible", 0) + 1
            return False
        examined = np.zeros(len(check.actions), np.int8)
        keep = min(changed_from, len(self.best["examined"]), len(examined))
        examined[:keep] = self.best["examined"][:keep]  # the states before the change are the same states
        self.best = best_of(check, examined)
        rec["best"].update(text_bytes=check.text_bytes, dottext_bytes=check.dottext_bytes, digest=check.digest,
                           decisions=len(check.actions),
                           deviations=int((check.actions != check.heuristic).sum()))  # fmt: skip
        rec["history"].append([rec["compiles"], check.text_bytes, move])
        self.save(states=True)
        return True

    def try_candidate(self, actions: np.ndarray, replay: int, move: str, changed_from: int) -> bool:
        """Compile one candidate (unless already tried); accept it if strictly smaller."""
        key = replay.to_bytes(4, "little") + actions[:replay].tobytes()
        if key in self.tried:
            return False
        self.tried.add(key)
        out = self.compile(actions, replay)
        if out is not None and out.text_bytes < self.record["best"]["text_bytes"]:
            return self.accept(out, move, changed_from)
        return False

    def compile(self, actions: np.ndarray, replay: int, *, features: bool = False) -> Outcome | None:
        """One compile of the budget; ``None`` (and the failure counted) if it failed."""
        rec = self.record
        rec["compiles"] += 1
        out = self.compiler.run(actions, replay, features=features)
        if not out.ok:
            rec["failures"] = rec.get("failures", 0) + 1
            rec["failure_statuses"] = sorted({*rec.get("failure_statuses", []), out.status})
            return None
        return out

    def focus_positions(self, start: int) -> list[int]:
        """Decisions ``≥ start`` a greedy pass tries: all of them, or — with ``focus < 1`` — the
        deviations from the heuristic plus the least sure fraction: by the base policy's confidence when
        it scores its decisions, else by the problem's decision margin (closest to the heuristic's
        turning point first — where clang nearly decided otherwise)."""
        n = len(self.best["actions"])
        lp = self.best.get("log_probs")
        if lp is None or len(lp) != n:
            features = self.best.get("features") or {}
            margin = get_problem(self.task.problem).decision_margin(features) if features else None
            lp = margin if margin is not None and len(margin) == n else None  # small: unsure, as a low log-prob
        if self.task.focus >= 1.0 or lp is None:
            return list(range(start, n))
        deviating = self.best["actions"] != self.best["heuristic"]
        unsure = np.argsort(lp, kind="stable")[: max(1, math.ceil(self.task.focus * n))]
        chosen = set(np.flatnonzero(deviating).tolist()) | set(unsure.tolist())
        return sorted(i for i in chosen if i >= start)

    def greedy(self, budget: int) -> None:
        """Passes of single flips until one improves nothing (then ``cursor.phase = groups``)."""
        cur = self.record["cursor"]
        while self.record["compiles"] < budget and cur["phase"] == "greedy":
            queue = self.focus_positions(cur["position"])
            if not queue:
                if cur["pass_improved"]:
                    cur.update(pass_=cur["pass_"] + 1, position=0, pass_improved=False)
                else:
                    cur.update(phase="groups" if self.task.groups else "evolve", stale=0)
                continue
            i = queue[0]
            actions = self.best["actions"].copy()
            actions[i] ^= 1
            replay = i + 1 if cur["pass_"] == 0 else len(actions)
            if self.try_candidate(actions, replay, f"flip@{i}/pass{cur['pass_']}", i):
                cur["pass_improved"] = True
            self.best["examined"][i] = 1  # both answers tried here (the new best keeps decisions ≤ i)
            cur["position"] = i + 1
            self.checkpoint()

    def group_queue(self) -> list[str]:
        """The subjects (callees) the group move has still to try on the best trajectory: those with at
        least two decisions answered "no" — one is a single flip, which the greedy passes tried — in the
        order of their first such decision."""
        subjects, actions = self.best.get("subjects"), self.best["actions"]
        if subjects is None:
            return []
        tried = set(self.record["cursor"].get("groups_tried", []))
        counts: dict[str, int] = {}
        order: list[str] = []
        for name, action in zip(subjects, actions.tolist(), strict=True):
            if action == 0 and name and name not in tried:
                counts[name] = counts.get(name, 0) + 1
                if counts[name] == 1:
                    order.append(name)
        return [name for name in order if counts[name] >= 2]

    def groups(self, budget: int) -> None:
        """Multi-flip moves, one callee at a time: answer "yes" at *every* call of it, then evolution.

        What no single flip finds: a function is only deleted when its last call is inlined, so taking
        one call alone adds a copy, while taking all of them can remove the original. A call's index
        moves once a flip before it inlines new call sites, so the calls are taken one compile at a
        time — the best's prefix, "yes" at the callee's first remaining "no", the base policy after,
        whose record names the next — and only the last compile, with no call of it left un-inlined
        (or after ``MAX_GROUP_STEPS``), is a candidate. Needs decision subjects (``Problem.decision_subject``)."""
        cur, rec = self.record["cursor"], self.record
        cur.setdefault("groups_tried", [])
        while rec["compiles"] < budget and cur["phase"] == "groups":
            queue = self.group_queue()
            if not queue:
                cur.update(phase="evolve", stale=0)
                break
            name = queue[0]
            self.take_every_call(name, budget)
            if rec["compiles"] < budget:  # cut short by the budget: a larger one tries it again
                cur["groups_tried"].append(name)
            self.checkpoint()

    def take_every_call(self, name: str, budget: int) -> bool:
        """Answer "yes" at every call of ``name`` (see :meth:`groups`); accept the result if smaller.
        Calls before the last step's are settled: the prefix replays, and each step took the first "no"."""
        actions, subjects = self.best["actions"], self.best["subjects"]
        first, start, out = None, 0, None
        for _ in range(MAX_GROUP_STEPS):
            pending = [i for i in range(start, len(actions)) if subjects[i] == name and actions[i] == 0]
            if not pending or self.record["compiles"] >= budget:
                break
            i = pending[0]
            first = i if first is None else first
            candidate = actions.copy()
            candidate[i] = 1
            out = self.compile(candidate, i + 1, features=True)
            if out is None or out.subjects is None:
                return False
            actions, subjects, start = out.actions, out.subjects, i + 1
        if out is None or first is None or out.text_bytes >= self.record["best"]["text_bytes"]:
            return False
        return self.accept(out, f"group:{name}", first)

    def evolve(self, budget: int) -> None:
        """(1+1)-EA over the best's actions until ``patience`` compiles bring nothing (``converged``)."""
        cur, rec = self.record["cursor"], self.record
        n = len(self.best["actions"])
        patience = self.task.patience or max(50, n)
        misses = 0  # consecutive already-tried mutations: a tiny module has run out of neighbours
        while rec["compiles"] < budget and cur["phase"] == "evolve":
            if cur["stale"] >= patience or misses >= 50 or n == 0:
                cur["phase"] = "converged"
                break
            rng = np.random.default_rng([self.task.seed, zlib.crc32(self.task.module.encode()), rec["compiles"],
                                         misses])  # fmt: skip
            n = len(self.best["actions"])
            k = min(n, 1 + int(rng.poisson(MUTATION_RATE)))
            flips = np.sort(rng.choice(n, size=k, replace=False))
            actions = self.best["actions"].copy()
            actions[flips] ^= 1
            before = rec["compiles"]
            if self.try_candidate(actions, n, f"evolve{k}@{flips[0]}", int(flips[0])):
                cur["stale"] = 0
            else:
                cur["stale"] += rec["compiles"] - before
            misses = 0 if rec["compiles"] > before else misses + 1
            self.checkpoint()

    def checkpoint(self) -> None:
        if self.record["compiles"] - self._last_checkpoint >= CHECKPOINT_EVERY:
            self.save()


def new_record(task: ModuleTask, module: Module, toolchain: Toolchain) -> dict[str, Any]:
    return {
        "kind": "optgym-search-module",
        "format_version": SEARCH_FORMAT_VERSION,
        "module": task.module,
        "digest": module.digest,
        "compiler": toolchain.identity,
        "start": task.start.identity,
        "status": "running",
        "budget": task.budget,
        "compiles": 0,
        "verify_compiles": 0,
        "failures": 0,
        "cursor": {"phase": "greedy", "pass_": 0, "position": 0, "pass_improved": False, "stale": 0},
        "history": [],
        "seconds": 0.0,
    }


def read_record(stem: Path) -> dict[str, Any] | None:
    try:
        rec = json.loads(Path(stem).with_suffix(".json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return rec if rec.get("format_version") == SEARCH_FORMAT_VERSION else None


def search_module(task: ModuleTask) -> dict[str, Any]:
    """Worker: search one module within ``task.budget`` compiles; returns its summary row.

    Starts from the module's record when there is one for the same module content, compiler and
    start policy (resume or a larger budget), else from the start policy's compile."""
    problem = get_problem(task.problem)
    toolchain = find_toolchain((problem.hook,))
    module = local_module(task.source)
    stem = Path(task.record)
    stem.parent.mkdir(parents=True, exist_ok=True)
    rec = read_record(stem)
    if rec is not None and (rec["digest"], rec["compiler"], rec["start"]) != (
        module.digest, toolchain.identity, task.start.identity
    ):  # fmt: skip
        rec = None  # another module content, compiler or start policy: that search says nothing here
    if (
        rec is not None
        and rec["status"] == "skipped"
        and (
            rec.get("decisions", 0) >= task.min_decisions  # --min-decisions was lowered
            or (rec.get("decisions", 0) and not stem.with_suffix(".parquet").exists())  # made before skips kept states
        )
    ):
        rec = None
    if rec is not None and (
        rec["status"] in ("skipped", "converged")
        or (rec["status"] == "budget" and rec["budget"] >= task.budget)
        or 0 < rec.get("decisions", 0) < task.min_decisions
    ):
        return summary_row(rec)

    compiler = Compiler(problem, module, toolchain, task.start.build(), score=False)
    try:
        if rec is None or rec["status"] == "failed" or "best" not in rec:
            rec = new_record(task, module, toolchain)
            if (row := start_search(task, problem, module, toolchain, compiler, rec)) is not None:
                return row
        search = ModuleSearch(task, compiler, rec)
        compiler.score, compiler.timeout = rec["scored"], rec["candidate_timeout"]
        if not search.load_best() and not restore_best(search):
            return summary_row(rec)
        rec["budget"], rec["status"] = task.budget, "running"
        search.greedy(task.budget)
        search.groups(task.budget)
        if task.evolve:
            search.evolve(task.budget)
        elif rec["cursor"]["phase"] == "evolve":
            rec["cursor"]["phase"] = "converged"
        rec["status"] = "converged" if rec["cursor"]["phase"] == "converged" else "budget"
        search.save(states=True)
        return summary_row(rec)
    finally:
        compiler.close()


#: The files of a module's record, by suffix (see the module doc).
RECORD_SUFFIXES = (".json", ".parquet")


def read_record_files(stem: Path | str) -> dict[str, bytes]:
    """A module's record files as bytes, by suffix (those that exist)."""
    paths = {suffix: Path(stem).with_suffix(suffix) for suffix in RECORD_SUFFIXES}
    return {suffix: path.read_bytes() for suffix, path in paths.items() if path.exists()}


def write_record_files(stem: Path | str, files: dict[str, bytes], old: dict[str, bytes]) -> None:
    """The record files a detached worker returned, written (atomically) where they differ from ``old``."""
    for suffix, data in files.items():
        if old.get(suffix) != data:
            Path(stem).parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(Path(stem).with_suffix(suffix), data)


@dataclass(frozen=True)
class DetachedTask:
    """A module's search for a worker that does not share the driver's filesystem (Ray): the task and the
    record files the driver has for it, so a rerun resumes there as it does locally."""

    task: ModuleTask
    files: dict[str, bytes]


def search_module_detached(job: DetachedTask) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Worker: :func:`search_module` in a scratch copy of the module's record; the summary row and the record
    files come back as the return value, for the driver to write (nothing stays on the worker's node).

    The price of being detached: the checkpoints taken during the module live in the scratch copy, so a
    driver or worker killed mid-module loses that module's progress since its last return (Ray retries a
    lost worker's task from the record the driver had)."""
    with tempfile.TemporaryDirectory(prefix="optgym-search-record-") as tmp:
        stem = Path(tmp) / Path(job.task.record).name
        for suffix, data in job.files.items():
            stem.with_suffix(suffix).write_bytes(data)
        row = search_module(dataclasses.replace(job.task, record=str(stem)))
        return row, read_record_files(stem)


def restore_best(search: ModuleSearch) -> bool:
    """The stored best compiled again when its states file is missing or stale (a kill between the
    states and the record); it must reproduce the recorded object, else the module is marked failed."""
    rec = search.record
    actions = _unbits(rec["best"]["actions"])
    out = search.compiler.run(actions, len(actions), features=True)
    rec["verify_compiles"] += 1
    if not out.ok or out.digest != rec["best"]["digest"]:
        rec.update(status="failed", detail=f"the stored best did not reproduce ({out.status})")
        search.save()
        return False
    search.best = best_of(out, _stored_examined(rec, len(out.actions)))
    search.save(states=True)
    return True


def start_search(
    task: ModuleTask, problem: Problem, module: Module, toolchain: Toolchain, compiler: Compiler, rec: dict[str, Any]
) -> dict[str, Any] | None:
    """The start policy's compile (the first of the budget) and the heuristic's sizes; a summary row if
    the module is not searched (failed, or fewer decisions than ``min_decisions``), else ``None``."""
    stem = Path(task.record)
    heur = baseline(problem, module, toolchain, timeout=task.timeout)
    if not heur.ok:
        rec.update(status="failed", detail=f"heuristic compile: {heur.status} {heur.detail}"[:500])
        atomic_write_bytes(stem.with_suffix(".json"), json.dumps(rec, indent=1).encode())
        return summary_row(rec)
    rec["heuristic"] = {
        "text_bytes": int(heur.metrics["text_bytes"]),
        "dottext_bytes": int(heur.metrics["dottext_bytes"]),
    }
    compiler.timeout = task.timeout
    out = compiler.run(np.zeros(0, np.int8), 0, features=True)  # the start policy alone
    rec["compiles"] += 1
    if not out.ok:
        rec.update(status="failed", detail=f"start compile: {out.status}")
        atomic_write_bytes(stem.with_suffix(".json"), json.dumps(rec, indent=1).encode())
        return summary_row(rec)
    rec["decisions"] = len(out.actions)
    # a policy that gives log-probs is asked at every decision of every candidate, so the stored
    # trajectories carry its confidence everywhere (DAgger's focus reads it)
    rec["scored"] = compiler.score = out.log_probs is not None
    # candidates that take far longer than the start compile (inlining blow-ups) are not worth waiting for
    rec["candidate_timeout"] = round(min(task.timeout, max(10.0, 20.0 * out.seconds)), 1)
    rec["start_sizes"] = {"text_bytes": out.text_bytes, "dottext_bytes": out.dottext_bytes}
    if task.start.identity == "heuristic" and (out.text_bytes, out.dottext_bytes) != (
        rec["heuristic"]["text_bytes"], rec["heuristic"]["dottext_bytes"]
    ):  # fmt: skip
        rec["heuristic_replay_mismatch"] = rec.pop("start_sizes")
    rec["best"] = {"text_bytes": out.text_bytes, "dottext_bytes": out.dottext_bytes, "digest": out.digest,
                   "decisions": len(out.actions), "deviations": int((out.actions != out.heuristic).sum()),
                   "actions": _bits(out.actions), "examined": _bits(np.zeros(len(out.actions), np.int8))}  # fmt: skip
    best = best_of(out, np.zeros(len(out.actions), np.int8))
    if len(out.actions):  # a skipped module keeps its start trajectory too: imitation may learn it as is
        write_states(stem.with_suffix(".parquet"), best)
    if len(out.actions) < task.min_decisions:
        rec["status"] = "skipped"
    atomic_write_bytes(stem.with_suffix(".json"), json.dumps(rec, indent=1).encode())
    return summary_row(rec) if rec["status"] == "skipped" else None


def best_of(out: Outcome, examined: np.ndarray) -> dict[str, Any]:
    """A module's best trajectory in memory, from the verified compile that recorded it."""
    return {"actions": out.actions, "heuristic": out.heuristic, "log_probs": out.log_probs,
            "features": out.features, "subjects": out.subjects, "examined": examined, "digest": out.digest}  # fmt: skip


def write_states(path: Path, best: dict[str, Any]) -> None:
    """The best trajectory's states as Parquet (written under a temporary name, then renamed)."""
    n = len(best["actions"])
    features = best["features"] or {}
    columns: dict[str, Any] = {"step": np.arange(n, dtype=np.int32)}
    columns.update({name: np.asarray(v, dtype=np.int64) for name, v in features.items()})
    columns["heuristic"] = np.asarray(best["heuristic"], dtype=np.int64)
    columns["action"] = np.asarray(best["actions"], dtype=np.int64)
    lp = best.get("log_probs")
    columns["log_prob"] = np.asarray(lp, dtype=np.float32) if lp is not None else np.full(n, np.nan, np.float32)
    columns["examined"] = np.asarray(best["examined"], dtype=bool)
    if best.get("subjects") is not None:
        columns["subject"] = pa.array(best["subjects"], pa.string())  # the callee, for multi-flip moves
    table = pa.table(columns).replace_schema_metadata(
        {"digest": best["digest"], "features": json.dumps(list(features)), "format_version": str(SEARCH_FORMAT_VERSION)}
    )
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, tmp, compression="zstd")
    tmp.replace(path)


def summary_row(rec: dict[str, Any]) -> dict[str, Any]:
    """The per-module row of ``modules.parquet`` and of the command's table."""
    best, heur = rec.get("best", {}), rec.get("heuristic", {})
    return {
        "module": rec["module"],
        "status": rec["status"],
        "detail": rec.get("detail", ""),
        "decisions": rec.get("decisions", 0),
        "heuristic_text_bytes": heur.get("text_bytes"),
        "heuristic_dottext_bytes": heur.get("dottext_bytes"),
        "start_text_bytes": rec.get("start_sizes", heur).get("text_bytes"),
        "best_text_bytes": best.get("text_bytes"),
        "best_dottext_bytes": best.get("dottext_bytes"),
        "deviations": best.get("deviations", 0),
        "improvements": len(rec.get("history", [])),
        "compiles": rec.get("compiles", 0),
        "verify_compiles": rec.get("verify_compiles", 0),
        "failures": rec.get("failures", 0),
        "budget": rec.get("budget", 0),
        "seconds": rec.get("seconds", 0.0),
    }


# -- the whole corpus ------------------------------------------------------------------------------------


#: ``-cc1`` options that only feed the preprocessor: they cannot change the compile of bitcode.
PREPROCESSOR_OPTIONS = ("-D", "-U", "-I", "-isystem", "-internal-isystem", "-internal-externc-isystem", "-iquote",
                        "-idirafter", "-include", "-MT", "-dependency-file")  # fmt: skip


def compile_key(module: Module) -> str:
    """What determines a module's compile: its bitcode and its ``-cc1`` options minus preprocessor-only ones.

    Builds compile one source twice (a shared and a static library, say) into identical bitcode; such
    twins have one search between them."""
    args, skip = [], False
    for arg in module.cc1_args:
        if skip:
            skip = False
        elif arg in PREPROCESSOR_OPTIONS:
            skip = True
        elif not arg.startswith(("-D", "-U", "-I")):
            args.append(arg)
    h = hashlib.sha256(module.bitcode.read_bytes())
    h.update("\0".join(args).encode())
    return h.hexdigest()


def select_modules(
    corpus: Corpus, pattern: str | None, names: Sequence[str] | None = None, language: str | None = None
) -> tuple[list[Module], dict[str, str]]:
    """The modules to search, decision-heavy C++ first — a run cut short has spent its time where the
    headroom is; the decision count is unknown before a compile, so bitcode size stands in for it —
    and the duplicates left out (``{duplicate: the module searched in its place}``, see :func:`compile_key`).
    ``language`` ("C" or "C++") keeps one language's modules only."""
    chosen = [m for m in corpus if pattern is None or fnmatch.fnmatchcase(m.name, pattern)]
    if names is not None:
        wanted = set(names)
        chosen = [m for m in chosen if m.name in wanted]
    chosen = of_language(chosen, language)

    def priority(m: Module) -> tuple[int, int, str]:
        return (0 if m.family == "C++" else 1, -m.bitcode.stat().st_size, m.name)

    unique: dict[str, Module] = {}
    duplicates: dict[str, str] = {}
    for m in sorted(chosen, key=priority):
        key = compile_key(m)
        if key in unique:
            duplicates[m.name] = unique[key].name
        else:
            unique[key] = m
    return list(unique.values()), duplicates


def draw_sample(
    modules: list[Module], duplicates: dict[str, str], count: int, seed: int
) -> tuple[list[Module], dict[str, str]]:
    """A seeded draw of ``count`` of ``modules``, as evenly as it can from four strata of bitcode size (the draw
    ES makes with ``--batch size``), and the duplicates of the modules drawn. Why a draw: a search of every
    training module costs hours, and what a learner imitates should be a sample of the corpus's sizes, not its
    largest modules (the order :func:`select_modules` searches in). Different seeds draw different samples, so a
    trainer's seeds see different searched data."""
    if count < 1:
        raise SearchError(f"--sample {count}: at least one module")
    chosen = draw_by_size(modules, count, np.random.default_rng([seed, SAMPLE_STREAM]))
    drawn = {m.name for m in chosen}
    return chosen, {d: m for d, m in duplicates.items() if m in drawn}


def read_search(path: Path | str) -> dict[str, Any]:
    """``search.json`` of a search directory (a clear error when it is not one)."""
    meta_path = Path(path) / META
    meta = read_versioned(meta_path, error=SearchError, what="search", missing="not a search directory",
                          max_version=SEARCH_FORMAT_VERSION)  # fmt: skip
    if meta.get("kind") != SEARCH_KIND:
        raise SearchError(f"{meta_path} is not an optgym search")
    return meta


def module_records(path: Path | str) -> list[dict[str, Any]]:
    """Every module record of a search directory (finished or not), by module name."""
    records = [read_record(p.with_suffix("")) for p in sorted((Path(path) / MODULES_DIR).glob("*.json"))]
    return sorted((r for r in records if r is not None), key=lambda r: r["module"])


def read_states(path: Path | str, module: str) -> pa.Table | None:
    """The stored best trajectory of ``module`` (``None`` when the module has none)."""
    states = record_stem(Path(path), module).with_suffix(".parquet")
    return pq.read_table(states) if states.exists() else None


def _summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    done = [r for r in rows if r["status"] in ("budget", "converged") and r["best_text_bytes"]]
    heur = sum(r["heuristic_text_bytes"] for r in done)
    best = sum(r["best_text_bytes"] for r in done)
    heur_dot = sum(r["heuristic_dottext_bytes"] for r in done)
    best_dot = sum(r["best_dottext_bytes"] for r in done)
    return {
        "modules": len(rows),
        "searched": len(done),
        "skipped": sum(r["status"] == "skipped" for r in rows),
        "failed": {r["module"]: r["detail"] for r in rows if r["status"] == "failed"},
        "improved": sum(r["best_text_bytes"] < r["heuristic_text_bytes"] for r in done),
        "heuristic_text_bytes": heur,
        "best_text_bytes": best,
        "ratio": best / heur if heur else None,
        "heuristic_dottext_bytes": heur_dot,
        "best_dottext_bytes": best_dot,
        "dottext_ratio": best_dot / heur_dot if heur_dot else None,
        "compiles": sum(r["compiles"] for r in rows),
        "verify_compiles": sum(r["verify_compiles"] for r in rows),
        "decisions": sum(r["decisions"] for r in done),
    }


def search(cfg: SearchConfig, *, progress: bool = True, say: Callable[[str], Any] = print) -> dict[str, Any]:
    """Search every selected module of ``cfg.corpus`` into ``cfg.output``; returns ``search.json``'s content."""
    if cfg.budget < 1:
        raise SearchError("--budget must be at least 1 compile per module")
    if cfg.language not in (None, "C", "C++"):
        raise SearchError(f"--language {cfg.language!r}: C or C++")
    root = Path(cfg.output)
    corpus_path = str(Path(cfg.corpus).resolve())
    problem = get_problem(cfg.problem)
    toolchain = find_toolchain((problem.hook,))
    start = resolve_policy(cfg.start, problem.name)  # --start pretrained: the policy shipped for this problem
    if start.stochastic:
        raise SearchError(f"--start {cfg.start} is stochastic; a search needs a deterministic policy")
    if (root / META).exists():
        old = read_search(root)
        mine = {"corpus": corpus_path, "problem": cfg.problem, "start_identity": start.identity}
        theirs = {k: old.get(k) for k in mine}
        if theirs != mine:
            raise SearchError(f"{root} holds a search of {theirs}, not {mine}; use another -o")
    corpus = Corpus(corpus_path, split=cfg.split)
    modules, duplicates = select_modules(corpus, cfg.modules, cfg.module_names, cfg.language)
    if cfg.sample is not None:
        modules, duplicates = draw_sample(modules, duplicates, cfg.sample, cfg.seed)
    if not modules:
        raise SearchError(f"no module of {corpus_path} matches --modules {cfg.modules!r} --language {cfg.language!r}")
    meta = {
        "kind": SEARCH_KIND,
        "format_version": SEARCH_FORMAT_VERSION,
        "problem": cfg.problem,
        "corpus": corpus_path,
        "split": cfg.split,
        "compiler": toolchain.identity,
        "start": cfg.start,
        "start_identity": start.identity,
        "options": {k: v for k, v in asdict(cfg).items() if k not in ("corpus", "output", "workers")},
    }
    root.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(root / META, json.dumps({**meta, "summary": None}, indent=2).encode())

    sources = portable_modules(modules, cfg.workers)  # under Ray: by content, with a trained start policy's files
    shipped = portable_policy(start, cfg.workers)
    tasks = [ModuleTask(source, m.name, str(record_stem(root, m.name)), cfg.problem, shipped, cfg.budget,
                        cfg.min_decisions, cfg.focus, cfg.patience, cfg.evolve, cfg.seed, cfg.timeout, cfg.groups)
             for m, source in zip(modules, sources, strict=True)]  # fmt: skip
    detached = ray_backend_address(cfg.workers) is not None  # records travel to and from the workers
    rows: list[dict[str, Any]] = []
    totals = {"h": 0, "b": 0}

    def status() -> str:
        return f"best/heuristic {totals['b'] / totals['h']:.4f}" if totals["h"] else ""

    jobs: list[Any] = [DetachedTask(t, read_record_files(t.record)) for t in tasks] if detached else tasks
    worker: Callable[[Any], Any] = search_module_detached if detached else search_module
    for i, out in run_tasks(worker, jobs, workers=cfg.workers, description="search", status=status,
                            progress=progress):  # fmt: skip
        if detached:
            row, files = out
            write_record_files(tasks[i].record, files, jobs[i].files)
        else:
            row = out
        rows.append(row)
        if row["status"] in ("budget", "converged"):
            totals["h"] += row["heuristic_text_bytes"]
            totals["b"] += row["best_text_bytes"]
    rows.sort(key=lambda r: r["module"])
    tmp = root / f".{MODULES_TABLE}.tmp"
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    tmp.replace(root / MODULES_TABLE)
    meta["summary"] = {**_summary(rows), "duplicates": duplicates}
    atomic_write_bytes(root / META, json.dumps(meta, indent=2).encode())
    meta["modules"] = rows
    return meta


__all__ = [
    "SEARCH_FORMAT_VERSION",
    "Candidate",
    "ModuleTask",
    "SearchConfig",
    "SearchError",
    "module_records",
    "read_search",
    "read_states",
    "record_stem",
    "search",
    "search_module",
    "summary_table",
]


def summary_table(meta: dict[str, Any], limit: int = 25):
    """A rich table of the largest searched modules and the total (what ``optgym train search`` prints)."""
    from rich.table import Table

    rows = [r for r in meta["modules"] if r["status"] in ("budget", "converged")]
    rows.sort(key=lambda r: -r["heuristic_text_bytes"])
    table = Table(title=f"search {meta['start']} → best, {meta['corpus']}")
    table.add_column("module", overflow="fold", min_width=22)
    for col in ("dec", "heuristic", "best", "ratio", ".text", "comp"):
        table.add_column(col, justify="right")
    for r in rows[:limit]:
        table.add_row(r["module"], str(r["decisions"]), str(r["heuristic_text_bytes"]), str(r["best_text_bytes"]),
                      f"{r['best_text_bytes'] / r['heuristic_text_bytes']:.4f}",
                      f"{r['best_dottext_bytes'] / max(1, r['heuristic_dottext_bytes']):.4f}",
                      str(r["compiles"]))  # fmt: skip
    s = meta["summary"]
    notes = ["dec: decisions; ratio: of Berkeley text; .text: of .text sections; "
             f"comp: compiles (+{s['verify_compiles']} verifying)"]  # fmt: skip
    if s.get("duplicates"):
        notes.append(f"{len(s['duplicates'])} duplicate modules (same bitcode and codegen flags) left out")
    if s["skipped"]:
        notes.append(f"{s['skipped']} modules under --min-decisions")
    table.caption = "; ".join(notes)
    if len(rows) > limit:
        table.add_row(f"… {len(rows) - limit} more", *[""] * 6)
    if s["heuristic_text_bytes"]:
        table.add_row("[bold]total", str(s["decisions"]), str(s["heuristic_text_bytes"]), str(s["best_text_bytes"]),
                      f"[bold]{s['ratio']:.4f}", f"{s['dottext_ratio']:.4f}", str(s["compiles"]))  # fmt: skip
    return table
