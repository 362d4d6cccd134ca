"""Whether a refused call site's callee stays in the object anyway: callee linkage, read from the compile itself.

Why: inlining for size pays where the inlined callee's last copy can then go (``internal``, ``linkonce_odr``), and
is pure growth where the body stays whatever happens (an ``external`` function of this translation unit). Most of
what the shipped rule saves is functions that go (docs/experiments/2026-11-29-where-the-bytes-go.md), and its
losses sit at the second kind. clang's channel sends numbers, never the callee's name or linkage.

clang says the name on stderr, though. Under ``-Rpass-missed=^inline$`` its own heuristic, which the channel's
``inlining_default`` feature runs at every decision, reports each call site it refuses (``'callee' not inlined
into 'caller' because too costly to inline``) *before* the channel asks the host: one line per refused decision,
none for a decision it would inline (checked over 3 500 decisions, and by tests/test_callee_linkage.py). So the
policy's own compile names the callee of every decision where an extra inline is possible, in time:

1. the module, before any pass, says which of its functions stay whatever is inlined: its ``external``
   definitions (a non-LTO compile changes no external definition's linkage), and the functions whose address is
   taken, by a vtable's slot or a stored callback. Weak, local and ``available_externally`` functions that are
   only called can go. optgym's pass plugin writes that set from inside clang (:mod:`optgym.toolchain.pass_plugin`),
   in training and ``optgym evaluate`` as in a served build. A machine without the plugin reads the external
   definitions alone from the bitcode's symbol table (``llvm-nm``'s ``T``), and caches keep the two apart
   (:func:`linkage_version`). Why the addresses: a virtual destructor is ``linkonce_odr`` and has one call (from
   the deleting destructor), so it looked like a callee whose last call deletes it, but its vtable slot keeps it;
   inlining that call only copied it, and made small C++ objects with vtables 2 % larger;
2. at each decision :meth:`CalleeLinkage.survives` reads what clang wrote to stderr since the last one. A
   refusal names this call site's callee; no refusal means clang inlines the site itself, and the site reads as
   surviving (no deleting inline to add there; an allowance keeps clang's yes anyway).

Before this, a first compile of each module with clang's decisions learned the same from its optimization
record: LLVM's passes twice per served C++ compile (graphite2's build 1.78× plain clang's CPU, against 1.16× for
the rule), and lookups by features that missed once a policy had departed from clang.
The derived inputs ``callee_survives`` and ``deletes:K`` (:mod:`optgym.problems.inputs`) hand it to a policy.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Collection
from pathlib import Path

from optgym.toolchain.bitcode_symbols import external_functions
from optgym.toolchain.llvm import Toolchain, ToolchainError
from optgym.toolchain.pass_plugin import surviving_plugin

#: Added to a compile whose policy reads the linkage: clang names each call site its heuristic refuses, on stderr,
#: with no source excerpt under the line (a served build's diagnostics are filtered of these lines).
REFUSAL_FLAGS = ("-Rpass-missed=^inline$", "-fno-caret-diagnostics")
#: ``llvm-nm`` kinds of a defined function whose body stays in the object whatever is inlined: global text.
SURVIVING_SYMBOLS = frozenset("T")
#: Linkage version: part of every cache key of a result a linkage-reading policy produced (:func:`linkage_version`).
LINKAGE_VERSION = "refusals-1"
#: Added where the pass plugin names the surviving functions: they include those whose address is taken.
ADDRESSED = "addressed"

_ANSI = re.compile(rb"\x1b\[[0-9;]*m")
_INCLUDE_STACK = re.compile(rb"In file included from ")
_REFUSAL = re.compile(rb"'([^']*)' not inlined into '[^']*' because .*\[-Rpass-missed=inline\]")


def refused_callee(line: bytes) -> str | None:
    """The callee a line of clang's stderr names as refused by its inliner, or ``None`` for any other line."""
    found = _REFUSAL.search(_ANSI.sub(b"", line))
    return found.group(1).decode(errors="replace") if found else None


def without_refusals(text: bytes) -> bytes:
    """``text`` (clang's stderr) without the refusal lines :data:`REFUSAL_FLAGS` asked for, nor the include stack
    (``In file included from …``) clang prints above one about a call in a header: what the build sees."""
    kept: list[bytes] = []
    stack: list[bytes] = []  # include-stack lines, whose diagnostic comes next
    for line in text.splitlines(keepends=True):
        if _INCLUDE_STACK.match(_ANSI.sub(b"", line)):
            stack.append(line)
            continue
        if refused_callee(line) is None:
            kept += stack
            kept.append(line)
        stack = []
    return b"".join(kept + stack)


class CalleeLinkage:
    """The callee linkage of one running compile, read decision by decision (see the module docstring).

    ``surviving`` is the module's global text symbols, or a function that reads them at the first decision (when
    the compile writes them itself: :mod:`optgym.toolchain.pass_plugin`); ``None`` where they could not be read:
    every call site then reads as surviving, so a policy adds no inline it would add for a callee that goes.
    ``stderr_fd`` is the file the compile writes its stderr to, read from ``offset`` on with ``pread`` (the
    compile's own file position, which it shares, never moves). ``why`` says why nothing is known, where the
    caller knows better."""

    def __init__(
        self,
        surviving: Collection[str] | Callable[[], Collection[str] | None] | None,
        stderr_fd: int | None,
        offset: int = 0,
        why: str | None = None,
    ) -> None:
        self._read_surviving = surviving if callable(surviving) else None
        self._surviving = None if surviving is None or callable(surviving) else frozenset(surviving)
        self._why = why
        self._fd, self._offset, self._partial = stderr_fd, offset, b""
        self._decision: object | None = None  # the observation last asked about, and its answer
        self._answer = True
        self.callee: str | None = None  # the callee clang named for that decision (``None``: it inlines the site)

    @property
    def surviving(self) -> frozenset[str] | None:
        """The module's functions that stay whatever is inlined, ``None`` where they could not be read."""
        if self._read_surviving is not None:
            read, self._read_surviving = self._read_surviving(), None
            self._surviving = None if read is None else frozenset(read)
        return self._surviving

    @property
    def status(self) -> str:
        """``ok``, or why every callee reads as surviving."""
        return self._why or ("ok" if self.surviving is not None else "the module's symbols could not be read")

    def survives(self, decision: object) -> bool:
        """Whether the callee of ``decision`` (the pending observation) stays in the object whatever is inlined.
        Asked again about the same decision, it answers the same."""
        if decision is self._decision:
            return self._answer
        self._decision = decision
        callee = self.callee = self._latest_refusal()
        self._answer = self.surviving is None or callee is None or callee in self.surviving
        return self._answer

    def _latest_refusal(self) -> str | None:
        """The callee of the last refusal clang wrote since the previous decision, if any."""
        if self._fd is None:
            return None
        text = self._partial
        while chunk := os.pread(self._fd, 1 << 16, self._offset):
            self._offset += len(chunk)
            text += chunk
        lines = text.split(b"\n")
        self._partial = lines.pop()  # clang writes a line before it asks, but never assume a whole read
        callee = None
        for line in lines:
            callee = refused_callee(line) or callee
        return callee


def defined_symbols(obj: Path, llvm_nm: str) -> dict[str, str]:
    """Each symbol defined in ``obj`` (an object or bitcode) and its ``llvm-nm`` kind (``T`` global text, ``W``
    weak, ``t`` local …)."""
    out = subprocess.run([llvm_nm, "--defined-only", str(obj)], capture_output=True, text=True, check=True).stdout
    return {parts[2]: parts[1] for parts in map(str.split, out.splitlines()) if len(parts) == 3}


def linkage_version(toolchain: Toolchain) -> str:
    """What decides the callee linkage a policy reads on this machine, for cache keys: the pass plugin counts a
    function whose address is taken as staying (:mod:`optgym.toolchain.pass_plugin`); the bitcode's symbol table,
    read where there is no plugin, knows only the external definitions."""
    return f"{LINKAGE_VERSION}+{ADDRESSED}" if surviving_plugin(toolchain) is not None else LINKAGE_VERSION


def linkage_key(reads_linkage: bool, toolchain: Toolchain) -> list[str]:
    """The cache-key part of a result a policy produced: :func:`linkage_version` where it reads the linkage."""
    return [linkage_version(toolchain)] if reads_linkage else []


def surviving_functions(module: Path, toolchain: Toolchain) -> frozenset[str] | None:
    """The functions of ``module`` (bitcode or an object) whose bodies stay whatever a compile inlines: global text
    symbols. Read from bitcode's own symbol table where it has one (:mod:`optgym.toolchain.bitcode_symbols`, no
    process started), else by ``toolchain``'s ``llvm-nm``; ``None`` when neither can read it."""
    if (names := external_functions(module)) is not None:
        return names
    try:
        kinds = defined_symbols(module, str(toolchain.tool("llvm-nm")))
    except (OSError, subprocess.CalledProcessError, ToolchainError):
        return None
    return frozenset(name for name, kind in kinds.items() if kind in SURVIVING_SYMBOLS)


__all__ = [
    "LINKAGE_VERSION",
    "REFUSAL_FLAGS",
    "CalleeLinkage",
    "defined_symbols",
    "linkage_key",
    "linkage_version",
    "refused_callee",
    "surviving_functions",
    "without_refusals",
]
