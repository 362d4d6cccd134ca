"""clang-22 and its tools: finding them, running compiles (plain or interactive), measuring objects."""

from optgym.toolchain.llvm import Hook, Toolchain, find_toolchain
from optgym.toolchain.sizes import ObjectSizes, object_sizes

__all__ = ["Hook", "ObjectSizes", "Toolchain", "find_toolchain", "object_sizes"]
