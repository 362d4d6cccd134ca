"""optgym.toolchain.process.private_tempdir: a process killed before its cleanup leaves one, and the next process of
optgym removes it, never a directory whose owner still runs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from optgym.toolchain.process import STALE_AFTER_SECONDS

PREFIX = "optgym-linkage-"
#: a process that makes its private directory, prints it, and dies by SIGKILL: no ``finally``, no atexit
KILLED = f"""
import os, signal
from optgym.toolchain.process import private_tempdir
work = private_tempdir({PREFIX!r})
print(work.name, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
#: the next process: its first private directory sweeps the leftovers, and it prints its own
NEXT = f"""
from optgym.toolchain.process import private_tempdir
work = private_tempdir({PREFIX!r})
print(work.name, flush=True)
work.cleanup()
"""


def run_python(code: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TMPDIR": str(tmp)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def age(path: Path) -> None:
    then = time.time() - STALE_AFTER_SECONDS - 60
    os.utime(path, (then, then))


def test_a_killed_processs_directory_is_removed_by_the_next_one(tmp_path):
    killed = run_python(KILLED, tmp_path)
    assert killed.returncode == -9
    orphan = Path(killed.stdout.strip())
    assert orphan.is_dir() and orphan.parent == tmp_path and orphan.name.startswith(PREFIX)
    (orphan / "surviving").write_bytes(b"f\0")  # what the plugin writes there
    fresh_orphan = Path(run_python(KILLED, tmp_path).stdout.strip())  # dead too, but as recent as a compile
    live = tmp_path / f"{PREFIX}{os.getpid()}-abcdefgh"  # this test process's: alive
    live.mkdir()
    age(orphan)
    age(live)

    following = run_python(NEXT, tmp_path)
    assert following.returncode == 0, following.stderr
    assert not orphan.exists(), "the dead owner's old directory stays"
    assert fresh_orphan.is_dir(), "a directory younger than the age bar was removed"
    assert live.is_dir(), "a live process's directory was removed"
    own = Path(following.stdout.strip())
    owner = own.name.removeprefix(PREFIX).partition("-")[0]
    assert owner.isdigit() and int(owner) != os.getpid(), "the directory is not named after its process"
    assert not own.exists()


def test_other_names_under_the_prefix_are_left_alone(tmp_path):
    foreign = tmp_path / f"{PREFIX}notapid-x"  # the names optgym used before the pid went into them
    foreign.mkdir()
    age(foreign)
    assert run_python(NEXT, tmp_path).returncode == 0
    assert foreign.is_dir()


def test_a_test_run_ended_before_its_session_leaves_a_directory_the_next_run_removes(tmp_path):
    """pytest refusing its own options never runs the session's teardown, so its ``optgym-tests-<pid>-…`` stays;
    the next test run (importing tests/conftest.py) removes it once its owner is gone."""
    env = {k: v for k, v in os.environ.items() if k != "OPTGYM_TESTS_RUN_DIR"}
    env["TMPDIR"] = str(tmp_path)
    pytest_run = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", str(Path(__file__).parent)]
    refused = subprocess.run([*pytest_run, "--no-such-option"], env=env, capture_output=True, timeout=120)
    assert refused.returncode != 0
    (left,) = tmp_path.glob("optgym-tests-*")
    age(left)
    listed = subprocess.run([*pytest_run, "--collect-only", "-q", "-k", "no_test_has_this_name"], env=env,
                            capture_output=True, timeout=300)  # fmt: skip
    assert listed.returncode == 5  # nothing selected: the run itself is not the point
    assert not left.exists(), "the refused run's directory stays"
