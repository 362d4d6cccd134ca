"""Reading and writing corpora in the format of LLVM's mlgo-utils (``extract_ir``).

A corpus is a directory with ``corpus_description.json``::

    {"has_thinlto": false, "modules": ["lib/a.c", …], "optgym": {"format_version": 1, …}}

and, per module ``m``, ``m.bc`` (the bitcode) and ``m.cmd`` (the ``-cc1`` arguments, NUL-separated,
as clang embedded them with ``-fembed-bitcode=all``). The ``optgym`` key is ours: mlgo-utils ignores
it, and it carries the format version and, later, provenance and splits.

A module compiles as ``clang <cmd args> <problem flags> -x ir m.bc -o out.o``. The embedding flags
are dropped from the command: ``-fembed-bitcode=all`` would embed the command line, so the object of
a compile with extra ``-mllvm`` flags could never be byte-identical to a plain one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from optgym.errors import CorpusError
from optgym.files import atomic_write_bytes

DESCRIPTION = "corpus_description.json"
FORMAT_VERSION = 1

#: Flags of the original compile that must not be replayed (they embed bitcode or name files).
_DROP_FLAGS = ("-fembed-bitcode", "-fembed-bitcode=all", "-fembed-bitcode=bitcode", "-fembed-bitcode=marker")
_DROP_WITH_VALUE = ("-o", "-x", "-dependency-file", "-MT", "-MF", "-MQ")
#: A distributed ThinLTO backend's flag: its value is the index file the compile reads.
THINLTO_INDEX = "-fthinlto-index="
#: Beside a backend captured from a real link (``NAME.site``): the directory it runs in (relative to the file),
#: the path its module is named by there, and its source language — see :attr:`Module.site`.
SITE_SUFFIX = ".site"


def sanitize_cc1_args(args: Sequence[str]) -> list[str]:
    """The ``-cc1`` arguments of a ``.cmd`` minus bitcode embedding and input/output naming."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in _DROP_WITH_VALUE:
            skip = True
        elif arg in _DROP_FLAGS or arg.startswith("-fembed-bitcode="):
            continue
        else:
            out.append(arg)
    return out


@dataclass(frozen=True)
class Module:
    """One translation unit of a corpus."""

    name: str
    bitcode: Path
    command: Path

    @cached_property
    def cc1_args(self) -> list[str]:
        """The sanitized ``-cc1 …`` arguments (see :func:`sanitize_cc1_args`)."""
        try:
            raw = self.command.read_bytes()
        except FileNotFoundError:
            raise CorpusError(f"module {self.name}: its command file {self.command} is missing") from None
        args = [a.decode() for a in raw.split(b"\0") if a]
        if not args or args[0] != "-cc1":
            raise CorpusError(f"module {self.name}: {self.command} does not hold a -cc1 command line")
        if args.count("-cc1") != 1:
            raise CorpusError(f"module {self.name}: {self.command} holds several -cc1 commands (a link step?)")
        return sanitize_cc1_args(args)

    @cached_property
    def site(self) -> tuple[Path, str, str] | None:
        """Where a ThinLTO backend captured from a real link runs: (working directory, the path of its module
        there, its source language), or ``None`` for a module that compiles anywhere.

        Such a backend reads its module and the modules it imports under the paths its link named them by, often
        relative ones (``CMakeFiles/x.dir/a.c.o``); its module identifier is that path, and a compile given
        another path for it silently compiles nothing. So it runs in the directory the capture rebuilt around
        it (:func:`optgym.corpus.thinlto.corpus_from_capture`), with that path."""
        path = self._site_file
        try:
            workdir, source, language = path.read_text().splitlines()[:3]
        except FileNotFoundError:
            return None
        except ValueError:
            raise CorpusError(f"module {self.name}: {path} is not a backend's site") from None
        return (path.parent / workdir).resolve(), source, language

    def files(self) -> list[tuple[str, Path]]:
        """The module's files by suffix — ``.bc``, ``.cmd``, and a captured backend's ``.site``: what a merge
        links into another corpus."""
        site = self._site_file
        return [(".bc", self.bitcode), (".cmd", self.command), *([(SITE_SUFFIX, site)] if site.exists() else [])]

    @property
    def _site_file(self) -> Path:
        return self.command.with_name(self.command.name.removesuffix(".cmd") + SITE_SUFFIX)

    @property
    def workdir(self) -> Path | None:
        """The directory the module's compile runs in (see :attr:`site`); ``None``: any."""
        return self.site[0] if self.site else None

    @cached_property
    def language(self) -> str:
        """C, C++, … from the command as clang recorded it (the sanitized one drops ``-x``)."""
        from optgym.toolchain.language import language

        if self.site:  # a backend's command compiles IR: the language is the one its source was compiled from
            return self.site[2]

        try:
            raw = self.command.read_bytes()
        except FileNotFoundError:
            raise CorpusError(f"module {self.name}: its command file {self.command} is missing") from None
        return language([a.decode(errors="replace") for a in raw.split(b"\0") if a])

    @cached_property
    def family(self) -> str:
        """ "C++" for C++ and ObjC++, "C" for everything else: the split every per-language figure and rule uses."""
        from optgym.toolchain.language import family

        return family(self.language)

    def argv(self, clang: Path, extra: Sequence[str], output: Path | str) -> list[str]:
        """The full compile command producing ``output`` (``-``: stdout) with ``extra`` flags added."""
        if not self.bitcode.exists():
            raise CorpusError(f"module {self.name}: its bitcode {self.bitcode} is missing")
        # the real path: a ThinLTO backend finds its own summaries in the index under the path it was linked
        # as (its module identifier is the input path); a relative one compiles silently to nothing — except for
        # a captured backend, run in its working directory under the path its link gave it (see `site`)
        source = self.site[1] if self.site else str(self.bitcode.resolve())
        return [str(clang), *self.cc1_args, *extra, "-x", "ir", source, "-o", str(output)]

    @cached_property
    def thinlto_index(self) -> Path | None:
        """The index file of a distributed-ThinLTO backend (see :mod:`optgym.corpus.thinlto`), else None."""
        found = [a.removeprefix(THINLTO_INDEX) for a in self.cc1_args if a.startswith(THINLTO_INDEX)]
        if not found:
            return None
        return self.workdir / found[-1] if self.workdir else Path(found[-1])

    @cached_property
    def digest(self) -> str:
        """Content hash of bitcode and command — and of a ThinLTO backend's index, which decides what the
        compile imports and keeps but is named, not held, by the command: the key of every per-module cache."""
        h = hashlib.sha256()
        index = [self.thinlto_index] if self.thinlto_index else []
        for path in (self.bitcode, self.command, *index):
            try:
                h.update(path.read_bytes())
            except FileNotFoundError:
                raise CorpusError(f"module {self.name}: {path} is missing") from None
            h.update(b"\0")
        return h.hexdigest()


SPLITS = ("train", "test")


class Corpus:
    """A corpus directory. Iterating yields its modules in the description's order.

    ``split="train"|"test"`` keeps only that side of the split stored in the description by
    ``optgym corpus split`` (the test modules are listed there; train is every other module).
    """

    def __init__(self, root: Path | str, split: str | None = None) -> None:
        self.root = Path(root)
        self.split = split
        description = self.root / DESCRIPTION
        if not description.is_file():
            raise CorpusError(f"{self.root} is not a corpus: {DESCRIPTION} not found")
        try:
            self.description = json.loads(description.read_text())
        except json.JSONDecodeError as e:
            raise CorpusError(f"{description} is not valid JSON: {e}") from None
        names = self.description.get("modules")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise CorpusError(f"{description} has no 'modules' list of names")
        version = self.description.get("optgym", {}).get("format_version", FORMAT_VERSION)
        if version > FORMAT_VERSION:
            raise CorpusError(f"{self.root} has corpus format {version}; this optgym reads ≤ {FORMAT_VERSION}")
        if split is not None:
            names = self._split_names(names, split)
        self.modules = [self.module(n) for n in names]
        self._by_name = {m.name: m for m in self.modules}

    def _split_names(self, names: list[str], split: str) -> list[str]:
        if split not in SPLITS:
            raise CorpusError(f"unknown split {split!r}; one of {', '.join(SPLITS)}")
        stored = self.description.get("optgym", {}).get("split")
        if not isinstance(stored, dict) or not isinstance(stored.get("test"), list):
            raise CorpusError(f"{self.root} has no split; make one with `optgym corpus split {self.root}`")
        test = set(stored["test"])
        return [n for n in names if (n in test) == (split == "test")]

    def module(self, name: str) -> Module:
        return Module(name=name, bitcode=self.root / f"{name}.bc", command=self.root / f"{name}.cmd")

    def __getitem__(self, name: str) -> Module:
        try:
            return self._by_name[name]
        except KeyError:
            raise CorpusError(f"no module {name!r} in corpus {self.root}") from None

    def __iter__(self) -> Iterator[Module]:
        return iter(self.modules)

    def __len__(self) -> int:
        return len(self.modules)


def write_corpus(root: Path, modules: Iterable[tuple[str, bytes, Sequence[str]]], **optgym_meta) -> Corpus:
    """Write a corpus from (name, bitcode, cc1 args) triples; the description is written last."""
    root = Path(root)
    names = []
    for name, bitcode, args in modules:
        atomic_write_bytes(root / f"{name}.bc", bitcode)
        atomic_write_bytes(root / f"{name}.cmd", b"\0".join(a.encode() for a in args))
        names.append(name)
    description = {
        "has_thinlto": False,
        "modules": names,
        "optgym": {"format_version": FORMAT_VERSION, **optgym_meta},
    }
    atomic_write_bytes(root / DESCRIPTION, json.dumps(description, indent=2).encode())
    return Corpus(root)
