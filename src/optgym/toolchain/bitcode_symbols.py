"""A bitcode file's symbols, read from the symbol table clang writes into it, with no process started.

Why: a served compile whose policy reads the callee's linkage needs the module's external definitions
(:mod:`optgym.rollout.linkage`). ``llvm-nm`` gives them, but starting it costs about 15 ms a compile, 5-7 % of a
graphite2 translation unit's compile. Bitcode that LLVM writes carries an *irsymtab* for linkers: a blob in a
top-level ``SYMTAB_BLOCK``, whose strings are in a top-level ``STRTAB_BLOCK``. Both sit after the module's own
block, which this reader skips by its length without decoding it.

The formats, from LLVM's documentation and ``llvm/Object/IRSymtab.h`` (read for facts, not copied):

* the bitstream: a magic ``BC\\xc0\\xde``, then top-level blocks in a stream of abbreviation ids 2 bits wide. A
  block opens with id 1, its block id (VBR-8), its own id width (VBR-4), alignment to 32 bits and its length in
  32-bit words. Inside, id 0 ends it, 2 defines an abbreviation and ids from 4 use one. The two blocks read here
  each define one abbreviation, ``[literal code, blob]``, and use it once;
* the symbol table: little-endian 32-bit words. A header with ``Version`` (4 in LLVM 22) and ``Range`` fields
  (offset, count) to the symbol array. Each symbol is 6 words: the name and the IR name as (offset, size) into
  the string table, the comdat index, and flag bits.

Anything else (an object file, another version, bitcode without a table) gives ``None``, and the caller falls
back to ``llvm-nm``.
"""

from __future__ import annotations

import struct
from pathlib import Path

MAGIC = b"BC\xc0\xde"
STRTAB_BLOCK, SYMTAB_BLOCK = 23, 25
#: irsymtab versions whose symbol layout this reads: 3 (clang 22.1 writes it) and 4 (LLVM main), the same
SYMTAB_VERSIONS = (3, 4)
#: storage::Header: Version, Producer(2), Modules(2), Comdats(2), then Symbols (offset, count) at word 7
SYMBOLS_AT = 7 * 4
SYMBOL_WORDS = 6
#: storage::Symbol::FlagBits
UNDEFINED, WEAK, GLOBAL, EXECUTABLE = 1 << 3, 1 << 4, 1 << 10, 1 << 13


class _Bits:
    """A little-endian bit cursor over bytes, as LLVM's bitstream reads them."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def read(self, width: int) -> int:
        start, shift = self.pos >> 3, self.pos & 7
        end = start + ((shift + width + 7) >> 3)
        if end > len(self.data):
            raise ValueError("the bitstream ends inside a field")
        self.pos += width
        return (int.from_bytes(self.data[start:end], "little") >> shift) & ((1 << width) - 1)

    def vbr(self, width: int) -> int:
        value, shift, high = 0, 0, 1 << (width - 1)
        while True:
            piece = self.read(width)
            value |= (piece & (high - 1)) << shift
            if not piece & high:
                return value
            shift += width - 1

    def align32(self) -> None:
        self.pos = (self.pos + 31) & ~31


def _blob(bits: _Bits, width: int, end: int) -> bytes | None:
    """The first blob of the block whose contents start at the cursor (ids ``width`` bits wide, ending at bit
    ``end``)."""
    abbreviations: list[list[tuple[int, int | None]]] = []
    while bits.pos < end:
        code = bits.read(width)
        if code == 0:  # END_BLOCK
            return None
        if code == 1:  # a nested block: skipped whole
            bits.vbr(8), bits.vbr(4)
            bits.align32()
            bits.pos += bits.read(32) * 32
        elif code == 2:  # DEFINE_ABBREV: ops of (encoding, value); 0 marks a literal
            operands: list[tuple[int, int | None]] = []
            for _ in range(bits.vbr(5)):
                if bits.read(1):
                    operands.append((0, bits.vbr(8)))
                else:
                    encoding = bits.read(3)
                    operands.append((encoding, bits.vbr(5) if encoding in (1, 2) else None))
            abbreviations.append(operands)
        elif code == 3:  # an unabbreviated record: no blob in it
            bits.vbr(6)
            for _ in range(bits.vbr(6)):
                bits.vbr(6)
        else:
            for encoding, value in abbreviations[code - 4]:
                if encoding == 5:  # Blob: length, aligned bytes
                    size = bits.vbr(6)
                    bits.align32()
                    start = bits.pos >> 3
                    return bits.data[start : start + size]
                if encoding in (1, 2):
                    bits.read(value) if encoding == 1 else bits.vbr(value)  # type: ignore[arg-type]
                elif encoding == 4:
                    bits.read(6)
                elif encoding == 3:
                    raise ValueError("an array in a string or symbol table record")
    return None


def symbol_table(data: bytes) -> tuple[bytes, bytes] | None:
    """The irsymtab blob and the string table of bitcode ``data``, or ``None`` where it has none."""
    if not data.startswith(MAGIC):
        return None
    bits = _Bits(data)
    bits.pos = 32
    found: dict[int, bytes] = {}
    while bits.pos + 32 <= len(data) * 8 and len(found) < 2:
        if bits.read(2) != 1:  # only blocks at the top level; anything else ends the stream
            break
        block, width = bits.vbr(8), bits.vbr(4)
        bits.align32()
        words = bits.read(32)
        end = bits.pos + words * 32
        if block in (STRTAB_BLOCK, SYMTAB_BLOCK) and (blob := _blob(bits, width, end)) is not None:
            found[block] = blob
        bits.pos = end
    if len(found) < 2:
        return None
    return found[SYMTAB_BLOCK], found[STRTAB_BLOCK]


def external_functions(path: Path) -> frozenset[str] | None:
    """The IR names of the functions bitcode file ``path`` defines with external linkage (``llvm-nm``'s ``T``:
    defined, global, not weak, executable), or ``None`` where it cannot tell: not bitcode, or no table of a
    version it knows."""
    try:
        tables = symbol_table(path.read_bytes())
    except (OSError, ValueError, IndexError):
        return None
    if tables is None:
        return None
    symtab, strtab = tables
    if len(symtab) < SYMBOLS_AT + 8 or struct.unpack_from("<I", symtab)[0] not in SYMTAB_VERSIONS:
        return None
    offset, count = struct.unpack_from("<II", symtab, SYMBOLS_AT)
    if offset + count * SYMBOL_WORDS * 4 > len(symtab):
        return None
    names = set()
    for name_at, name_size, ir_at, ir_size, _, flags in struct.iter_unpack("<6I", symtab[offset : offset + count * 24]):
        if flags & (UNDEFINED | WEAK) or flags & (GLOBAL | EXECUTABLE) != GLOBAL | EXECUTABLE:
            continue
        at, size = (ir_at, ir_size) if ir_size else (name_at, name_size)
        names.add(strtab[at : at + size].decode(errors="replace"))
    return frozenset(names)


__all__ = ["external_functions", "symbol_table"]
