#!/usr/bin/env python3
"""How much time does optgym's host add to a compile? Four ways of compiling each module, side by side.

(a) plain      the module's plain compile, no channel (``Module.argv`` + ``process.run``, as
               ``plain_compile`` does). Also timed as "plain exact": the same ``spawn`` and argv, but
               the exit is seen through a pidfd at once — ``process.run`` waits with
               ``Popen.wait(timeout=…)``, which polls with sleeps growing to 50 ms and rounds a
               compile's time *up*, so only the exact figure is a fair denominator.
(b) C host     clang with the channel flags, answered by a minimal C program (bench/minimal_host.c, built with
               ``gcc -O2`` at startup) that replays ``inlining_default``: the floor for any host.
(c) rollout    ``optgym.rollout.rollout(problem, module, toolchain, simple.heuristic)``.
(d) env        one full gymnasium episode of ``optgym.make("inline-size", …)`` answering
               ``info["heuristic_action"]`` (reset through the last step; the env's baseline cache is
               warmed first so its plain compile is not counted).

Every round runs every variant on every module, the variants in an order rotated each time, so a
noisy moment of the machine hits all of them alike; round 0 is an unmeasured warm-up that also
checks that the heuristic replay is byte-identical to the plain compile. Per module the median of
the measured rounds is taken, then summed over modules. Checks per module and round: (b), (c) and
(d) make the same number of decisions, and (c)'s object has (a)'s size.

    .venv/bin/python bench/host_overhead.py                       # the demo programs
    .venv/bin/python bench/host_overhead.py --corpus DIR --modules 'lib/*' --repeat 7 --json out.json
    .venv/bin/python bench/host_overhead.py --profile             # + phase timings and cProfile

Exit status 0 unless a compile failed or a check did not hold (1). Missing a ratio target is reported,
not an error.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import fnmatch
import io
import json
import os
import pstats
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path

from rich.console import Console
from rich.table import Table

import optgym
from optgym.corpus import Corpus, Module
from optgym.corpus.embedded import corpus_from_sources
from optgym.errors import OptgymError
from optgym.problems import Problem, get_problem
from optgym.rollout import rollout
from optgym.rollout.simple import heuristic
from optgym.toolchain import interactive
from optgym.toolchain.llvm import Toolchain, find_toolchain
from optgym.toolchain.process import kill_group, private_dir, read_tail, run, spawn, wait_exit
from optgym.toolchain.sizes import object_sizes

TIMEOUT = 300.0
ROLLOUT_TARGET = 1.10
ENV_TARGET = 1.25
VARIANTS = ("plain", "plain_exact", "c_host", "rollout", "env")
LABELS = {
    "plain": "(a) plain run()",
    "plain_exact": "(a') plain exact",
    "c_host": "(b) C host",
    "rollout": "(c) rollout",
    "env": "(d) env",
}

#: The floor for any host (shared with bench/build.py): opens .in for writing first, then .out; replays the
#: last feature, ``inlining_default``.
C_HOST_SOURCE = Path(__file__).resolve().with_name("minimal_host.c")


class BenchFailure(Exception):
    """A compile failed or a check did not hold; the module is dropped from the figures."""


@dataclass
class Sample:
    seconds: float
    decisions: int | None = None
    text_bytes: int | None = None
    phases: dict[str, float] = field(default_factory=dict)  # seconds from the start, (b) and profiled (c)
    host_cpu: float | None = None  # CPU seconds of the host itself ((b): the C program's own rusage)


@dataclass
class ModuleStats:
    module: Module
    samples: dict[str, list[Sample]] = field(default_factory=lambda: {v: [] for v in VARIANTS})
    decisions: int | None = None
    failure: str | None = None
    no_decisions: bool = False  # the env cannot start an episode on such a module: (d) is skipped

    def median(self, variant: str) -> float | None:
        values = [s.seconds for s in self.samples[variant]]
        return statistics.median(values) if values else None

    def minimum(self, variant: str) -> float | None:
        values = [s.seconds for s in self.samples[variant]]
        return min(values) if values else None


def mono() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)  # the C host's clock too


# -- the variants -------------------------------------------------------------------------------


class Bench:
    def __init__(self, corpus: Corpus, modules: list[Module], toolchain: Toolchain, workdir: Path) -> None:
        self.corpus, self.modules, self.toolchain, self.workdir = corpus, modules, toolchain, workdir
        self.problem: Problem = get_problem("inline-size")
        self.host = build_c_host(workdir)
        self.scratch = private_dir()  # objects of (a) and (b); FIFOs next to them, as optgym's own
        self.env = optgym.make(
            "inline-size", corpus=corpus, modules=[m.name for m in modules], toolchain=toolchain, timeout=TIMEOUT
        )
        self.plain_objects: dict[str, bytes] = {}

    def close(self) -> None:
        self.env.close()
        shutil.rmtree(self.scratch, ignore_errors=True)

    def _argv(self, module: Module, out: Path, channel: str | None = None) -> list[str]:
        extra = list(self.problem.compile_flags())
        if channel is not None:  # the same order as Episode: problem flags, then the channel's
            extra = [*extra, *self.problem.channel_flags(channel)]
        return module.argv(self.toolchain.clang, extra, out)

    def plain(self, module: Module, warmup: bool) -> Sample:
        out = self.scratch / "plain.o"
        argv = self._argv(module, out)
        t0 = time.perf_counter()
        res = run(argv, timeout=TIMEOUT)
        seconds = time.perf_counter() - t0
        if res.status != "ok":
            raise BenchFailure(f"plain compile: {res.status}: {res.detail}\n{res.stderr_tail}")
        if warmup:
            self.plain_objects[module.name] = out.read_bytes()
        return Sample(seconds, text_bytes=text_bytes(out))

    def plain_exact(self, module: Module, warmup: bool) -> Sample:
        out = self.scratch / "plain_exact.o"
        argv = self._argv(module, out)
        with tempfile.TemporaryFile() as err:
            t0 = time.perf_counter()
            proc = spawn(argv, stderr=err)
            try:
                returncode = wait_exit(proc, TIMEOUT)
                seconds = time.perf_counter() - t0
            finally:
                kill_group(proc)
            if returncode != 0:
                raise BenchFailure(f"plain compile (exact): exit {returncode}\n{read_tail(err)}")
        return Sample(seconds, text_bytes=text_bytes(out))

    def c_host(self, module: Module, warmup: bool) -> Sample:
        out = self.scratch / "c_host.o"
        seconds, start, fields = c_host_compile(self.host, lambda base: self._argv(module, out, base), self.scratch)
        decisions = int(fields[0])
        t_open, t_header, t_last, t_eof, exited = (float(x) - start for x in [*fields[1:5], fields[-1]])
        host_cpu = float(fields[5])
        phases = {"connect": t_open, "header": t_header, "last_decision": t_last, "eof": t_eof, "exit": exited}
        if warmup and out.read_bytes() != self.plain_objects.get(module.name):
            raise BenchFailure("C host: the heuristic replay's object differs from the plain compile's")
        return Sample(seconds, decisions=decisions, text_bytes=text_bytes(out), phases=phases, host_cpu=host_cpu)

    def rollout(self, module: Module, warmup: bool) -> Sample:
        keep = self.scratch / "rollout.o" if warmup else None  # the copy is made only in the warm-up
        t0 = time.perf_counter()
        result = rollout(self.problem, module, self.toolchain, heuristic, timeout=TIMEOUT, keep_object=keep).result
        seconds = time.perf_counter() - t0
        if not result.ok:
            raise BenchFailure(f"rollout: {result.status}: {result.detail}\n{result.stderr_tail}")
        if keep is not None and keep.read_bytes() != self.plain_objects.get(module.name):
            raise BenchFailure("rollout: the heuristic replay's object differs from the plain compile's")
        return Sample(seconds, decisions=result.decisions, text_bytes=int(result.metrics["text_bytes"]))

    def env_episode(self, module: Module, warmup: bool) -> Sample:
        env = self.env
        t0 = time.perf_counter()
        _obs, info = env.reset(options={"module": module.name})
        steps = 0
        while True:
            _obs, _reward, terminated, truncated, info = env.step(info["heuristic_action"])
            steps += 1
            if terminated or truncated:
                break
        seconds = time.perf_counter() - t0
        if truncated or info.get("status") != "ok":
            raise BenchFailure(f"env: {info.get('status')}: {info.get('detail', '')}\n{info.get('stderr_tail', '')}")
        if info["policy_text_bytes"] != info["heuristic_text_bytes"]:
            raise BenchFailure(
                f"env: heuristic replay has {info['policy_text_bytes']} text bytes, "
                f"the env's baseline {info['heuristic_text_bytes']}"
            )
        return Sample(seconds, decisions=steps, text_bytes=int(info["policy_text_bytes"]))

    def variant(self, name: str) -> Callable[[Module, bool], Sample]:
        return {
            "plain": self.plain,
            "plain_exact": self.plain_exact,
            "c_host": self.c_host,
            "rollout": self.rollout,
            "env": self.env_episode,
        }[name]


def text_bytes(obj: Path) -> int:
    """The figure inline-size measures (Berkeley text), read from an object file."""
    return object_sizes(obj).text_bytes


def build_c_host(workdir: Path) -> Path:
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise SystemExit("error: gcc (or cc) is needed to build the minimal C host")
    binary = workdir / "c_host"
    proc = subprocess.run([gcc, "-O2", "-o", str(binary), str(C_HOST_SOURCE), "-lm"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"error: building the C host failed:\n{proc.stderr}")
    return binary


def c_host_compile(
    host: Path, argv: Callable[[str], list[str]], scratch: Path, *host_args: str
) -> tuple[float, float, list[str]]:
    """One compile answered by the C host: the FIFOs made in a fresh directory under ``scratch``, the host
    started (with ``host_args``: ``priority`` answers allocation priorities), clang run with ``argv(base)``.
    Returns the wall seconds, the monotonic start, and the host's printed fields with the exit time appended
    (``0`` decisions and NaN times if clang never opened the channel); raises :class:`BenchFailure` if either
    fails. Nothing is left running or on disk."""
    channel = Path(tempfile.mkdtemp(dir=scratch))
    base = str(channel / "channel")
    os.mkfifo(base + ".in", 0o600)
    os.mkfifo(base + ".out", 0o600)
    proc = clang = None
    try:
        with tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as host_err:
            start, t0 = mono(), time.perf_counter()
            proc = subprocess.Popen(
                [str(host), base, *host_args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=host_err
            )
            clang = spawn(argv(base), stderr=err)
            clang_rc = wait_exit(clang, TIMEOUT)
            clang_seconds = time.perf_counter() - t0
            if clang_rc != 0:
                proc.kill()
            host_rc = wait_exit(proc, 10.0)
            seconds = time.perf_counter() - t0
            exited = mono()
            if clang_rc != 0:
                raise BenchFailure(f"C-host compile: clang exit {clang_rc}\n{read_tail(err)}")
            if host_rc is None:  # a clang that connected has closed the FIFOs: the host would have seen the end
                # so clang never opened the channel (an allocator's, in a module without a function): nothing
                # was decided, and the compile's own time is the figure
                return clang_seconds, start, ["0", *["nan"] * 5, repr(exited)]
            if host_rc != 0:
                raise BenchFailure(f"C host: exit {host_rc}: {read_tail(host_err)}")
        assert proc.stdout is not None
        return seconds, start, [*proc.stdout.read().decode().split(), repr(exited)]
    finally:
        if clang is not None:
            kill_group(clang)
        if proc is not None:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            if proc.stdout is not None:
                proc.stdout.close()
        shutil.rmtree(channel, ignore_errors=True)


def demo_corpus(toolchain: Toolchain, root: Path) -> Corpus:
    sources = {
        Path(str(p)).stem: Path(str(p))
        for p in files("optgym.data.demo").iterdir()
        if Path(str(p)).suffix in (".c", ".cpp")
    }
    return corpus_from_sources(toolchain, dict(sorted(sources.items())), root)


# -- the measurement ----------------------------------------------------------------------------


def check(stats: ModuleStats, samples: dict[str, Sample]) -> None:
    """Same decisions for (b), (c), (d) — and from round to round; (c)'s object size is (a)'s."""
    counts = {v: samples[v].decisions for v in ("c_host", "rollout", "env") if v in samples}
    if len(set(counts.values())) != 1:
        raise BenchFailure(f"decision counts differ: {counts}")
    count = next(iter(counts.values()))
    if stats.decisions is not None and count != stats.decisions:
        raise BenchFailure(f"{count} decisions this round, {stats.decisions} before")
    stats.decisions = count
    plain, replay = samples["plain"].text_bytes, samples["rollout"].text_bytes
    if plain != replay:
        raise BenchFailure(f"rollout object has {replay} text bytes, the plain compile {plain}")


def measure(bench: Bench, stats: list[ModuleStats], repeat: int, console: Console) -> None:
    rounds = repeat + 1
    for r in range(rounds):
        warmup = r == 0
        t_round = time.perf_counter()
        for i, st in enumerate(stats):
            if st.failure:
                continue
            shift = (r + i) % len(VARIANTS)
            order = VARIANTS[shift:] + VARIANTS[:shift]
            if warmup:  # byte-identity checks need the plain object first; the env skip needs the rollout
                order = ("plain", *(v for v in VARIANTS if v != "plain"))
            samples: dict[str, Sample] = {}
            try:
                for v in order:
                    if v == "env" and st.no_decisions:
                        continue
                    samples[v] = bench.variant(v)(st.module, warmup)
                    if warmup and v == "rollout" and samples[v].decisions == 0:
                        st.no_decisions = True
                check(st, samples)
            except (BenchFailure, OptgymError) as e:
                st.failure = f"{v if len(samples) < len(order) else 'check'}: {e}"
                console.print(f"[bold red]FAILED[/] {st.module.name}: {st.failure}", highlight=False)
                continue
            if not warmup:
                for v, s in samples.items():
                    st.samples[v].append(s)
        label = "warm-up" if warmup else f"round {r}/{repeat}"
        console.print(f"[dim]{label}: {time.perf_counter() - t_round:.2f} s[/]")


def fmt(x: float | None, digits: int = 4) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def report(stats: list[ModuleStats], console: Console, title: str) -> dict:
    ok = [s for s in stats if not s.failure]
    table = Table(title=title)
    table.add_column("module")
    table.add_column("decisions", justify="right")
    for v in VARIANTS:
        table.add_column(LABELS[v] + " s", justify="right")
    table.add_column("c/b", justify="right")
    table.add_column("d/b", justify="right")
    rows = []
    for st in stats:
        med = {v: st.median(v) for v in VARIANTS}
        b = med["c_host"]
        table.add_row(
            st.module.name + (" [red](failed)[/]" if st.failure else ""),
            "—" if st.decisions is None else str(st.decisions),
            *(fmt(med[v]) for v in VARIANTS),
            fmt(med["rollout"] / b, 3) if b and med["rollout"] else "—",
            fmt(med["env"] / b, 3) if b and med["env"] else "—",
        )
        rows.append(
            {
                "module": st.module.name,
                "decisions": st.decisions,
                "failure": st.failure,
                "median_seconds": med,
                "samples_seconds": {v: [s.seconds for s in st.samples[v]] for v in VARIANTS},
                "c_host_phases_median": {
                    k: statistics.median(s.phases[k] for s in st.samples["c_host"])
                    for k in (st.samples["c_host"][0].phases if st.samples["c_host"] else {})
                },
            }
        )
    totals = {v: sum(st.median(v) or 0.0 for st in ok) for v in VARIANTS}
    decisions = sum(st.decisions or 0 for st in ok)
    # (d) runs only on modules with a decision: its ratio compares it with (b) on those.
    with_env = [st for st in ok if st.median("env") is not None]
    b_env = sum(st.median("c_host") or 0.0 for st in with_env)
    decisions_env = sum(st.decisions or 0 for st in with_env)
    table.add_section()
    b = totals["c_host"]
    table.add_row(
        f"total ({len(ok)} modules)",
        str(decisions),
        *(fmt(totals[v]) for v in VARIANTS),
        fmt(totals["rollout"] / b, 3) if b else "—",
        fmt(totals["env"] / b_env, 3) if b_env else "—",
    )
    console.print(table)

    ratios: dict[str, float | None] = {}
    if ok and b:
        ratios = {
            "floor_b_over_a_exact": b / totals["plain_exact"],
            "floor_b_over_a_run": b / totals["plain"],
            "run_over_exact": totals["plain"] / totals["plain_exact"],
            "rollout_c_over_b": totals["rollout"] / b,
            "env_d_over_b": totals["env"] / b_env if b_env else None,
            "rollout_host_us_per_decision": (totals["rollout"] - b) / decisions * 1e6 if decisions else None,
            "env_host_us_per_decision": (totals["env"] - b_env) / decisions_env * 1e6 if decisions_env else None,
        }

        def verdict(value: float, target: float) -> str:
            return "[green]ok[/]" if value <= target else "[bold red]above target[/]"

        console.print(
            f"interactive floor (b)/(a')  {ratios['floor_b_over_a_exact']:.3f}   "
            f"[dim](against (a) via process.run: {ratios['floor_b_over_a_run']:.3f}; "
            f"run()'s polled wait reports {ratios['run_over_exact']:.3f}× the exact plain time)[/]"
        )
        c_over_b, d_over_b = ratios["rollout_c_over_b"], ratios["env_d_over_b"]
        rollout_verdict = verdict(c_over_b, ROLLOUT_TARGET)
        console.print(f"rollout (c)/(b)             {c_over_b:.3f}   target ≤ {ROLLOUT_TARGET:.2f}  {rollout_verdict}")
        if d_over_b is not None:
            env_verdict = verdict(d_over_b, ENV_TARGET)
            console.print(f"env     (d)/(b)             {d_over_b:.3f}   target ≤ {ENV_TARGET:.2f}  {env_verdict}")
        if decisions:
            env_us = ratios["env_host_us_per_decision"]
            console.print(
                f"host µs per decision        rollout ((c)-(b))/n = {ratios['rollout_host_us_per_decision']:.1f}   "
                f"env ((d)-(b))/n = {fmt(env_us, 1)}   (n = {decisions})"
            )
        # The same ratios from each module's fastest round: noise only ever adds time, so on a busy
        # machine these say more about the host's own cost than the medians do.
        mins = {v: sum(st.minimum(v) or 0.0 for st in ok) for v in VARIANTS}
        b_env_min = sum(st.minimum("c_host") or 0.0 for st in with_env)
        ratios |= {
            "min_floor_b_over_a_exact": mins["c_host"] / mins["plain_exact"],
            "min_rollout_c_over_b": mins["rollout"] / mins["c_host"],
            "min_env_d_over_b": mins["env"] / b_env_min if b_env_min else None,
        }
        console.print(
            f"[dim]from per-module minima instead of medians: floor {ratios['min_floor_b_over_a_exact']:.3f}, "
            f"rollout {ratios['min_rollout_c_over_b']:.3f}, env {fmt(ratios['min_env_d_over_b'], 3)}[/]"
        )
    return {
        "modules": rows,
        "totals_seconds": totals,
        "decisions": decisions,
        "ratios": ratios,
    }


# -- profiling the rollout ------------------------------------------------------------------------


@contextlib.contextmanager
def rollout_marks(marks: dict[str, float]):
    """Time-stamp the phases of InteractiveCompile (in this process only; nothing is edited)."""
    cls = interactive.InteractiveCompile
    saved = {name: getattr(cls, name) for name in ("_open_inbound", "start", "answer", "_eof")}

    def open_inbound(self, path):
        result = saved["_open_inbound"](self, path)
        marks["connect"] = mono()
        return result

    def start(self):
        result = saved["start"](self)
        marks["header"] = mono()
        return result

    def answer(self, advice):
        saved["answer"](self, advice)
        marks["last_decision"] = mono()

    def eof(self):
        marks["eof"] = mono()
        saved["_eof"](self)
        marks["exit"] = mono()

    cls._open_inbound, cls.start, cls.answer, cls._eof = open_inbound, start, answer, eof  # type: ignore[method-assign]
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(cls, name, fn)


PHASES = ("connect", "header", "last_decision", "eof", "exit", "end")
STAGES = (  # (label, from phase, to phase): durations between the time stamps
    ("to connect", None, "connect"),
    ("to header", "connect", "header"),
    ("decisions", "header", "last_decision"),
    ("to EOF", "last_decision", "eof"),
    ("EOF→exit seen", "eof", "exit"),
    ("teardown", "exit", "end"),
    ("total", None, "end"),
)


def self_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def print_cprofile(profiler: cProfile.Profile, what: str, console: Console, lines: int = 22) -> str:
    buf = io.StringIO()
    pstats.Stats(profiler, stream=buf).sort_stats("tottime").print_stats(lines)
    text = buf.getvalue()
    console.print(f"[bold]cProfile of {what}, by tottime[/]")
    console.print(text[text.find("   ncalls") :].rstrip(), highlight=False, markup=False)
    return text


def profile(bench: Bench, stats: list[ModuleStats], repeat: int, console: Console) -> dict:
    """Where the rollout's extra time goes: phases of (b) and (c) side by side, host CPU, cProfile."""
    ok = [s for s in stats if not s.failure]
    result: dict = {"stages_ms": {}, "host_cpu_us_per_decision": {}}
    table = Table(title=f"phases of one compile, ms (median of {repeat}): C host (b) vs rollout (c)")
    table.add_column("module")
    for label, _, _ in STAGES:
        table.add_column(label, justify="right")
    cpu = {"b": 0.0, "c": 0.0, "d": 0.0}
    decisions = 0
    for st in ok:
        b_runs, c_runs = [], []
        for _ in range(repeat):
            sample = bench.c_host(st.module, False)
            cpu["b"] += sample.host_cpu or 0.0
            b_runs.append(sample.phases | {"end": sample.phases["exit"]})
            marks: dict[str, float] = {}
            with rollout_marks(marks):
                cpu0, start = self_cpu(), mono()
                bench.rollout(st.module, False)
                end, cpu1 = mono(), self_cpu()
            cpu["c"] += cpu1 - cpu0
            c_runs.append({k: marks[k] - start for k in PHASES if k in marks} | {"end": end - start})
            cpu0 = self_cpu()
            bench.env_episode(st.module, False)
            cpu["d"] += self_cpu() - cpu0
            decisions += st.decisions or 0
        for label, runs in (("b", b_runs), ("c", c_runs)):
            row = {}
            for name, a, z in STAGES:
                try:
                    row[name] = statistics.median((r[z] - (r[a] if a else 0.0)) * 1e3 for r in runs)
                except KeyError:  # a module without decisions has no last_decision mark
                    row[name] = None
            result["stages_ms"].setdefault(st.module.name, {})[label] = row
            table.add_row(f"{st.module.name} ({label})", *(fmt(v, 2) for v in row.values()))
    console.print(table)
    console.print(
        "[dim]to connect: spawn until the host has .in open; to header: until it has read the header; "
        "decisions: header until the last answer is written; to EOF: until the compiler closes .out; "
        "EOF→exit seen: until the host knows the compiler exited; teardown: until rollout() returns[/]"
    )
    if decisions:
        result["host_cpu_us_per_decision"] = {k: v / decisions * 1e6 for k, v in cpu.items()}
        console.print(
            "host CPU (user+sys) per decision, whole compile included: "
            + "   ".join(f"({k}) {v / decisions * 1e6:.1f} µs" for k, v in cpu.items())
            + f"   [dim](n = {decisions}; (b) from the C host's own rusage, (c)/(d) this process's)[/]"
        )

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(repeat):
        for st in ok:
            bench.rollout(st.module, False)
    profiler.disable()
    result["cprofile_rollout"] = print_cprofile(profiler, f"{repeat}× every rollout (c)", console)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(repeat):
        for st in ok:
            if not st.no_decisions:
                bench.env_episode(st.module, False)
    profiler.disable()
    result["cprofile_env"] = print_cprofile(profiler, f"{repeat}× every env episode (d)", console, 16)
    return result


# -- main -----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--corpus", type=Path, help="corpus directory (default: the demo programs, built in a temp dir)"
    )
    parser.add_argument("--repeat", type=int, default=5, help="measured rounds (median per module; default 5)")
    parser.add_argument("--modules", help="only modules whose name matches this glob")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write the figures here")
    parser.add_argument("--profile", action="store_true", help="also time the phases and cProfile the rollout")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be ≥ 1")
    console = Console()
    if not console.is_terminal:  # a pipe or a log: do not squeeze the table into 80 columns
        console = Console(width=150)
    toolchain = find_toolchain((get_problem("inline-size").hook,))
    with tempfile.TemporaryDirectory(prefix="optgym-bench-") as tmp:
        workdir = Path(tmp)
        t0 = time.perf_counter()
        corpus = Corpus(args.corpus) if args.corpus else demo_corpus(toolchain, workdir / "corpus")
        modules = [m for m in corpus if args.modules is None or fnmatch.fnmatchcase(m.name, args.modules)]
        if not modules:
            console.print(f"[bold red]error:[/] no module of {corpus.root} matches {args.modules!r}")
            return 1
        console.print(
            f"[bold]compiler[/] {toolchain.banner}; [bold]corpus[/] {corpus.root} "
            f"({len(modules)} modules{'' if args.corpus else ', built in ' + f'{time.perf_counter() - t0:.1f} s'}); "
            f"{args.repeat} measured rounds + 1 warm-up; load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs",
            highlight=False,
        )
        bench = Bench(corpus, modules, toolchain, workdir)
        try:
            stats = [ModuleStats(m) for m in modules]
            measure(bench, stats, args.repeat, console)
            figures = report(stats, console, f"host overhead, median of {args.repeat} (seconds)")
            if args.profile:
                figures["profile"] = profile(bench, stats, args.repeat, console)
        finally:
            bench.close()
    load = os.getloadavg()[0]
    if load > (os.cpu_count() or 1) / 2:
        console.print(f"[yellow]load average {load:.2f} at the end: other work shared the machine; expect noise[/]")
    failures = {s.module.name: s.failure for s in stats if s.failure}
    if args.json:
        figures.update(
            compiler=toolchain.banner,
            corpus=str(args.corpus or "demo"),
            repeat=args.repeat,
            variants=LABELS,
            targets={"rollout_c_over_b": ROLLOUT_TARGET, "env_d_over_b": ENV_TARGET},
            failures=failures,
            load_average_end=load,
        )
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    if failures:
        console.print(f"[bold red]{len(failures)} module(s) failed:[/] {', '.join(failures)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
