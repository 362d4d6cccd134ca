"""Which language a compile is: from a ``-cc1`` command line (a corpus module) or a driver's (a build).

One place for it because two layers need the same answer: the corpus layer (``corpus info``'s C/C++
counts, search's C++-first order) reads a module's recorded ``-cc1`` arguments, and a policy that
decides differently for C and C++ (the ``cxx`` derived input, :mod:`optgym.problems.inputs`) must
see the same language inside a training rollout as inside a served build, where only the driver's
arguments are known. Standard library only: the policy server imports it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

C_SUFFIXES = (".c",)
CXX_SUFFIXES = (".cc", ".cpp", ".cxx", ".c++", ".C", ".cp", ".CPP")
OBJC_SUFFIXES = (".m", ".mm")
#: ``-x`` values, by the language they name (``-cpp-output``/``-header`` variants included).
X_LANGUAGE = {"c": "C", "c++": "C++", "objective-c": "ObjC", "objective-c++": "ObjC++", "cuda": "CUDA"}
CXX_LANGUAGES = ("C++", "ObjC++")


def is_cxx(language: str | None) -> int | None:
    """The ``cxx`` derived input of a module in ``language`` (``None``: unknown)."""
    return None if language is None else int(language in CXX_LANGUAGES)


def _from_x(value: str) -> str:
    base = value.removesuffix("-cpp-output").removesuffix("-header")
    return X_LANGUAGE.get(base, value)


def _from_suffix(name: str) -> str | None:
    if name.endswith(CXX_SUFFIXES):
        return "C++"
    if name.endswith(".mm"):
        return "ObjC++"
    if name.endswith(OBJC_SUFFIXES):
        return "ObjC"
    if name.endswith(C_SUFFIXES):
        return "C"
    return None


def language(args: Sequence[str]) -> str:
    """C, C++, ObjC, ObjC++ … of a ``-cc1`` command line: its ``-x``, else its ``-main-file-name``."""
    for i, arg in enumerate(args[:-1]):
        if arg == "-x":
            return _from_x(args[i + 1])
    for i, arg in enumerate(args[:-1]):
        if arg == "-main-file-name" and (found := _from_suffix(args[i + 1])):
            return found
    return "other"


def family(language: str) -> str:
    """ "C++" for C++ and ObjC++, "C" for everything else: the split every per-language figure and rule uses."""
    return "C++" if language in CXX_LANGUAGES else "C"


def driver_language(argv: Sequence[str]) -> str:
    """The language of a one-source driver compile (``clang++ -Oz -c f.cc``), as clang decides it: the
    last ``-x`` before the source, else the source's suffix (``clang`` compiles ``f.cc`` as C++, and
    ``clang++`` compiles ``f.c`` as C++ too), else the driver's name."""
    if not argv:
        return "other"
    cxx_driver = os.path.basename(argv[0]).endswith("++")
    current: str | None = None
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "-x" or (arg.startswith("-x") and len(arg) > 2):
            value = argv[i + 1] if arg == "-x" and i + 1 < len(argv) else arg[2:]
            current = None if value == "none" else _from_x(value)
            i += 2 if arg == "-x" else 1
            continue
        if not arg.startswith("-") and (found := _from_suffix(arg)) is not None:
            if current:
                return current
            return "C++" if found == "C" and cxx_driver else found  # clang++ compiles f.c as C++
        i += 1
    return "C++" if cxx_driver else "C"


__all__ = [
    "CXX_LANGUAGES",
    "CXX_SUFFIXES",
    "C_SUFFIXES",
    "OBJC_SUFFIXES",
    "driver_language",
    "family",
    "is_cxx",
    "language",
]
