"""Bad input and dying processes: clear errors, fast, and nothing left behind.

The real clang-22 produces every fault it can (corrupt bitcode, a killed compiler, a killed host);
a stand-in compiler (a few lines of Python) is used only for what clang will not do on demand:
hang, or cut its stream short.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from conftest import process_running, runtime_leftovers

import optgym
from optgym.corpus import Corpus
from optgym.errors import CompileError, CorpusError
from optgym.problems import get_problem
from optgym.rollout import Episode
from optgym.toolchain.interactive import InteractiveCompile

pytestmark = pytest.mark.usefixtures("no_leftovers")

HEADER = {
    "features": [{"name": "f", "type": "int64_t", "port": 0, "shape": [1]}],
    "advice": {"name": "inlining_decision", "type": "int64_t", "port": 0, "shape": [1]},
}


def stand_in(tmp_path: Path, body: str) -> Path:
    """A fake compiler: opens the channel like clang, then misbehaves as ``body`` says."""
    script = tmp_path / "fake_compiler.py"
    script.write_text(
        textwrap.dedent(f"""
        import json, os, sys, time
        base = sys.argv[1]
        inbound = open(base + ".in", "rb")
        out = open(base + ".out", "wb")
        out.write(json.dumps({HEADER!r}).encode() + b"\\n" + b'{{"context":""}}\\n')
        out.flush()
    """)
        + textwrap.dedent(body)
    )
    return script


def run_stand_in(script: Path, timeout: float):
    with InteractiveCompile(lambda base: [sys.executable, str(script), base], timeout=timeout) as c:
        start = time.monotonic()
        header = c.start()
        observations = 0
        while c.next_observation() is not None:
            observations += 1
            c.answer((1).to_bytes(8, sys.byteorder))
        return header, observations, c.outcome, time.monotonic() - start


def test_corrupt_bitcode_is_a_clear_fast_error(corpus, tmp_path):
    root = tmp_path / "bad"
    root.mkdir()
    (root / "broken.bc").write_bytes(b"BC\xc0\xde" + b"\x00garbage" * 10)
    (root / "broken.cmd").write_bytes(corpus["tree"].command.read_bytes())
    (root / "corpus_description.json").write_text(json.dumps({"modules": ["broken"]}))
    env = optgym.make("inline-size", corpus=root)
    start = time.monotonic()
    with pytest.raises(CompileError) as err:
        env.reset()
    assert time.monotonic() - start < 10  # the bar is 2 s; the margin only catches hangs
    assert err.value.module == "broken" and err.value.status == "compile_error"
    assert "broken" in str(err.value) and "error" in err.value.stderr_tail.lower()
    env.close()


def test_failing_module_can_be_skipped(corpus, tmp_path):
    root = tmp_path / "mixed"
    root.mkdir()
    for name in ("tree", "zoo"):
        for suffix in (".bc", ".cmd"):
            (root / f"{name}{suffix}").write_bytes((corpus.root / f"{name}{suffix}").read_bytes())
    (root / "zoo.bc").write_bytes(b"not bitcode")
    (root / "corpus_description.json").write_text(json.dumps({"modules": ["tree", "zoo"]}))
    env = optgym.make("inline-size", corpus=root, on_error="skip")
    assert {env.reset(seed=s)[1]["module"] for s in range(4)} == {"tree"}
    with pytest.raises(CompileError, match="zoo"):  # named explicitly: the real error, not "no decisions"
        env.reset(options={"module": "zoo"})
    env.close()


def test_missing_cmd_names_the_module(corpus, tmp_path):
    root = tmp_path / "nocmd"
    root.mkdir()
    (root / "tree.bc").write_bytes(corpus["tree"].bitcode.read_bytes())
    (root / "corpus_description.json").write_text(json.dumps({"modules": ["tree"]}))
    env = optgym.make("inline-size", corpus=root)
    with pytest.raises(CorpusError, match=r"tree.*tree\.cmd is missing"):
        env.reset()
    env.close()


def test_missing_corpus_is_a_clear_error(tmp_path):
    with pytest.raises(CorpusError, match="not a corpus"):
        optgym.make("inline-size", corpus=tmp_path / "nowhere")


def test_link_step_cmd_is_refused(corpus, tmp_path):
    root = tmp_path / "link"
    root.mkdir()
    (root / "lib.bc").write_bytes(b"")
    (root / "lib.cmd").write_bytes(b"\0".join([b"-cc1", b"-Oz", b"-cc1", b"-Oz"]))
    (root / "corpus_description.json").write_text(json.dumps({"modules": ["lib"]}))
    with pytest.raises(CorpusError, match="several -cc1"):
        _ = Corpus(root)["lib"].cc1_args


def test_compiler_that_never_opens_the_channel_times_out(tmp_path):
    with InteractiveCompile(lambda base: ["sleep", "600"], timeout=1.0) as c:
        start = time.monotonic()
        assert c.start() is None
        assert c.outcome.status == "timeout" and "never sent a header" in c.outcome.detail
        assert time.monotonic() - start < 10


def test_compiler_failing_before_the_pass_is_noticed_at_once(tmp_path):
    with InteractiveCompile(lambda base: ["sh", "-c", "echo 'fatal: nope' >&2; exit 3"], timeout=60) as c:
        start = time.monotonic()
        assert c.start() is None
        assert c.outcome.status == "compile_error" and c.outcome.returncode == 3
        assert "fatal: nope" in c.outcome.stderr_tail
        assert time.monotonic() - start < 5  # not the 60 s timeout


def test_compiler_hanging_mid_stream_is_killed(tmp_path):
    script = stand_in(tmp_path, "time.sleep(600)\n")
    header, observations, outcome, seconds = run_stand_in(script, timeout=1.0)
    assert header is not None and observations == 0
    assert outcome.status == "timeout" and seconds < 10


def test_truncated_stream_is_a_protocol_error(tmp_path):
    script = stand_in(
        tmp_path,
        """
        out.write(b'{"observation":0}\\n' + b"\\x01\\x00\\x00")  # 3 of the 8 tensor bytes
        out.flush()
        sys.exit(0)
    """,
    )
    _, observations, outcome, _ = run_stand_in(script, timeout=30)
    assert observations == 0
    assert outcome.status == "protocol_error" and "cut short" in outcome.detail


def test_garbage_stream_is_a_protocol_error(tmp_path):
    script = stand_in(
        tmp_path,
        """
        out.write(b"this is not the protocol\\n")
        out.flush()
        time.sleep(600)
    """,
    )
    _, _, outcome, seconds = run_stand_in(script, timeout=30)
    assert outcome.status == "protocol_error" and seconds < 10


def test_crash_mid_stream_is_reported_as_crash(tmp_path):
    script = stand_in(
        tmp_path,
        """
        import signal
        out.write(b'{"observation":0}\\n' + (5).to_bytes(8, sys.byteorder) + b"\\n")
        out.flush()
        inbound.read(8)
        os.kill(os.getpid(), signal.SIGSEGV)
    """,
    )
    _, observations, outcome, _ = run_stand_in(script, timeout=30)
    assert observations == 1 and outcome.status == "crash" and "SIGSEGV" in outcome.detail


def test_close_mid_episode_kills_the_compiler(corpus, toolchain):
    episode = Episode(get_problem("inline-size"), corpus["zoo"], toolchain)
    assert episode.begin() is not None
    pid = episode._compile.pid
    assert psutil.pid_exists(pid)
    episode.close()
    assert not _running(pid)


def test_garbage_collection_kills_the_compiler(corpus, toolchain):
    episode = Episode(get_problem("inline-size"), corpus["zoo"], toolchain)
    episode.begin()
    pid = episode._compile.pid
    del episode
    gc.collect()
    assert not _running(pid)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


HOST = """
import faulthandler, signal, sys, time, optgym
faulthandler.register(signal.SIGUSR1)  # the test asks for a stack dump if the host hangs
# Ctrl-C as an interactive Python takes it, whatever was inherited: a test run started in the background
# by a non-interactive shell (`make test &`) hands its children SIGINT ignored
signal.signal(signal.SIGINT, signal.default_int_handler)
env = optgym.make("inline-size", corpus=sys.argv[1])
obs, info = env.reset(options={"module": "zoo"})
for _ in range(3):
    obs, *_ = env.step(info["heuristic_action"])
print(env.unwrapped._episode._compile.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_compiler_never_outlives_its_host(corpus_dir, sig, tmp_path):
    """A host killed mid-episode takes its clang with it (clang would spin at 100 % CPU forever)."""
    # stderr to a file, not a pipe: a host blocked on a full pipe nobody reads would look like a hang
    err = tmp_path / "host.err"
    with err.open("w") as err_file:  # the child keeps its own copy of the descriptor
        host = subprocess.Popen(
            [sys.executable, "-c", HOST, str(corpus_dir)],
            stdout=subprocess.PIPE,
            stderr=err_file,
            text=True,
            env=os.environ.copy(),
        )
    try:
        line = host.stdout.readline()
        assert line.strip().isdigit(), err.read_text()
        clang = int(line)
        assert _running(clang) and "clang" in psutil.Process(clang).name()
        host.send_signal(sig)
        try:
            host.wait(timeout=60)
        except subprocess.TimeoutExpired:
            host.send_signal(signal.SIGUSR1)
            time.sleep(1)
            pytest.fail(f"host still running 60 s after {sig.name}; its stacks:\n{err.read_text()}")
        deadline = time.monotonic() + 10
        while _running(clang) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(clang), f"clang {clang} outlived its host ({sig.name})"
        assert not [d for d in runtime_leftovers() if d.name.startswith(f"{host.pid}-")]
    finally:
        host.kill()
        host.wait()


def test_channel_drives_a_distributed_thinlto_backend(toolchain, tmp_path):
    """C's next lever is cross-module (README): in distributed ThinLTO every backend is an ordinary clang
    compile (``-x ir M.o -fthinlto-index=M.o.thinlto.bc``), so the channel reaches its decisions — including
    calls of functions imported from the other module — and clang's own answers reproduce it byte for byte."""
    (tmp_path / "lib.c").write_text("int scale(int x) { return 3 * x + 1; }\nint twice(int x) { return 2 * scale(x); }")
    (tmp_path / "main.c").write_text("int twice(int);\nint main(int argc, char **argv) { return twice(argc); }\n")
    clang = str(toolchain.clang)

    def ok(*argv: str) -> None:
        out = subprocess.run([clang, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr

    for name in ("lib", "main"):
        ok("-Oz", "-flto=thin", "-c", f"{name}.c", "-o", f"{name}.o")
    ok("-flto=thin", "-fuse-ld=lld", "lib.o", "main.o", "-Wl,--thinlto-index-only", "-o", "index-only")
    backend = ["-Oz", "-x", "ir", "main.o", "-fthinlto-index=main.o.thinlto.bc", "-c"]
    ok(*backend, "-o", "plain.o")
    problem = get_problem("inline-size")
    argv = [clang, *backend, "-o", "served.o", *problem.compile_flags()]
    imported = []
    with InteractiveCompile(lambda base: [*argv, *problem.channel_flags(base)], cwd=tmp_path) as compile_:
        header = compile_.start()
        assert header is not None, compile_.outcome
        view = problem.view(header)
        while (obs := compile_.next_observation()) is not None:
            imported.append(int(obs.as_dict()["is_callee_avail_external"].reshape(-1)[0]))
            compile_.answer(problem.encode_action(header, problem.heuristic_action(view, obs)))
        assert compile_.finish().ok
    assert 1 in imported, f"no decision about an imported callee: {imported}"
    assert (tmp_path / "served.o").read_bytes() == (tmp_path / "plain.o").read_bytes()


def test_a_compiler_never_outlives_a_host_that_dies_the_moment_it_spawned_it(tmp_path):
    """The death signal is armed by the child itself, a moment after the spawn returns: a host killed in that
    moment would leave the child running forever (a served clang then waits on its FIFO for good). The child
    checks its parent after arming the signal, so it dies either way."""
    pid_file = tmp_path / "child.pid"
    host = (
        "import os\n"
        "from optgym.toolchain.process import spawn\n"
        "child = spawn(['sleep', '60'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "os._exit(0)\n"  # at once: no clean-up, like SIGKILL
    )
    for _ in range(5):
        subprocess.run([sys.executable, "-c", host], check=True, timeout=60)
        child = int(pid_file.read_text())
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and process_running(child):
            time.sleep(0.01)
        assert not process_running(child), "the child outlived its host"
