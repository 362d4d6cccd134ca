"""Tasks that failed for good, as every executor reports them (:mod:`optgym.parallel.executor`,
:mod:`optgym.parallel.ray_backend`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from optgym.errors import OptgymError

#: How often a task whose worker died is resubmitted before it is reported as failed.
DEFAULT_MAX_RETRIES = 3


class TaskFailed(OptgymError):
    """A task that failed for good: its function raised, or its worker died on every attempt.

    ``cause`` is the function's exception (``None`` when the worker was lost); ``attempts`` counts the
    submissions, so a caller can tell a deterministic failure (1) from a flaky node (``max_retries + 1``).
    """

    def __init__(self, index: int, reason: str, attempts: int, cause: BaseException | None = None) -> None:
        self.index, self.reason, self.attempts, self.cause = index, reason, attempts, cause
        super().__init__(f"task {index} failed after {attempts} attempt(s): {reason}")

    @property
    def worker_lost(self) -> bool:
        """True when no attempt finished (the worker process or node died every time)."""
        return self.cause is None


#: ``on_error(item, failure)``: the result to yield for an item whose task failed for good.
OnError = Callable[[Any, TaskFailed], Any]


def failure_result(failure: TaskFailed, item: Any, on_error: OnError | None) -> Any:
    """The result for a failed item, or raise: the function's own exception if it raised one."""
    if on_error is not None:
        return on_error(item, failure)
    if failure.cause is not None:
        raise failure.cause
    raise failure
