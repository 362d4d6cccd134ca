"""C compiles the launcher runs itself: clang's own decisions with a portfolio's pass options.

The default build's C compile on x86-64 and AArch64 is a portfolio's first candidate, pass options alone
(``-mllvm -disable-block-placement`` and the like): no decision goes over a channel, no second compile runs,
no guard. Handing it to the policy server still cost the build a round trip and the server's bookkeeping per
object: cmark's default build took 1.19x plain clang's CPU through the server and 1.15x run here, against 1.11x
for the launcher passing the compile straight to clang (docs/experiments/2026-11-29-direct-c.md).

Only the server knows that a compile is of that kind: whether the build's policies decide C at all is written
in their files, which the launcher does not load. So the server says it, once: when a C compile it serves is
clang's own with ``flags``, it records the flags under the launcher's key (:func:`key`), in a small file
named after the server's socket, which names the policies, their files' inodes and times, clang's directory
and the protocol (:func:`plans_file`). A later compile of the same build finds its key there and runs clang
itself (:func:`run`), with the server's safety: a crash or a compile past ``OPTGYM_TIMEOUT`` falls back to
clang's plain compile with one warning line; clang's diagnostics reach the build only from the compile that
counts. A changed portfolio file, policy file or variable changes the key or the file, and the next compile
asks the server again.

Standard library only, like the launcher (``_signal``, not ``signal``: the latter imports ``enum``).
"""

from __future__ import annotations

import marshal
import os

TYPE_CHECKING = False  # as in the launcher: typing's import is not free
if TYPE_CHECKING:
    from collections.abc import Mapping

#: The variables besides the portfolio's file that change how the server compiles a C object: how many
#: candidates, and the guards. Part of the key, so a build that sets one asks the server again.
KEY_VARIABLES = ("OPTGYM_CANDIDATES", "OPTGYM_GUARD", "OPTGYM_GUARD_BELOW", "OPTGYM_PORTFOLIO")
#: Exits that are clang's crash, not the source's error (``describe_exit`` in optgym.toolchain.process says the
#: same; tests/test_direct.py holds the two equal): killed by a signal, or the driver reporting that its
#: in-process compile died of SIGILL, SIGABRT, SIGBUS or SIGSEGV (``#pragma clang __debug crash`` exits 132).
CRASH_SIGNALS = (4, 6, 7, 11)
#: Seconds of compiler time a served compile may take unless ``OPTGYM_TIMEOUT`` says; the server's bound too. A
#: policy can drive clang where its heuristic never goes: ``random`` inlining made sqlite3's amalgamation, a
#: minute's compile for clang, run for over 19 minutes. Ten minutes is well past any translation unit of the
#: benches served with a trained policy, and caps what such a compile wastes.
DEFAULT_TIMEOUT = 600.0
#: Seconds clang has to remove its temporary output after a SIGTERM past the bound, before SIGKILL.
KILL_GRACE = 5.0
#: Added to every compile run under a policy or a portfolio (here and by the server): a crash leaves no reproducer
#: (a ``.c`` and a ``.sh`` in the temporary directory) behind; the build falls back to a plain compile instead.
NO_CRASH_FILES = "-fno-crash-diagnostics"
#: Plans one file keeps. Each edit of a portfolio file or change of a key variable adds a key, and the file is
#: read on every C compile, so the oldest plans go: a build that comes back to one asks the server once more.
MAX_PLANS = 32


def plans_file(cache_root: str, socket_path: str) -> str:
    """The file of the server at ``socket_path``'s recorded plans, in optgym's cache: it outlives the server,
    which goes when idle, and is keyed as its socket is."""
    return os.path.join(cache_root, "direct", os.path.basename(socket_path).removesuffix(".sock") + ".marshal")


def key(portfolio: str, sent: bool) -> tuple[str, ...] | None:
    """What the server's plan for a C compile depends on beyond its policies: ``portfolio`` (the file it compiles
    C by, an absolute path) as it is now, whether the launcher ``sent`` it (a target's, which sends the compiles
    it does not take to clang) and :data:`KEY_VARIABLES`. ``None`` when it cannot be told (no such file, or a
    relative path, which the server would read from its own directory)."""
    if not os.path.isabs(portfolio):
        return None
    try:
        st = os.stat(portfolio)
    except OSError:
        return None
    variables = (os.environ.get(name, "") for name in KEY_VARIABLES)
    return (portfolio, str(sent), str(st.st_ino), str(st.st_mtime_ns), str(st.st_size), *variables)


def _read(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            plans = marshal.load(f)
    except (OSError, EOFError, ValueError, TypeError):
        return {}
    return plans if isinstance(plans, dict) else {}


def plan(path: str, compile_key: tuple[str, ...]) -> list[str] | None:
    """The flags recorded for ``compile_key`` in the plans file ``path``, else ``None`` (ask the server)."""
    flags = _read(path).get(compile_key)
    return list(flags) if isinstance(flags, tuple) and all(isinstance(f, str) for f in flags) else None


def remember(path: str, compile_key: tuple[str, ...], flags: tuple[str, ...]) -> None:
    """Record (the server does) that a C compile under ``compile_key`` is clang's own with ``flags``. Replaced
    whole, never written in place, so a launcher reads the old file or the new one; best effort (an unwritable
    cache costs the next compiles their shortcut, nothing else). Keeps the :data:`MAX_PLANS` latest."""
    plans = _read(path)
    if plans.get(compile_key) == flags:
        return
    plans.pop(compile_key, None)  # a plan replaced is the latest
    plans[compile_key] = flags
    for oldest in list(plans)[: max(0, len(plans) - MAX_PLANS)]:
        del plans[oldest]
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        partial = f"{path}.{os.getpid()}.{id(plans)}.tmp"
        with open(partial, "wb") as f:
            marshal.dump(plans, f)
        os.replace(partial, path)
    except OSError:
        pass


def crashed(returncode: int) -> bool:
    """Whether clang's exit status is a crash (see :data:`CRASH_SIGNALS`)."""
    return returncode < 0 or returncode - 128 in CRASH_SIGNALS


def timeout(environ: Mapping[str, str] = os.environ, default: float = DEFAULT_TIMEOUT) -> float | None:
    """``OPTGYM_TIMEOUT``'s seconds in ``environ`` (``default`` when unset), or ``None`` for a value that is not a
    positive number: the server then tells the build why (``compile_timeout`` in optgym.serve.server)."""
    value = environ.get("OPTGYM_TIMEOUT", "").strip()
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds > 0 else None


def run(clang: str, args: list[str], flags: list[str], scratch: str) -> dict:
    """Run clang on the build's ``args`` with ``flags``, as the server would, and answer as the server does:
    ``{"returncode": N}`` once clang's diagnostics are on the build's stderr, or ``{"fallback": True, "warning":
    …}`` when clang crashed or ran past :func:`timeout` (its diagnostics dropped: the plain compile prints its own).
    ``scratch``: a directory for the diagnostics' unnamed file. A SIGINT, SIGTERM or SIGHUP sent to the launcher
    goes on to clang, and the launcher ends as clang does."""
    import _signal  # type: ignore[import-not-found]  # no stub: the C module under `signal`

    seconds = timeout() or DEFAULT_TIMEOUT
    diagnostics = os.open(scratch, os.O_TMPFILE | os.O_RDWR, 0o600)
    colour = ["-fcolor-diagnostics"] if os.isatty(2) else []  # the build's terminal, not the file's
    argv = [clang, *colour, *args, NO_CRASH_FILES, *flags]
    # the signals wait until the handlers know clang's pid: one between the spawn and the handlers would end the
    # launcher and leave clang running (the child starts with none blocked)
    watched = {_signal.SIGALRM, _signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP}
    _signal.pthread_sigmask(_signal.SIG_BLOCK, watched)
    pid = os.posix_spawn(clang, argv, os.environ, file_actions=[(os.POSIX_SPAWN_DUP2, diagnostics, 2)], setsigmask=())
    stopped: list[int] = []

    def stop(signum: int, _frame: object) -> None:
        """Past the bound, SIGTERM first: clang removes its half-written ``<stem>-XXXXXXXX.o.tmp`` on it (SIGKILL
        would leave it in the build's directory), then SIGKILL after a grace the bound does not count."""
        late = signum == _signal.SIGALRM and _signal.SIGALRM in stopped
        stopped.append(signum)
        os.kill(pid, _signal.SIGKILL if late else _signal.SIGTERM if signum == _signal.SIGALRM else signum)
        if signum == _signal.SIGALRM and not late:
            _signal.setitimer(_signal.ITIMER_REAL, KILL_GRACE)

    for signum in watched:
        _signal.signal(signum, stop)
    _signal.setitimer(_signal.ITIMER_REAL, seconds)
    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, watched)
    status = os.waitpid(pid, 0)[1]  # retried after each handler (PEP 475): clang is gone when it returns
    _signal.setitimer(_signal.ITIMER_REAL, 0)
    returncode = os.waitstatus_to_exitcode(status)
    if stopped and stopped[0] != _signal.SIGALRM:  # the build stopped us: end as it asked
        os._exit(128 + stopped[0])
    if stopped:
        return {"fallback": True, "warning": f"clang with the portfolio's pass options ran past {seconds:g} s"}
    if crashed(returncode):
        return {"fallback": True, "warning": f"clang with the portfolio's pass options crashed (exit {returncode})"}
    os.lseek(diagnostics, 0, os.SEEK_SET)
    while chunk := os.read(diagnostics, 1 << 16):
        view = memoryview(chunk)
        while view:
            view = view[os.write(2, view) :]
    os.close(diagnostics)
    return {"returncode": returncode}
