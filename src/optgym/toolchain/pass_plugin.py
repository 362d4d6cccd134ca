"""The pass plugin that tells a served compile which of its functions stay, inside the compile itself.

Why: a policy that reads ``callee_survives`` needs the functions that stay whatever is inlined (the module's
``external`` definitions and the functions whose address is taken) before its first decision
(:mod:`optgym.rollout.linkage`). clang's channel never sends them. Without this plugin the server runs the front end
as a process of its own and reads the external definitions from the bitcode it writes
(:mod:`optgym.serve.front_end`), which costs a second clang start and a bitcode round trip: graphite2's C++
sources took 1.107x plain clang's CPU that way, and 1.006x with the plugin, with byte-identical objects
(docs/experiments/2026-11-29-linkage-plugin.md).

What: ``surviving.cpp``, beside this file, is an LLVM pass plugin for clang's own ``-fpass-plugin=`` option; clang
itself is not changed. At the start of the optimization pipeline, before any pass, it writes the names of the
module's external definitions, and of the functions whose address is taken (a vtable's slot, a stored callback),
to the file ``$OPTGYM_SURVIVING_OUT`` names, each ended by a NUL byte. The first part is the set the bitcode's
symbol table gives (its global text symbols); the second is what that table cannot say. The inliner runs later in
the same pipeline, so the file is whole before the first decision. Training and ``optgym evaluate`` load it into
their compiles too (:mod:`optgym.rollout.episode`), so a policy reads the same input it was trained on.

It is built once per machine (:mod:`optgym.toolchain.native`) with the toolchain's ``clang++`` against the
headers of Debian's ``llvm-22-dev``, and a build is kept only after a compile with it has named a function. A
machine without those headers has no plugin, and the server splits the front end off instead.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from optgym.toolchain.llvm import Toolchain, ToolchainError
from optgym.toolchain.native import built_once

SOURCE = Path(__file__).with_name("surviving.cpp")
#: The environment variable naming the file the plugin writes.
SURVIVING_OUT = "OPTGYM_SURVIVING_OUT"
#: The header the plugin's build needs (``llvm-22-dev``): without it there is no build to try.
PLUGIN_HEADER = Path("llvm") / "Plugins" / "PassPlugin.h"

_built: dict[str, Path | None] = {}


def surviving_plugin(toolchain: Toolchain) -> Path | None:
    """The plugin built for ``toolchain`` (once per source and clang, in optgym's cache), or ``None`` where it
    cannot be built or does not work here."""
    key = str(toolchain.clang)
    if key not in _built:
        _built[key] = _build(toolchain)
    return _built[key]


def read_surviving(path: Path) -> frozenset[str] | None:
    """The names the plugin wrote to ``path``, or ``None`` if it wrote nothing there."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return frozenset(name.decode(errors="replace") for name in data.split(b"\0")[:-1])


def plugin_flags(plugin: Path) -> list[str]:
    """What a compile is given to load the plugin."""
    return [f"-fpass-plugin={plugin}"]


def _build(toolchain: Toolchain) -> Path | None:
    try:
        config = str(toolchain.tool("llvm-config"))
        include, cxxflags, ldflags, libs = subprocess.run(
            [config, "--includedir", "--cxxflags", "--ldflags", "--libs"],
            capture_output=True, text=True, check=True, timeout=30,
        ).stdout.splitlines()[:4]  # fmt: skip
    except (OSError, ValueError, subprocess.SubprocessError, ToolchainError):
        return None
    if not (Path(include) / PLUGIN_HEADER).exists():
        return None
    clangxx = str(toolchain.bin_dir / "clang++")

    def command(output: Path) -> list[str]:
        return [clangxx, "-shared", "-fPIC", "-O2", "-w", *cxxflags.split(), str(SOURCE), "-o", str(output),
                *ldflags.split(), *libs.split()]  # fmt: skip

    key = SOURCE.read_bytes() + toolchain.identity.encode() + cxxflags.encode()
    return built_once("pass-plugin", key, "optgym-surviving.so", command, lambda built: _works(toolchain, built))


def _works(toolchain: Toolchain, plugin: Path) -> bool:
    """Whether clang loads ``plugin`` and it names the external functions of a tiny C module, not its static one."""
    with tempfile.TemporaryDirectory(prefix="optgym-plugin-") as work:
        out = Path(work) / "surviving"
        command = [str(toolchain.clang), "-x", "c", "-", "-Oz", "-c", "-o", os.devnull, *plugin_flags(plugin)]
        env = {**os.environ, SURVIVING_OUT: str(out)}
        try:
            subprocess.run(command, input=b"static int g(int x) { return x + 1; }\nint f(int x) { return g(x); }\n",
                           capture_output=True, check=True, timeout=60, env=env)  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            return False
        return read_surviving(out) == {"f"}


__all__ = ["SURVIVING_OUT", "plugin_flags", "read_surviving", "surviving_plugin"]


def main() -> None:
    """``python -m optgym.toolchain.pass_plugin``: build the plugin now (``make setup`` does), and say where."""
    from optgym.toolchain.llvm import find_toolchain

    plugin = surviving_plugin(find_toolchain())
    print(plugin or "no pass plugin could be built here (is llvm-22-dev installed?); the server splits instead")


if __name__ == "__main__":
    main()
