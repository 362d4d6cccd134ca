"""The policy server: runs compiles for ``optgym-cc`` launchers and answers their decisions.

One server per (policy, toolchain) listens on a Unix socket in optgym's private runtime directory.
A launcher connects, sends the compile's argv, cwd and environment (``marshal``: both ends are the
same interpreter, and ``json`` would cost every launcher 6 ms of imports) with its stdout/stderr
file descriptors (``SCM_RIGHTS``), and reads one ``marshal``-ed reply to the end of the connection.
The server starts clang exactly as the build asked plus the channel flags, with the launcher's
stdio, so the build sees clang's own output; it answers every decision with the policy, and replies
with clang's exit status.

A cold build waits for the server's start, so it is kept short: one server however many compiles
arrive at once (the launcher's ``flock``, handed to the server and held until it exits), no
gymnasium (``OPTGYM_NO_GYMNASIUM``), exported policies served by numpy rather than onnxruntime
(:mod:`optgym.policies.embedded`), and the compiler check running beside the policy load. Per
decision, a greedy MLPPolicy's answer to a decision point it has seen before (same features,
heuristic answer and language: a third of a C++ build's) is remembered rather than recomputed.

Falling back never breaks a build: when the policy does not fit this compiler (feature names or
compiler version differ from the ones it was trained with) every decision gets clang's own answer
(``inlining_default``), which is byte-identical to a plain compile; when the policy fails mid-compile
the reply says ``fallback`` and the launcher reruns the compile without optgym. Either way the
launcher prints one warning line (or fails under ``OPTGYM_STRICT=1``).

With ``OPTGYM_GUARD=1`` in the build's environment, clang's plain compile runs beside the policy's —
from the policy's first answer that is not clang's own — and the smaller object is kept
(:mod:`optgym.serve.guard`).

A compile of the shipped portfolio's language (C) with the shipped policies is the portfolio's
(:mod:`optgym.policies.portfolio`; ``OPTGYM_PORTFOLIO=FILE``: another one): its first candidate's policies and
flags make the compile (the shipped one's: pass options alone, no channel), and with ``OPTGYM_CANDIDATES=N``
(default: the portfolio's ``default_candidates``, one for the shipped one; ``0``: no portfolio) the object is
then compiled the next ``N - 1`` ways too, one after
the other, each into a hidden sibling, and the smallest object is kept. Sequential on purpose: a parallel
build already keeps every core busy with other objects' compiles.

A launcher that disappears (the build was interrupted) has its compile killed at once; the server
exits after ``--idle`` seconds without a connection.
"""

from __future__ import annotations

import argparse
import contextlib
import marshal
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from optgym.errors import OptgymError
from optgym.files import cache_root
from optgym.policies import DEFAULT_GUARD_BELOW, pretrained_path, resolve_policy
from optgym.policies.portfolio import PRETRAINED_PORTFOLIO, Candidate, Portfolio, PortfolioError, load_portfolio
from optgym.problems import FeatureView, InvalidAction, Problem, get_problem, problem_flags, servable
from optgym.protocol import Header
from optgym.rollout.decider import Decider, Policy, PolicyInfo, decides
from optgym.rollout.linkage import REFUSAL_FLAGS, CalleeLinkage, surviving_functions, without_refusals
from optgym.serve.front_end import from_bitcode_args, front_end_args, unsplittable
from optgym.serve.guard import (
    Guard,
    guard_below,
    keep_smaller,
    link_linker,
    link_output,
    output_path,
    reference_args,
    remove_orphans,
    remove_partial_link,
    remove_partial_output,
    sibling,
    unguardable,
)
from optgym.toolchain.interactive import InteractiveCompile
from optgym.toolchain.lanes import lanes_library
from optgym.toolchain.language import driver_language, family
from optgym.toolchain.llvm import Hook, find_toolchain, for_linker, parse_version
from optgym.toolchain.pass_plugin import SURVIVING_OUT, plugin_flags, read_surviving, surviving_plugin
from optgym.toolchain.process import kill_group, linker_dying_with_driver, private_tempdir, spawn, wait_exit
from optgym_cc import direct
from optgym_cc.thinlto import BACKEND_FLAGS, first_error, link_jobs, without_link_jobs

MAX_REQUEST = 1 << 20
#: At most this many lanes (and so backends side by side) in a served link: each lane holds two descriptors per
#: channel, and a process may open 1 024 by default
MAX_LANES = 64
DEFAULT_TIMEOUT = direct.DEFAULT_TIMEOUT  # (``OPTGYM_TIMEOUT``): see there
#: How a served compile may end that is the policy's doing, not the source's: the build gets clang's own
#: compile instead. A crash counts (clang has no business crashing on a valid answer, but a policy drives it
#: where its own heuristic never goes); a compile error does not — the source has one, and a plain compile would
#: only print it twice.
FALLBACK_STATUSES = frozenset(["crash", "timeout", "protocol_error", "aborted"])
NO_CRASH_FILES = direct.NO_CRASH_FILES  # no crash reproducers in the build's temporary directory


def _fits(policy: Policy, header: Header, compiler_version: str) -> str | None:
    """Why ``policy`` must not decide for this compiler, or ``None`` when it fits."""
    info = PolicyInfo.of(policy)
    if info.feature_names is not None:
        sent = {s.name for s in header.features}
        missing = [n for n in info.feature_names if n not in sent]
        if missing:
            return f"the compiler does not send the policy's features {missing[:5]}"
    trained_with = info.compiler
    if trained_with:
        try:
            trained = parse_version(trained_with)
        except OptgymError:
            trained = None
        if trained and trained.split(".")[0] != compiler_version.split(".")[0]:
            return f"the policy was trained with clang {trained}, this is clang {compiler_version}"
    return None


def _memoizable(policy: Any) -> bool:
    """Whether the policy's answer is a function of what the memo keys on (:class:`Decider`) — the feature
    view, the observation's bytes, the heuristic's answer and the language: true of a greedy
    :class:`MLPPolicy` (exported or not). A :class:`~optgym.rollout.decider.DecisionPoint`'s one other input,
    its index in the module, is not read by it; tests/test_serve.py pins both facts, so a new input cannot
    slip past the memo unnoticed."""
    from optgym.policies.mlp import MLPPolicy

    return isinstance(policy, MLPPolicy) and policy.greedy


def _find_toolchain(hooks: tuple[Hook, ...], out: list[Any]) -> None:
    """``find_toolchain`` for a thread: its result, or the exception, in ``out``."""
    try:
        out.append(find_toolchain(hooks))
    except BaseException as e:  # handed to the thread that waits for it
        out.append(e)


def _plain(fds: Sequence[int], warning: str | None = None) -> dict[str, Any]:
    """The reply that has the launcher compile plainly (with ``warning`` on stderr), the build's descriptors
    closed here since no compile of ours will write them."""
    for fd in fds:
        os.close(fd)
    return {"fallback": True} | ({"warning": warning} if warning else {})


def _copy(source: IO[bytes], fd: int, keep: Callable[[bytes], bytes] | None = None) -> None:
    """Everything written to ``source`` so far, onto ``fd`` (the build's stderr); ``keep`` filters it whole."""
    source.seek(0)
    text = source.read()
    if keep is not None:
        text = keep(text)
    with contextlib.suppress(OSError):  # the build closed its end: nothing is lost that it would read
        os.write(fd, text)


@dataclass
class Served:
    """One decision problem of the served compiles and the policy that answers it."""

    problem: Problem
    spec: str
    policy: Any
    # A deterministic policy's answers, remembered across the build's compiles (~35 µs each saved).
    memo: dict[tuple[Any, ...], Any] | None = None  # see Decider
    view: tuple[Header, FeatureView, str | None] | None = None  # the last header's view and fit verdict

    @property
    def linkage_reader(self) -> bool:
        """Whether the policy reads the callee's linkage: each compile it serves is then compiled once before."""
        return PolicyInfo.of(self.policy).reads_callee_linkage


@dataclass
class _Running:
    """What a launcher waits for: the compile running now — the build's own, then each other candidate's — and
    whether the launcher has gone (then the running compile is killed and no other candidate starts)."""

    compile: InteractiveCompile | subprocess.Popen | None = None
    gone: bool = False

    def kill(self) -> None:
        current = self.compile
        if isinstance(current, subprocess.Popen):
            kill_group(current)
        elif current is not None and current.outcome is None and current.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(current.pid, signal.SIGKILL)


def bitcode_in(work: tempfile.TemporaryDirectory) -> str:
    """Where the front end's bitcode goes in a linkage compile's working directory."""
    return os.path.join(work.name, "front-end.bc")


def surviving_in(work: tempfile.TemporaryDirectory) -> str:
    """Where the pass plugin writes the surviving functions in a linkage compile's working directory."""
    return os.path.join(work.name, "surviving")


def candidate_count(env: dict[str, str]) -> int | None:
    """``OPTGYM_CANDIDATES``: how many of the portfolio's candidates compile each object (``None`` when unset:
    the portfolio's ``default_candidates``; ``0``: no portfolio). A value that is not a count is an error the
    build is told about."""
    value = env.get("OPTGYM_CANDIDATES", "").strip()
    if not value:
        return None
    if not value.isdigit():
        raise ValueError(f"OPTGYM_CANDIDATES={value!r} is not a number of compiles")
    return int(value)


def compile_timeout(env: dict[str, str], default: float = DEFAULT_TIMEOUT) -> float:
    """The bound on a served compile's compiler time: ``OPTGYM_TIMEOUT`` seconds, else ``default``. A value that
    is not a positive number is an error the build is told about (and the compile is clang's own)."""
    seconds = direct.timeout(env, default)
    if seconds is None:
        raise ValueError(f"OPTGYM_TIMEOUT={env['OPTGYM_TIMEOUT'].strip()!r} is not a positive number of seconds")
    return seconds


def channels() -> list[tuple[str, str, str]]:
    """The decisions ``optgym-cc`` serves, from the problem registry: ``(problem, the environment variable naming
    its policy, the shipped policy's file)`` of every problem that declares a ``serve_variable``, in registration
    order (the file ``""`` where none is shipped: the launcher then defaults to clang's own). The launcher's
    :data:`optgym_cc.CHANNELS` is this table written out, since it imports nothing of optgym; a test holds the
    two equal, and a server serves these problems only."""
    return [
        (cls.name, cls.serve_variable, str(pretrained_path(cls.name)) if cls.pretrained is not None else "")
        for cls in servable()
        if cls.serve_variable is not None  # always, by servable(): said again for the type checker
    ]


def _load(problem: str, spec: str) -> Served:
    factory = resolve_policy(spec, problem)
    policy = factory.build(seed=0) if factory.stochastic else factory.build()
    return Served(get_problem(problem), spec, policy, {} if _memoizable(policy) else None)


class Server:
    def __init__(self, policy_spec: str, problem: str, companions: Sequence[tuple[str, str]] = ()):
        """Load the policies and check the compiler, concurrently: the compiler check is two clang runs
        (``--version`` and the hooks), the load is Python work, and a cold build waits for both.

        ``policy_spec`` decides ``problem``; each ``(problem, spec)`` of ``companions`` decides another
        problem of the same compiles (register allocation's eviction beside the inliner), over its own
        channel."""
        wanted = [(problem, policy_spec), *companions]
        if len({name for name, _ in wanted}) != len(wanted):
            raise OptgymError(f"each problem is served by one policy: {[name for name, _ in wanted]}")
        known = [name for name, _, _ in channels()]
        if unserved := [name for name, _ in wanted if name not in known]:
            raise OptgymError(f"optgym-cc serves {', '.join(known)}; not {', '.join(unserved)}")
        hooks = tuple(get_problem(name).hook for name, _ in wanted)
        found: list[Any] = []
        probe = threading.Thread(target=_find_toolchain, args=(hooks, found), daemon=True)
        probe.start()
        try:
            self.served = [_load(name, spec) for name, spec in wanted]
        finally:
            probe.join()
        if isinstance(found[0], BaseException):
            raise found[0]
        self.toolchain = found[0]
        self.policy_spec = policy_spec
        self.portfolios: dict[tuple[str, int, int, int], Portfolio] = {}  # by file version, read at its first compile
        self.candidate_policies: dict[tuple[str, str], Served] = {}  # loaded at a candidate's first compile
        self.remembered: set[tuple[str, tuple[str, ...]]] = set()  # plans recorded (_remember_direct)
        self.active = 0
        self.lock = threading.Lock()
        self.last_activity = time.monotonic()

    @property
    def problem(self) -> Problem:
        """The first served problem (the one ``policy_spec`` decides)."""
        return self.served[0].problem

    @property
    def policy(self) -> Any:
        return self.served[0].policy

    def deciding(self, language: str) -> list[Served]:
        """The served problems whose policy decides compiles of ``language`` (see ``decides``)."""
        return [s for s in self.served if decides(s.policy, language)]

    def accepted(self, conn: socket.socket) -> threading.Thread:
        """Count the connection as active *before* its thread runs, then serve it in that thread: a
        thread not yet scheduled when the idle check comes would otherwise let the server exit under
        an accepted launcher (seen on a loaded machine as "went away mid-compile")."""
        with self.lock:
            self.active += 1
        worker = threading.Thread(target=self.handle, args=(conn,), daemon=True)
        worker.start()
        return worker

    def handle(self, conn: socket.socket) -> None:
        """One compile for one launcher, already counted in ``active`` by :meth:`accepted`."""
        try:
            reply = self._compile(conn)
            with contextlib.suppress(OSError):
                conn.sendall(marshal.dumps(reply))
        finally:
            # shutdown, not just close: the launcher reads to the end of the connection, and _watch's
            # recv() in another thread keeps the socket open past a plain close()
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
            with self.lock:
                self.active -= 1
                self.last_activity = time.monotonic()

    def _compile(self, conn: socket.socket) -> dict[str, Any]:
        message, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, 2)
        try:
            request = marshal.loads(message)
            stdout_fd, stderr_fd = fds
            argv, cwd, env = request["argv"], request["cwd"], request["env"]
        except (ValueError, TypeError, EOFError, KeyError):
            return _plain(fds, "malformed request from the launcher")
        try:
            timeout = compile_timeout(env, float(request.get("timeout", DEFAULT_TIMEOUT)))
        except ValueError as e:
            return _plain(fds, str(e))
        backend = bool(request.get("thinlto"))  # a ThinLTO backend of a link: no portfolio, guarded only on request
        link = backend and bool(request.get("link"))  # a ThinLTO link whose backends run inside lld, in lanes
        language = driver_language(argv)
        served = self.deciding(language)
        if not served:  # every policy leaves this language to clang: the launcher compiles plainly
            self._remember_direct(request.get("direct"), ())
            return _plain(fds)
        try:
            below = None if backend else guard_below(env, DEFAULT_GUARD_BELOW)  # every served compile: see the bound
            build = [(s.problem.name, s.spec) for s in served]  # this compile's (problem, spec) pairs
            candidates = () if backend else self._candidates(language, build, env, request.get("portfolio"))
        except (ValueError, OptgymError) as e:
            return _plain(fds, str(e))
        if not candidates and request.get("portfolio"):  # sent for its target's portfolio, which does not take it
            self._remember_direct(request.get("direct"), ())
            return _plain(fds)
        flags: tuple[str, ...] = ()
        if candidates and not candidates[0].clashes_with(argv):  # the portfolio's first way is this compile
            flags, served = candidates[0].flags, self._policies_of(candidates[0], build, language)
            if len(candidates) == 1 and not served and below is None and env.get("OPTGYM_GUARD") != "1":
                self._remember_direct(request.get("direct"), flags)
        # clang's diagnostics wait in a file until the compile is judged: those of a compile that falls back
        # are not the build's (the plain compile prints its own), so a fallback is one warning line
        diagnostics = tempfile.TemporaryFile()  # noqa: SIM115 - closed below
        colour = ["-fcolor-diagnostics"] if os.isatty(stderr_fd) else []  # the build's terminal, not the file's
        # a policy reading the callee's linkage, in a compile of one source: the pass plugin names the module's
        # surviving functions from inside this compile; without the plugin the front end runs apart, once, and
        # this compile reads its bitcode
        reads_linkage = not backend and any(s.linkage_reader for s in served)
        readable = reads_linkage and unsplittable(argv[1:]) is None
        plugin = surviving_plugin(self.toolchain) if readable else None
        split = readable and plugin is None
        # clang names the callees it refuses on stderr (filtered from the build's diagnostics), unless the build
        # asks for missed-optimization remarks of its own: the policy then reads every callee as staying
        refusals = readable and not any(arg.startswith("-Rpass-missed") for arg in argv)
        work = private_tempdir("optgym-linkage-") if readable else None
        args = from_bitcode_args(argv[1:], bitcode_in(work), output_path(argv[1:], cwd)) if split and work else argv[1:]
        compile_env = env
        if plugin is not None and work is not None:
            args = [*args, *plugin_flags(plugin)]
            compile_env = {**env, SURVIVING_OUT: surviving_in(work)}
        lanes, library = 1, None
        if link:  # its backends side by side, each lld thread on its own lane's channels; BACKEND_FLAGS go to lld
            lanes = min(link_jobs(args), MAX_LANES)  # the link's own --thinlto-jobs / -flto-jobs, else every core
            library = lanes_library(argv[0]) if lanes > 1 else None
            lanes = lanes if library else 1  # without the library, one at a time on one set of channels
            args = [*without_link_jobs(args), f"-Wl,--thinlto-jobs={lanes}", *for_linker(BACKEND_FLAGS)]
        command = [argv[0], *colour, *args, NO_CRASH_FILES, *flags, *(REFUSAL_FLAGS if refusals else ())]
        if link and (linker := link_linker(args, argv[0])):  # lld dies with the driver, which dies with us
            command.append(f"--ld-path={linker_dying_with_driver(linker, cache_root() / 'linkers')}")
        to_clang = for_linker if link else list  # a link hands each -mllvm option to lld
        compile_ = InteractiveCompile(
            lambda *bases: [*command, *to_clang(problem_flags([s.problem for s in served], bases))],
            channels=len(served),
            timeout=timeout,
            stdout=stdout_fd,
            stderr=diagnostics.fileno(),
            cwd=cwd,
            env=compile_env,
            sessions=link,
            lanes=lanes,
            lane_library=library,
        )
        # clang's own compile among the candidates is the guard already
        guarded = not any(c.is_clang for c in candidates) and (env.get("OPTGYM_GUARD") == "1" or below is not None)
        guard = Guard(argv, cwd, env, below) if guarded else None
        if guard is not None and flags:  # pass options depart from clang's compile before any decision does
            guard.start()
        running = _Running(compile_)
        started = time.time()
        try:
            threading.Thread(target=self._watch, args=(conn, running), daemon=True).start()
            linkage = None
            if reads_linkage:
                coloured = [argv[0], *colour, *argv[1:]]  # the front end writes the build's diagnostics
                linkage = self._linkage(coloured, cwd, env, timeout, running, diagnostics, work, refusals, split)
                if running.gone:
                    return {"fallback": True, "warning": "the launcher went away"}
                if linkage is None:  # the front end failed on the source: clang's own compile says why, once
                    return {"fallback": True}
                running.compile = compile_
            reply = self._drive(compile_, language, guard, served, linkage)
            if link:  # how many of its backends' sessions were served
                reply["sessions"], reply["lanes"] = compile_.sessions, compile_.lanes_used
                if reply.get("returncode") and env.get("OPTGYM_STRICT") != "1":  # ours or the build's: clang's says
                    diagnostics.seek(0)
                    why = first_error(diagnostics.read().decode(errors="replace"))
                    reply = {"fallback": True, "link_failed": True, "warning": f"the served link failed ({why})"}
            if not reply.get("fallback"):
                _copy(diagnostics, stderr_fd, without_refusals if refusals else None)
            elif "-c" in argv:  # stopped before it finished: clang's half-written object goes too
                remove_partial_output(output_path(argv[1:], cwd), started)
            elif link:  # and lld's half-written program
                remove_partial_link(link_output(argv[1:], cwd), started)
            if guard is not None and not reply.get("fallback"):
                reply |= guard.finish(reply["returncode"], timeout)
            if len(candidates) > 1 and not reply.get("fallback") and reply["returncode"] == 0:
                reply |= self._other_candidates(argv, cwd, env, language, build, candidates, timeout, running)
            return reply
        except Exception as e:  # a policy bug must never break the build: the launcher reruns plainly
            return {"fallback": True, "warning": f"policy {self.policy_spec} failed: {type(e).__name__}: {e}"}
        finally:
            compile_.close()
            diagnostics.close()
            if guard is not None:
                guard.close()
            if work is not None:
                work.cleanup()
            os.close(stdout_fd)
            os.close(stderr_fd)

    def _remember_direct(self, where: Any, flags: tuple[str, ...]) -> None:
        """Tell later launchers that the C compile of ``where`` (the launcher's plans file and key) is clang's own
        with ``flags``, so they run it themselves (:mod:`optgym_cc.direct`): no channel, no guard, no other
        candidate. Once per key and server."""
        if not (isinstance(where, tuple) and len(where) == 2 and isinstance(where[1], tuple)):
            return
        with self.lock:  # held while the file is rewritten: two threads' plans both reach it
            if where not in self.remembered:
                self.remembered.add(where)
                direct.remember(str(where[0]), where[1], tuple(flags))

    def _candidates(
        self, language: str, build: Sequence[tuple[str, str]], env: dict[str, str], target: str | None = None
    ) -> tuple[Candidate, ...]:
        """The portfolio's candidates for this compile: none unless it is of the portfolio's language and its
        deciding policies are the portfolio's own (a build that chose other policies gets what it chose). The
        portfolio is ``target``'s file (the launcher's, for a target that ships one), else the build's or the
        shipped one."""
        count = candidate_count(env)
        if count == 0:
            return ()
        path = target or env.get("OPTGYM_PORTFOLIO") or str(PRETRAINED_PORTFOLIO)
        try:  # the file as it is now: a portfolio edited while the server idles is read again
            st = os.stat(path)
            version = (path, st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            version = (path, 0, 0, 0)  # load_portfolio says why
        portfolio = self.portfolios.get(version)
        if portfolio is None:
            try:
                portfolio = self.portfolios[version] = load_portfolio(path)
            except PortfolioError as e:  # read again by the next compile: the build may mend it
                raise OptgymError(f"{e} (OPTGYM_CANDIDATES=0 compiles without a portfolio)") from e
        if family(language) != portfolio.family or not portfolio.applies_to(build):
            return ()
        return portfolio.first(portfolio.default_count if count is None else count)

    def _other_candidates(
        self,
        argv: Sequence[str],
        cwd: str,
        env: dict[str, str],
        language: str,
        build: Sequence[tuple[str, str]],
        candidates: Sequence[Candidate],
        timeout: float,
        running: _Running,
    ) -> dict[str, Any]:
        """Compile the object each other way of ``candidates`` (the first is the build's own compile, done),
        each into a hidden sibling that replaces the object when strictly smaller; what was kept, for the reply.
        A candidate that fails or clashes with the build's flags is passed over: the build's object stands."""
        output = output_path(argv[1:], cwd)
        if (why := unguardable(argv[1:])) is not None:
            return {"candidate": candidates[0].name, "candidate_detail": why}
        kept, passed_over = candidates[0].name, []
        remove_orphans(*os.path.split(output))  # once per object, not per candidate: it scans the directory
        for candidate in candidates[1:]:
            if running.gone:
                break
            if candidate.clashes_with(argv):
                passed_over.append(candidate.name)
                continue
            try:
                other = sibling(output)
            except OSError as e:
                return {"candidate": kept, "candidate_detail": f"no temporary file beside the output: {e}"}
            try:
                args = [argv[0], *reference_args(argv[1:], other), *candidate.flags]
                compiled = self._compile_candidate(candidate, build, args, cwd, env, language, timeout, running)
                if compiled and not running.gone:
                    mine, theirs = keep_smaller(output, other)
                    kept = candidate.name if theirs < mine else kept
                else:
                    passed_over.append(candidate.name)
            except Exception:  # a candidate's failure, a policy bug too, never costs the build its object
                passed_over.append(candidate.name)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(other)
        return {"candidate": kept} | ({"candidates_passed_over": passed_over} if passed_over else {})

    def _compile_candidate(
        self,
        candidate: Candidate,
        build: Sequence[tuple[str, str]],
        args: list[str],
        cwd: str,
        env: dict[str, str],
        language: str,
        timeout: float,
        running: _Running,
    ) -> bool:
        """One candidate's compile (``args``: the build's command writing the sibling, the candidate's flags),
        its decisions answered by the build's policies ``build`` with the candidate's in their place; whether
        it succeeded. Its output goes nowhere."""
        args = [*args, NO_CRASH_FILES]
        served = self._policies_of(candidate, build, language)
        if not served:  # clang's own compile, with the candidate's flags
            proc = running.compile = spawn(args, stderr=subprocess.DEVNULL, cwd=cwd, env=env)
            try:
                return wait_exit(proc, timeout) == 0
            finally:
                kill_group(proc)
        compile_ = running.compile = InteractiveCompile(
            lambda *bases: [*args, *problem_flags([s.problem for s in served], bases)],
            channels=len(served),
            timeout=timeout,
            stderr=subprocess.DEVNULL,
            cwd=cwd,
            env=env,
        )
        try:
            reply = self._drive(compile_, language, None, served)
        finally:
            compile_.close()
        return not reply.get("fallback") and reply["returncode"] == 0

    def _policies_of(self, candidate: Candidate, build: Sequence[tuple[str, str]], language: str) -> list[Served]:
        """The policies deciding ``candidate``'s compile of ``language`` in a build whose policies are ``build``:
        the build's, each replaced by the candidate's for the same problem, none for clang's own decisions."""
        served = [self._candidate_policy(problem, spec) for problem, spec in candidate.channel_policies(build)]
        return [s for s in served if decides(s.policy, language)]

    def _candidate_policy(self, problem: str, spec: str) -> Served:
        """A candidate's policy for ``problem``: the server's own when it serves that spec, else loaded once."""
        for served in self.served:
            if (served.problem.name, served.spec) == (problem, spec):
                return served
        loaded = self.candidate_policies.get((problem, spec))
        if loaded is None:  # two compiles may both load it: the first one kept serves both from then on
            loaded = self.candidate_policies.setdefault((problem, spec), _load(problem, spec))
        return loaded

    def _view(self, served: Served, header: Header) -> tuple[FeatureView, str | None]:
        """The feature view and fit verdict for ``header``: every compile sends the same header (the
        decoder hands back the same object), so both are made once, not per compile."""
        cached = served.view
        if cached is None or cached[0] is not header:
            view = served.problem.view(header)
            verdict = _fits(served.policy, header, self.toolchain.version)
            cached = served.view = (header, view, verdict)
        return cached[1], cached[2]

    def _drive(
        self,
        compile_: InteractiveCompile,
        language: str,
        guard: Guard | None = None,
        served: Sequence[Served] | None = None,
        linkage: CalleeLinkage | None = None,
    ) -> dict[str, Any]:
        """Answer every decision of ``compile_``, each with its channel's policy (channel ``i`` is
        ``served[i]``; default: every served problem); ``guard``'s reference compile starts at the first
        answer that is not clang's own (any answer to a problem whose stream carries none counts as one).
        ``linkage`` is the compile's callee linkage, for the policies that read it."""
        served = self.served if served is None else served
        warnings: list[str] = []
        if compile_.start() is not None:
            # The loop runs once per decision, between two of clang's feature computations: each channel's
            # decider is made once per session (a compile has one; a link one per backend), when its first
            # decision comes, and decides everything after.
            channels = len(served) * compile_.lanes  # lane after lane, each with every served problem's channel
            deciders: list[Decider | None] = [None] * channels
            sessions = [0] * channels
            next_observation, answer = compile_.next_observation, compile_.answer
            try:
                while (obs := next_observation()) is not None:
                    channel = compile_.channel
                    decider = deciders[channel]
                    if decider is None or sessions[channel] != compile_.session:
                        sessions[channel] = compile_.session
                        decider = deciders[channel] = self._decider(
                            served[channel % len(served)], compile_, language, warnings, linkage
                        )
                    action = decider.decide(obs)
                    answer(decider.advice(obs, action))
                    if guard is not None and action != decider.heuristic:
                        guard.start()
                        guard = None  # started once: the rest of the loop checks nothing more
            except InvalidAction as why:  # never sent: clang would crash on it (a masked eviction index is a SIGSEGV)
                compile_.close()
                return {"fallback": True, "warning": f"the policy gave an answer clang cannot take ({why})"}
        outcome = compile_.finish()
        if outcome.status in FALLBACK_STATUSES:
            return {"fallback": True, "warning": f"served compile ended with {outcome.status}: {outcome.detail}"}
        reply: dict[str, Any] = {"returncode": outcome.returncode, "decisions": outcome.decisions}
        if warnings:
            reply["warning"] = "; ".join(warnings)
        return reply

    def _decider(
        self,
        served: Served,
        compile_: InteractiveCompile,
        language: str,
        warnings: list[str],
        linkage: CalleeLinkage | None = None,
    ) -> Decider:
        """The decider of ``served``'s channel, made at its first decision of a compile. A policy that does not
        fit this compiler answers nothing: clang's own answer goes instead (a decider without a policy), or —
        for a problem whose stream carries none — the compile falls back to a plain one."""
        header = compile_.header
        assert header is not None
        view, warning = self._view(served, header)
        if warning is not None:
            if not served.problem.heuristic_in_stream:
                raise OptgymError(f"{served.problem.name}: {warning}, and the compiler sends no answer of its own")
            warnings.append(f"{warning}; this compile used clang's own {served.problem.name} heuristic")
            return Decider(served.problem, view, None, language)
        reads = served.linkage_reader
        return Decider(
            served.problem, view, served.policy, language, memo=served.memo, linkage=linkage if reads else None
        )

    def _linkage(
        self,
        argv: Sequence[str],
        cwd: str,
        env: dict[str, str],
        timeout: float,
        running: _Running,
        diagnostics: IO[bytes],
        work: tempfile.TemporaryDirectory | None,
        refusals: bool,
        split: bool,
    ) -> CalleeLinkage | None:
        """The callee linkage of this compile, for the served policy that reads it (:mod:`optgym.rollout.linkage`).
        clang names the callees it refuses in ``diagnostics`` (with ``refusals``), and which functions stay comes
        from the pass plugin, which writes them into ``work`` from inside the compile
        (:mod:`optgym.toolchain.pass_plugin`). With ``split`` (no plugin here) the front end runs once into
        ``work`` instead (:mod:`optgym.serve.front_end`): that run writes the build's diagnostics and dependency
        file, and its bitcode says which functions stay. ``None`` when that front end fails: the source has an
        error, which clang's own compile reports. A command with more than one source, or none (``work`` is
        ``None``), reads every callee as staying: the policy adds no inline it adds for callees that go."""
        if work is None:
            return CalleeLinkage(None, None, why=unsplittable(argv[1:]) or "not split")
        written = 0  # where the compile's own stderr starts in ``diagnostics``
        if split:
            bitcode = bitcode_in(work)
            front = running.compile = spawn([argv[0], *front_end_args(argv[1:], bitcode)],
                                            stderr=diagnostics.fileno(), cwd=cwd, env=env)  # fmt: skip
            status = wait_exit(front, timeout)
            if status is None:  # the build hears of it: one warning line, then clang's own compile
                kill_group(front)
                raise TimeoutError(f"the front end ran past {timeout:.0f} s")
            if status != 0:
                return None
            written = os.fstat(diagnostics.fileno()).st_size  # the front end's diagnostics: the compile's follow
        if not refusals:
            return CalleeLinkage(None, None, why="the build asks for missed-optimization remarks itself")
        if split:
            return CalleeLinkage(surviving_functions(Path(bitcode_in(work)), self.toolchain), diagnostics.fileno(),
                                 offset=written)  # fmt: skip
        return CalleeLinkage(lambda: read_surviving(Path(surviving_in(work))), diagnostics.fileno())

    @staticmethod
    def _watch(conn: socket.socket, running: _Running) -> None:
        """Kill the running compile if its launcher goes away (the launcher sends nothing more until then), and
        start no other candidate. A candidate that starts in the instant between the two runs to its end, and
        its object is not kept."""
        with contextlib.suppress(OSError):
            conn.recv(1)
        running.gone = True
        running.kill()


def serve(
    socket_path: str,
    policy_spec: str,
    idle: float,
    problem: str,
    companions: Sequence[tuple[str, str]] = (),
) -> None:
    """Listen on ``socket_path`` until ``idle`` seconds pass with no compile running."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = os.path.join(os.path.dirname(socket_path), f".{os.getpid()}.tmp")  # shorter than the name: AF_UNIX's 108
    listener.bind(tmp)
    inode = os.stat(tmp).st_ino
    listener.listen(64)
    try:
        server = Server(policy_spec, problem, companions)  # load the policies before the socket becomes visible
        os.replace(tmp, socket_path)  # atomically: a launcher never connects to a half-started server
    except BaseException:
        listener.close()
        os.unlink(tmp)  # a policy that fails to load leaves no socket file behind
        raise
    listener.settimeout(1.0)
    try:
        while True:
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                with server.lock:
                    if server.active == 0 and time.monotonic() - server.last_activity > idle:
                        break
                continue
            server.accepted(conn)
        # Leaving: first the name goes (new launchers start a new server, which waits for our lock),
        # then every launcher that connected before that is still served — closing the listener
        # with connections in its backlog would fail their compiles.
        with contextlib.suppress(FileNotFoundError):
            if os.stat(socket_path).st_ino == inode:  # still ours, not a newer server's
                os.unlink(socket_path)
        listener.setblocking(False)
        workers = []
        while True:
            try:
                conn, _ = listener.accept()
            except BlockingIOError:
                break
            conn.setblocking(True)
            workers.append(server.accepted(conn))
        for worker in workers:
            worker.join()
    finally:
        with contextlib.suppress(FileNotFoundError):
            if os.stat(socket_path).st_ino == inode:
                os.unlink(socket_path)
        listener.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True)
    parser.add_argument("--policy", required=True)
    parser.add_argument("--problem", required=True, help="the problem --policy decides")
    parser.add_argument("--with", dest="companions", action="append", default=[], metavar="PROBLEM=POLICY",
                        help="another problem of the same compiles and the policy that decides it")  # fmt: skip
    parser.add_argument("--idle", type=float, default=60.0, help="exit after this many idle seconds")
    parser.add_argument("--lock-fd", type=int, help="the launcher's start lock, held until this server exits")
    args = parser.parse_args(argv)
    if args.lock_fd is not None:  # kept open (not inherited by compiles): released when this process ends
        os.set_inheritable(args.lock_fd, False)
    try:
        companions = [tuple(item.split("=", 1)) for item in args.companions]
        if any(len(c) != 2 for c in companions):
            raise OptgymError(f"--with takes PROBLEM=POLICY, got {args.companions}")
        serve(args.socket, args.policy, args.idle, args.problem, companions)
    except OptgymError as e:
        print(f"optgym policy server: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
