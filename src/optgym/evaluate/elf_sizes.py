"""``optgym compare-sizes``: the linked ELF files of two builds, matched by path (as Fuchsia's
compare_elf_sizes does for MLGO's demo).

Per-object sizes over-count template code that the linker later deduplicates (COMDAT); the linked
executables and shared libraries are what a user ships, so this is the figure that settles it.
Static archives are not linked outputs, but a library project ships them: :func:`archive_sizes` sums
their ELF members, and says when the members are LTO bitcode (no code size until a link).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from optgym.toolchain.sizes import ElfError, object_sizes

ET_EXEC, ET_DYN = 2, 3
FIELDS = ("text", "code", "file")
#: Directories a build system fills with its own probes (CMake's compiler-id ``a.out``s and try_compile
#: programs, meson's sanity checks): linked, but not the project's outputs.
SKIP_DIRS = frozenset(["CMakeFiles", ".git", "meson-private"])
#: Compiler-check programs a configure step may leave at the top of a tree.
PROBE_NAMES = frozenset(["a.out", "a.exe", "conftest", "conftest.exe"])
ARCHIVE_MAGIC = b"!<arch>\n"
THIN_ARCHIVE_MAGIC = b"!<thin>\n"
BITCODE_MAGICS = (b"BC\xc0\xde", b"\xde\xc0\x17\x0b")  # raw LLVM bitcode, and bitcode in its wrapper header


def _build_files(root: Path) -> Iterator[Path]:
    """Regular files under ``root`` outside the build systems' probe directories (symlinks skipped: a
    ``libfoo.so`` → ``libfoo.so.1`` link names a file counted once, by its real name)."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        for name in filenames:
            path = Path(dirpath) / name
            if name not in PROBE_NAMES and not path.is_symlink() and path.is_file():
                yield path


def linked_elf_files(root: Path) -> dict[str, Path]:
    """Executables and shared libraries under ``root`` (objects and archives excluded), by relative path."""
    found: dict[str, Path] = {}
    for path in _build_files(root):
        with path.open("rb") as f:
            head = f.read(18)
        if len(head) == 18 and head[:4] == b"\x7fELF":
            (e_type,) = struct.unpack_from("<H" if head[5] == 1 else ">H", head, 16)
            if e_type in (ET_EXEC, ET_DYN):
                found[str(path.relative_to(root))] = path
    return found


def static_archives(root: Path) -> dict[str, Path]:
    """Static archives under ``root`` — regular and thin (meson's own static libraries are thin: they name
    their members' files) — by relative path."""
    found: dict[str, Path] = {}
    for path in _build_files(root):
        with path.open("rb") as f:
            if f.read(len(ARCHIVE_MAGIC)) in (ARCHIVE_MAGIC, THIN_ARCHIVE_MAGIC):
                found[str(path.relative_to(root))] = path
    return found


@dataclass(frozen=True)
class ArchiveSizes:
    """The ELF members' summed :class:`~optgym.toolchain.sizes.ObjectSizes`; ``bitcode_members`` are LTO
    members, whose code has no size until a link compiles them (``text_bytes`` leaves them out)."""

    text_bytes: int
    dottext_bytes: int
    elf_members: int
    bitcode_members: int
    data_bytes: int = 0


def archive_sizes(path: Path) -> ArchiveSizes:
    """Sum the sizes of an archive's ELF members (GNU and BSD member names; the symbol and name tables
    skipped). A thin archive's members are read from the files it names, relative to the archive."""
    path = Path(path)
    data = path.read_bytes()
    thin = data.startswith(THIN_ARCHIVE_MAGIC)
    if not thin and not data.startswith(ARCHIVE_MAGIC):
        raise ElfError(f"{path}: not an ar archive")
    text = dottext = writable = elf = bitcode = 0
    long_names = b""
    pos = len(ARCHIVE_MAGIC)
    while pos + 60 <= len(data):
        name, size_field = data[pos : pos + 16].rstrip(), data[pos + 48 : pos + 58]
        try:
            size = int(size_field)
        except ValueError:
            raise ElfError(f"{path}: malformed member header at byte {pos}") from None
        stored = not thin or name in (b"/", b"/SYM64/", b"//")  # a thin archive stores only its tables
        member = data[pos + 60 : pos + 60 + size] if stored else b""
        pos += 60 + (size + (size & 1) if stored else 0)  # stored members start on even offsets
        if name == b"//":  # GNU long names: "NAME/\n" each, referred to as "/OFFSET"
            long_names = member
            continue
        if name in (b"/", b"/SYM64/") or name.startswith(b"__.SYMDEF"):  # symbol tables
            continue
        if name.startswith(b"#1/"):  # BSD: the name's N bytes open the member's data
            member = member[int(name[3:]) :]
        elif thin:
            if name[1:].isdigit():
                offset = int(name[1:])
                name = long_names[offset : long_names.index(b"/\n", offset)]
            try:
                member = (path.parent / name.rstrip(b"/").decode()).read_bytes()
            except OSError:
                continue
        if member.startswith(b"\x7fELF"):
            sizes = object_sizes(member)
            text, dottext, elf = text + sizes.text_bytes, dottext + sizes.dottext_bytes, elf + 1
            writable += sizes.data_bytes
        elif member.startswith(BITCODE_MAGICS):
            bitcode += 1
    return ArchiveSizes(text, dottext, elf, bitcode, writable)


def size_of(path: Path, field: str) -> int:
    """``text``: Berkeley text; ``code``: ``.text*``; ``file``: bytes on disk."""
    if field == "file":
        return path.stat().st_size
    sizes = object_sizes(path)
    return sizes.text_bytes if field == "text" else sizes.dottext_bytes


@dataclass
class SizeRow:
    path: str
    a: int | None
    b: int | None


def compare_builds(a: Path, b: Path, field: str = "text") -> list[SizeRow]:
    """One row per linked ELF path present in either build (``None`` where it is missing)."""
    if field not in FIELDS:
        raise ValueError(f"field must be one of {FIELDS}, got {field!r}")
    files_a, files_b = linked_elf_files(Path(a)), linked_elf_files(Path(b))
    rows = []
    for rel in sorted(set(files_a) | set(files_b)):
        try:
            size_a = size_of(files_a[rel], field) if rel in files_a else None
            size_b = size_of(files_b[rel], field) if rel in files_b else None
        except ElfError:
            continue
        rows.append(SizeRow(rel, size_a, size_b))
    return rows
