"""Backend lanes: one lld, its ThinLTO backends side by side, each thread on its own channels.

clang-22 names each decision's channel with one option per process, so the backends that lld runs on its threads
would share two FIFOs, and a link served inside lld had to run them one at a time (``--thinlto-jobs=1``). A small
library preloaded into lld (``lanes.c``, beside this file) gives each of its threads its own names instead: the
first thread to open a channel keeps the names the options give, the k-th opens the same names under
``<channel directory>/lane<k>/``. A thread runs one backend at a time and keeps its lane, so each lane is a
sequence of sessions, as the one-at-a-time link was, and the host serves every lane's channels at once
(:class:`optgym.toolchain.interactive.InteractiveCompile` with ``lanes``).

Nothing in LLVM changes: the library rewrites paths passed to libc's ``open`` and only those under the channel
directory. It is built once with the toolchain's own clang into optgym's cache
(:mod:`optgym.toolchain.native`). Where it cannot be built, a link runs its backends one at a time, as before.
"""

from __future__ import annotations

import os
from pathlib import Path

from optgym.toolchain.native import built_once

SOURCE = Path(__file__).with_name("lanes.c")
#: Environment variables the library reads: the directory whose paths it rewrites, and how many lanes exist
#: (a thread beyond them is refused, which fails the link rather than mixing two threads on one channel).
LANE_DIR, LANE_COUNT = "OPTGYM_LANE_DIR", "OPTGYM_LANES"

_built: dict[str, str | None] = {}


def lanes_library(clang: str) -> str | None:
    """The lanes library built by ``clang`` (once per source and compiler binary, in optgym's cache: ``clang``,
    ``clang++`` and ``clang-22`` are one), or ``None`` if it cannot be built here."""
    clang = os.path.realpath(clang)
    if clang not in _built:
        library = built_once(
            "lanes",
            SOURCE.read_bytes() + clang.encode(),
            "liboptgym-lanes.so",
            lambda output: [clang, "-shared", "-fPIC", "-O2", "-w", "-o", str(output), str(SOURCE), "-ldl"],
        )
        _built[clang] = None if library is None else str(library)
    return _built[clang]


def lane_environment(env: dict[str, str] | None, library: str, directory: Path, lanes: int) -> dict[str, str]:
    """``env`` (else this process's) with ``library`` preloaded for ``lanes`` lanes under ``directory``."""
    result = dict(os.environ if env is None else env)
    preload = result.get("LD_PRELOAD", "")
    result["LD_PRELOAD"] = f"{library} {preload}".strip()
    result[LANE_DIR], result[LANE_COUNT] = str(directory), str(lanes)
    return result


def lane_base(base: str, lane: int) -> str:
    """Where lane ``lane`` finds the channel the options name ``base`` (``<directory>/<name>``)."""
    if lane == 0:
        return base
    directory, name = os.path.split(base)
    return os.path.join(directory, f"lane{lane}", name)
