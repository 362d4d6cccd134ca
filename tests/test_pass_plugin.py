"""The pass plugin (optgym.toolchain.pass_plugin) that names a module's surviving functions from inside its compile,
on real clang-22: the same set as the bitcode's own symbol table on every target, no change to the object, and a
served linkage compile that decides as the split one does."""

from __future__ import annotations

import filecmp
import os
import subprocess
from pathlib import Path

import pytest
from test_bitcode_symbols import SOURCE, TARGETS
from test_callee_linkage import SOURCE as CALLS
from test_callee_linkage import _gated
from test_serve_fallback import _env, _serve_one

from optgym.serve import server as server_module
from optgym.serve.server import Server
from optgym.toolchain import object_sizes
from optgym.toolchain.bitcode_symbols import external_functions
from optgym.toolchain.pass_plugin import SURVIVING_OUT, plugin_flags, read_surviving, surviving_plugin


@pytest.fixture(scope="module")
def plugin(toolchain) -> Path:
    built = surviving_plugin(toolchain)
    assert built is not None, "make setup installs llvm-22-dev, whose headers the plugin is built against"
    return built


@pytest.mark.parametrize("target", TARGETS, ids=["x86-64", "aarch64", "cortex-m4"])
def test_the_plugin_names_the_bitcodes_external_definitions_and_changes_no_object(toolchain, plugin, tmp_path, target):
    """Where no address is taken, what the plugin writes is the symbol table's set of the front end's bitcode
    (external definitions: not the static, inline, template, weak or anonymous ones), and the object is
    byte-identical to clang's without it."""
    (tmp_path / "m.cpp").write_text(SOURCE)
    clang = [str(toolchain.clang), *target, "-Oz", "-c", "m.cpp"]
    subprocess.run([*clang, "-emit-llvm", "-Xclang", "-disable-llvm-passes", "-o", "m.bc"], cwd=tmp_path, check=True)
    subprocess.run([*clang, "-o", "plain.o"], cwd=tmp_path, check=True)
    env = {**os.environ, SURVIVING_OUT: str(tmp_path / "surviving")}
    subprocess.run([*clang, "-o", "plugin.o", *plugin_flags(plugin)], cwd=tmp_path, check=True, env=env)
    named = read_surviving(tmp_path / "surviving")
    assert named == external_functions(tmp_path / "m.bc")
    assert named is not None and {"_Z8exportedi", "_Z10hidden_onei"} <= named
    assert filecmp.cmp(tmp_path / "plain.o", tmp_path / "plugin.o", shallow=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.bc", "m.cpp", "plain.o", "plugin.o", "surviving"]


#: A vtable's destructors and methods and a stored callback have their address taken; ``only_called`` does not.
ADDRESSED = r"""
extern int sink(int);
struct Shape { virtual ~Shape() { sink(1); } virtual int area() const { return sink(2); } };
struct Square : Shape { int area() const override { return sink(4); } };
static int callback(int x) { return sink(x); }
inline int only_called(int x) { return sink(x + 3); }
int (*registered)(int) = callback;
Shape *make() { return new Square; }
int use(int x) { return only_called(x); }
"""


def test_the_plugin_also_names_functions_whose_address_is_taken(toolchain, plugin, tmp_path):
    """A virtual destructor is ``linkonce_odr`` and called once (by the deleting destructor), but its vtable slot
    keeps it: the plugin names it with the vtable's other functions and a stored static callback, beside the
    external definitions, and leaves out an inline function that is only called."""
    (tmp_path / "m.cpp").write_text(ADDRESSED)
    clang = [str(toolchain.clang), "-Oz", "-c", "m.cpp"]
    subprocess.run([*clang, "-emit-llvm", "-Xclang", "-disable-llvm-passes", "-o", "m.bc"], cwd=tmp_path, check=True)
    env = {**os.environ, SURVIVING_OUT: str(tmp_path / "surviving")}
    subprocess.run([*clang, "-o", "m.o", *plugin_flags(plugin)], cwd=tmp_path, check=True, env=env)
    named = read_surviving(tmp_path / "surviving")
    external = external_functions(tmp_path / "m.bc")
    assert named is not None and external is not None and external < named
    assert {"_ZL8callbacki", "_ZN5ShapeD2Ev", "_ZN5ShapeD0Ev", "_ZNK6Square4areaEv"} <= named - external
    assert not any("only_called" in name for name in named)


def test_without_the_variable_the_plugin_writes_nothing(toolchain, plugin, tmp_path):
    (tmp_path / "m.cpp").write_text(SOURCE)
    env = {k: v for k, v in os.environ.items() if k != SURVIVING_OUT}
    subprocess.run([str(toolchain.clang), "-Oz", "-c", "m.cpp", *plugin_flags(plugin)], cwd=tmp_path, check=True,
                   env=env)  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.cpp", "m.o"]
    assert read_surviving(tmp_path / "surviving") is None


def test_a_served_linkage_compile_decides_alike_with_the_plugin_and_with_the_split(plugin, tmp_path, monkeypatch):
    """Compiles of policies that read ``callee_survives``, served with the plugin (one clang process) and with the
    front end split off (where no plugin can be built): the same object, byte for byte, for each policy, and the
    weight on ``callee_survives`` changes it, so both ways read the linkage. The build sees none of the refusal
    lines, and nothing is left in the temporary directory. The source takes no function's address: the split reads
    the external definitions alone, where the plugin also names the functions whose address is taken."""
    (tmp_path / "calls.cpp").write_text(CALLS)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(server_module.tempfile, "tempdir", str(scratch))
    spawned: list[list[str]] = []
    real_spawn = server_module.spawn
    monkeypatch.setattr(server_module, "spawn", lambda argv, **kw: spawned.append(argv) or real_spawn(argv, **kw))
    sizes: dict[str, int] = {}
    for way in ("plugin", "split"):
        if way == "split":
            monkeypatch.setattr(server_module, "surviving_plugin", lambda _toolchain: None)
        for name, weight in (("loose", 0.0), ("tight", -3.0)):
            _gated(weight).save(tmp_path / name)
            server = Server(str(tmp_path / name), "inline-size")
            with open(tmp_path / "build.err", "wb") as build_stderr:
                argv = ["clang++-22", "-Oz", "-c", "calls.cpp", "-o", f"{way}-{name}.o"]
                reply = _serve_one(server, argv, tmp_path, _env(scratch, OPTGYM_STRICT="1"), build_stderr.fileno())
            assert reply.get("returncode") == 0 and not reply.get("fallback"), reply
            assert (tmp_path / "build.err").read_bytes() == b""
            assert list(scratch.iterdir()) == []
            sizes[f"{way}-{name}"] = object_sizes(tmp_path / f"{way}-{name}.o").text_bytes
    assert len(spawned) == 2 and all("-disable-llvm-passes" in argv for argv in spawned)  # the split's front ends
    for name in ("loose", "tight"):
        assert filecmp.cmp(tmp_path / f"plugin-{name}.o", tmp_path / f"split-{name}.o", shallow=False), sizes
    assert sizes["plugin-tight"] < sizes["plugin-loose"], sizes
