"""One executor API for every fan-out (corpus builds, traces, evaluations, searches, ES rollouts).

``get_executor(workers)`` gives an in-process executor for one worker and a local process pool for
more, or — when ``ray_address``/``$OPTGYM_RAY_ADDRESS`` (``optgym --ray-address``) names a cluster — a
Ray executor behind the same two calls (Ray is imported only then). Tasks carry modules and files by content
(:mod:`optgym.corpus.portable`, :mod:`optgym.parallel.portable`) for workers that do not share the driver's
filesystem.
"""

from optgym.parallel.executor import (
    RAY_ADDRESS_ENV,
    Executor,
    InlineExecutor,
    ProcessExecutor,
    check_ray_address,
    get_executor,
    ray_backend_address,
    resolve_ray_address,
    run_tasks,
)
from optgym.parallel.failures import TaskFailed

__all__ = [
    "RAY_ADDRESS_ENV",
    "Executor",
    "InlineExecutor",
    "ProcessExecutor",
    "TaskFailed",
    "check_ray_address",
    "get_executor",
    "ray_backend_address",
    "resolve_ray_address",
    "run_tasks",
]
