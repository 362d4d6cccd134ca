"""The Ray backend: the executor API on an existing Ray cluster (``pip install 'optgym[ray]'``).

Ray is imported here and only here, and only when a Ray address is given, so a laptop install never
pays for it. One connection per driver process, made on first use and kept: a trainer that fans out
every iteration (ES) does not reconnect each time, and the module blobs it put in the object store
stay there (see :mod:`optgym.corpus.portable`).

Semantics match :class:`~optgym.parallel.executor.ProcessExecutor`: at most ``2 × workers`` tasks in
flight (``workers`` defaults to the cluster's CPUs), results in completion order, each index once. A
task whose worker process or node dies is resubmitted by Ray itself (``max_retries``); a function that
raises is *not* retried (``retry_exceptions=False``: compiles are deterministic, a second try would fail
the same way); either kind of final failure goes to ``on_error`` or is raised.

Loopback clusters: Ray replaces ``127.0.0.1`` by the machine's outward address unless
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``; for a loopback address this module sets it (before Ray is
imported), so driver, head and workers all stay on loopback (start the head with the same variable).
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import logging
import os
import socket
import threading
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from optgym.errors import OptgymError
from optgym.parallel.failures import DEFAULT_MAX_RETRIES, OnError, TaskFailed, failure_result

T = TypeVar("T")
R = TypeVar("R")

_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
_lock = threading.Lock()
_connected: str | None = None  # the address this process is connected to
_remote: Any = None  # the remote version of _run_task, made once per connection
#: content digest → Ray ObjectRef of the bytes put in the object store for it, for the current connection
#: (:mod:`optgym.parallel.portable`; a disconnect invalidates them).
uploads: dict[str, Any] = {}


def is_loopback(address: str) -> bool:
    """True for ``127.x.y.z:PORT``, ``localhost:PORT`` and ``[::1]:PORT``."""
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _import_ray(address: str) -> tuple[types.ModuleType, str]:
    """``ray``, imported for ``address``, and the concrete ``HOST:PORT`` that ``auto`` stands for."""
    if is_loopback(address):
        os.environ.setdefault(_LOOPBACK_ENV, "0")
    try:
        import ray
    except ImportError:
        raise OptgymError(
            f"a Ray address ({address}) was given but Ray is not installed: pip install 'optgym[ray]'"
        ) from None
    target = address
    if address == "auto":  # the cluster the last `ray start` on this machine made (Ray's own lookup)
        with contextlib.suppress(Exception):
            from ray._private.services import get_ray_address_from_environment

            target = get_ray_address_from_environment("auto", None) or address
    if is_loopback(target) and os.environ.setdefault(_LOOPBACK_ENV, "0") == "0":
        # Ray read the variable when it was imported, perhaps before it was set: tell it the same way.
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = False
    return ray, target


def _probe(target: str, timeout: float = 10.0) -> None:
    """Fail fast when nothing listens at ``HOST:PORT``: ``ray.init`` would retry for minutes."""
    host, _, port = target.rpartition(":")
    if not port.isdigit():
        return  # "auto" that Ray could not resolve: ray.init says why, at once
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        raise OptgymError(
            f"no Ray cluster at {target} ({e.strerror or e}): start one with `ray start --head --port {port}` "
            "(see docs/scaling.md), or check the address"
        ) from None


def connect(address: str) -> types.ModuleType:
    """The ``ray`` module, connected to ``address`` (``auto`` or ``HOST:PORT``); reused across calls."""
    global _connected, _remote
    with _lock:
        ray, target = _import_ray(address)
        if ray.is_initialized() and _connected == address:
            return ray
        if ray.is_initialized():
            _shutdown(ray)
        _probe(target)
        try:
            ray.init(address=target, logging_level=logging.WARNING, log_to_driver=False, configure_logging=True)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise OptgymError(f"cannot connect to the Ray cluster at {address}: {e}") from None
        _connected = address
        _remote = ray.remote(_run_task)
        return ray


def _shutdown(ray: types.ModuleType) -> None:
    global _connected, _remote
    uploads.clear()
    ray.shutdown()
    _connected, _remote = None, None


def shutdown() -> None:
    """Disconnect this process from its cluster (tests and benchmarks before ``ray stop``)."""
    with _lock:
        if _connected is not None:
            import ray

            _shutdown(ray)


def connected_address() -> str | None:
    return _connected


def _run_task(fn: Callable[[Any], Any], item: Any) -> Any:
    """What a Ray worker runs: one ``fn(item)`` (its name is the worker's process title, ``ray::_run_task``)."""
    return fn(item)


class RayExecutor:
    """Tasks on a Ray cluster; see the module doc for retries, failures and loopback clusters."""

    def __init__(self, address: str, workers: int | None = None, max_retries: int = DEFAULT_MAX_RETRIES) -> None:
        self.address = address
        self._ray = connect(address)
        self.workers = workers or max(1, int(self._ray.cluster_resources().get("CPU", 1)))
        self.max_retries = max_retries
        self._live: list[Any] = []  # refs of the current map, cancelled by close()

    def map_unordered(
        self, fn: Callable[[T], R], items: Sequence[T], on_error: OnError | None = None
    ) -> Iterator[tuple[int, R]]:
        ray = self._ray
        from ray.exceptions import RayError, RayTaskError

        remote = _remote.options(num_cpus=1, max_retries=self.max_retries, retry_exceptions=False)
        fn_ref = ray.put(fn)  # shipped once per map, not once per task
        pending: dict[Any, int] = {}
        queue = iter(enumerate(items))
        seen: set[int] = set()

        def submit() -> None:
            try:
                index, item = next(queue)
            except StopIteration:
                return
            pending[remote.remote(fn_ref, item)] = index

        try:
            for _ in range(2 * self.workers):
                submit()
            while pending:
                self._live = list(pending)
                done, _ = ray.wait(self._live, num_returns=1)
                if len(self._live) > 1:  # and whatever else is ready by now: one wait per batch, not per task
                    done, _ = ray.wait(self._live, num_returns=len(self._live), timeout=0)
                for ref in done:
                    index = pending.pop(ref)
                    assert index not in seen, f"task {index} finished twice"
                    seen.add(index)
                    try:
                        result = ray.get(ref)
                    except RayTaskError as e:
                        cause = e.as_instanceof_cause()
                        original = e.cause if isinstance(e.cause, BaseException) else cause
                        failure = TaskFailed(index, f"{type(original).__name__}: {original}", 1, cause)
                        result = failure_result(failure, items[index], on_error)
                    except RayError as e:
                        failure = TaskFailed(index, f"its worker was lost ({type(e).__name__}: {e})",
                                             self.max_retries + 1)  # fmt: skip
                        result = failure_result(failure, items[index], on_error)
                    yield index, result
                    submit()
        finally:
            self._cancel(list(pending))

    def _cancel(self, refs: list[Any]) -> None:
        for ref in refs:
            with contextlib.suppress(Exception):  # a task that finished meanwhile cannot be cancelled: fine
                self._ray.cancel(ref, force=False)
        self._live = []

    def close(self) -> None:
        """Cancel what is still in flight; the connection stays for the next fan-out (see module doc)."""
        self._cancel(self._live)


atexit.register(shutdown)
