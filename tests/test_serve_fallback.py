"""A policy that drives clang where it cannot go never breaks the build: the server refuses answers a problem
rules out, a crashed compile falls back to clang's own with one warning line, and no crash files are left."""

from __future__ import annotations

import marshal
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from optgym.data import demo
from optgym.serve.server import Server

BIN = Path(sys.executable).parent
CC = str(BIN / "optgym-cc")
CLANG = "/usr/lib/llvm-22/bin/clang"
#: hashtab.c asks the eviction advisor at -Oz on x86-64, and a masked answer there crashed clang (SIGSEGV).
HASHTAB = Path(demo.__file__).parent / "hashtab.c"
MAKEFILE = """CFLAGS ?= -Oz
hashtab: hashtab.o
\t$(CC) $(CFLAGS) -o $@ $^
hashtab.o: hashtab.c
\t$(CC) $(CFLAGS) -c -o $@ $<
"""


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    """The build's environment, with a private TMPDIR in which clang would leave its crash reproducers."""
    return {**os.environ, "TMPDIR": str(tmp), "OPTGYM_SERVER_IDLE": "5", **extra}


@pytest.mark.parametrize("policy", ["random", "never", "always"])
def test_model_free_eviction_policies_build_and_run_a_project(tmp_path, policy):
    """Before, each of these crashed clang on hashtab.c (an index whose mask bit is 0) and failed the build."""
    project, scratch = tmp_path / "project", tmp_path / "tmp"
    project.mkdir(), scratch.mkdir()
    (project / "hashtab.c").write_bytes(HASHTAB.read_bytes())
    (project / "Makefile").write_text(MAKEFILE)
    env = _env(scratch, OPTGYM_EVICT_POLICY=policy, OPTGYM_STRICT="1")  # strict: a fallback would fail the build
    build = subprocess.run(["make", f"CC={CC}"], cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    assert "optgym-cc" not in build.stderr
    ran = subprocess.run(["./hashtab"], cwd=project, capture_output=True, text=True, timeout=60)
    plain = subprocess.run([CLANG, "-Oz", "-o", tmp_path / "plain", HASHTAB], capture_output=True, text=True)
    assert plain.returncode == 0, plain.stderr
    assert (
        ran.returncode == 0
        and ran.stdout == subprocess.run([tmp_path / "plain"], capture_output=True, text=True).stdout
    )
    assert list(scratch.iterdir()) == []


def _serve_one(server: Server, argv: list[str], cwd: Path, env: dict[str, str], stderr_fd: int) -> dict:
    """One compile handed to ``server`` as a launcher hands it, over a socket pair; the server's reply."""
    launcher, server_end = socket.socketpair()
    with launcher:
        request = marshal.dumps({"argv": argv, "cwd": str(cwd), "env": env})
        socket.send_fds(launcher, [request], [1, stderr_fd])
        server.accepted(server_end).join(timeout=120)
        chunks = []
        while chunk := launcher.recv(65536):
            chunks.append(chunk)
    return marshal.loads(b"".join(chunks))


def _masked(point) -> int:
    """Evict from a register the mask rules out where there is one: what crashed clang."""
    valid = set(point.valid_actions().tolist())
    return next((i for i in range(33) if i not in valid), 0)


def test_an_answer_clang_cannot_take_is_refused_and_the_compile_falls_back(tmp_path, no_leftovers):
    server = Server("heuristic", "regalloc-evict")
    server.served[0].policy = _masked
    server.served[0].memo = None
    diagnostics = tmp_path / "stderr"
    with open(diagnostics, "wb") as build_stderr:
        argv = [CLANG, "-Oz", "-c", str(HASHTAB), "-o", str(tmp_path / "x.o")]
        reply = _serve_one(server, argv, tmp_path, _env(tmp_path), build_stderr.fileno())
    assert reply["fallback"] is True
    assert "cannot take" in reply["warning"] and "not valid at this decision" in reply["warning"]
    assert diagnostics.read_bytes() == b""  # the refused compile printed nothing of its own
    assert not (tmp_path / "x.o").exists()  # the launcher's plain compile writes the object
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stderr"]


def test_a_crashed_compile_falls_back_with_one_warning_and_leaves_no_crash_files(tmp_path, monkeypatch):
    """clang cannot be made to crash on a valid answer on demand, so the compile is killed with SIGSEGV from
    outside at its first decision: what a crash looks like to the server."""
    import signal

    from optgym.toolchain.interactive import InteractiveCompile

    answer = InteractiveCompile.answer

    def crash_at_first_answer(self, advice):
        os.kill(self.pid, signal.SIGSEGV)
        return answer(self, advice)

    monkeypatch.setattr(InteractiveCompile, "answer", crash_at_first_answer)
    server = Server("never", "inline-size")
    diagnostics = tmp_path / "stderr"
    with open(diagnostics, "wb") as build_stderr:
        argv = [CLANG, "-Oz", "-c", str(HASHTAB), "-o", str(tmp_path / "x.o")]
        reply = _serve_one(server, argv, tmp_path, _env(tmp_path), build_stderr.fileno())
    assert reply["fallback"] is True and "crash" in reply["warning"]
    assert diagnostics.read_bytes() == b""  # clang's crash report is not the build's: one warning line instead
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stderr"]


def test_a_served_compiles_diagnostics_reach_the_build(tmp_path):
    (tmp_path / "w.c").write_text("int f(int x) { int unused; return x; }\n")
    server = Server("never", "inline-size")
    diagnostics = tmp_path / "stderr"
    with open(diagnostics, "wb") as build_stderr:
        argv = [CLANG, "-Oz", "-Wall", "-c", "w.c", "-o", "w.o"]
        reply = _serve_one(server, argv, tmp_path, _env(tmp_path), build_stderr.fileno())
    assert reply["returncode"] == 0 and not reply.get("fallback")
    plain = subprocess.run([CLANG, "-Oz", "-Wall", "-c", "w.c", "-o", "p.o"], cwd=tmp_path, capture_output=True)
    assert diagnostics.read_bytes() == plain.stderr and b"unused" in plain.stderr


def test_the_crash_test_really_crashes_clang(tmp_path):
    """The fault the crash test injects is a real crash of clang: without optgym it fails the compile."""
    proc = subprocess.Popen([CLANG, "-Oz", "-fno-crash-diagnostics", "-c", str(HASHTAB), "-o", str(tmp_path / "x.o"),
                             "-mllvm", "-enable-ml-inliner=release", "-mllvm",
                             f"-inliner-interactive-channel-base={tmp_path}/none"],
                            stderr=subprocess.PIPE)  # fmt: skip
    threading.Timer(0.2, lambda: proc.poll() is None and proc.send_signal(11)).start()
    proc.communicate(timeout=60)
    assert proc.returncode != 0


def test_a_compile_past_optgym_timeout_is_killed_and_falls_back(tmp_path):
    """A compile that runs past ``OPTGYM_TIMEOUT`` seconds of compiler time (as ``random`` inlining kept clang busy
    on sqlite3.c for 19 minutes) is killed, nothing of it is left, and the build compiles plainly."""
    source = tmp_path / "many.c"  # ~1 s of clang at -Oz, well past the bound below
    source.write_text("".join(f"int f{i}(int x) {{ return x * {i} + (x > {i} ? f{i - 1}(x - 1) : 1); }}\n"
                              if i else "int f0(int x) { return x; }\n" for i in range(3000)))  # fmt: skip
    server = Server("never", "inline-size")
    diagnostics = tmp_path / "stderr"
    with open(diagnostics, "wb") as build_stderr:
        argv = [CLANG, "-Oz", "-c", str(source), "-o", str(tmp_path / "x.o")]
        reply = _serve_one(server, argv, tmp_path, _env(tmp_path, OPTGYM_TIMEOUT="0.2"), build_stderr.fileno())
    assert reply["fallback"] is True and "timeout" in reply["warning"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["many.c", "stderr"]


@pytest.mark.parametrize("value", ["0", "-3", "soon"])
def test_a_bad_optgym_timeout_is_a_clear_error_and_a_plain_compile(tmp_path, value):
    server = Server("never", "inline-size")
    argv = [CLANG, "-Oz", "-c", str(HASHTAB), "-o", str(tmp_path / "x.o")]
    reply = _serve_one(server, argv, tmp_path, _env(tmp_path, OPTGYM_TIMEOUT=value), 2)
    assert reply == {"fallback": True, "warning": f"OPTGYM_TIMEOUT={value!r} is not a positive number of seconds"}


def test_a_server_that_leaves_with_the_request_unread_is_replaced_without_a_warning(tmp_path):
    """An idle server that exits between a launcher's connect and its own accept resets the connection with the
    request unread (it once failed a test under load: "Connection reset by peer; compiled without optgym"). No
    compile of that request ran, so the launcher connects again, a new server starts, and the compile is served:
    no warning, no fallback. Here a stand-in server takes the connection, leaves, and closes it unread."""
    (tmp_path / "m.c").write_text("int twice(int x) { return x + x; }\n")
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    path = str(runtime / "optgym" / "serve-standin.sock")
    os.makedirs(os.path.dirname(path), mode=0o700)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    took: list[int] = []

    def leave() -> None:
        conn, _ = listener.accept()
        os.unlink(path)  # as serve() does when it leaves: new launchers start a new server
        while not conn.recv(1, socket.MSG_PEEK):  # the request has arrived, and stays unread
            pass
        took.append(1)
        conn.close()
        listener.close()

    stand_in = threading.Thread(target=leave)
    stand_in.start()
    launcher = (
        "import sys, optgym_cc\n"
        "policies = [('inline-size', 'never')]\n"
        "reply = optgym_cc.serve_request(sys.argv[1], sys.argv[3:], policies, socket_path=sys.argv[2])\n"
        "print(reply.get('returncode'), reply.get('fallback'), reply.get('warning'))\n"
    )
    env = _env(tmp_path, XDG_RUNTIME_DIR=str(runtime), OPTGYM_SERVER_IDLE="1")
    done = subprocess.run([sys.executable, "-c", launcher, CLANG, path, "-Oz", "-c", "m.c", "-o", "m.o"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    stand_in.join(timeout=30)
    assert took == [1]
    assert done.returncode == 0 and done.stdout == "0 None None\n", done.stdout + done.stderr
    assert (tmp_path / "m.o").stat().st_size > 0
