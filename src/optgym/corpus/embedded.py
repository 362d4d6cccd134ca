"""Bitcode and command line embedded in objects built with ``-Xclang -fembed-bitcode=all``.

The real-build path goes through mlgo-utils' ``extract_ir``; this is the direct route for a handful
of objects (tests, the demo's own programs): ``llvm-objcopy --dump-section`` of ``.llvmbc`` and
``.llvmcmd``.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from optgym.corpus.corpus import Corpus, write_corpus
from optgym.corpus.target import Target
from optgym.errors import CorpusError
from optgym.toolchain.llvm import Toolchain


def extract_object(toolchain: Toolchain, obj: Path) -> tuple[bytes, list[str]]:
    """(bitcode, cc1 args) embedded in one object file."""
    with tempfile.TemporaryDirectory(prefix="optgym-extract-") as tmp:
        bc, cmd = Path(tmp) / "m.bc", Path(tmp) / "m.cmd"
        proc = subprocess.run(
            [
                str(toolchain.tool("llvm-objcopy")),
                f"--dump-section=.llvmbc={bc}",
                f"--dump-section=.llvmcmd={cmd}",
                str(obj),
                str(Path(tmp) / "stripped.o"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if proc.returncode != 0:
            raise CorpusError(
                f"{obj}: no embedded bitcode (was it built with -Xclang -fembed-bitcode=all?): {proc.stderr.strip()}"
            )
        args = [a.decode() for a in cmd.read_bytes().split(b"\0") if a]
        return bc.read_bytes(), args


def corpus_from_objects(toolchain: Toolchain, objects: Mapping[str, Path], root: Path, **meta) -> Corpus:
    """A corpus whose module ``name`` is the bitcode embedded in ``objects[name]``."""
    return write_corpus(root, ((name, *extract_object(toolchain, obj)) for name, obj in objects.items()), **meta)


CXX_SUFFIXES = (".cc", ".cpp", ".cxx", ".C")


def compile_embedded(toolchain: Toolchain, source: Path, obj: Path, flags: tuple[str, ...] = ("-Oz",)) -> Path:
    """Compile one C/C++ source to an object carrying its bitcode and cc1 command."""
    driver = toolchain.tool("clang++") if source.suffix in CXX_SUFFIXES else toolchain.clang
    proc = subprocess.run(
        [str(driver), *flags, "-c", "-Xclang", "-fembed-bitcode=all", str(source), "-o", str(obj)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        raise CorpusError(f"{source}: compile failed:\n{proc.stderr[-4000:]}")
    return obj


def corpus_from_sources(
    toolchain: Toolchain,
    sources: Mapping[str, Path],
    root: Path,
    flags: tuple[str, ...] = ("-Oz",),
    target: str | None = None,
    target_flags: Sequence[str] = (),
    **meta,
) -> Corpus:
    """A corpus of the given sources (module name → path), each compiled with ``flags`` — for ``target`` with
    ``target_flags`` (each one argument: ``("-mcpu=cortex-m4", "-mthumb")``) when given, recorded in the
    provenance as ``optgym corpus build`` records it."""
    if target:
        chosen = Target(target, tuple(target_flags))
        flags = (*flags, *chosen.compile_flags)
        meta["provenance"] = {**meta.get("provenance", {}), **chosen.provenance()}
    elif target_flags:
        raise CorpusError("target_flags without a target would compile for this machine")
    with tempfile.TemporaryDirectory(prefix="optgym-sources-") as tmp:
        objects = {
            name: compile_embedded(toolchain, Path(src), Path(tmp) / f"{i}.o", flags)
            for i, (name, src) in enumerate(sources.items())
        }
        return corpus_from_objects(toolchain, objects, root, **meta)
