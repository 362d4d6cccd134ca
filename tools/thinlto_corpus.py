#!/usr/bin/env python3
"""A corpus of distributed-ThinLTO backend compiles, from the bitcode objects of a ``-flto=thin`` build.

    .venv/bin/python tools/thinlto_corpus.py OBJ.o... -o CORPUS [--link-arg=-lm ...]

Why: a ThinLTO backend decides its inlining after importing other modules' functions, so its room
differs from a per-TU compile's (README, issue 7: a search of 100 compiles per module finds 0.9853 of
clang's own backends on cmark against 0.9962 per TU, and 0.9878 against 0.9833 on c-ares). This is the
corpus to measure and train on there, the kind MLGO itself trains on (``extract_ir
--thinlto_build=distributed``).

Each object is copied into CORPUS as ``NAME.bc``; one ``lld --thinlto-index-only`` link over the copies
writes ``NAME.bc.thinlto.bc`` beside each (the link's symbol resolution decides what every backend
imports, so pass the link's own libraries with ``--link-arg``); each module's command is the backend
``-cc1`` of ``clang -Oz -x ir NAME.bc -fthinlto-index=NAME.bc.thinlto.bc -c``. A module then compiles
with every optgym command (search, evaluate, train), and clang's own answers give the backend's object
byte for byte. The index names the copies by absolute path: the corpus does not move.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from optgym.corpus.corpus import sanitize_cc1_args, write_corpus
from optgym.toolchain import find_toolchain


def backend_cc1(clang: Path, bitcode: Path, opt: str) -> list[str]:
    """The ``-cc1`` arguments of the distributed backend compile of ``bitcode``, without input and output."""
    driver = [str(clang), "-###", opt, "-x", "ir", str(bitcode), f"-fthinlto-index={bitcode}.thinlto.bc", "-c",
              "-o", "/dev/null"]  # fmt: skip
    listing = subprocess.run(driver, capture_output=True, text=True, check=True, timeout=60).stderr
    cc1 = next(shlex.split(line) for line in listing.splitlines() if '"-cc1"' in line)
    return sanitize_cc1_args([arg for arg in cc1[1:] if arg != str(bitcode)])


def build(objects: list[Path], root: Path, link_args: list[str], opt: str = "-Oz") -> int:
    """Write the corpus; the number of modules. On any failure nothing is left behind."""
    clang = find_toolchain().clang
    if root.exists():
        sys.exit(f"{root} exists; choose a new directory")
    for obj in objects:
        with open(obj, "rb") as f:
            if f.read(4) != b"BC\xc0\xde":
                sys.exit(f"{obj} is not bitcode: compile with -flto=thin")
    names: list[str] = []
    for obj in objects:
        stem = obj.name.removesuffix(".o").replace(".", "_")
        name, n = stem, 1
        while name in names:
            name, n = f"{stem}-{n}", n + 1
        names.append(name)
    root.mkdir(parents=True)
    try:
        copies = [(root / f"{name}.bc").resolve() for name in names]
        for obj, copy in zip(objects, copies, strict=True):
            shutil.copyfile(obj, copy)
        # -Wl,: the driver would compile a .bc input to an object first; the linker must see the bitcode itself
        link = [str(clang), "-flto=thin", "-fuse-ld=lld", f"-Wl,--thinlto-index-only={root / 'index-only.txt'}",
                *(f"-Wl,{c}" for c in copies), *link_args, "-o", str(root / "index-only.out")]  # fmt: skip
        result = subprocess.run(link, capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            sys.exit(f"the index-only link failed:\n{result.stderr[-3000:]}")
        modules = [(name, copy.read_bytes(), backend_cc1(clang, copy, opt))
                   for name, copy in zip(names, copies, strict=True)]  # fmt: skip
        write_corpus(root, modules, source="distributed ThinLTO backends", link=link)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return len(modules)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("objects", type=Path, nargs="+", help="bitcode objects of a -flto=thin build")
    parser.add_argument("-o", "--output", type=Path, required=True, help="the corpus directory (new)")
    parser.add_argument("--link-arg", action="append", default=[], help="passed to the index-only link (repeatable)")
    parser.add_argument("--opt", default="-Oz", help="the backends' optimization level (default -Oz)")
    args = parser.parse_args()
    print(f"{build(args.objects, args.output, args.link_arg, args.opt)} modules in {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
