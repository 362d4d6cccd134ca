"""One compile whose decisions are made by this host, over LLVM's interactive FIFO channel.

The compiler writes features to ``<base>.out`` and reads each answer from ``<base>.in``
(``InteractiveModelRunner``). clang opens ``.in`` for reading first and blocks until a writer exists,
then ``.out`` for writing, blocking until a reader exists; a host that opens them the other way
round deadlocks. This host opens both ends *before* spawning the compiler — ``.in`` read-write
(Linux lets a FIFO be opened O_RDWR without a peer, so it is a writer at once) and ``.out``
read-only non-blocking — so neither of clang's opens ever waits and no open needs polling. A
compile that fails before the decision pass runs never opens the FIFOs: the compiler's ``pidfd``
wakes the host the moment it exits.

Once the compiler has written its header both FIFOs are open on both sides, so their names are
unlinked and the private directory removed at once: for the rest of the compile nothing exists on
disk that could be left behind. Every wait is bounded by ``timeout``, which counts only the time
spent waiting for the *compiler* (a host that thinks for a minute between two decisions — a
learner updating its network — does not time the compile out).

A link may carry several *sessions* on one channel (``sessions=True``): lld's in-process ThinLTO backends, run one
at a time, each open the channel anew, send a header and decide, then close it. Between two sessions the host
swaps in a fresh reader of ``.out`` (opened before the old one closes, so clang never finds the FIFO without a
reader), keeps the names until the link exits, and reads each new header as the start of the next session.

A link may also run its backends side by side in *lanes* (``lanes=N``, with the library of
:mod:`optgym.toolchain.lanes` preloaded into lld): every thread of lld opens its own copy of the channels, and the
host serves each lane's channels as it serves any other. Channel ``lane * channels + i`` is problem ``i`` of lane
``lane``, and only lane 0's names go on the command line.

Several decision problems can share one compile (``channels=N``: the inliner's decisions during
optimization, then register allocation's during code generation), each over its own FIFO pair. clang
answers one of them at a time, so the host polls every stream and hands back events in the order they
come, each tagged with its :attr:`InteractiveCompile.channel`. A channel whose writer closes is done;
the compile is done when every channel that opened has closed, or when the compiler exits.

Hot path, per decision: one ``poll`` (a persistent poll object over the streams and the pidfd), one
``read``, one ``write``; clang's own feature computation dominates.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import subprocess
import tempfile
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from optgym.protocol import Context, Header, Observation, Outcome, ProtocolError, StreamDecoder
from optgym.protocol.transcript import TranscriptWriter
from optgym.toolchain.lanes import lane_base, lane_environment
from optgym.toolchain.process import (
    describe_exit,
    install_sigterm_handler,
    kill_group,
    private_dir,
    read_tail,
    spawn,
    wait_exit,
)

READ_CHUNK = 1 << 16


@dataclass
class CompileOutcome:
    """How an interactive compile ended."""

    status: str  # "ok" | "compile_error" | "crash" | "timeout" | "protocol_error" | "aborted"
    detail: str = ""
    returncode: int | None = None
    stderr_tail: str = ""
    seconds: float = 0.0  # wall time from spawn to exit
    compiler_seconds: float = 0.0  # time spent waiting on the compiler (excludes host think time)
    decisions: int = 0

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass
class _Resources:
    """What must be released on every exit path; shared with the GC finalizer."""

    proc: subprocess.Popen | None = None
    fds: list[int] = field(default_factory=list)
    directory: Path | None = None
    stderr: object | None = None
    transcript: TranscriptWriter | None = None

    def release(self) -> None:
        if self.proc is not None:
            kill_group(self.proc)
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
        if self.stderr is not None:
            self.stderr.close()  # type: ignore[attr-defined]
            self.stderr = None
        if self.transcript is not None:
            self.transcript.close()
            self.transcript = None


@dataclass
class _Channel:
    """One FIFO pair of a compile and what its stream has said so far."""

    in_fd: int
    out_fd: int
    decoder: StreamDecoder = field(default_factory=StreamDecoder)
    header: Header | None = None
    context: str | None = None
    closed: bool = False  # the compiler closed its end after the header: nothing more will come
    base: str = ""  # the FIFO pair's path without its suffix, to reopen ``.out`` between sessions
    session: int = 0  # headers seen on this channel: its sessions so far


class InteractiveCompile:
    """Drive one compile decision by decision.

    ``argv(*bases)`` builds the command line given each channel's base path (one per channel). Use as
    a context manager::

        with InteractiveCompile(argv, timeout=60) as compile_:
            header = compile_.start()
            while (obs := compile_.next_observation()) is not None:
                compile_.answer(advice_bytes)  # for compile_.channel, whose header is compile_.header
            outcome = compile_.finish()
    """

    def __init__(
        self,
        argv: Callable[..., Sequence[str]],
        *,
        channels: int = 1,
        timeout: float = 120.0,
        transcript: Path | None = None,
        meta: dict | None = None,
        cwd: Path | str | None = None,
        stdout=subprocess.DEVNULL,
        stderr=None,
        env: dict[str, str] | None = None,
        sessions: bool = False,
        lanes: int = 1,
        lane_library: str | None = None,
    ) -> None:
        """``stdout``/``stderr``: where the compiler's go (``stderr=None``: a temporary file whose tail
        ends up in ``outcome.stderr_tail``; a file descriptor passes it straight through, as a
        compile served for a build does). A transcript records one channel's exchange, so it needs
        ``channels=1``. ``lanes`` > 1 (a link with ``sessions``) needs ``lane_library``, preloaded into the
        compiler so that each of its threads opens its own lane's channels."""
        if channels < 0:
            raise ValueError(f"a compile has no negative count of channels, got {channels}")
        if lanes > 1 and (lane_library is None or not sessions):
            raise ValueError("lanes are a link's, with sessions and the lanes library")
        if transcript is not None and channels != 1:
            raise ValueError("a transcript records a single channel's exchange")
        self._argv, self.timeout, self._cwd, self._stdout = argv, timeout, cwd, stdout
        self._stderr, self._env = stderr, env
        self._sessions = sessions
        self._res = _Resources()
        self._finalizer = weakref.finalize(self, _Resources.release, self._res)
        self._channel_count = channels  # per lane
        self._lanes, self._lane_library = max(lanes, 1), lane_library
        self._channels: list[_Channel] = []
        self._by_fd: dict[int, int] = {}  # a stream's fd -> its channel
        self._fed: set[int] = set()  # channels whose decoder may hold a whole event: fed since it last ran dry
        self._start = 0.0
        self._budget = timeout
        self._pidfd: int | None = None
        self._poller: select.poll | None = None
        self.channel = 0  # the channel of the latest header or observation
        self.decisions = 0
        self.outcome: CompileOutcome | None = None
        if transcript is not None:
            self._res.transcript = TranscriptWriter(open(transcript, "wb"))  # noqa: SIM115 - closed by release()
            self._res.transcript.json("meta", dict(meta or {}))
        self._meta = meta or {}

    # -- lifecycle ------------------------------------------------------------------------------

    def __enter__(self) -> InteractiveCompile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Kill the compiler if it still runs and remove everything; safe to call twice."""
        if self.outcome is None and self._res.proc is not None:
            self._end(CompileOutcome("aborted", "closed by the host before the compile finished"))
        self._finalizer()

    @property
    def stderr_fd(self) -> int | None:
        """Where clang's stderr goes once started: its temporary file's descriptor, or the one given; ``None`` for
        anything else. A reader during the compile must ``pread``: the compiler shares the file's position."""
        if self._res.stderr is not None:
            return self._res.stderr.fileno()  # type: ignore[attr-defined]
        return self._stderr if isinstance(self._stderr, int) else None

    @property
    def pid(self) -> int | None:
        return self._res.proc.pid if self._res.proc else None

    @property
    def headers(self) -> list[Header | None]:
        """Each channel's header, ``None`` for a channel the compiler has not opened (yet)."""
        return [c.header for c in self._channels]

    @property
    def header(self) -> Header | None:
        """The header of :attr:`channel`, the channel of the pending decision."""
        return self._channels[self.channel].header if self._channels else None

    @property
    def session(self) -> int:
        """Which session of :attr:`channel` the pending decision belongs to (1 for the first): a new number is a
        new backend, whose decider starts afresh."""
        return self._channels[self.channel].session if self._channels else 0

    @property
    def lanes(self) -> int:
        """How many copies of the channels the compiler may open (one per lld thread; see the module doc)."""
        return self._lanes

    @property
    def lanes_used(self) -> int:
        """How many lanes opened a channel so far."""
        per_lane = self._channel_count
        lanes = (self._channels[lane * per_lane : (lane + 1) * per_lane] for lane in range(self._lanes))
        return sum(any(c.session for c in channels) for channels in lanes)

    @property
    def sessions(self) -> int:
        """Sessions opened so far, over every channel."""
        return sum(c.session for c in self._channels)

    @property
    def context(self) -> str | None:
        """The function (or module) :attr:`channel`'s compiler pass is working on."""
        return self._channels[self.channel].context if self._channels else None

    # -- protocol -------------------------------------------------------------------------------

    def start(self) -> Header | None:
        """Spawn the compiler and connect; the first header (of :attr:`channel`), or ``None`` if the
        compile ended first.

        A compile that fails before a decision pass runs (bad bitcode, bad flags) ends here with
        ``self.outcome`` set; so does one that needed no channel at all.
        """
        install_sigterm_handler()
        res = self._res
        res.directory = private_dir()
        bases = [str(res.directory / f"channel{i or ''}") for i in range(self._channel_count)]
        env = self._env
        if self._lanes > 1:
            assert self._lane_library is not None
            env = lane_environment(env, self._lane_library, res.directory, self._lanes)
            for lane in range(1, self._lanes):
                (res.directory / f"lane{lane}").mkdir()
        self._poller = select.poll()
        for base in (lane_base(b, lane) for lane in range(self._lanes) for b in bases):
            os.mkfifo(base + ".in", 0o600)
            os.mkfifo(base + ".out", 0o600)
            in_fd = os.open(base + ".in", os.O_RDWR)
            res.fds.append(in_fd)
            out_fd = os.open(base + ".out", os.O_RDONLY | os.O_NONBLOCK)
            res.fds.append(out_fd)
            self._by_fd[out_fd] = len(self._channels)
            self._channels.append(_Channel(in_fd, out_fd, StreamDecoder(self._sessions), base=base))
            self._poller.register(out_fd, select.POLLIN)
        if self._stderr is None:
            res.stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed by release()
        self._start = time.perf_counter()
        stderr = self._stderr if res.stderr is None else res.stderr
        res.proc = spawn(self._argv(*bases), stdout=self._stdout, stderr=stderr, cwd=self._cwd, env=env)
        try:
            self._pidfd = os.pidfd_open(res.proc.pid)
            res.fds.append(self._pidfd)
            self._poller.register(self._pidfd, select.POLLIN)
        except (AttributeError, OSError):  # no pidfd (kernel < 5.3): poll in slices instead
            self._pidfd = None
        event = self._next_event()
        if event is None:
            return None
        if not isinstance(event, Header):
            self._protocol_failure(ProtocolError("the compiler's stream did not start with a header"))
            return None
        return event

    def next_observation(self) -> Observation | None:
        """The next decision point (of :attr:`channel`), or ``None`` once the compile has ended (see
        ``outcome``)."""
        while self.outcome is None:
            event = self._next_event()
            if isinstance(event, Observation):
                return event
            if isinstance(event, Outcome):
                self._protocol_failure(ProtocolError("unexpected Outcome in an interactive stream"))
        return None

    def answer(self, advice: bytes) -> None:
        """Send the advice tensor's raw bytes for the current decision (of :attr:`channel`)."""
        if self.outcome is not None:
            raise RuntimeError("answer() after the compile ended")
        if self._res.transcript:
            self._res.transcript.record("in", advice)
        with contextlib.suppress(BrokenPipeError):  # the compiler is gone; the next read says how it ended
            os.write(self._channels[self.channel].in_fd, advice)
        self.decisions += 1

    def finish(self) -> CompileOutcome:
        """Drain to the end of the compile (answering nothing more) and wait for the compiler."""
        while self.outcome is None:
            if self.next_observation() is not None:
                self._protocol_failure(ProtocolError("finish() called with a decision still pending"))
        return self.outcome

    # -- internals ------------------------------------------------------------------------------

    def _wait(self) -> list[tuple[int, int]]:
        """Block until a stream has data or the compiler exits, at most the remaining budget."""
        assert self._poller is not None
        limit = self._budget if self._pidfd is not None else min(self._budget, 0.05)
        t0 = time.perf_counter()
        ready = self._poller.poll(max(0.0, limit) * 1000)
        self._budget -= time.perf_counter() - t0
        return ready

    def _pending(self):
        """The next event already decoded on some channel (the current one first, then by index), or ``None``.
        Only channels fed since their decoder last ran dry are looked at: a link with many lanes has many
        channels, and this runs at every decision. A header opens its channel; a context names what that
        channel's pass works on next."""
        fed = self._fed
        while fed:
            index = self.channel if self.channel in fed else min(fed)
            channel = self._channels[index]
            while (event := channel.decoder.next_event()) is not None:
                if isinstance(event, Context):
                    channel.context = event.name
                    continue
                if isinstance(event, Header):
                    if channel.header is not None and not self._sessions:
                        raise ProtocolError("a second header in one channel's stream")
                    channel.header = event
                    channel.session += 1
                    # later sessions open the names again: with sessions they stay until the end
                    if not self._sessions and self._res.directory is not None and all(c.header for c in self._channels):
                        # every channel is open on both sides: nothing needs the names any more
                        shutil.rmtree(self._res.directory, ignore_errors=True)
                        self._res.directory = None
                self.channel = index
                return event
            fed.discard(index)
        return None

    def _next_event(self):
        """The next protocol event on any channel, reading as needed; ``None`` (with ``outcome`` set)
        at the end: every channel closed, or the compiler exited and its streams are drained."""
        proc = self._res.proc
        assert proc is not None
        while True:
            try:
                event = self._pending()
            except ProtocolError as e:
                self._protocol_failure(e)
                return None
            if event is not None:
                return event
            ready = self._wait()
            if self._budget <= 0 and proc.poll() is None:  # out of time, whether or not data keeps coming
                opened = any(c.header is not None for c in self._channels)
                self._timed_out(
                    "the compiler never sent a header"
                    if self._channels and not opened
                    else "the compiler is still running"
                )
                return None
            try:
                if any([self._read(self._by_fd[fd], revents) for fd, revents in ready if fd in self._by_fd]):
                    continue
                exited = proc.poll() is not None
                if exited and self._drained():
                    continue
            except ProtocolError as e:  # a session cut short
                self._protocol_failure(e)
                return None
            if exited or all(c.closed for c in self._channels):
                self._eof()
                return None

    def _read(self, index: int, revents: int = 0) -> bool:
        """Read what channel ``index`` has; whether anything came. An empty read ends the channel once
        a writer has been there (a header or hang-up seen); before that it only means that no writer
        has connected yet."""
        channel = self._channels[index]
        if channel.closed:
            return False
        try:
            data = os.read(channel.out_fd, READ_CHUNK)
        except BlockingIOError:
            return False
        if data:
            if self._res.transcript:
                self._res.transcript.record("out", data)
            channel.decoder.feed(data)
            self._fed.add(index)
            return True
        if self._sessions:
            spoke = channel.decoder.header is not None or channel.decoder.buffered > 0
            if spoke or revents & select.POLLHUP:  # a session ended (or a writer left without a word): the next
                self._next_session(index, spoke)
            return False
        if channel.header is not None or channel.decoder.buffered or revents & select.POLLHUP:
            channel.closed = True
            assert self._poller is not None
            self._poller.unregister(channel.out_fd)  # a closed FIFO polls as ready forever
        return False

    def _next_session(self, index: int, spoke: bool = True) -> None:
        """Channel ``index``'s writer closed its session: read the next one through a fresh descriptor (a reader
        whose writer left polls as ready forever), opened before the old one closes, so the FIFO always has a
        reader and clang's next open never fails. What a session that ``spoke`` left unfinished is a protocol
        error."""
        channel = self._channels[index]
        if spoke:
            channel.decoder.close()
        fresh = os.open(channel.base + ".out", os.O_RDONLY | os.O_NONBLOCK)
        self._res.fds.append(fresh)
        assert self._poller is not None
        self._poller.unregister(channel.out_fd)
        del self._by_fd[channel.out_fd]
        self._res.fds.remove(channel.out_fd)
        os.close(channel.out_fd)
        channel.out_fd, channel.decoder = fresh, StreamDecoder(sessions=True)
        self._by_fd[fresh] = index
        self._poller.register(fresh, select.POLLIN)

    def _drained(self) -> bool:
        """Read every channel once more (the compiler has exited): whether any still had data, which
        must be decoded before the compile is judged."""
        return any([self._read(i) for i in range(len(self._channels))])

    def _eof(self) -> None:
        """The compiler closed its end: it is finishing (or crashed). Wait for it and judge."""
        proc = self._res.proc
        assert proc is not None
        t0 = time.perf_counter()
        returncode = wait_exit(proc, max(self._budget, 0))
        self._budget -= time.perf_counter() - t0
        if returncode is None:
            self._timed_out("the compiler did not exit after its last decision")
            return
        if proc.returncode == 0:
            try:
                for channel in self._channels:
                    if channel.decoder.header is not None or channel.decoder.buffered:
                        channel.decoder.close()
            except ProtocolError as e:
                self._protocol_failure(e)
                return
        self._exited()

    def _exited(self) -> None:
        proc = self._res.proc
        assert proc is not None
        returncode = proc.wait()
        if returncode == 0:
            self._end(CompileOutcome("ok", returncode=0))
        else:
            status, detail = describe_exit(returncode)
            self._end(CompileOutcome(status, detail, returncode=returncode))

    def _timed_out(self, why: str) -> None:
        self._end(CompileOutcome("timeout", f"{why}; killed after {self.timeout:g} s of compiler time"))

    def _protocol_failure(self, error: ProtocolError) -> None:
        self._end(CompileOutcome("protocol_error", str(error)))

    def _end(self, outcome: CompileOutcome) -> None:
        res = self._res
        if res.proc is not None:
            kill_group(res.proc)
            outcome.returncode = res.proc.returncode if outcome.returncode is None else outcome.returncode
        outcome.seconds = time.perf_counter() - self._start if self._start else 0.0
        outcome.compiler_seconds = self.timeout - self._budget
        outcome.decisions = self.decisions
        if res.stderr is not None:
            outcome.stderr_tail = read_tail(res.stderr)
        if res.transcript:
            res.transcript.record("stderr", outcome.stderr_tail.encode())
            res.transcript.json(
                "end",
                {
                    "status": outcome.status,
                    "detail": outcome.detail,
                    "returncode": outcome.returncode,
                    "decisions": outcome.decisions,
                },
            )
        self.outcome = outcome
        res.release()
