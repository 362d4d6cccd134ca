"""Running the compiler so that it can never outlive its host, and never leave files behind.

Three mechanisms, because each covers an exit path the others cannot:

* every compiler is started in its own process group with ``PR_SET_PDEATHSIG=SIGKILL`` (through
  util-linux's ``setpriv``, which keeps ``posix_spawn`` fast; a ``preexec_fn`` otherwise), so a host
  killed with SIGKILL takes its compilers with it — clang would otherwise busy-loop forever on a
  closed FIFO, or wait forever to open one. The signal is armed only once the child has set it, so a host
  that dies before then would leave the child behind; the child checks, after arming it, that its parent is
  still the host, and exits if not (a ``/bin/sh`` between ``setpriv`` and the compiler: +1.3 ms a spawn, median of
  300 side by side with ``setpriv`` alone on 2 busy cores);
* :func:`kill_group` on every normal exit path (``close()``, exceptions, Ctrl-C, garbage collection);
* private run directories named after the host PID under one root; :func:`private_dir` removes the
  directories of hosts that died before they could clean up, and :func:`install_sigterm_handler`
  turns SIGTERM into ``SystemExit`` so that ``finally`` blocks run.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PR_SET_PDEATHSIG = 1
_SETPRIV = shutil.which("setpriv")
STDERR_TAIL = 4000


#: Run by ``sh`` after ``setpriv`` armed the signal: exec the compiler only if the host (``$0``) is still the
#: parent, i.e. did not die before the signal was armed.
_IF_HOST_ALIVE = 'test "$PPID" = "$0" && exec "$@"'


def linker_dying_with_driver(linker: str, directory: Path) -> str:
    """A program that runs ``linker`` so that it dies with the clang driver that started it: a link's driver is
    the host's child (and dies with the host, :func:`spawn`), but lld is the driver's child, and an lld left
    behind would busy-loop on its closed channel. It is a shell script named like the linker (lld takes its
    flavour from its name) in ``directory``, one per linker, made once; give it to the driver as ``--ld-path``.
    Without ``setpriv``, the linker itself."""
    if not _SETPRIV or "'" in linker:
        return linker
    import hashlib

    wrapper = directory / hashlib.sha256(linker.encode()).hexdigest()[:16] / os.path.basename(linker)
    script = (
        f"#!/bin/sh\nexec {_SETPRIV} --pdeathsig KILL -- /bin/sh -c '{_IF_HOST_ALIVE}' \"$PPID\" '{linker}' \"$@\"\n"
    )
    if not wrapper.exists() or wrapper.read_text() != script:
        wrapper.parent.mkdir(parents=True, exist_ok=True)
        partial = wrapper.with_name(f".{wrapper.name}.{os.getpid()}")
        partial.write_text(script)
        partial.chmod(0o755)
        os.replace(partial, wrapper)  # atomically: a link running it never reads half a script
    return str(wrapper)


def _set_pdeathsig(host: int) -> None:  # pragma: no cover - runs in the child between fork and exec
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != host:
        os._exit(1)


def spawn(
    args: Sequence[str],
    *,
    stdout=subprocess.DEVNULL,
    stderr=None,
    cwd: Path | str | None = None,
    env: dict[str, str] | None = None,
    stdin=subprocess.DEVNULL,
) -> subprocess.Popen:
    """Start ``args`` in a new process group that dies with this process (see the module doc).

    PDEATHSIG fires when the *thread* that spawned the child exits: spawn from a thread that lives
    as long as the compile (any ordinary use does).
    """
    host = os.getpid()
    if _SETPRIV:
        return subprocess.Popen(
            [_SETPRIV, "--pdeathsig", "KILL", "--", "/bin/sh", "-c", _IF_HOST_ALIVE, str(host), *args],
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            cwd=cwd,
            env=env,
            process_group=0,
        )
    return subprocess.Popen(
        list(args),
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        cwd=cwd,
        env=env,
        process_group=0,
        preexec_fn=lambda: _set_pdeathsig(host),
    )


def wait_exit(proc: subprocess.Popen, timeout: float) -> int | None:
    """The exit status, or ``None`` at the timeout.

    Waits on a pidfd, which wakes the moment the process exits; ``Popen.wait(timeout)`` sleeps in
    growing steps of up to 50 ms and was measured to notice exits tens of milliseconds late.
    """
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
    try:
        select.select([pidfd], [], [], max(timeout, 0))
    finally:
        os.close(pidfd)
    return proc.poll()


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group of ``proc`` and reap it; a no-op if it already ended."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            proc.wait()


def describe_exit(returncode: int) -> tuple[str, str]:
    """(status, detail) of a finished compiler: ``compile_error`` for a non-zero exit, ``crash`` for a signal."""
    if returncode < 0:
        sig = signal.Signals(-returncode).name if -returncode in signal.Signals._value2member_map_ else -returncode
        return "crash", f"compiler killed by signal {sig}"
    if returncode >= 128 + 1 and returncode - 128 in (
        signal.SIGSEGV,
        signal.SIGABRT,
        signal.SIGBUS,
        signal.SIGILL,
    ):
        return (
            "crash",
            f"compiler crashed (exit {returncode}, signal {signal.Signals(returncode - 128).name})",
        )
    return "compile_error", f"compiler exited with status {returncode}"


def read_tail(file, limit: int = STDERR_TAIL) -> str:
    """The last ``limit`` bytes of an open (temporary) file, decoded leniently."""
    file.seek(0, os.SEEK_END)
    size = file.tell()
    file.seek(max(0, size - limit))
    return file.read().decode("utf-8", "replace")


@dataclass(frozen=True)
class RunResult:
    returncode: int | None  # None when killed at the timeout
    status: str  # "ok" | "compile_error" | "crash" | "timeout"
    detail: str
    stderr_tail: str
    seconds: float


def run(args: Sequence[str], timeout: float, cwd: Path | None = None, stdout=subprocess.DEVNULL) -> RunResult:
    """Run one non-interactive compile with a wall-clock timeout; the group is killed at the timeout."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = spawn(args, stdout=stdout, stderr=err, cwd=cwd)
        try:
            returncode = wait_exit(proc, timeout)
        finally:
            kill_group(proc)
        if returncode is None:
            return RunResult(
                None, "timeout", f"killed after {timeout:g} s", read_tail(err), time.perf_counter() - start
            )
        status, detail = ("ok", "") if returncode == 0 else describe_exit(returncode)
        return RunResult(returncode, status, detail, read_tail(err), time.perf_counter() - start)


# ---------------------------------------------------------------------------------------------
# private run directories


def runtime_root() -> Path:
    """Where optgym puts FIFOs: ``$XDG_RUNTIME_DIR/optgym`` or ``$TMPDIR/optgym-<uid>``."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    root = Path(base) / "optgym" if base else Path(tempfile.gettempdir()) / f"optgym-{os.getuid()}"
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    return root


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(root: Path, prefix: str = "", min_age: float = 0.0) -> int:
    """Remove run directories ``<prefix><pid>-…`` in ``root`` whose host process is gone (killed before it could
    clean up), and that are at least ``min_age`` seconds old."""
    removed, now = 0, time.time()
    for entry in root.iterdir() if root.exists() else ():
        if not entry.name.startswith(prefix):
            continue
        pid = entry.name[len(prefix) :].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or pid_alive(int(pid)):
            continue
        with contextlib.suppress(OSError):
            if now - entry.lstat().st_mtime >= min_age:
                shutil.rmtree(entry, ignore_errors=True)
                removed += 1
    return removed


_swept = False


def private_dir() -> Path:
    """A fresh mode-0700 directory ``<pid>-<random>`` under :func:`runtime_root`."""
    global _swept
    root = runtime_root()
    if not _swept:
        sweep_stale(root)
        _swept = True
    return Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=root))


#: How long a dead process's :func:`private_tempdir` is left before another process removes it. The owner's death
#: is read from its pid, which another PID namespace sharing ``/tmp`` cannot see; no compile lasts this long, so age
#: alone keeps a live directory of such a neighbour safe.
STALE_AFTER_SECONDS = 3600.0
_swept_prefixes: set[str] = set()


def private_tempdir(prefix: str) -> tempfile.TemporaryDirectory[str]:
    """A temporary directory of this process in the temporary directory, ``<prefix><pid>-XXXXXXXX``, removed by its
    owner when done: for files a compile writes where the build's ``TMPDIR`` puts them (the pass plugin's list).

    Why the pid: a process killed mid-compile (a training run stopped with ``kill -TERM``, a server killed with
    its build) never runs its cleanup. As :func:`private_dir` does, the first call for ``prefix`` in each process
    sweeps such leftovers (:func:`sweep_stale`), here only those older than :data:`STALE_AFTER_SECONDS`.
    """
    if prefix not in _swept_prefixes:
        _swept_prefixes.add(prefix)
        sweep_stale(Path(tempfile.gettempdir()), prefix, STALE_AFTER_SECONDS)
    return tempfile.TemporaryDirectory(prefix=f"{prefix}{os.getpid()}-")


def install_sigterm_handler() -> None:
    """Make SIGTERM raise ``SystemExit`` so that cleanup runs; only if nobody else handles it."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:

        def _raise(signum, frame):
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, _raise)
