"""ThinLTO links through optgym-c++ on the real clang-22 and lld-22: the backends are served, the program runs,
a failure of the policy server mid-link costs nothing, and the links optgym cannot serve say why."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

import optgym_cc
from optgym.toolchain import object_sizes
from optgym.toolchain.lanes import lane_environment, lanes_library
from optgym.toolchain.llvm import for_linker
from optgym_cc import thinlto
from optgym_cc.thinlto import PLAN_FORMAT

BIN = Path(sys.executable).parent
CXX = str(BIN / "optgym-c++")
CLANGXX = "/usr/lib/llvm-22/bin/clang++"

#: Six translation units with the standard library's templates in each: one backend per unit, with imports.
UNIT = r"""
#include <map>
#include <string>
#include <vector>
#include <algorithm>
std::string unit{i}(const std::vector<int>& v) {{
  std::map<int, std::string> names;
  for (int x : v) names[x % 7] += std::to_string(x * {i});
  std::string out;
  for (auto& [k, s] : names) {{ std::string t = s; std::reverse(t.begin(), t.end()); out += t.substr(0, 3); }}
  return out;
}}
"""
MAIN = r"""
#include <iostream>
#include <string>
#include <vector>
{decls}
int main() {{
  std::vector<int> v;
  for (int i = 0; i < 40; ++i) v.push_back(i * i + 3);
  std::string all;
{calls}
  std::cout << all.size() << ' ' << all.substr(0, 24) << '\n';
  return 0;
}}
"""
UNITS = 6


@pytest.fixture(autouse=True)
def short_lived_servers(monkeypatch):
    monkeypatch.setenv("OPTGYM_SERVER_IDLE", "5")
    for name in ("OPTGYM_STRICT", "OPTGYM_VERBOSE", "OPTGYM_LTO_POLICY"):
        monkeypatch.delenv(name, raising=False)
    # the inliner's tests; the allocator's name their policies (and one its default)
    for name in ("OPTGYM_LTO_EVICT_POLICY", "OPTGYM_LTO_PRIORITY_POLICY"):
        monkeypatch.setenv(name, "heuristic")
    monkeypatch.setenv("OPTGYM_LTO_PLAN", "none")  # the policy's tests; the plan's set their own
    monkeypatch.setenv("OPTGYM_LTO_SERVE_FROM", "0")  # this program's link is small: served anyway, to be tested
    # backends each a clang of their own, side by side: the tests of lld's own (the default) say so
    monkeypatch.setenv("OPTGYM_LTO_BACKENDS", "distributed")
    yield
    for proc in _servers():
        proc.kill()


def _servers() -> list[psutil.Process]:
    root = str(Path(os.environ["XDG_RUNTIME_DIR"]) / "optgym")
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if "optgym.serve.server" in cmd and root in cmd:
            found.append(proc)
    return found


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> Path:
    """The program's ThinLTO bitcode objects (compiled by clang-22 itself: the link is what is tested) and
    its expected output."""
    root = tmp_path_factory.mktemp("thinlto")
    decls = "\n".join(f"std::string unit{i}(const std::vector<int>&);" for i in range(UNITS))
    calls = "\n".join(f"  all += unit{i}(v);" for i in range(UNITS))
    (root / "main.cpp").write_text(MAIN.format(decls=decls, calls=calls))
    for i in range(UNITS):
        (root / f"unit{i}.cpp").write_text(UNIT.format(i=i))
    sources = ["main.cpp", *(f"unit{i}.cpp" for i in range(UNITS))]
    subprocess.run([CLANGXX, "-Oz", "-flto=thin", "-c", *sources], cwd=root, check=True, timeout=300)
    plain = subprocess.run([CLANGXX, "-Oz", "-flto=thin", "-fuse-ld=lld", *_objects(), "-o", "plain"], cwd=root,
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert plain.returncode == 0, plain.stderr
    return root


def _objects() -> list[str]:
    return ["main.o", *(f"unit{i}.o" for i in range(UNITS))]


def _link(root: Path, output: str, *extra: str, **env: str) -> subprocess.CompletedProcess:
    command = [CXX, "-Oz", "-flto=thin", "-fuse-ld=lld", *extra, *_objects(), "-o", output]
    return subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=600, env={**os.environ, **env})


def _run(path: Path) -> str:
    return subprocess.run([path], capture_output=True, text=True, timeout=60, check=True).stdout


def test_every_backend_is_served_and_the_program_runs(program):
    linked = _link(program, "never", OPTGYM_LTO_POLICY="never", OPTGYM_VERBOSE="1", OPTGYM_STRICT="1")
    assert linked.returncode == 0, linked.stderr
    served = [line for line in linked.stderr.splitlines() if "ThinLTO:" in line]
    assert served and f"{UNITS + 1} of {UNITS + 1} backends served by never" in served[0], linked.stderr
    decisions = int(served[0].split(",")[1].split()[0])
    assert decisions > 0
    assert _run(program / "never") == _run(program / "plain")
    # the policy really decided: a program none of whose calls were inlined is larger than clang's ThinLTO link
    assert object_sizes(program / "never").text_bytes > object_sizes(program / "plain").text_bytes


def test_the_backends_run_side_by_side_up_to_the_links_jobs(program):
    """With --thinlto-jobs=2 two backends are served at once, each with its own clang and channel."""
    seen: set[int] = set()
    most = 0
    done = threading.Event()

    def watch() -> None:
        nonlocal most
        while not done.is_set():
            backends = [p for s in _servers() for p in _children(s) if "-fthinlto-index" in " ".join(_cmd(p))]
            seen.update(p.pid for p in backends)
            most = max(most, len(backends))
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        linked = _link(program, "two", "-Wl,--thinlto-jobs=2", OPTGYM_LTO_POLICY="random:3", OPTGYM_STRICT="1",
                       OPTGYM_VERBOSE="1")  # fmt: skip
    finally:
        done.set()
        watcher.join()
    assert linked.returncode == 0, linked.stderr
    # every backend served: the distributor's own count (polling every 5 ms can miss a short backend on a busy
    # machine), and each one the watcher did see was a clang of the server's
    assert f"{UNITS + 1} of {UNITS + 1} backends served" in linked.stderr, linked.stderr
    assert 1 <= len(seen) <= UNITS + 1
    assert most <= 2
    assert _run(program / "two") == _run(program / "plain")


def _kill_server_once(
    ready: Callable[[psutil.Process], bool], settle: Callable[[psutil.Process], None] | None = None
) -> tuple[threading.Thread, threading.Event]:
    """A started thread that SIGKILLs the first policy server for which ``ready`` holds (within 120 s), after
    ``settle`` on it if given, and the event it sets once it has."""
    killed = threading.Event()

    def watch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for server in _servers():
                if ready(server):
                    if settle is not None:
                        settle(server)
                    server.send_signal(signal.SIGKILL)
                    killed.set()
                    return
            time.sleep(0.002)

    thread = threading.Thread(target=watch)
    thread.start()
    return thread, killed


def _children(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _cmd(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def _scorers() -> dict[str, str]:
    """The allocator's ThinLTO policies shipped for x86-64, named by path (the fixture turns the defaults off)."""
    return {
        variable: str(Path(optgym_cc.PRETRAINED_DIR) / shipped) for _, variable, shipped, _ in thinlto.LTO_CHANNELS[1:]
    }


def test_the_allocators_policies_serve_every_backend_and_the_program_runs(program):
    """Eviction and priority scorers serve every backend (clang keeps its inlining: no inline channel), the
    program runs as clang's does, and it is not clang's program: the scorers decided."""
    linked = _link(program, "scored", OPTGYM_VERBOSE="1", OPTGYM_STRICT="1", **_scorers())
    assert linked.returncode == 0, linked.stderr
    served = [line for line in linked.stderr.splitlines() if "ThinLTO:" in line]
    assert served and f"{UNITS + 1} of {UNITS + 1} backends served by regalloc-evict=" in served[0], linked.stderr
    assert "regalloc-priority=" in served[0] and "inline-size" not in served[0]
    assert int(served[0].split(",")[-1].split()[0]) > 0
    assert _run(program / "scored") == _run(program / "plain")
    assert (program / "scored").read_bytes() != (program / "plain").read_bytes()


def test_the_shipped_eviction_scorer_serves_by_default_and_the_priority_scorer_is_asked_for(program, monkeypatch):
    """No OPTGYM_LTO_* set: the plan and the eviction scorer shipped for x86-64, served inside lld (inlining and
    priority stay clang's) for links from 256 KiB of inputs; a lighter one, like this program's, takes the plan
    alone. ``OPTGYM_LTO_EVICT_POLICY=heuristic`` is the plan alone, no server;
    ``OPTGYM_LTO_PRIORITY_POLICY=pretrained`` adds the priority scorer (it decides C links: this one is C++, so
    asking for it changes nothing here)."""
    for name in ("OPTGYM_LTO_EVICT_POLICY", "OPTGYM_LTO_PRIORITY_POLICY", "OPTGYM_LTO_PLAN", "OPTGYM_LTO_BACKENDS"):
        monkeypatch.delenv(name)
    weight = thinlto.input_bytes([str(program / o) for o in _objects()])
    assert weight < thinlto.DEFAULT_SERVE_FROM  # by default a link this light takes the plan alone: no server
    light = _link(program, "light", OPTGYM_VERBOSE="1", OPTGYM_STRICT="1", OPTGYM_LTO_SERVE_FROM="")
    assert light.returncode == 0, light.stderr
    assert "ThinLTO:" not in light.stderr and _servers() == []
    default = _link(program, "default", OPTGYM_VERBOSE="1", OPTGYM_STRICT="1")  # served from 0 bytes (fixture)
    assert default.returncode == 0, default.stderr
    served = next(line for line in default.stderr.splitlines() if "ThinLTO:" in line)
    evict, priority = _scorers().values()
    assert evict in served and priority not in served and "inline-size" not in served, served
    assert _sessions(default.stderr)[0] == UNITS + 1
    assert _run(program / "default") == _run(program / "plain")
    plan_alone = _link(program, "plan-alone", OPTGYM_VERBOSE="1", OPTGYM_STRICT="1",
                       OPTGYM_LTO_EVICT_POLICY="heuristic")  # fmt: skip
    assert plan_alone.returncode == 0, plan_alone.stderr
    assert "ThinLTO:" not in plan_alone.stderr
    assert (program / "plan-alone").read_bytes() != (program / "default").read_bytes()  # the scorer decided
    assert (program / "plan-alone").read_bytes() == (program / "light").read_bytes()
    asked = _link(program, "asked", OPTGYM_VERBOSE="1", OPTGYM_STRICT="1", OPTGYM_LTO_PRIORITY_POLICY="pretrained")
    assert asked.returncode == 0, asked.stderr
    assert priority in next(line for line in asked.stderr.splitlines() if "ThinLTO:" in line)
    assert (program / "asked").read_bytes() == (program / "default").read_bytes()


@pytest.mark.parametrize("served", ["inlining", "allocation"])
def test_a_server_killed_mid_link_costs_the_link_nothing(program, served):
    """SIGKILL to the policy server while a backend is being served: the link still succeeds (the backends that
    were not served run as clang's own), says so in one warning line, and the program runs."""
    killer, killed = _kill_server_once(lambda server: any("-fthinlto-index" in " ".join(_cmd(p))
                                                         for p in _children(server)))  # fmt: skip
    policies = {"OPTGYM_LTO_POLICY": "random:1"} if served == "inlining" else _scorers()
    linked = _link(program, "killed", "-Wl,--thinlto-jobs=1", **policies)
    killer.join()
    assert killed.is_set()
    assert linked.returncode == 0, linked.stderr
    warnings = [line for line in linked.stderr.splitlines() if line.startswith("optgym-cc:")]
    assert len(warnings) == 1 and "warning" in warnings[0] and "backends were not served" in warnings[0]
    assert _run(program / "killed") == _run(program / "plain")
    # the link's temporary files, lld's plan and what a backend killed mid-write left are gone
    leftovers = [p.name for p in program.iterdir() if "native" in p.name or p.name.endswith((".json", ".tmp"))]
    assert leftovers == []


def _sessions(stderr: str) -> tuple[int, int]:
    """The backend sessions and decisions a link inside lld said it served (``OPTGYM_VERBOSE=1``)."""
    line = next(line for line in stderr.splitlines() if "backend sessions in lld" in line)
    return int(line.split("ThinLTO:")[1].split()[0]), int(line.split(",")[-1].split()[0])


def test_inside_lld_every_backend_is_a_session_of_one_channel_and_the_program_runs(program, monkeypatch):
    """By default a served link runs inside lld, its backends one after another over one channel per decision:
    a session for each, every one served, and the decisions the same as when each backend is its own clang."""
    monkeypatch.delenv("OPTGYM_LTO_BACKENDS")
    linked = _link(program, "in-lld", OPTGYM_LTO_POLICY="never", OPTGYM_VERBOSE="1", OPTGYM_STRICT="1")
    assert linked.returncode == 0, linked.stderr
    sessions, decisions = _sessions(linked.stderr)
    assert sessions == UNITS + 1 and decisions > 0
    assert _run(program / "in-lld") == _run(program / "plain")
    assert object_sizes(program / "in-lld").text_bytes > object_sizes(program / "plain").text_bytes
    distributed = _link(program, "distributed", OPTGYM_LTO_POLICY="never", OPTGYM_LTO_BACKENDS="distributed",
                        OPTGYM_VERBOSE="1", OPTGYM_STRICT="1")  # fmt: skip
    served = next(line for line in distributed.stderr.splitlines() if "ThinLTO:" in line)
    assert int(served.split(",")[-1].split()[0]) == decisions  # the same decisions, asked the same way


def test_inside_lld_two_decisions_are_two_channels_each_with_a_session_per_backend(program, monkeypatch):
    """Inlining and eviction served together inside lld: each channel opens once per backend. (The priority
    scorer decides C links only: this program is C++.)"""
    monkeypatch.delenv("OPTGYM_LTO_BACKENDS")
    evict = _scorers()["OPTGYM_LTO_EVICT_POLICY"]
    linked = _link(program, "in-lld-two", OPTGYM_LTO_POLICY="never", OPTGYM_LTO_EVICT_POLICY=evict,
                   OPTGYM_VERBOSE="1", OPTGYM_STRICT="1")  # fmt: skip
    assert linked.returncode == 0, linked.stderr
    sessions, decisions = _sessions(linked.stderr)
    assert sessions == 2 * (UNITS + 1) and decisions > 0
    assert _run(program / "in-lld-two") == _run(program / "plain")
    assert object_sizes(program / "in-lld-two").text_bytes > object_sizes(program / "plain").text_bytes


def test_inside_lld_the_backends_run_side_by_side_each_lane_on_its_own_channels(program, monkeypatch):
    """With ``--thinlto-jobs=2`` lld runs its backends on two threads, each opening its own lane's channels: both
    lanes are served, every backend is a session, and the program is byte for byte the one-at-a-time link's (the
    decisions do not depend on the thread that asks them)."""
    monkeypatch.delenv("OPTGYM_LTO_BACKENDS")
    evict = _scorers()["OPTGYM_LTO_EVICT_POLICY"]
    linked = {}
    for jobs in (1, 2):
        output = f"lanes-{jobs}"
        run = _link(program, output, f"-Wl,--thinlto-jobs={jobs}", OPTGYM_LTO_POLICY="never",
                    OPTGYM_LTO_EVICT_POLICY=evict, OPTGYM_VERBOSE="1", OPTGYM_STRICT="1")  # fmt: skip
        assert run.returncode == 0, run.stderr
        line = next(line for line in run.stderr.splitlines() if "ThinLTO:" in line)
        linked[jobs] = (_sessions(run.stderr), int(line.split("(")[1].split()[0]), (program / output).read_bytes())
    (serial_sessions, serial_decisions), serial_lanes, serial_program = linked[1]
    (sessions, decisions), lanes, program_bytes = linked[2]
    assert serial_lanes == 1 and lanes == 2
    assert sessions == serial_sessions == 2 * (UNITS + 1) and decisions == serial_decisions > 0
    assert program_bytes == serial_program
    assert _run(program / "lanes-2") == _run(program / "plain")


def test_the_lanes_library_gives_each_thread_its_own_names_and_refuses_one_too_many(tmp_path):
    """Preloaded into a process (here a Python one; lld in a link), the library rewrites the paths opened under its
    directory: the first thread keeps them, the second gets ``lane1/``, a third of two lanes is refused (EBUSY);
    paths elsewhere are untouched."""
    library = lanes_library(CLANGXX)
    assert library is not None
    channels = tmp_path / "channels"
    (channels / "lane1").mkdir(parents=True)
    for name in ("c.out", "lane1/c.out"):
        (channels / name).write_text(name)
    (tmp_path / "elsewhere").write_text("elsewhere")
    script = (
        "import errno, os, sys, threading\n"
        "def read(path):\n"
        "    try:\n"
        "        fd = os.open(path, os.O_RDONLY)\n"
        "    except OSError as e:\n"
        "        return errno.errorcode[e.errno]\n"
        "    data = os.read(fd, 100).decode(); os.close(fd); return data\n"
        "seen = []\n"
        "for _ in range(3):\n"
        "    t = threading.Thread(target=lambda: seen.append(read(sys.argv[1]) + ' ' + read(sys.argv[2])))\n"
        "    t.start(); t.join()\n"
        "print('|'.join(seen))\n"
    )
    env = lane_environment(dict(os.environ), library, channels, 2)
    run = subprocess.run([sys.executable, "-c", script, str(channels / "c.out"), str(tmp_path / "elsewhere")],
                         capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().split("|") == ["c.out elsewhere", "lane1/c.out elsewhere", "EBUSY elsewhere"]


def test_a_server_killed_mid_link_inside_lld_costs_the_link_nothing_and_leaves_no_lld(program, monkeypatch):
    """SIGKILL to the policy server while lld runs the served backends: lld dies with it (it would busy-loop on
    its closed channel), the link runs again with clang's own backends and one warning line, the program runs,
    and nothing is left: no linker process, no half-written output."""
    monkeypatch.delenv("OPTGYM_LTO_BACKENDS")
    lld: list[psutil.Process] = []

    def until_lld_waits(server: psutil.Process) -> None:
        """Stop the server, so that lld soon waits for an answer, and wait for that."""
        server.suspend()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(_waits_on_a_pipe(p) for p in _linkers(server)):
            time.sleep(0.002)
        lld.extend(_linkers(server))

    killer, killed = _kill_server_once(lambda server: bool(_linkers(server)), until_lld_waits)
    linked = _link(program, "killed-in-lld", **_scorers())
    killer.join()
    assert killed.is_set() and lld
    assert linked.returncode == 0, linked.stderr
    warnings = [line for line in linked.stderr.splitlines() if line.startswith("optgym-cc:")]
    assert len(warnings) == 1 and "warning" in warnings[0] and "not served" in warnings[0], linked.stderr
    assert _run(program / "killed-in-lld") == _run(program / "plain")
    psutil.wait_procs(lld, timeout=10)
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in lld)
    assert [p.name for p in program.iterdir() if ".tmp" in p.name] == []


def _linkers(server: psutil.Process) -> list[psutil.Process]:
    """The lld processes a server's link runs (through the driver, and the wrapper that execs lld)."""
    return [p for p in _children(server) if os.path.basename((_cmd(p) or [""])[0]) == "ld.lld"]


def _waits_on_a_pipe(proc: psutil.Process) -> bool:
    """Whether a thread of ``proc`` is blocked reading a pipe (lld's backend thread, on its channel's FIFO)."""
    try:
        tasks = list(Path(f"/proc/{proc.pid}/task").iterdir())
        return any((task / "wchan").read_text().strip().endswith("pipe_read") for task in tasks)  # anon_pipe_read: 6.x
    except OSError:
        return False


def test_a_served_link_that_fails_inside_lld_is_clangs_own_link(program, monkeypatch):
    """A link that fails inside lld for a reason of optgym's (here lld's wrapper cannot be run) is clang's own link,
    with one warning line, and the program runs; one that fails for the build's own reason (an undefined symbol)
    fails as clang's does, its error said once."""
    monkeypatch.delenv("OPTGYM_LTO_BACKENDS")
    first = _link(program, "wrapped", OPTGYM_LTO_POLICY="never", OPTGYM_STRICT="1")
    assert first.returncode == 0, first.stderr
    wrappers = [path for path in (Path(os.environ["OPTGYM_CACHE_DIR"]) / "linkers").rglob("ld.lld")]
    assert wrappers
    try:
        for wrapper in wrappers:
            wrapper.chmod(0o644)
        linked = _link(program, "unwrapped", OPTGYM_LTO_POLICY="never")
    finally:
        for wrapper in wrappers:
            wrapper.chmod(0o755)
    assert linked.returncode == 0, linked.stderr
    warnings = [line for line in linked.stderr.splitlines() if line.startswith("optgym-cc:")]
    assert len(warnings) == 1 and "served link failed" in warnings[0] and "as clang does" in warnings[0], warnings
    assert (program / "unwrapped").read_bytes() == (program / "plain").read_bytes()
    broken = _link(program, "broken-link", "-lno_such_library_anywhere", OPTGYM_LTO_POLICY="never")
    assert broken.returncode != 0
    lines = broken.stderr.splitlines()
    assert len([line for line in lines if line.startswith("ld.lld: error:")]) == 1, lines  # clang's own link's
    assert len([line for line in lines if line.startswith("optgym-cc:")]) == 1, lines
    assert not (program / "broken-link").exists()


def test_links_under_the_serve_bound_are_not_served(program, monkeypatch):
    """``OPTGYM_LTO_SERVE_FROM``: a link whose object and archive inputs weigh less is lld's own, no server started;
    one that weighs that much is served. A bound that is not a number is one note and clang's own link."""
    monkeypatch.delenv("OPTGYM_LTO_BACKENDS")
    weight = sum((program / name).stat().st_size for name in _objects())
    under = _link(program, "under", OPTGYM_LTO_POLICY="never", OPTGYM_LTO_SERVE_FROM=str(weight + 1),
                  OPTGYM_VERBOSE="1", OPTGYM_STRICT="1")  # fmt: skip
    assert under.returncode == 0, under.stderr
    assert "ThinLTO:" not in under.stderr and _servers() == []
    assert (program / "under").read_bytes() == (program / "plain").read_bytes()  # no plan in these tests
    at = _link(program, "at", OPTGYM_LTO_POLICY="never", OPTGYM_LTO_SERVE_FROM=str(weight), OPTGYM_VERBOSE="1",
               OPTGYM_STRICT="1")  # fmt: skip
    assert at.returncode == 0, at.stderr
    assert _sessions(at.stderr)[0] == UNITS + 1
    bad = _link(program, "bad-bound", OPTGYM_LTO_POLICY="never", OPTGYM_LTO_SERVE_FROM="lots")
    notes = [line for line in bad.stderr.splitlines() if line.startswith("optgym-cc:")]
    assert bad.returncode == 0 and len(notes) == 1 and "OPTGYM_LTO_SERVE_FROM" in notes[0], notes
    assert (program / "bad-bound").read_bytes() == (program / "plain").read_bytes()


@pytest.mark.parametrize("setting", ["side-by-side", ""])
def test_the_backends_setting_is_checked(program, setting):
    """``OPTGYM_LTO_BACKENDS`` takes ``lld`` or ``distributed``: anything else is one note and clang's own link, or
    with ``OPTGYM_STRICT=1`` an error."""
    linked = _link(program, "setting", OPTGYM_LTO_POLICY="never", OPTGYM_LTO_BACKENDS=setting)
    assert linked.returncode == 0, linked.stderr
    notes = [line for line in linked.stderr.splitlines() if line.startswith("optgym-cc:")]
    if not setting:  # unset: the default, lld's own backends, served
        assert notes == [] and (program / "setting").read_bytes() != (program / "plain").read_bytes()
        return
    assert len(notes) == 1 and "OPTGYM_LTO_BACKENDS" in notes[0] and "note" in notes[0], notes
    assert (program / "setting").read_bytes() == (program / "plain").read_bytes()
    strict = _link(program, "setting-strict", OPTGYM_LTO_POLICY="never", OPTGYM_LTO_BACKENDS=setting,
                   OPTGYM_STRICT="1")  # fmt: skip
    assert strict.returncode == 1 and "optgym-cc: error: OPTGYM_LTO_BACKENDS" in strict.stderr


def test_a_links_own_backend_parallelism_is_taken_out_for_the_server_to_set():
    """The server sets a served link's ``--thinlto-jobs`` to its lanes: the build's own settings are taken out."""
    args = ["-flto=thin", "-flto-jobs=4", "-Wl,--thinlto-jobs=3,--gc-sections", "-Wl,--thinlto-jobs=2", "a.o"]
    assert thinlto.without_link_jobs(args) == ["-flto=thin", "-Wl,--gc-sections", "a.o"]


def test_a_links_channel_options_go_to_lld():
    """A compile's ``-mllvm`` options reach a link's in-process backends only through ``-Wl``, which splits at
    commas: anything else is refused, not passed on half."""
    assert for_linker(["-mllvm", "-enable-ml-inliner=release", "-mllvm", "-x=/tmp/c"]) == [
        "-Wl,-mllvm,-enable-ml-inliner=release",
        "-Wl,-mllvm,-x=/tmp/c",
    ]
    for flags in (["-O2"], ["-mllvm"], ["-mllvm", "-a=1,2"]):
        with pytest.raises(ValueError):
            for_linker(flags)


@pytest.mark.parametrize("backends", thinlto.BACKENDS_MODES)
def test_strict_refuses_a_link_whose_backends_cannot_be_served(program, tmp_path, monkeypatch, backends):
    """A policy that cannot load: one warning line and clang's own backends, or with OPTGYM_STRICT=1 an error;
    the same wherever the backends would have run."""
    monkeypatch.setenv("OPTGYM_LTO_BACKENDS", backends)
    broken = tmp_path / "policy"
    broken.mkdir()
    (broken / "policy.json").write_text("{ not json")
    linked = _link(program, "broken", OPTGYM_LTO_POLICY=str(broken))
    assert linked.returncode == 0, linked.stderr
    assert [line for line in linked.stderr.splitlines() if line.startswith("optgym-cc:")] == [
        next(line for line in linked.stderr.splitlines() if "warning" in line)
    ]
    assert (program / "broken").read_bytes() == (program / "plain").read_bytes()  # clang's own backends
    strict = _link(program, "strict", OPTGYM_LTO_POLICY=str(broken), OPTGYM_STRICT="1")
    assert strict.returncode != 0 and "optgym-cc: error:" in strict.stderr


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        (("-flto=full", "-fuse-ld=lld"), "full LTO"),
        (("-fuse-ld=bfd",), "only lld"),
        (("-fuse-ld=lld", "-r"), "relocatable"),
    ],
)
def test_links_optgym_cannot_serve_pass_through_with_one_note(program, flags, why):
    command = [CXX, "-Oz", "-flto=thin", *flags, *_objects(), "-o", "x"]
    linked = subprocess.run(command, cwd=program, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "OPTGYM_LTO_POLICY": "never"})  # fmt: skip
    notes = [line for line in linked.stderr.splitlines() if line.startswith("optgym-cc:")]
    assert len(notes) == 1 and "note" in notes[0] and why in notes[0], linked.stderr
    assert linked.returncode == 0 or why == "only lld", linked.stderr  # bfd cannot read LLVM 22 bitcode


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is installed by `make setup`")
def test_a_cmake_ipo_build_with_a_static_library_links_through_optgym(tmp_path, program):
    """CMAKE_INTERPROCEDURAL_OPTIMIZATION with a static library: CMake archives bitcode with LLVM 22's llvm-ar
    found beside optgym-c++, and the link's backends are served."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ["main.cpp", *(f"unit{i}.cpp" for i in range(UNITS))]:
        shutil.copy(program / name, src / name)
    units = " ".join(f"unit{i}.cpp" for i in range(UNITS))
    (src / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.16)\nproject(t CXX)\n"
        f"add_library(units STATIC {units})\nadd_executable(app main.cpp)\ntarget_link_libraries(app units)\n"
    )
    env = {**os.environ, "CXX": CXX, "OPTGYM_LTO_POLICY": "never", "OPTGYM_VERBOSE": "1", "OPTGYM_STRICT": "1"}
    configure = subprocess.run(
        ["cmake", "-S", src, "-B", tmp_path / "b", "-DCMAKE_BUILD_TYPE=MinSizeRel",
         "-DCMAKE_INTERPROCEDURAL_OPTIMIZATION=ON", "-DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert configure.returncode == 0, configure.stdout + configure.stderr
    cache = (tmp_path / "b" / "CMakeCache.txt").read_text()
    archiver = next(line.split("=", 1)[1] for line in cache.splitlines() if line.startswith("CMAKE_CXX_COMPILER_AR:"))
    assert Path(archiver).resolve() == (BIN / "optgym-llvm-ar").resolve()  # CMake may name the venv by its real path
    build = subprocess.run(["cmake", "--build", tmp_path / "b", "-j", "2"], capture_output=True, text=True, env=env,
                           timeout=600)  # fmt: skip
    assert build.returncode == 0, build.stdout + build.stderr
    assert "backends served by never" in build.stdout + build.stderr
    assert _run(tmp_path / "b" / "app") == _run(program / "plain")


def _plan(tmp_path: Path, **fields) -> str:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"format": PLAN_FORMAT, **fields}))
    return str(path)


def _functions(path: Path, name_part: str) -> dict[str, int]:
    """The addresses of the program's functions whose names contain ``name_part``."""
    listing = subprocess.run(["/usr/lib/llvm-22/bin/llvm-readelf", "-s", "-W", path], capture_output=True, text=True,
                             check=True).stdout  # fmt: skip
    rows = [line.split() for line in listing.splitlines()]
    return {row[7]: int(row[1], 16) for row in rows if len(row) >= 8 and row[3] == "FUNC" and name_part in row[7]}


def _build_id(path: Path) -> str:
    notes = subprocess.run(["/usr/lib/llvm-22/bin/llvm-readelf", "-n", path], capture_output=True, text=True,
                           check=True).stdout  # fmt: skip
    return next(line.split(":", 1)[1].strip() for line in notes.splitlines() if "Build ID" in line)


@pytest.mark.parametrize("policy", ["heuristic", "never"])
def test_a_plans_options_reach_the_link_and_every_backend(program, tmp_path, policy):
    """A plan's lld options reach the link, and its LLVM options every backend: in lld's own backends (clang's
    inlining) and in the distributed ones a policy serves, to which lld would not pass them."""
    plan = _plan(tmp_path, link_flags=["--build-id=0x5eed5eed5eed5eed"], llvm_options=["-align-all-functions=6"])
    linked = _link(program, f"plan-{policy}", OPTGYM_LTO_PLAN=plan, OPTGYM_LTO_POLICY=policy, OPTGYM_STRICT="1")
    assert linked.returncode == 0, linked.stderr
    output = program / f"plan-{policy}"
    assert _run(output) == _run(program / "plain")
    assert _build_id(output) == "5eed5eed5eed5eed"
    units = _functions(output, "unit")
    assert units and all(address % 64 == 0 for address in units.values()), units
    assert any(address % 64 for address in _functions(program / "plain", "unit").values())  # not so by chance


def test_the_builds_own_link_options_win_over_the_plans(program, tmp_path):
    plan = _plan(tmp_path, link_flags=["--build-id=0x5eed5eed5eed5eed"])
    linked = _link(program, "own", "-Wl,--build-id=0xbeefbeefbeefbeef", OPTGYM_LTO_PLAN=plan)
    assert linked.returncode == 0, linked.stderr
    assert _build_id(program / "own") == "beefbeefbeefbeef"


def test_a_plan_that_cannot_be_used_is_one_note_and_clangs_own_link(program, tmp_path):
    broken = tmp_path / "plan.json"
    broken.write_text(json.dumps({"format": PLAN_FORMAT, "link_flags": ["icf=safe"]}))  # not an option
    linked = _link(program, "badplan", OPTGYM_LTO_PLAN=str(broken))
    assert linked.returncode == 0, linked.stderr
    lines = [line for line in linked.stderr.splitlines() if line.startswith("optgym-cc:")]
    assert len(lines) == 1 and "note" in lines[0] and "link_flags" in lines[0], linked.stderr
    assert (program / "badplan").read_bytes() == (program / "plain").read_bytes()
    strict = _link(program, "badplan-strict", OPTGYM_LTO_PLAN=str(broken), OPTGYM_STRICT="1")
    assert strict.returncode == 1 and "optgym-cc: error: ThinLTO plan" in strict.stderr
    missing = _link(program, "noplan", OPTGYM_LTO_PLAN=str(tmp_path / "absent.json"))
    assert missing.returncode == 0 and "ThinLTO plan" in missing.stderr


def test_the_shipped_plan_links_a_smaller_program_that_runs(program, monkeypatch):
    """The plan shipped for x86-64 applies by default (``OPTGYM_LTO_PLAN`` unset), with no policy server."""
    monkeypatch.delenv("OPTGYM_LTO_PLAN")
    linked = _link(program, "shipped", OPTGYM_STRICT="1")
    assert linked.returncode == 0, linked.stderr
    assert _run(program / "shipped") == _run(program / "plain")
    assert object_sizes(program / "shipped").text_bytes < object_sizes(program / "plain").text_bytes
    assert _servers() == []


def test_a_link_the_plan_breaks_is_clangs_own_link_with_one_warning(program, tmp_path):
    """An lld option some link cannot take fails that link; optgym-cc then links as clang does."""
    plan = _plan(tmp_path, link_flags=["--no-such-option-in-lld"])
    linked = _link(program, "fallback", OPTGYM_LTO_PLAN=plan)
    assert linked.returncode == 0, linked.stderr
    lines = [line for line in linked.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("optgym-cc: warning:") and "no-such-option" in lines[0], lines
    assert (program / "fallback").read_bytes() == (program / "plain").read_bytes()
    strict = _link(program, "fallback-strict", OPTGYM_LTO_PLAN=plan, OPTGYM_STRICT="1")
    assert strict.returncode != 0 and "no-such-option" in strict.stderr
    assert not (program / "fallback-strict").exists()
