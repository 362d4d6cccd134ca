"""Run a bare-metal Cortex-M program on this machine: QEMU's system emulator, with ARM semihosting.

    python -m optgym.corpus.qemu_system --machine mps2-an386 --cpu cortex-m4 [--timeout 300] PROGRAM [ARG…]

A Linux target's programs run under qemu-user (:meth:`optgym.corpus.target.Target.emulator`). A bare-metal one
has no OS to ask for a file, an argument or an exit, so its programs (linked by optgym against picolibc's
``crt0-semihost.o`` and ``libsemihost``: :class:`optgym.corpus.target.BareMetalRuntime`) ask the debugger
instead, through semihosting, and QEMU answers as the debugger would: the program's arguments, files of this
machine (``fopen`` of a path relative to the working directory), its exit code as QEMU's, and its standard
streams: optgym links programs with its own stdin, stdout and stderr (``baremetal/semihost-stdio.c``), which
open QEMU's own ``/dev/stdin``, ``/dev/stdout`` and ``/dev/stderr``. This runner gives QEMU pipes for the two
outputs and copies them to its own: a file opened again by path writes at its end, and would otherwise
overwrite, or be overwritten by, whatever shares our stdout with it (a log the program's output goes to). So a
CMake or Meson build's tests run unchanged (``CMAKE_CROSSCOMPILING_EMULATOR``, Meson's ``exe_wrapper``), and
``optgym compare-build --test`` compares firmware whose test suite passed.

The machines are ARM's MPS2 boards, whose memory holds optgym's generic Cortex-M map (code at 0, RAM at
``0x20000000``: ``baremetal/cortex-m.ld``); :data:`MACHINES` picks one by CPU. What semihosting cannot carry is
refused here, clearly: an argument with a space (QEMU splits its command line on spaces). A program linked
without optgym's streams writes to libsemihost's one console, which QEMU prints on our stderr, and its
stdin never ends; a run stops at ``--timeout`` with exit 124, as ``timeout(1)`` does.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import threading
from typing import IO

QEMU = "qemu-system-arm"
#: An MPS2 board per Cortex-M CPU (its 4 MiB of RAM at 0 and at 0x20000000 fit optgym's linker script). The
#: Cortex-M33's board (AN505) maps its memory for TrustZone elsewhere, and no board here emulates an M0 or M0+.
MACHINES = {
    "cortex-m3": "mps2-an385",
    "cortex-m4": "mps2-an386",
    "cortex-m7": "mps2-an500",
}
#: The CPU of a triple's architecture when the build names none (clang's own default for it).
ARCH_CPUS = {"thumbv7m": "cortex-m3", "thumbv7em": "cortex-m4"}
DEFAULT_TIMEOUT = 300.0
TIMED_OUT = 124


def machine_for(arch: str, flags: list[str] | tuple[str, ...]) -> tuple[str, str] | None:
    """``(machine, cpu)`` for a Cortex-M target (its triple's architecture and its flags' ``-mcpu``), or
    ``None`` when no MPS2 board emulates that CPU (a Cortex-M0, say) or QEMU is not installed."""
    cpus = [f.removeprefix("-mcpu=") for f in flags if f.startswith("-mcpu=")]
    cpu = (cpus[-1] if cpus else ARCH_CPUS.get(arch, "")).split("+")[0]
    if cpu not in MACHINES or shutil.which(QEMU) is None:
        return None
    return MACHINES[cpu], cpu


def command(machine: str, cpu: str, program: str, args: list[str]) -> list[str]:
    """QEMU's command line running ``program`` with ``args``: semihosting on (its console on QEMU's stderr), no
    display, no serial port, no monitor. Raises ``ValueError`` for an argument semihosting cannot pass."""
    if bad := [a for a in args if any(c.isspace() for c in a)]:
        raise ValueError(f"semihosting splits arguments on spaces, so it cannot pass {bad[0]!r}")
    # one "arg=" per argument, commas doubled (QEMU's option syntax); picolibc's start file names argv[0] itself,
    # and with no "arg=" at all QEMU would pass the kernel's file name as an argument: an empty one then
    config = ",".join(["enable=on", "target=native", *(f"arg={a.replace(',', ',,')}" for a in args or [""])])
    return [QEMU, "-M", machine, "-cpu", cpu, "-display", "none", "-serial", "none", "-monitor", "none",
            "-semihosting-config", config, "-kernel", program]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--machine", required=True, help=f"an MPS2 board ({', '.join(sorted(MACHINES.values()))})")
    parser.add_argument("--cpu", required=True)
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds; then exit 124")
    parser.add_argument("program")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    opts = parser.parse_args(argv)
    try:
        cmd = command(opts.machine, opts.cpu, opts.program, opts.args)
    except ValueError as e:
        print(f"optgym qemu_system: {e}", file=sys.stderr)
        return 2
    if shutil.which(QEMU) is None:
        print(f"optgym qemu_system: {QEMU} is not installed (Debian: apt-get install qemu-system-arm)", file=sys.stderr)
        return 127
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    relays = [threading.Thread(target=_relay, args=pair, daemon=True)
              for pair in ((proc.stdout, sys.stdout.buffer), (proc.stderr, sys.stderr.buffer))]  # fmt: skip
    for relay in relays:
        relay.start()
    try:
        code = proc.wait(timeout=opts.timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        code = None
    for relay in relays:
        relay.join()
    if code is None:
        print(f"optgym qemu_system: {opts.program} still ran after {opts.timeout:g} s", file=sys.stderr)
        return TIMED_OUT
    return code


def _relay(source: IO[bytes], sink: IO[bytes]) -> None:
    """Copy one of QEMU's outputs to ours as it comes (a test's log shows how far a hung program got)."""
    while chunk := source.read1(65536):  # type: ignore[attr-defined]
        sink.write(chunk)
        sink.flush()


if __name__ == "__main__":
    raise SystemExit(main())
