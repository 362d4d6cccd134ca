"""The front door ``optgym-cc`` / ``optgym-c++`` (``scripts/optgym-cc``): it execs clang-22 itself only for
steps the Python launcher would pass through unchanged, and hands every other step over under its own name.

Each case runs the real clang-22. The front is copied into a directory with no launcher beside it, so a step
it hands over fails with the front's "not found" message, and a step it takes is clang's own run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import optgym_cc
from optgym.toolchain.llvm import find_toolchain

REPO = Path(__file__).resolve().parents[1]
FRONT = REPO / "scripts" / "optgym-cc"
BIN = Path(sys.executable).parent
SOURCE = "int twice(int x) { return 2 * x; }\n"
#: The front's message when it hands a step to a launcher that is not there.
HANDED_OVER = "optgym-cc-launcher not found"


@pytest.fixture(scope="module")
def lone_front(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both names of the front in a directory without the launcher, and a C source to compile."""
    where = tmp_path_factory.mktemp("front")
    shutil.copy(FRONT, where / "optgym-cc")
    (where / "optgym-c++").symlink_to("optgym-cc")
    (where / "x.c").write_text(SOURCE)
    return where


def run_front(front: Path, args: list[str], extra_env: dict[str, str] | None = None) -> tuple[bool, str]:
    """(whether the front ran clang itself, stderr) for one step run in the front's directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPTGYM_")} | (extra_env or {})
    done = subprocess.run([str(front), *args], cwd=front.parent, env=env, capture_output=True, text=True)
    handed_over = HANDED_OVER in done.stderr
    assert handed_over == (done.returncode == 127), done.stderr
    return not handed_over, done.stderr


# (arguments, environment, whether the front should run clang itself)
CASES = [
    (["-Oz", "-flto=thin", "-c", "x.c", "-o", "x.o"], {}, True),  # an LTO compile step: bitcode
    (["-Oz", "-flto", "-c", "x.c", "-o", "x.o"], {}, True),
    (["-O2", "-c", "x.c", "-o", "x.o"], {}, True),  # a level optgym does not serve
    (["-c", "x.c", "-o", "x.o"], {}, True),  # no -O at all
    (["-Oz", "-O2", "-c", "x.c", "-o", "x.o"], {}, True),  # the last -O wins
    (["-Oz", "-E", "x.c", "-o", "x.i"], {}, True),  # no object: preprocessing
    (["--version"], {}, True),
    (["-Oz", "-c", "x.c", "-o", "x.o"], {}, False),  # served
    (["-Os", "-c", "x.c", "-o", "x.o"], {}, False),
    (["-O2", "-Oz", "-c", "x.c", "-o", "x.o"], {}, False),
    (["-flto=thin", "-fno-lto", "-Oz", "-c", "x.c", "-o", "x.o"], {}, False),  # -fno-lto undoes -flto
    (["-Oz", "-flto=thin", "-c", "x.c", "-o", "x.o"], {"OPTGYM_SERVE_LTO": "1"}, False),
    (["-O2", "-c", "x.c", "-o", "x.o"], {"OPTGYM_SERVE_OPT": "2"}, False),  # the launcher reads the levels
    (["-flto=thin", "-fuse-ld=lld", "x.o", "-o", "prog"], {}, False),  # an LTO link: backends may be served
]


@pytest.mark.parametrize(("args", "env", "runs_clang"), CASES, ids=[" ".join(c[0]) + str(c[1]) for c in CASES])
def test_front_runs_clang_only_for_what_the_launcher_passes_through(
    lone_front: Path, args: list[str], env: dict[str, str], runs_clang: bool
) -> None:
    ran, stderr = run_front(lone_front / "optgym-cc", args, env)
    assert ran == runs_clang, stderr
    if ran:
        assert not optgym_cc.may_serve(args, env)


TOKENS = ["-c", "-flto", "-flto=thin", "-fno-lto", "-flto-jobs=2", "-Oz", "-Os", "-O2", "-O", "-Ofast", "-E", "-S",
          "x.c", "-o", "out.o", "-fuse-ld=lld", "-###"]  # fmt: skip


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=st.lists(st.sampled_from(TOKENS), max_size=7), serve_lto=st.booleans(), cxx=st.booleans())
def test_front_never_takes_a_step_the_launcher_would_serve(
    lone_front: Path, args: list[str], serve_lto: bool, cxx: bool
) -> None:
    """Any mix of the flags that decide it: whatever the front runs as clang, the launcher passes through too."""
    env = {"OPTGYM_SERVE_LTO": "1"} if serve_lto else {}
    ran, _ = run_front(lone_front / ("optgym-c++" if cxx else "optgym-cc"), args, env)
    if ran:
        assert not optgym_cc.may_serve(args, env), args


def test_a_triple_prefixed_name_reaches_the_launcher_with_its_target(tmp_path: Path) -> None:
    """A link named ``aarch64-linux-gnu-optgym-cc`` elsewhere: the front finds the launcher through the link,
    and the launcher compiles for the triple in the name, which only it knows how to add."""
    prefixed = tmp_path / "aarch64-linux-gnu-optgym-cc"
    prefixed.symlink_to(BIN / "optgym-cc")
    (tmp_path / "x.c").write_text(SOURCE)
    subprocess.run([str(prefixed), "-O2", "-c", "x.c", "-o", "x.o"], cwd=tmp_path, check=True)
    assert (tmp_path / "x.o").read_bytes()[18] == 183  # e_machine: EM_AARCH64


LLVM_TOOLS = ("optgym-llvm-ar", "optgym-llvm-ranlib", "optgym-llvm-nm", "llvm-ar", "llvm-ranlib")


@pytest.mark.parametrize("name", LLVM_TOOLS)
def test_each_llvm_tool_name_runs_llvm_22s_own_tool(name: str) -> None:
    """CMake's archiver beside the compilers, and Meson's on PATH, must be LLVM 22's: older ones cannot read
    its bitcode. Each name runs the tool of that name: ``llvm-ar`` and ``llvm-ranlib`` are one program that
    behaves by the name it is run by, so their ``--help`` tells them apart."""
    done = subprocess.run([str(BIN / name), "--version"], capture_output=True, text=True, check=True)
    assert "LLVM version 22." in done.stdout
    tool = Path(find_toolchain().tool(name.removeprefix("optgym-")))
    wrapped, own = (subprocess.run([str(program), "--help"], capture_output=True, text=True)
                    for program in (BIN / name, tool))  # fmt: skip
    assert wrapped.returncode == own.returncode and wrapped.stdout + wrapped.stderr == own.stdout + own.stderr


def test_the_installed_scripts_are_the_repositorys() -> None:
    """What this suite runs as ``optgym-cc`` and the LLVM tools is scripts/, installed under every name (a
    stale install would test old code), and the launcher is beside them."""
    for name in ("optgym-cc", "optgym-c++"):
        assert (BIN / name).read_bytes() == FRONT.read_bytes()
    for name in LLVM_TOOLS:
        assert (BIN / name).read_bytes() == (REPO / "scripts" / "optgym-llvm-ar").read_bytes()
    assert os.access(BIN / "optgym-cc-launcher", os.X_OK)


def test_doctor_says_whether_the_compilers_work(lone_front: Path) -> None:
    """``optgym doctor`` runs each front door: the installed ones answer as clang-22; fronts with no launcher
    beside them (a broken install) are reported broken, since a build's served steps would fail."""
    from optgym.cli import _doctor_compilers

    assert _doctor_compilers(BIN)
    assert not _doctor_compilers(lone_front)
    assert not _doctor_compilers(lone_front / "nowhere")
