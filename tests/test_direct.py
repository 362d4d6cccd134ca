"""C compiles the launcher runs itself (:mod:`optgym_cc.direct`) once the server has said they are clang's own with
a portfolio's pass options: the plan the server records, the same objects, and the server's safety kept — a crash
or a compile past ``OPTGYM_TIMEOUT`` falls back to clang's plain compile with one warning line, and a stopped build
leaves no clang behind. Every compile here is the real clang-22's."""

from __future__ import annotations

import json
import marshal
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import live_children, runtime_leftovers

from optgym.policies import pretrained_path
from optgym.policies.embedded import load_embedded
from optgym.policies.portfolio import FORMAT, load_portfolio
from optgym.toolchain.process import describe_exit
from optgym.train.threshold import threshold_policy
from optgym_cc import direct

CC = str(Path(sys.executable).parent / "optgym-cc")
CLANG = "/usr/lib/llvm-22/bin/clang"
#: Which way a compile went shows in its symbols: each flag a portfolio below sets defines one function.
SOURCE = r"""
int g(int);
int f(int x) { for (int i = 0; i < x; i++) x += g(i); return x; }
#ifdef FIRST
int first(void) { return 1; }
#endif
#ifdef SECOND
int second(void) { return 2; }
#endif
#ifdef CRASH
#pragma clang __debug crash
#endif
"""
#: A second of clang's time under ``-DSLOW``: past the 0.2 s bound below, and long enough to stop a build in.
SLOW_BODY = "".join(
    f"int s{i}(int x) {{ return x * {i} + (x > {i} ? s{i - 1}(x - 1) : 1); }}\n" for i in range(1, 3000)
)
SLOW = "#ifdef SLOW\nint s0(int x) { return x; }\n" + SLOW_BODY + "#endif\n"


def run_cc(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """optgym-cc as a user's build runs it: the portfolio at its default count, no guard unless asked."""
    full = {**os.environ, "OPTGYM_SERVER_IDLE": "5", **env}
    for name in ("OPTGYM_CANDIDATES", "OPTGYM_GUARD_BELOW", "OPTGYM_PORTFOLIO"):
        if name not in env:
            full.pop(name, None)
    return subprocess.run([CC, *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=full)


def plans() -> dict:
    """Every plan the servers of this test run recorded, over all their files."""
    found: dict = {}
    for path in (Path(os.environ["OPTGYM_CACHE_DIR"]) / "direct").glob("*.marshal"):
        found |= marshal.loads(path.read_bytes())
    return found


def portfolio_file(path: Path, flags: list[str]) -> Path:
    """A portfolio for C whose first way is clang's own decisions with ``flags``, the default build's one compile."""
    way = {"name": "pass options", "policies": {"regalloc-evict": "heuristic", "regalloc-priority": "heuristic"},
           "flags": flags}  # fmt: skip
    data = {"format": FORMAT, "family": "C", "candidates": [way, {"name": "clang"}], "default_candidates": 1}
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(data))
    partial.replace(path)  # a new file: what a user's edit or a reinstall gives
    return path


def symbols(path: Path) -> set[str]:
    out = subprocess.run(["/usr/lib/llvm-22/bin/llvm-nm", "--defined-only", "-j", str(path)], capture_output=True,
                         text=True, check=True)  # fmt: skip
    return set(out.stdout.split())


def test_the_default_c_compile_is_planned_by_the_server_then_run_by_the_launcher(tmp_path):
    """The shipped portfolio's first way on x86-64 is pass options alone, and the shipped inline rule leaves C to
    clang: the server records exactly those flags, and every compile's object is clang's with them, byte for
    byte, whichever of the two ran it."""
    (tmp_path / "a.c").write_text(SOURCE)
    flags = load_portfolio().candidates[0].flags
    for name in ("served.o", "direct.o"):
        done = run_cc(["-Oz", "-c", "a.c", "-o", name], tmp_path, OPTGYM_STRICT="1")
        assert done.returncode == 0 and done.stderr == "", done.stderr
        assert tuple(flags) in plans().values()
    subprocess.run([CLANG, "-Oz", "-c", "a.c", "-o", "clang.o", *flags], cwd=tmp_path, check=True)
    clang = (tmp_path / "clang.o").read_bytes()
    assert (tmp_path / "served.o").read_bytes() == clang and (tmp_path / "direct.o").read_bytes() == clang


def test_a_changed_portfolio_is_asked_for_again_and_a_guard_is_never_planned(tmp_path):
    """The plan is keyed by the portfolio file as it is: rewritten, the next compile goes to the server, which
    records its new flags (the server reads the file again too); the launcher then runs the new plan. A guarded
    build compiles twice, so it is not recorded as clang's own."""
    (tmp_path / "a.c").write_text(SOURCE)
    portfolio = portfolio_file(tmp_path / "portfolio.json", ["-DFIRST"])
    for n in (1, 2):
        done = run_cc(["-Oz", "-c", "a.c", "-o", f"first{n}.o"], tmp_path, OPTGYM_PORTFOLIO=str(portfolio))
        assert done.returncode == 0, done.stderr
        assert "first" in symbols(tmp_path / f"first{n}.o")
    portfolio_file(portfolio, ["-DSECOND"])
    for n in (1, 2):
        done = run_cc(["-Oz", "-c", "a.c", "-o", f"second{n}.o"], tmp_path, OPTGYM_PORTFOLIO=str(portfolio))
        assert done.returncode == 0, done.stderr
        found = symbols(tmp_path / f"second{n}.o")
        assert "second" in found and "first" not in found
    recorded = [flags for key, flags in plans().items() if key[0] == str(portfolio)]
    assert sorted(recorded) == [("-DFIRST",), ("-DSECOND",)]
    guarded = run_cc(["-Oz", "-c", "a.c", "-o", "guarded.o"], tmp_path, OPTGYM_PORTFOLIO=str(portfolio),
                     OPTGYM_GUARD_BELOW="100000")  # fmt: skip
    assert guarded.returncode == 0, guarded.stderr  # clang's own object kept, the smaller: no "second" in it
    assert not [key for key in plans() if "100000" in key]


@pytest.mark.parametrize(
    "flag, bound, why", [("-DCRASH", {}, "crashed (exit 132)"), ("-DSLOW", {"OPTGYM_TIMEOUT": "0.2"}, "ran past 0.2 s")]
)
def test_a_crash_or_a_timeout_of_the_launchers_compile_falls_back_with_one_warning(tmp_path, flag, bound, why):
    """``#pragma clang __debug crash`` crashes the real clang, and ``SLOW`` keeps it busy past the bound, both only
    under the portfolio's flag: the first compile (the server's) and the second (the launcher's) each fall back to
    clang's plain compile with one warning line, leave clang's plain object, and nothing else behind."""
    (tmp_path / "a.c").write_text(SOURCE + SLOW)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    portfolio = portfolio_file(tmp_path / "portfolio.json", [flag])
    env = {"OPTGYM_PORTFOLIO": str(portfolio), "TMPDIR": str(scratch), **bound}
    for name in ("served.o", "direct.o"):
        done = run_cc(["-Oz", "-c", "a.c", "-o", name], tmp_path, **env)
        assert done.returncode == 0, done.stderr
        assert len(done.stderr.splitlines()) == 1 and "compiled without optgym" in done.stderr
    assert why in done.stderr  # the launcher's own words: it ran the second compile
    subprocess.run([CLANG, "-Oz", "-c", "a.c", "-o", "clang.o"], cwd=tmp_path, check=True)
    assert (tmp_path / "direct.o").read_bytes() == (tmp_path / "clang.o").read_bytes()
    assert list(scratch.iterdir()) == [] and not runtime_leftovers()
    # no half-written object of the stopped compile (clang's a-XXXXXXXX.o.tmp) beside the build's
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.c", "clang.o", "direct.o", "portfolio.json", "served.o",
                                                          "tmp"]  # fmt: skip
    assert not [c for c in live_children() if "clang" in " ".join(c.cmdline())]


def test_a_build_stopped_mid_compile_takes_the_launchers_clang_with_it(tmp_path):
    """SIGTERM to optgym-cc (make's, on an interrupted build) goes on to clang: both end, nothing is left."""
    (tmp_path / "a.c").write_text(SOURCE + SLOW)
    portfolio = portfolio_file(tmp_path / "portfolio.json", ["-DSLOW"])
    args = ["-Oz", "-c", "a.c", "-o", "a.o"]
    assert run_cc(args, tmp_path, OPTGYM_PORTFOLIO=str(portfolio)).returncode == 0  # the server's: recorded
    env = {k: v for k, v in os.environ.items() if k not in ("OPTGYM_CANDIDATES", "OPTGYM_GUARD_BELOW")}
    build = subprocess.Popen([CC, *args], cwd=tmp_path, env={**env, "OPTGYM_PORTFOLIO": str(portfolio)})
    deadline = time.monotonic() + 30
    while not (clangs := [c for c in psutil.Process(build.pid).children() if "clang" in c.name()]):
        assert time.monotonic() < deadline and build.poll() is None, "no clang started under the launcher"
        time.sleep(0.01)
    build.send_signal(signal.SIGTERM)
    assert build.wait(timeout=30) == 128 + signal.SIGTERM
    psutil.wait_procs(clangs, timeout=10)
    assert not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in clangs)
    assert not runtime_leftovers()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.c", "a.o", "portfolio.json"]  # the first build's a.o


def test_the_launcher_calls_a_crash_what_the_server_calls_one():
    """:func:`optgym_cc.direct.crashed` (standard library only) and the toolchain's ``describe_exit`` agree on
    every exit status, so both ways of a compile fall back on the same ones."""
    for code in range(-31, 256):
        assert direct.crashed(code) == (describe_exit(code)[0] == "crash"), code


def test_the_plans_file_keeps_the_latest_plans_and_a_replaced_one_counts_as_new(tmp_path):
    """Every portfolio edit adds a key, and the file is read on every C compile: it must not grow without end."""
    path = str(tmp_path / "direct" / "serve.marshal")
    keys = [("/p", "False", str(i)) for i in range(direct.MAX_PLANS + 3)]
    for k in keys:
        direct.remember(path, k, ("-O", k[2]))
    direct.remember(path, keys[3], ("-changed",))  # the oldest kept so far, replaced: now the latest
    direct.remember(path, ("/p", "False", "new"), ("-new",))
    with open(path, "rb") as f:
        kept = marshal.load(f)
    assert len(kept) == direct.MAX_PLANS
    assert direct.plan(path, keys[3]) == ["-changed"] and direct.plan(path, keys[-1]) == ["-O", keys[-1][2]]
    assert all(direct.plan(path, k) is None for k in keys[:5] if k != keys[3])


def test_the_shipped_inline_policy_leaves_c_to_clang_and_opens_no_channel_for_it():
    """The shipped allowance was trained on C++ alone (``train pattern --language C++``), so its file decides C++
    only and its held-out C figures are clang's own; a rule the threshold trainer writes says which languages it
    moves, too."""
    shipped = load_embedded(pretrained_path("inline-size"))
    assert shipped is not None and shipped.languages == ["C++"]
    provenance = json.loads(pretrained_path("inline-size").with_suffix(".provenance.json").read_text())
    held = provenance["figures"]["heldout"]["C"]
    assert held["evaluated"] > 0 and held["policy_text_bytes"] == held["heuristic_text_bytes"]
    features = list(shipped.feature_names)
    assert threshold_policy(features, cxx=40, c=None).languages == ["C++"]
    assert threshold_policy(features, cxx=40, c=10).languages == ["C", "C++"]
