"""clang's own heuristic on one corpus module, as a task: its sizes and its decision count (both cached).

The corpus layer reports them (``optgym corpus info``, ``--max-decisions``) but sits below the compiles: these
workers are registered with it (:func:`optgym.corpus.info.register_heuristic_worker`) when ``optgym.rollout`` is
imported.
"""

from __future__ import annotations

from typing import Any

from optgym.corpus.info import SizeTask, register_heuristic_worker


def heuristic_size(task: SizeTask) -> dict[str, Any]:
    """Worker: the module compiled by clang's own heuristic (cached), as a row."""
    from optgym.corpus.portable import local_module
    from optgym.problems import get_problem
    from optgym.rollout.episode import baseline
    from optgym.toolchain import find_toolchain

    module = local_module(task.source)
    result = baseline(get_problem(task.problem), module, find_toolchain(), timeout=task.timeout)
    return {"module": module.name, "status": result.status, "detail": result.detail, **result.metrics}


def heuristic_decisions(task: SizeTask) -> dict[str, Any]:
    """Worker: decision count of the module under clang's heuristic (an interactive compile, cached)."""
    from optgym.corpus.cache import ResultCache
    from optgym.corpus.portable import local_module
    from optgym.problems import get_problem
    from optgym.rollout import rollout
    from optgym.rollout.simple import heuristic
    from optgym.toolchain import find_toolchain

    module = local_module(task.source)
    problem = get_problem(task.problem)
    toolchain = find_toolchain((problem.hook,))
    cache = ResultCache("decisions")
    key = cache.key([module.digest, problem.name, "decisions", *problem.compile_flags(), toolchain.identity])
    if (hit := cache.get(key)) is not None:
        return hit
    out = rollout(problem, module, toolchain, heuristic, timeout=task.timeout)
    row = {
        "module": module.name,
        "status": out.result.status,
        "detail": out.result.detail,
        "decisions": int(out.result.decisions),
        "heuristic_yes": int((out.trajectory.heuristic > 0).sum()),
    }
    if out.result.ok:
        cache.put(key, row)
    return row


register_heuristic_worker("sizes", heuristic_size)
register_heuristic_worker("decisions", heuristic_decisions)

__all__ = ["heuristic_decisions", "heuristic_size"]
