"""``OPTGYM_GUARD=1``: never an object larger than clang's own, at the price of a second compile.

A learned size policy wins in total and loses on a few modules (the shipped one: 2 of 141 held-out C++
modules more than 1 % worse). A build that must never grow an object can pay one more compile per
object instead: beside the policy's compile the server runs clang's plain compile of the same command
into a hidden sibling of the output, compares the two objects' Berkeley ``text`` (the size the policy
was trained on), and keeps the smaller. Every object of the build is then at most clang's, and the
build's total is the per-module minimum of policy and clang: where the policy loses nothing is lost.
The reference starts at the policy's first answer that differs from clang's: a compile without one is
clang's own already.

Why the policy's compile keeps the build's own command line and the reference is the one redirected:
everything the build reads besides the object — dependency files (``-MD``), diagnostics, ``-v`` output
— comes from the policy's compile exactly as without the guard. The reference writes only its object
(dependency flags removed; its stdout and stderr go nowhere), and replaces the output only when smaller,
with one ``rename`` in the output's own directory, so a reader never sees a partial object.

``OPTGYM_GUARD_BELOW=N`` bounds the price: only an object whose policy text comes out under ``N`` bytes gets the
second compile, run after the policy's (its size is known only then). A policy's losses of more than 1 % are
mostly in small objects — there a few bytes are a large share and there is little to win — while its bytes
are saved in large ones; and a small object is quick to compile again. (``OPTGYM_GUARD=1`` guards every object
whatever ``N``.)

Commands with other outputs tied to the object are compiled unguarded (``unguardable`` says why):
``-gsplit-dwarf`` (a ``.dwo`` that must match its object), ``-save-temps`` and ``-ftime-trace`` (named
after the output), recorded command lines (they would name the reference's temporary file), and LTO
compile steps (``OPTGYM_SERVE_LTO=1``: bitcode has no code size until the link).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from typing import Any

from optgym.toolchain.process import kill_group, pid_alive, spawn, wait_exit
from optgym.toolchain.sizes import ElfError, object_sizes
from optgym_cc import joined_output, lto, operands

#: Dependency-file options, dropped from the reference so it writes nothing but its object (those with a value
#: also in their joined form, ``-MFfile``).
DEPENDENCY_FLAGS = frozenset(["-MD", "-MMD", "-MP", "-MG", "-MV"])
DEPENDENCY_WITH_VALUE = ("-MF", "-MT", "-MQ", "-MJ", "--serialize-diagnostics")
#: The reference's file is ``.<object>.<server pid>.<random>`` + this, beside the object.
SUFFIX = ".optgym-guard"
#: Options (or prefixes) that tie another output to the object's name: such compiles go unguarded.
UNGUARDABLE = ("-gsplit-dwarf", "-save-temps", "-ftime-trace", "-frecord-command-line", "-grecord-command-line",
               "-frecord-gcc-switches", "-grecord-gcc-switches")  # fmt: skip


def remove_orphans(directory: str, name: str) -> None:
    """Remove the reference files a killed server left beside ``name``: a server killed with SIGKILL runs no
    cleanup, but its clang dies with it (``spawn``), and the file names that server's pid, so the next
    guarded compile of the same object removes every such file whose server is gone."""
    prefix = f".{name}."
    with contextlib.suppress(OSError), os.scandir(directory or ".") as entries:
        for entry in entries:
            if not (entry.name.startswith(prefix) and entry.name.endswith(SUFFIX)):
                continue
            pid = entry.name[len(prefix) :].split(".", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)


def sibling(output: str) -> str:
    """A new empty hidden file beside ``output`` for another compile of the same object: beside it, so the object
    that wins replaces ``output`` with one ``rename``. ``OSError`` when the directory takes no file. (Callers
    remove a killed server's files first, once per object: :func:`remove_orphans` scans the directory.)"""
    directory, name = os.path.split(output)
    fd, path = tempfile.mkstemp(dir=directory, prefix=f".{name}.{os.getpid()}.", suffix=SUFFIX)
    os.close(fd)
    return path


def keep_smaller(output: str, other: str) -> tuple[int, int]:
    """The Berkeley ``text + data`` of ``output`` and of ``other``, a compile of the same object; ``other``
    replaces ``output`` only when strictly smaller (a tie keeps the build's own compile). ``text + data``, not
    ``text``: a pass option that moves constants into writable sections (global merge of constants) shrinks
    ``text`` and not the program (:mod:`optgym.toolchain.sizes`). ``OSError``/``ElfError`` when either is
    unreadable."""
    mine, theirs = object_sizes(output).image_bytes, object_sizes(other).image_bytes
    if theirs < mine:
        os.replace(other, output)
    return mine, theirs


def output_path(args: Sequence[str], cwd: str) -> str:
    """The object a ``-c`` compile writes: the last ``-o``, else the source's basename with ``.o`` in ``cwd``
    (clang's rule). ``args`` excludes the driver; the caller has checked it is one source to one object."""
    inputs, output = operands(list(args))
    if output is None:
        output = os.path.splitext(os.path.basename(inputs[0] if inputs else "a"))[0] + ".o"
    return os.path.join(cwd, output)


def link_linker(args: Sequence[str], driver: str) -> str | None:
    """The lld a ThinLTO link's driver runs: ``--ld-path``, else ``-fuse-ld`` as a path, else ``ld.lld`` beside the
    driver (where clang looks first) or on ``PATH``; ``None`` if there is none."""
    ld_path = use = None
    for arg in args:
        if arg.startswith("--ld-path="):
            ld_path = arg.split("=", 1)[1]
        elif arg.startswith("-fuse-ld="):
            use = arg.split("=", 1)[1]
    if ld_path or (use and os.path.isabs(use)):
        return shutil.which(ld_path or use or "")
    beside = os.path.join(os.path.dirname(driver), "ld.lld")
    return beside if os.access(beside, os.X_OK) else shutil.which("ld.lld")


def link_output(args: Sequence[str], cwd: str) -> str:
    """The file a link writes: the last ``-o``, else ``a.out`` in ``cwd``."""
    return os.path.join(cwd, operands(list(args))[1] or "a.out")


def remove_partial_output(output: str, since: float) -> None:
    """Remove the temporary file a compile killed before it finished left instead of ``output``: clang writes
    ``<stem>-<8 hex digits><ext>.tmp`` beside it and renames it at the end (LLVM's unique-file model), so a
    compile the server stops (a refused answer, a timeout, a launcher gone) leaves one behind. Only files made
    since ``since`` (the compile's start, ``time.time()``) go: an older one is not that compile's."""
    stem, ext = os.path.splitext(os.path.basename(output))
    _remove_made_since(output, since, stem + "-", 8, ext + ".tmp")


def remove_partial_link(output: str, since: float) -> None:
    """The same for a link stopped before it finished: lld writes ``<output>.tmp<7 hex digits>`` and renames it."""
    _remove_made_since(output, since, os.path.basename(output) + ".tmp", 7, "")


def _remove_made_since(output: str, since: float, prefix: str, digits: int, suffix: str) -> None:
    """Remove the files beside ``output`` named ``prefix``, ``digits`` hex digits, ``suffix``, made since ``since``."""
    with contextlib.suppress(OSError), os.scandir(os.path.dirname(output) or ".") as entries:
        for entry in entries:
            name = entry.name
            middle = name[len(prefix) : len(name) - len(suffix)]
            if not (name.startswith(prefix) and name.endswith(suffix) and len(middle) == digits and _is_hex(middle)):
                continue
            with contextlib.suppress(OSError):
                if entry.stat().st_mtime >= since - 1:
                    os.unlink(entry.path)


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


def unguardable(args: Sequence[str]) -> str | None:
    """Why this compile cannot be guarded, or ``None``."""
    if mode := lto(list(args)):
        return f"{mode} writes bitcode, whose code size the link decides"
    for arg in args:
        if arg.startswith(UNGUARDABLE):
            return f"{arg} ties another output to the object"
        if arg.startswith("-Wp,") and any(part not in ("-MD", "-MMD") for part in arg.split(",")[1::2]):
            return f"{arg} passes the preprocessor more than a dependency file"
    return None


def reference_args(args: Sequence[str], output: str, dependencies: bool = False) -> list[str]:
    """``args`` writing ``output`` instead, without dependency-file options (the policy's compile writes those)
    unless ``dependencies`` keeps them."""
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == "-o" or (not dependencies and arg in DEPENDENCY_WITH_VALUE):
            skip = True
        elif joined_output(arg) or (
            not dependencies and (arg in DEPENDENCY_FLAGS or arg.startswith(("-Wp,", *DEPENDENCY_WITH_VALUE)))
        ):
            continue
        else:
            kept.append(arg)
    return [*kept, "-o", output]


def guard_below(env: dict[str, str], default: int | None = None) -> int | None:
    """The bound for this compile: ``OPTGYM_GUARD_BELOW`` (``0``: none), else ``default``; ``None`` with
    ``OPTGYM_GUARD=1`` (which guards every object). A value that is not a byte count is an error the build is
    told about."""
    value = env.get("OPTGYM_GUARD_BELOW", "").strip()
    if env.get("OPTGYM_GUARD") == "1":
        return None
    if not value:
        return default
    if not value.isdigit():
        raise ValueError(f"OPTGYM_GUARD_BELOW={value!r} is not a number of bytes")
    return int(value) or None  # 0: no object is under it


class Guard:
    """The reference compile of one guarded request: started at the policy's first departure from clang's
    decisions (with ``below``, after the policy's compile, and only for an object under ``below`` bytes of
    text), then the choice of object.

    A compile in which the policy answered every decision as clang would is byte-identical to clang's own
    (the channel changes nothing else), so it needs no reference: only compiles where the policy decided
    differently pay the second compile — for the shipped inliner, no C compile at all.
    """

    def __init__(self, argv: Sequence[str], cwd: str, env: dict[str, str], below: int | None = None) -> None:
        """Nothing runs yet; ``argv`` is the build's command, driver first."""
        self.argv, self.cwd, self.env, self.below = list(argv), cwd, env, below
        self.args = self.argv[1:]
        self.output = output_path(self.args, cwd)
        self.why_not = unguardable(self.args)
        self.departed = False  # the policy answered a decision differently from clang
        self.reference: str | None = None  # the hidden sibling of ``output`` the reference compile writes
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        """At the policy's first departure: spawn clang's plain compile beside the policy's (once) — with
        ``below``, only note it, since the object's size is not known yet. Not at all for an unguardable
        command, or when the output's directory takes no file (clang will say why, not us)."""
        self.departed = True
        if self.why_not is not None or self.reference is not None or self.below is not None:
            return
        remove_orphans(*os.path.split(self.output))
        try:
            self.reference = sibling(self.output)
        except OSError as e:
            self.why_not = f"no temporary file beside the output: {e}"
            return
        try:
            self.proc = spawn([self.argv[0], *reference_args(self.args, self.reference)],
                              stderr=subprocess.DEVNULL, cwd=self.cwd, env=self.env)  # fmt: skip
        except OSError as e:
            self.why_not = f"clang's own compile did not start: {e}"

    def finish(self, policy_returncode: int | None, timeout: float) -> dict[str, Any]:
        """Wait for the reference and keep the smaller object (the policy's on a tie or a failed reference);
        what was kept, for the reply."""
        if policy_returncode != 0:
            return {}
        if self.below is not None and self.departed and self.why_not is None:
            try:
                policy = object_sizes(self.output).text_bytes
            except (OSError, ElfError) as e:
                return {"guard": "policy", "guard_detail": f"sizes unreadable: {e}"}
            if policy >= self.below:
                return {"guard": "policy", "guard_detail": f"{policy} B of text, not under {self.below}"}
            self.below = None  # small: guard it as any object
            self.start()
        if self.proc is None or self.reference is None:
            return {"guard": "policy", "guard_detail": self.why_not or "every decision was clang's own"}
        if wait_exit(self.proc, timeout) != 0:
            return {"guard": "policy", "guard_detail": "clang's own compile failed or timed out"}
        try:
            policy, reference = keep_smaller(self.output, self.reference)
        except (OSError, ElfError) as e:
            return {"guard": "policy", "guard_detail": f"sizes unreadable: {e}"}
        return {"guard": "clang" if reference < policy else "policy", "policy_image": policy, "clang_image": reference}

    def close(self) -> None:
        """Kill the reference if it still runs and remove its file: safe on every path, twice too."""
        if self.proc is not None:
            kill_group(self.proc)
        if self.reference is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.reference)
