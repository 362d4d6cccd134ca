"""The front end once: how a served compile reads its callees' linkage from the bitcode its own front end writes.

A policy that reads ``callee_survives`` needs to know which of the module's functions stay whatever is inlined
(:mod:`optgym.rollout.linkage`): its ``external`` definitions, which unoptimized bitcode lists. So the server runs
the front end once, into unoptimized bitcode (``-emit-llvm -Xclang -disable-llvm-passes``), reads that file's
symbols, and the policy's compile writes the build's object from the same bitcode, naming the callees clang
refuses as it goes. (It once ran a whole first compile of the bitcode with clang's decisions; splitting the front
end off kept that from parsing the source twice.)

From that bitcode clang writes an object byte-identical to the one it compiles from source (checked with
``-g``, ``-fPIC`` and ``-MD`` in tests/test_front_end.py), so the split changes nothing but the time.

Everything else the build reads comes from the front end's run, the one that sees the source: its
diagnostics and its dependency file. clang names the dependency file and its target after ``-o``, which the
front end's run redirects to the bitcode, so that run is given the build's names explicitly (``-MF``, ``-MQ``)
where the build leaves them implicit. The policy's compile gets no dependency options, no ``-x`` and no source;
the preprocessor options it still carries are unused for bitcode, and that warning is switched off (a build
with ``-Werror`` would otherwise fail on it).

Commands whose meaning is not all in the bitcode, or that tie other outputs to the object, are not split
(:func:`unsplittable` says why): sanitizers, profiles and coverage act inside LLVM's passes on options the
front end also reads, and ``-save-temps`` and the like name files after the output.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from optgym.serve.guard import reference_args, unguardable
from optgym_cc import TAKES_VALUE, operands

#: The options that stop the front end before LLVM's passes and have it write bitcode.
FRONT_END_ONLY = ("-emit-llvm", "-Xclang", "-disable-llvm-passes")
#: Added to the compiles that read the bitcode: the source's preprocessor and language options are unused there.
QUIET_UNUSED = "-Wno-unused-command-line-argument"
#: Options (or prefixes) whose effect is not all in the front end's bitcode: such commands are not split.
NOT_SPLIT = ("-fsanitize", "-fprofile", "-fcoverage", "--coverage", "-ftest-coverage", "-fxray", "-fembed-bitcode",
             "-fmodules", "-fcs-profile", "-fpseudo-probe", "-fsave-optimization-record",
             "-foptimization-record")  # fmt: skip


def unsplittable(args: Sequence[str]) -> str | None:
    """Why the compile ``args`` (driver excluded) cannot run its front end apart from its compile, or ``None``."""
    if "-c" not in args:
        return "not a -c compile"
    if (why := unguardable(args)) is not None:
        return why
    inputs, _ = operands(list(args))
    if len(inputs) != 1:
        return f"{len(inputs)} inputs, not one source"
    for arg in args:
        if arg.startswith(NOT_SPLIT):
            return f"{arg} acts inside LLVM's passes"
        if arg.startswith("--output"):  # the object's name in a form the rewriting below does not read
            return f"{arg}: only -o names the object of a split compile"
    return None


def object_as_written(args: Sequence[str]) -> str:
    """The object's name as the command gives it (the last ``-o``), else clang's default: the source's stem with
    ``.o``, in the working directory. clang names an implicit dependency file and target after it."""
    inputs, output = operands(list(args))
    return output if output is not None else os.path.splitext(os.path.basename(inputs[0]))[0] + ".o"


def _writes_dependencies(args: Sequence[str]) -> tuple[bool, bool, bool]:
    """Whether ``args`` ask for a dependency file, name it, and name its target."""
    wants = named = targeted = False
    for arg in args:
        if arg in ("-MD", "-MMD") or arg.startswith(("-Wp,-MD,", "-Wp,-MMD,")):
            wants = True
            named = named or arg.startswith("-Wp,")
        named = named or arg.startswith("-MF")
        targeted = targeted or arg.startswith(("-MT", "-MQ"))
    return wants, named, targeted


def front_end_args(args: Sequence[str], bitcode: str) -> list[str]:
    """The build's command (driver excluded) stopped after the front end, writing unoptimized ``bitcode``, with
    the dependency file and its target the build's own would have had."""
    wants, named, targeted = _writes_dependencies(args)
    written = object_as_written(args)
    pinned: list[str] = []
    if wants and not named:
        pinned += ["-MF", os.path.splitext(written)[0] + ".d"]
    if wants and not targeted:
        pinned += ["-MQ", written]  # -MQ: quoted for make, as clang quotes its implicit target
    return [*pinned, *FRONT_END_ONLY, *reference_args(args, bitcode, dependencies=True)]


def from_bitcode_args(args: Sequence[str], bitcode: str, output: str) -> list[str]:
    """The build's command (driver excluded) compiling ``bitcode`` into ``output`` instead of its source: no
    source, no ``-x``, no dependency options (:func:`reference_args`), unused-argument warnings off."""
    kept: list[str] = []
    option: str | None = None
    for arg in args:
        if option is not None:
            if option != "-x":
                kept += [option, arg]
            option = None
        elif arg in TAKES_VALUE:
            option = arg
        elif arg.startswith("-x") and len(arg) > 2:  # -xc++ …
            continue
        elif arg.startswith("-"):
            kept.append(arg)
        # else: the source, which the bitcode replaces
    return [*reference_args(kept, output), QUIET_UNUSED, "-x", "ir", bitcode]


__all__ = ["from_bitcode_args", "front_end_args", "object_as_written", "unsplittable"]
