"""optgym: machine-learned policies for a real compiler's optimization decisions.

``optgym.make("inline-size", corpus=DIR)`` returns a gymnasium env that drives an unmodified
clang-22 through LLVM's interactive MLGO channel, one step per inlining decision. Importing optgym
also registers ``optgym/InlineSize-v0`` with gymnasium.

The one exception is the policy server behind ``optgym-cc``, started with ``OPTGYM_NO_GYMNASIUM=1``:
it never uses gymnasium, whose import was a third of the server's start — which a cold build waits
for. There ``optgym.make`` and ``optgym.CompilerEnv`` are still there, imported on first use.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["CompilerEnv", "__version__", "make"]

if TYPE_CHECKING:
    from optgym.env import CompilerEnv, make
elif os.environ.get("OPTGYM_NO_GYMNASIUM") != "1":
    from optgym.env import CompilerEnv, make  # registers optgym/InlineSize-v0 with gymnasium
else:

    def __getattr__(name: str) -> Any:
        if name in ("CompilerEnv", "make"):
            import optgym.env

            return getattr(optgym.env, name)
        raise AttributeError(f"module 'optgym' has no attribute {name!r}")
