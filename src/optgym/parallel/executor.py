"""Executors: ``map_unordered(fn, items)`` yields ``(index, result)`` as tasks finish.

``fn`` must be a picklable top-level function; results come back in completion order so a caller can
show progress and write results incrementally. Every index is yielded exactly once.

Failures. Tasks that expect failures (compiles) return a status instead of raising. A task that fails
anyway — its function raised, or its worker process died more often than the executor retries — is
*final*: it is never retried forever and never yielded twice. With ``on_error(item, failure)`` the
caller turns it into a result for that index (a failed row in a report); without it the function's own
exception is re-raised in the caller (a lost worker raises :class:`TaskFailed`).

Backends: :class:`InlineExecutor` (one worker, this process), :class:`ProcessExecutor` (local
forkserver pool, the default) and :class:`~optgym.parallel.ray_backend.RayExecutor` (a Ray cluster,
chosen by ``ray_address`` or ``$OPTGYM_RAY_ADDRESS``; Ray is imported only then).
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from optgym.errors import OptgymError
from optgym.parallel.failures import DEFAULT_MAX_RETRIES, OnError, TaskFailed, failure_result

T = TypeVar("T")
R = TypeVar("R")

#: The environment variable that selects the Ray backend (``auto`` or ``HOST:PORT``).
RAY_ADDRESS_ENV = "OPTGYM_RAY_ADDRESS"


class Executor(Protocol):
    workers: int

    def map_unordered(
        self, fn: Callable[[T], R], items: Sequence[T], on_error: OnError | None = None
    ) -> Iterator[tuple[int, R]]: ...

    def close(self) -> None: ...


class InlineExecutor:
    """Runs tasks one after another in this process: ``--workers 1``, debugging, tests."""

    workers = 1

    def map_unordered(
        self, fn: Callable[[T], R], items: Sequence[T], on_error: OnError | None = None
    ) -> Iterator[tuple[int, R]]:
        for i, item in enumerate(items):
            try:
                result = fn(item)
            except Exception as e:
                if on_error is None:
                    raise
                result = on_error(item, TaskFailed(i, f"{type(e).__name__}: {e}", 1, e))
            yield i, result

    def close(self) -> None:
        pass


@dataclass
class _Pending:
    index: int
    item: Any
    attempts: int = 1


def _exit_with_driver(driver: int) -> None:
    """Worker initializer: end this worker the moment the driver process is gone.

    A forkserver worker is the forkserver's child, not the driver's, so a driver killed by SIGKILL (or
    one whose SIGTERM handler never ran) left its workers compiling on — measured: a killed
    ``optgym search`` kept two workers writing into its directory for minutes. A daemon thread waits on
    a pidfd of the driver (no polling) and then exits the worker; the compile it was running dies with
    it (compilers are spawned with a parent-death signal, see optgym.toolchain.process).
    """
    import select
    import threading

    try:
        fd = os.pidfd_open(driver)
    except (OSError, AttributeError):  # already gone, or no pidfd on this kernel: nothing to watch
        from optgym.toolchain.process import pid_alive

        if not pid_alive(driver):
            os._exit(1)
        return

    def watch() -> None:
        select.select([fd], [], [])
        os._exit(1)

    threading.Thread(target=watch, name="optgym-driver-watch", daemon=True).start()


class ProcessExecutor:
    """A local pool of ``workers`` processes (forkserver: safe with threads in the parent).

    At most ``2 × workers`` tasks are in flight, so a million-module corpus does not become a million
    pending futures.

    A worker that dies (OOM killer, a crash, SIGKILL) breaks a ``ProcessPoolExecutor``: every future in
    flight fails, and the pool cannot say whose worker died. So the pool is rebuilt and those tasks
    become *suspects*, rerun one at a time: an innocent one completes, the culprit breaks the pool while
    alone and is charged an attempt; after ``max_retries`` retries it is reported as failed. A task that
    keeps killing its worker thus never takes its neighbours down with it, and nothing runs forever.
    """

    def __init__(self, workers: int, max_retries: int = DEFAULT_MAX_RETRIES) -> None:
        self.workers = workers
        self.max_retries = max_retries
        self._context = multiprocessing.get_context("forkserver")
        self._pool = self._new_pool()

    def _new_pool(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            self.workers, mp_context=self._context, initializer=_exit_with_driver, initargs=(os.getpid(),)
        )

    def map_unordered(
        self, fn: Callable[[T], R], items: Sequence[T], on_error: OnError | None = None
    ) -> Iterator[tuple[int, R]]:
        pending: dict[Future, _Pending] = {}
        suspects: deque[_Pending] = deque()
        queue = iter(enumerate(items))

        def fill() -> None:
            if suspects:  # isolation: one suspect at a time, nothing else, so a break names its culprit
                if not pending:
                    task = suspects.popleft()
                    pending[self._pool.submit(fn, task.item)] = task
                return
            for index, item in itertools.islice(queue, max(0, 2 * self.workers - len(pending))):
                pending[self._pool.submit(fn, item)] = _Pending(index, item)

        try:
            fill()
            while pending:
                alone = len(pending) == 1
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                if any(isinstance(f.exception(), BrokenProcessPool) for f in done):
                    wait(pending)  # a broken pool fails every future in flight within moments
                    done = set(pending)
                lost: list[_Pending] = []
                for future in sorted(done, key=lambda f: pending[f].index):
                    task = pending.pop(future)
                    if isinstance(future.exception(), BrokenProcessPool):
                        lost.append(task)
                    else:
                        yield task.index, self._outcome(future, task, on_error)
                if lost:
                    self._pool.shutdown(wait=True, cancel_futures=True)
                    self._pool = self._new_pool()
                    if alone:  # it was the only task running: its worker died under it
                        (task,) = lost
                        if task.attempts > self.max_retries:
                            failure = TaskFailed(task.index, "its worker process died on every attempt", task.attempts)
                            yield task.index, failure_result(failure, task.item, on_error)
                        else:
                            task.attempts += 1
                            suspects.appendleft(task)
                    else:
                        suspects.extend(lost)
                fill()
        finally:
            for future in pending:
                future.cancel()

    @staticmethod
    def _outcome(future: Future, task: _Pending, on_error: OnError | None) -> Any:
        error = future.exception()
        if error is None:
            return future.result()
        failure = TaskFailed(task.index, f"{type(error).__name__}: {error}", task.attempts, error)
        return failure_result(failure, task.item, on_error)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def default_workers() -> int:
    return len(os.sched_getaffinity(0))


_ADDRESS = re.compile(r"^(auto|[A-Za-z0-9._-]+:\d{1,5}|\[[0-9A-Fa-f:]+\]:\d{1,5})$")


def check_ray_address(address: str) -> str:
    """``address`` if it is ``auto`` or ``HOST:PORT``; a clear error otherwise (typos fail before any work)."""
    if not _ADDRESS.match(address):
        raise OptgymError(f"bad Ray address {address!r}: use 'auto' or HOST:PORT (the head's GCS port, e.g. 6379)")
    return address


def resolve_ray_address(explicit: str | None = None) -> str | None:
    """The Ray cluster to use: ``explicit``, else ``$OPTGYM_RAY_ADDRESS``, else ``None`` (local processes)."""
    address = explicit or os.environ.get(RAY_ADDRESS_ENV) or None
    return check_ray_address(address.strip()) if address else None


def ray_backend_address(workers: int | None = None, ray_address: str | None = None) -> str | None:
    """The Ray address :func:`get_executor` will use for these arguments, or ``None`` for a local executor."""
    address = resolve_ray_address(ray_address)
    return address if address is not None and (ray_address or workers != 1) else None


def get_executor(workers: int | None = None, ray_address: str | None = None) -> Executor:
    """The executor for a fan-out.

    A Ray cluster when ``ray_address`` names one, or when ``$OPTGYM_RAY_ADDRESS`` does and ``workers``
    is not 1 (``workers == 1`` stays in this process: debugging, and callers that must stay local such as
    one-at-a-time package builds); ``workers``, if given, caps Ray's tasks in flight at ``2 × workers``.
    Otherwise ``workers`` local processes (default: every core this process may use), in-process for 1.
    """
    address = ray_backend_address(workers, ray_address)
    if address is not None:
        from optgym.parallel.ray_backend import RayExecutor

        return RayExecutor(address, workers=workers)
    workers = workers or default_workers()
    return InlineExecutor() if workers <= 1 else ProcessExecutor(workers)


#: Without a terminal (a log file, nohup) rich draws the bar only when the fan-out ends, so a long one looks hung
#: (a corpus build printed nothing for an hour); there a plain line says how far it is, at most this often.
LOG_EVERY_SECONDS = 60.0


def run_tasks(
    fn: Callable[[T], R],
    items: Sequence[T],
    *,
    workers: int | None = None,
    description: str = "working",
    status: Callable[[], str] | None = None,
    progress: bool = True,
    on_error: OnError | None = None,
    ray_address: str | None = None,
) -> Iterable[tuple[int, R]]:
    """``map_unordered`` with a rich progress bar (and an optional live ``status()`` text); without a terminal, a
    line of progress after a task finishes, at most every :data:`LOG_EVERY_SECONDS`."""
    executor = get_executor(workers, ray_address)
    columns = [
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[status]}"),
    ]
    try:
        with Progress(*columns, transient=False, disable=not progress) as bar:
            task = bar.add_task(description, total=len(items), status="")
            plain = progress and not bar.console.is_terminal
            started = logged = time.monotonic()
            for done, (index, result) in enumerate(executor.map_unordered(fn, items, on_error), start=1):
                yield index, result
                text = status() if status else ""
                bar.update(task, advance=1, status=text)
                if plain and done < len(items) and time.monotonic() - logged >= LOG_EVERY_SECONDS:
                    logged = time.monotonic()
                    bar.console.print(f"{description}: {done}/{len(items)} after {logged - started:.0f} s {text}",
                                      highlight=False, markup=False)  # fmt: skip
    finally:
        executor.close()
