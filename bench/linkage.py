#!/usr/bin/env python3
"""What learning a compile's callee linkage costs, per source file: plain clang, clang with optgym's pass plugin,
and the front end split off (the server's own commands: a front-end run to bitcode, then the compile of that
bitcode), side by side.

A policy reading ``callee_survives`` needs the module's surviving functions before its first decision
(docs/serving.md, "Policies that read the callee's linkage"). The server learns them with the plugin inside the
compile where it can be built, else by splitting. This times exactly those commands, without the channel, so the
ratios are the mechanism's alone. Every round runs the three ways on each file in a rotated order, so a noisy
moment hits all alike; the CPU (user + system) of each way is summed over rounds, and each object is compared
with plain clang's byte for byte.

    .venv/bin/python bench/linkage.py --build ~/.cache/optgym/bench-build/builds/graphite2/plain --files 8

``--build`` is a Ninja build directory (``bench/build.py`` leaves one per project); its C and C++ compile commands
come from ``ninja -t compdb``. Exit status 0 unless a compile failed or an object differed (1).
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from optgym.serve.front_end import from_bitcode_args, front_end_args
from optgym.serve.guard import reference_args
from optgym.toolchain import find_toolchain
from optgym.toolchain.pass_plugin import SURVIVING_OUT, plugin_flags, surviving_plugin

WAYS = ("plain", "plugin", "split")


def compile_commands(build: Path, files: int) -> list[tuple[list[str], str]]:
    """The first ``files`` -c compiles of ``build`` as (arguments without the driver, directory)."""
    database = json.loads(subprocess.run(["ninja", "-C", str(build), "-t", "compdb"], capture_output=True,
                                         text=True, check=True).stdout)  # fmt: skip
    chosen = [
        (shlex.split(entry["command"])[1:], entry["directory"])
        for entry in database
        if "-c" in shlex.split(entry["command"]) and entry["file"].endswith((".c", ".cc", ".cpp", ".cxx"))
    ]
    return chosen[:files]


def cpu_of(commands: list[tuple[list[str], dict[str, str] | None]], cwd: str) -> float:
    """CPU seconds (user + system) of running ``commands`` one after another; a failure stops the bench."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for argv, env in commands:
        subprocess.run(argv, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", type=Path, required=True, help="a Ninja build directory")
    parser.add_argument("--files", type=int, default=8, help="how many of its compiles (default 8)")
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    toolchain = find_toolchain()
    plugin = surviving_plugin(toolchain)
    if plugin is None:
        print("no pass plugin could be built here (llvm-22-dev's headers?): nothing to compare", file=sys.stderr)
        return 1
    clang = str(toolchain.bin_dir / "clang++")
    commands = compile_commands(options.build, options.files)
    cpu = dict.fromkeys(WAYS, 0.0)
    differed = 0
    with tempfile.TemporaryDirectory(prefix="optgym-bench-linkage-") as work:
        out = {way: os.path.join(work, f"{way}.o") for way in WAYS}
        bitcode, surviving = os.path.join(work, "front-end.bc"), os.path.join(work, "surviving")
        plugin_env = {**os.environ, SURVIVING_OUT: surviving}
        for round_ in range(options.rounds):
            for i, (args, cwd) in enumerate(commands):
                ways = {  # each writes its own object and no dependency file (the server's own rewriting)
                    "plain": [([clang, *reference_args(args, out["plain"])], None)],
                    "plugin": [([clang, *reference_args(args, out["plugin"]), *plugin_flags(plugin)], plugin_env)],
                    "split": [([clang, *front_end_args(reference_args(args, out["split"]), bitcode)], None),
                              ([clang, *from_bitcode_args(args, bitcode, out["split"])], None)],
                }  # fmt: skip
                order = WAYS[(round_ + i) % 3 :] + WAYS[: (round_ + i) % 3]
                for way in order:
                    cpu[way] += cpu_of(ways[way], cwd)
                differed += sum(not filecmp.cmp(out["plain"], out[way], shallow=False) for way in ("plugin", "split"))
    print(f"{len(commands)} compiles of {options.build}, {options.rounds} rounds, CPU (user + system):")
    for way in WAYS:
        print(f"  {way:7s} {cpu[way]:7.2f} s  {cpu[way] / cpu['plain']:.3f}x plain")
    print(f"objects differing from plain clang's: {differed}")
    return 1 if differed else 0


if __name__ == "__main__":
    sys.exit(main())
