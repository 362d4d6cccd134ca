"""Compile every module with a policy and with the heuristic; compare them exactly.

Each module is one task on the executor: the heuristic's compile (cached), the never-inline compile
(cached), and the policy's rollout (cached by policy identity, module content, flags and compiler),
so re-evaluating a policy is instant and evaluating a new one costs only its own compiles.
``same``/``improved``/``regressed`` compare the Berkeley ``text`` bytes exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from optgym.corpus import Corpus, Module
from optgym.corpus.cache import ResultCache
from optgym.corpus.portable import PortableModule, local_module, portable_modules
from optgym.corpus.split import group_of
from optgym.errors import OptgymError
from optgym.parallel import TaskFailed, run_tasks
from optgym.policies import SUGGESTED_GUARD_BELOW, PolicyFactory, resolve_policy
from optgym.policies.portable import portable_policy
from optgym.policies.portfolio import Portfolio, load_portfolio
from optgym.problems import Problem, get_problem
from optgym.rollout import EpisodeResult, baseline, rollout
from optgym.rollout.decider import PolicyInfo
from optgym.rollout.episode import DEFAULT_TIMEOUT, decides
from optgym.rollout.linkage import linkage_key
from optgym.toolchain import find_toolchain

REPORT_FORMAT_VERSION = 1


@dataclass
class ModuleRow:
    """One module's outcome; sizes are ``None`` where a compile failed."""

    module: str
    heuristic_text: int | None
    policy_text: int | None
    heuristic_dottext: int | None
    policy_dottext: int | None
    never_text: int | None
    ratio: float | None
    decisions: int
    decisions_differing: int
    compile_seconds: float
    status: str
    detail: str = ""
    heuristic_data: int | None = None  # Berkeley data: None where the compile's record predates it
    policy_data: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def images(self) -> tuple[int, int]:
        """``(heuristic, policy)`` Berkeley ``text + data``: what a portfolio compares, since an option can move
        bytes from text into data (:mod:`optgym.toolchain.sizes`). Only for a row that is ``ok``."""
        heuristic, policy = self.texts
        return heuristic + (self.heuristic_data or 0), policy + (self.policy_data or 0)

    @property
    def texts(self) -> tuple[int, int]:
        """``(heuristic_text, policy_text)``: only for a row that is ``ok`` (both compiled)."""
        assert self.heuristic_text is not None and self.policy_text is not None
        return self.heuristic_text, self.policy_text

    def guarded_below(self, below: int) -> int:
        """The text a build guarding objects under ``below`` bytes keeps (the policy's decides whether it is
        small: clang's size is what the guard pays a compile to learn). Only for a row that is ``ok``."""
        assert self.policy_text is not None and self.heuristic_text is not None
        return min(self.policy_text, self.heuristic_text) if self.policy_text < below else self.policy_text


#: The size target's regression bar: an object more than this many times clang's is "more than 1 % worse".
WORSE = 1.01


def more_than_1pct_worse(size: int, heuristic: int) -> bool:
    """Whether an object of ``size`` bytes is more than 1 % larger than clang's ``heuristic`` bytes — what every
    report counts and the size target caps the share of."""
    return size > WORSE * heuristic


@dataclass(frozen=True)
class _Task:
    problem: str
    source: PortableModule  # the module, or under Ray its content (workers need not see the corpus)
    module: str
    policy: PolicyFactory
    mode: str  # "eval" (greedy) or "collect" (stochastic)
    seed: int
    timeout: float
    transcript_dir: str | None = None  # record exchanges there (bypasses the cache: a hit records nothing)
    companions: tuple[tuple[str, PolicyFactory], ...] = ()  # other problems of the compile, and their policies
    flags: tuple[str, ...] = ()  # extra clang flags of the policy's compile (a portfolio candidate's thresholds)


def _policy_result(problem: Problem, module: Module, task: _Task, toolchain) -> tuple[EpisodeResult, int]:
    """The policy's compile of ``module`` and how many decisions differed from the heuristic (cached)."""
    cache = ResultCache("evaluate")
    policy = task.policy.build(seed=task.seed) if task.policy.stochastic else task.policy.build()
    seed_part = str(task.seed) if task.mode == "collect" or task.policy.stochastic else ""
    with_part = [f"{name}={factory.identity}" for name, factory in task.companions]
    # a policy that leaves this language to clang: a key of its own (such entries once held its compile)
    left_part = [] if decides(policy, module.language) else ["left to clang"]
    # a policy reading the callee's linkage decides by how the loop learns it (optgym.rollout.linkage)
    linkage_part = linkage_key(PolicyInfo.of(policy).reads_callee_linkage, toolchain)
    key = cache.key([task.policy.identity, task.mode, seed_part, module.digest, problem.name,
                     *problem.compile_flags(), toolchain.identity, *with_part, *left_part, *linkage_part,
                     *task.flags])  # fmt: skip
    if task.transcript_dir is None and (hit := cache.get(key)) is not None:
        return EpisodeResult(**hit["result"]), hit["differing"]
    if task.mode == "collect" and hasattr(policy, "stochastic"):
        policy = policy.stochastic(seed=task.seed)
    transcript = None
    if task.transcript_dir is not None:
        Path(task.transcript_dir).mkdir(parents=True, exist_ok=True)
        transcript = Path(task.transcript_dir) / f"{module.name.replace('/', '_')}.transcript"
    companions = [(get_problem(name), factory.build()) for name, factory in task.companions]
    if not decides(policy, module.language):
        # served, this policy leaves the module's language to clang (its channel is not opened): the compile
        # is the other policies' that decide it, or clang's own
        deciding = [(p, c) for p, c in companions if decides(c, module.language)]
        if not deciding:  # clang's own decisions, with the pass options optgym-cc's launcher adds to the compile
            return baseline(problem, module, toolchain, timeout=task.timeout, extra_flags=task.flags), 0
        (problem, policy), companions = deciding[0], deciding[1:]
    run = rollout(problem, module, toolchain, policy, timeout=task.timeout, transcript=transcript,
                  companions=companions, extra_flags=task.flags)  # fmt: skip
    differing = int((run.trajectory.actions != run.trajectory.heuristic).sum())
    if run.result.ok:
        cache.put(key, {"result": asdict(run.result), "differing": differing})
    return run.result, differing


def evaluate_module(task: _Task) -> ModuleRow:
    """Worker: one module, heuristic vs policy (and the problem's reference policy, never-inline for inlining)."""
    problem = get_problem(task.problem)
    toolchain = find_toolchain((problem.hook, *(get_problem(name).hook for name, _ in task.companions)))
    module = local_module(task.source)
    base = baseline(problem, module, toolchain, timeout=task.timeout)
    if not base.ok:
        return ModuleRow(task.module, None, None, None, None, None, None, 0, 0, base.compile_seconds,
                         f"heuristic {base.status}", base.detail)  # fmt: skip
    never_text = None
    if problem.reference_policy is not None:
        spec = resolve_policy(problem.reference_policy)
        reference = _Task(**{**task.__dict__, "policy": spec, "transcript_dir": None})
        never_text = _policy_result(problem, module, reference, toolchain)[0].metrics.get("text_bytes")
    result, differing = _policy_result(problem, module, task, toolchain)
    h = base.metrics
    if not result.ok:
        return ModuleRow(task.module, h["text_bytes"], None, h["dottext_bytes"], None,
                         never_text, None, result.decisions, differing,
                         result.compile_seconds, result.status, result.detail)  # fmt: skip
    p = result.metrics
    return ModuleRow(
        module=task.module,
        heuristic_text=h["text_bytes"],
        policy_text=p["text_bytes"],
        heuristic_dottext=h["dottext_bytes"],
        policy_dottext=p["dottext_bytes"],
        never_text=never_text,
        ratio=p["text_bytes"] / h["text_bytes"] if h["text_bytes"] else 1.0,
        decisions=result.decisions,
        decisions_differing=differing,
        compile_seconds=result.compile_seconds,
        status="ok",
        heuristic_data=h.get("data_bytes"),
        policy_data=p.get("data_bytes"),
    )


def _task_failed(task: _Task, failure: TaskFailed) -> ModuleRow:
    """A module whose task failed for good (a raising worker, a worker lost on every retry): a failed row."""
    status = "worker lost" if failure.worker_lost else "task error"
    return ModuleRow(task.module, None, None, None, None, None, None, 0, 0, 0.0, status, failure.reason)


#: The bound of the guard ``optgym evaluate`` reports besides the full one: the bound a build asks for
#: (``OPTGYM_GUARD_BELOW``), so the guarded-below figure is what a build with optgym-cc's defaults gets.
GUARD_BELOW = SUGGESTED_GUARD_BELOW


def by_package(rows: Sequence[ModuleRow]) -> dict[str, list[ModuleRow]]:
    """``rows`` grouped by package, in name order (a module's name starts with its package): a set's total can hide
    one package that grows, and the size targets count packages too."""
    groups: dict[str, list[ModuleRow]] = {}
    for row in rows:
        groups.setdefault(group_of(row.module, "package"), []).append(row)
    return dict(sorted(groups.items()))


def summarize(rows: Sequence[ModuleRow]) -> dict[str, Any]:
    """The report's totals over the modules that compiled both ways."""
    ok = [r for r in rows if r.ok]

    def total(field: str) -> int:
        return sum(getattr(r, field) or 0 for r in ok)

    h, p, hd, pd = total("heuristic_text"), total("policy_text"), total("heuristic_dottext"), total("policy_dottext")
    logs = [math.log(r.ratio) for r in ok if r.ratio]
    return {
        "modules": len(rows),
        "evaluated": len(ok),
        "failed": len(rows) - len(ok),
        "improved": sum(r.policy_text < r.heuristic_text for r in ok),  # type: ignore[operator]
        "regressed": sum(r.policy_text > r.heuristic_text for r in ok),  # type: ignore[operator]
        "same": sum(r.policy_text == r.heuristic_text for r in ok),
        "regressed_over_1pct": sum(more_than_1pct_worse(r.policy_text, r.heuristic_text) for r in ok),  # type: ignore[arg-type]
        "heuristic_text_bytes": h,
        "policy_text_bytes": p,
        "heuristic_dottext_bytes": hd,
        "policy_dottext_bytes": pd,
        # None when the problem compiles no never-inline reference (eviction)
        "never_inline_text_bytes": total("never_text") if any(r.never_text is not None for r in ok) else None,
        "total_ratio": p / h if h else None,
        # what a build with OPTGYM_GUARD=1 gets: per module the smaller of the policy's object and clang's
        "guarded_ratio": sum(min(r.texts) for r in ok) / h if h else None,
        # what a build with OPTGYM_GUARD_BELOW=GUARD_BELOW gets: the smaller one only where the policy's is small
        "guarded_below_ratio": sum(r.guarded_below(GUARD_BELOW) for r in ok) / h if h else None,
        "guarded_below_over_1pct": sum(
            more_than_1pct_worse(r.guarded_below(GUARD_BELOW), r.heuristic_text)  # type: ignore[arg-type]
            for r in ok
        ),
        "dottext_ratio": pd / hd if hd else None,
        # Berkeley text + data: a pass option's bytes moved into writable sections count here (None: unrecorded)
        "text_and_data_ratio": _text_and_data_ratio(ok),
        "geomean_ratio": math.exp(sum(logs) / len(logs)) if logs else None,
        "decisions": total("decisions"),
        "decisions_differing": total("decisions_differing"),
    }


def _text_and_data_ratio(rows: Sequence[ModuleRow]) -> float | None:
    """Policy ÷ clang in Berkeley ``text + data`` over ``rows`` (all ``ok``), or None if any lacks its data."""
    if not rows or any(r.heuristic_data is None or r.policy_data is None for r in rows):
        return None
    heuristic = sum(r.images[0] for r in rows)
    return sum(r.images[1] for r in rows) / heuristic if heuristic else None


def companion_factories(
    problem: str, companions: Sequence[tuple[str, str]], workers: int | None
) -> tuple[tuple[str, PolicyFactory], ...]:
    """``(problem, policy spec)`` pairs resolved into factories a worker builds the policies from: each
    deterministic (a compile with them is one result), each problem decided once."""
    with_policies = tuple((get_problem(name).name, portable_policy(resolve_policy(spec, name), workers))
                          for name, spec in companions)  # fmt: skip
    if any(factory.stochastic for _, factory in with_policies):
        raise OptgymError("a companion policy must be deterministic (random:SEED, not random)")
    if len({problem, *(name for name, _ in with_policies)}) != 1 + len(with_policies):
        raise OptgymError(f"each problem is decided once: {problem} with {[name for name, _ in with_policies]}")
    return with_policies


def evaluate(
    policy: str,
    corpus: Corpus | Path | str,
    *,
    problem: str = "inline-size",
    modules: Sequence[str] | None = None,
    workers: int | None = None,
    mode: str = "eval",
    seed: int = 0,
    timeout: float = DEFAULT_TIMEOUT,
    progress: bool = True,
    transcript_dir: Path | None = None,
    companions: Sequence[tuple[str, str]] = (),
    flags: Sequence[str] = (),
    candidates: int = 0,
    portfolio: Portfolio | None = None,
) -> list[ModuleRow]:
    """Every module of ``corpus`` (or just ``modules``) compiled with ``policy`` vs the heuristic.

    ``companions`` — ``(problem, policy spec)`` pairs — decide other problems of the policy's compiles
    (a trained eviction policy beside an inliner): the comparison is then the policies together against
    clang alone. Deterministic companions only: a greedy policy's compile is cached as one result.
    ``flags`` are added to every compile a policy decides.

    ``candidates`` ≥ 1: the modules of ``portfolio``'s language family (default: the shipped one) are
    compiled as ``optgym-cc`` compiles them with ``OPTGYM_CANDIDATES=candidates`` — each by the portfolio's
    first ``candidates`` candidates, the smallest object kept (:func:`evaluate_portfolio`); ``policy`` and
    ``companions`` decide the other modules."""
    if mode not in ("eval", "collect"):
        raise ValueError(f"mode must be 'eval' or 'collect', got {mode!r}")
    corpus = corpus if isinstance(corpus, Corpus) else Corpus(corpus)
    names = list(modules) if modules is not None else [m.name for m in corpus]
    if candidates:
        portfolio = portfolio or load_portfolio()
        mine = {n for n in names if corpus.module(n).family == portfolio.family}
        common: dict[str, Any] = {"workers": workers, "timeout": timeout, "progress": progress}
        build = [(get_problem(name).name, spec) for name, spec in [(problem, policy), *companions]]
        # a problem the first candidate names but the command decides with another policy than the shipped one:
        # not this portfolio's build (optgym-cc would compile it without the portfolio, Portfolio.applies_to);
        # the problems the command leaves out it fills in
        first = dict(portfolio.candidates[0].policies)
        if other := sorted(name for name, spec in build if name in first and spec != "pretrained"):
            raise OptgymError(f"{portfolio.path} decides {', '.join(first)} in a default build: "
                              f"evaluate it with the shipped policy (pretrained) for {', '.join(other)}")  # fmt: skip
        rows = evaluate_portfolio(corpus, portfolio, candidates, [n for n in names if n in mine], policies=build,
                                  **common)  # fmt: skip
        others = [n for n in names if n not in mine]
        if others:
            rows += evaluate(policy, corpus, problem=problem, modules=others, mode=mode, seed=seed,
                             transcript_dir=transcript_dir, companions=companions, flags=flags, **common)  # fmt: skip
        by_name = {row.module: row for row in rows}
        return [by_name[n] for n in names]
    factory = portable_policy(resolve_policy(policy, problem), workers)  # under Ray, a policy directory travels too
    transcripts = str(transcript_dir) if transcript_dir else None
    if transcripts and companions:
        raise OptgymError("a transcript records one channel: evaluate without --with to record one")
    with_policies = companion_factories(problem, companions, workers)
    sources = portable_modules([corpus.module(n) for n in names], workers)
    tasks = [_Task(problem, source, n, factory, mode, seed + i, timeout, transcripts, with_policies, tuple(flags))
             for i, (n, source) in enumerate(zip(names, sources, strict=True))]  # fmt: skip
    slots: list[ModuleRow | None] = [None] * len(tasks)
    totals = {"h": 0, "p": 0}

    def running() -> str:
        return f"ratio {totals['p'] / totals['h']:.4f}" if totals["h"] else ""

    for index, row in run_tasks(evaluate_module, tasks, workers=workers, description=f"evaluate {policy}",
                                status=running, progress=progress, on_error=_task_failed):  # fmt: skip
        slots[index] = row
        if row.ok:
            heuristic, text = row.texts
            totals["h"] += heuristic
            totals["p"] += text
    return [r for r in slots if r is not None]


def evaluate_portfolio(
    corpus: Corpus,
    portfolio: Portfolio,
    count: int,
    modules: Sequence[str],
    *,
    policies: Sequence[tuple[str, str]] = (),
    workers: int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    progress: bool = True,
) -> list[ModuleRow]:
    """``modules`` compiled by the first ``count`` candidates of ``portfolio``, each row the smallest object
    (what ``optgym-cc`` keeps with ``OPTGYM_CANDIDATES=count``): every candidate is one cached evaluation,
    so a larger ``count`` costs only the new candidates' compiles. ``policies``: the build's ``(problem,
    spec)`` pairs, each candidate's own in their place (:meth:`Candidate.compile_policies`).

    The first candidate is the build's own compile: where it fails the row fails (the build would have
    fallen back to clang); another candidate's failure only takes it out of that module's choice. A row's
    ``detail`` names the candidate kept, its ``compile_seconds`` add up every candidate's but clang's own (the
    heuristic's compile, which every row has)."""
    chosen = portfolio.first(count)
    runs: list[tuple[str, dict[str, ModuleRow]]] = []
    for candidate in chosen:
        if candidate.is_clang:
            continue
        (problem, spec), *companions = candidate.measured_policies(policies)  # as optgym-cc compiles it
        rows = evaluate(spec, corpus, problem=problem, modules=modules, workers=workers, timeout=timeout,
                        progress=progress, companions=companions, flags=candidate.flags)  # fmt: skip
        runs.append((candidate.name, {row.module: row for row in rows}))
    if not runs:
        raise OptgymError(f"{portfolio.path}: its first {count} candidates are clang's own compile alone")
    with_clang = any(candidate.is_clang for candidate in chosen)
    combined = []
    for name in modules:
        first = runs[0][1][name]
        if not first.ok:
            combined.append(first)
            continue
        kept, label = first, runs[0][0]
        for other, other_rows in runs[1:]:  # by text + data, as optgym-cc keeps an object (keep_smaller)
            row = other_rows[name]
            if row.ok and row.images[1] < kept.images[1]:
                kept, label = row, other
        (heuristic, text), dottext, data = kept.texts, kept.policy_dottext, kept.policy_data
        if with_clang and kept.images[0] < kept.images[1]:
            text, dottext, data, label = heuristic, kept.heuristic_dottext, kept.heuristic_data, "clang"
        seconds = sum(by_module[name].compile_seconds for _, by_module in runs)
        combined.append(replace(kept, policy_text=text, policy_dottext=dottext, policy_data=data, detail=label,
                                compile_seconds=seconds, ratio=text / heuristic if heuristic else 1.0))  # fmt: skip
    return combined
