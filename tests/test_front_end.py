"""The front end once (optgym.serve.front_end): the build's command split into a front-end run and compiles of its
bitcode, on real clang-22. The split must change nothing the build reads: the object and the dependency file come
out byte-identical to the build's own compile."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import CXX_SOURCE

from optgym.policies.allowance import DEFAULT_GATES, allowance_policy, with_gates
from optgym.serve.front_end import from_bitcode_args, front_end_args, unsplittable
from optgym.toolchain import object_sizes

CLANG = "clang++-22"
CXX = str(Path(sys.executable).parent / "optgym-c++")
HEADER = "inline int twice(int x) { return 2 * x; }\n"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "twice.h").write_text(HEADER)
    (tmp_path / "zoo.cpp").write_text('#include "twice.h"\n' + CXX_SOURCE + "int use(int v) { return twice(v); }\n")
    (tmp_path / "out").mkdir()
    return tmp_path


def _run(args: list[str], cwd: Path) -> None:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    "deps",
    [["-MD"], ["-MMD", "-MF", "out/named.d"], ["-Wp,-MD,out/wp.d"], ["-MD", "-MT", "custom-target"], []],
    ids=["implicit", "named", "wp", "target", "none"],
)
def test_the_split_compile_writes_the_builds_object_and_dependency_file(project, deps):
    """Front end into bitcode, then the object from the bitcode: the object and the dependency file are
    byte-identical to the ones the unsplit command writes (with -g, -fPIC and an include path)."""
    build = ["-Oz", "-g", "-fPIC", "-Iinc", "-std=c++17", "-Werror", *deps, "-c", "zoo.cpp", "-o", "out/zoo.o"]
    _run([CLANG, *build], project)
    direct = {p.name: p.read_bytes() for p in (project / "out").iterdir()}
    for p in (project / "out").iterdir():
        p.unlink()
    _run([CLANG, *front_end_args(build, "fe.bc")], project)
    _run([CLANG, *from_bitcode_args(build, "fe.bc", "out/zoo.o")], project)
    split = {p.name: p.read_bytes() for p in (project / "out").iterdir()}
    assert split.keys() == direct.keys() and (len(direct) == 2) == bool(deps)
    assert split == direct


def test_an_object_named_by_default_keeps_its_dependency_files_name_and_target(project):
    """No ``-o``: clang names the object after the source and the dependency file after the object."""
    build = ["-Oz", "-Iinc", "-MD", "-c", "zoo.cpp"]
    _run([CLANG, *build], project)
    direct = (project / "zoo.d").read_text()
    (project / "zoo.d").unlink()
    _run([CLANG, *front_end_args(build, "fe.bc")], project)
    assert (project / "zoo.d").read_text() == direct
    assert direct.startswith("zoo.o:")


def test_the_bitcode_compile_drops_the_source_language_and_dependency_options():
    build = ["-x", "c++", "-MD", "-MF", "a.d", "-xc", "-Iinc", "-c", "a.cc", "-o", "a.o"]
    args = from_bitcode_args(build, "f.bc", "b.o")
    assert args == ["-Iinc", "-c", "-o", "b.o", "-Wno-unused-command-line-argument", "-x", "ir", "f.bc"]


@pytest.mark.parametrize(
    ("args", "why"),
    [(["-S", "a.cc"], "not a -c"), (["-c", "a.cc", "b.cc"], "2 inputs"), (["-c", "-fsanitize=address", "a.cc"],
     "inside LLVM's passes"), (["-c", "-save-temps", "a.cc"], "ties another output"),
     (["-c", "-flto=thin", "a.cc"], "bitcode"), (["-c", "a.cc", "--output=b.o"], "only -o")],
)  # fmt: skip
def test_commands_the_split_would_change_are_not_split(args, why):
    assert why in (unsplittable(args) or "")


def test_a_linkage_policy_served_writes_clangs_dependency_file_and_the_guard_still_works(project, no_leftovers):
    """optgym-c++ with a policy reading ``callee_survives``: the dependency file is clang's own, byte for byte,
    however the object is decided; ``OPTGYM_GUARD=1`` keeps clang's object where the policy's is larger (the
    linkage compile has no object of clang's to offer any more); nothing is left in the temporary directory."""
    everything = allowance_policy()
    everything.weights[0][1][1] = 4.0  # inline every call site: a larger object than clang's
    everything._prune()
    with_gates(everything, [*DEFAULT_GATES, "callee_survives"]).save(project / "policy")
    build = ["-Oz", "-Iinc", "-MD", "-c", "zoo.cpp", "-o"]
    _run([CLANG, *build, "out/plain.o"], project)
    scratch = project / "tmp"  # the server's TMPDIR: the launcher that starts it hands it the build's environment
    scratch.mkdir()
    sizes = {}
    for name, guard in (("served", ""), ("guarded", "1")):
        env = {**os.environ, "OPTGYM_POLICY": str(project / "policy"), "OPTGYM_STRICT": "1", "OPTGYM_SERVER_IDLE": "5",
               "OPTGYM_GUARD": guard, "TMPDIR": str(scratch)}  # fmt: skip
        done = subprocess.run([CXX, *build, f"out/{name}.o"], cwd=project, env=env, capture_output=True, text=True,
                              timeout=300)  # fmt: skip
        assert done.returncode == 0 and not done.stderr, done.stderr
        assert (project / f"out/{name}.d").read_text() == (project / "out/plain.d").read_text().replace("plain", name)
        sizes[name] = object_sizes(project / f"out/{name}.o").text_bytes
    plain = object_sizes(project / "out/plain.o").text_bytes
    assert sizes["served"] > plain, "the test needs a policy that makes the object larger"
    assert sizes["guarded"] == plain
    assert list(scratch.iterdir()) == []
    assert sorted(p.name for p in (project / "out").iterdir() if p.name.startswith(".")) == []


def test_a_front_end_past_optgym_timeout_falls_back_with_one_warning(tmp_path, monkeypatch):
    """The front end counts against ``OPTGYM_TIMEOUT`` like any compile the server runs: past it, it is killed,
    the build is told once and compiles plainly, and no bitcode or object is left."""
    from test_serve_fallback import _env, _serve_one

    from optgym.serve import server as server_module
    from optgym.serve.server import Server

    source = tmp_path / "many.cpp"  # seconds of front end at -Oz, well past the bound below
    source.write_text("".join(f"template <int N> int f{i}(int x) {{ return x * N + {i}; }}\n"
                              f"int g{i}(int x) {{ return f{i}<{i}>(x); }}\n" for i in range(6000)))  # fmt: skip
    with_gates(allowance_policy(), [*DEFAULT_GATES, "callee_survives"]).save(tmp_path / "policy")
    monkeypatch.setattr(server_module, "surviving_plugin", lambda _toolchain: None)  # the split: no pass plugin
    server = Server(str(tmp_path / "policy"), "inline-size")
    scratch = tmp_path / "tmp"  # this process's temporary directory: the server runs in it here
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    with open(tmp_path / "stderr", "wb") as build_stderr:
        argv = [CLANG, "-Oz", "-c", str(source), "-o", str(tmp_path / "x.o")]
        reply = _serve_one(server, argv, tmp_path, _env(tmp_path, OPTGYM_TIMEOUT="0.2"), build_stderr.fileno())
    assert reply["fallback"] is True and "front end ran past" in reply["warning"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["many.cpp", "policy", "stderr", "tmp"]
    assert list(scratch.iterdir()) == []
