"""Object sizes, read straight from the ELF section headers.

``text_bytes`` is what ``llvm-size`` (Berkeley format) prints as ``text``: every allocated section
that is executable or not writable — ``.text*``, ``.rodata*``, ``.eh_frame``, ``.gcc_except_table*`` —
the figure MLGO rewards. ``dottext_bytes`` is the ``.text*`` total of ``llvm-size -A``. ``data_bytes`` is
Berkeley ``data``: the allocated, writable sections with contents (``.data*``, ``.data.rel.ro*``; not
``.bss``). Why it is read too: an option can move bytes from ``text`` into ``data`` without removing any —
LLVM's global merge of constants (``-global-merge-on-const``) in position-independent code puts read-only
constants into one ``_MergedGlobals`` that needs relocations, so it lands in ``.data.rel.ro`` — and Berkeley
``text`` alone then counts a saving the program does not get. ``text + data`` (:attr:`ObjectSizes.image_bytes`)
is what the file, or a microcontroller's flash, holds. Parsing
the headers here instead of running ``llvm-size`` twice saves two process spawns per compile; a test
checks both figures against ``llvm-size`` itself.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR = 0x1, 0x2, 0x4
SHT_NOBITS = 8  # .bss: allocated, but no bytes in the file
SHN_XINDEX = 0xFFFF  # e_shstrndx when the string table's index is in section 0's sh_link


@dataclass(frozen=True)
class ObjectSizes:
    text_bytes: int
    dottext_bytes: int
    data_bytes: int = 0

    @property
    def image_bytes(self) -> int:
        """Berkeley ``text + data``: what an object contributes to the file (or to flash), however an option
        moves bytes between read-only and writable sections."""
        return self.text_bytes + self.data_bytes


class ElfError(ValueError):
    """Not an ELF object we can read."""


def _sections(data: bytes) -> list[tuple[str, int, int, int]]:
    """(name, type, flags, size) of every section of a 32- or 64-bit ELF file."""
    if len(data) < 52 or data[:4] != b"\x7fELF":
        raise ElfError("not an ELF file")
    is64 = data[4] == 2
    order = "<" if data[5] == 1 else ">"
    if is64:
        (shoff,) = struct.unpack_from(order + "Q", data, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from(order + "HHH", data, 0x3A)
        entry = order + "IIQQQQIIQQ"
    else:
        (shoff,) = struct.unpack_from(order + "I", data, 0x20)
        shentsize, shnum, shstrndx = struct.unpack_from(order + "HHH", data, 0x2E)
        entry = order + "IIIIIIIIII"
    if shoff == 0 or shentsize != struct.calcsize(entry) or shoff + shentsize > len(data):
        raise ElfError("malformed section header table")
    # ELF's extended numbering: with SHN_LORESERVE (0xff00) sections or more — a never-inline compile of a
    # large C++ file has one per function — the header says 0 and SHN_XINDEX, and section 0 holds the count
    # (sh_size) and the string table's index (sh_link)
    first = struct.unpack_from(entry, data, shoff)
    shnum = shnum or first[5]
    shstrndx = first[6] if shstrndx == SHN_XINDEX else shstrndx
    if shoff + shnum * shentsize > len(data) or shstrndx >= shnum:
        raise ElfError("malformed section header table")
    headers = [struct.unpack_from(entry, data, shoff + i * shentsize) for i in range(shnum)]
    strtab = headers[shstrndx]
    names = data[strtab[4] : strtab[4] + strtab[5]]  # sh_offset, sh_size
    result = []
    for h in headers:
        name_off, sh_type, flags, size = h[0], h[1], h[2], h[5]
        end = names.find(b"\0", name_off)
        result.append((names[name_off:end].decode("latin-1"), sh_type, flags, size))
    return result


def text_sections(data: bytes) -> list[tuple[str, int]]:
    """``(name, size)`` of every section of an object that Berkeley ``text`` counts: allocated, and code or
    read-only (``.text*``, ``.rodata*``, ``.eh_frame``, ``.gcc_except_table*``…)."""
    return [(name, size) for name, _, flags, size in _sections(data) if _in_text(flags)]


def _in_text(flags: int) -> bool:
    return bool(flags & SHF_ALLOC and (flags & SHF_EXECINSTR or not flags & SHF_WRITE))


def object_sizes(obj: str | Path | bytes) -> ObjectSizes:
    """Berkeley ``text`` and ``data``, and the ``.text*`` total, of one object (a path, or the object's bytes)."""
    text = dottext = data = 0
    for name, section_type, flags, size in _sections(obj if isinstance(obj, bytes) else Path(obj).read_bytes()):
        if _in_text(flags):
            text += size
        elif flags & SHF_ALLOC and section_type != SHT_NOBITS:
            data += size
        if name.startswith(".text"):
            dottext += size
    return ObjectSizes(text_bytes=text, dottext_bytes=dottext, data_bytes=data)
