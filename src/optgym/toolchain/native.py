"""optgym's small native helpers, built once on this machine with the toolchain's own compiler.

Two pieces of optgym run inside LLVM's processes, not beside them: the lanes library preloaded into lld
(:mod:`optgym.toolchain.lanes`) and the pass plugin that names a module's surviving functions
(:mod:`optgym.toolchain.pass_plugin`). Each is shipped as source and built on first use into optgym's cache, keyed
by what it was built from, because a binary built elsewhere would be tied to another libc or LLVM build. A helper
that cannot be built here is ``None``, and its caller does without it.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from optgym.files import cache_root

BUILD_TIMEOUT = 120.0  # seconds; the plugin, the larger of the two, takes about 4 s of CPU


def built_once(
    kind: str, key: bytes, name: str, command: Callable[[Path], list[str]], works: Callable[[Path], bool] | None = None
) -> Path | None:
    """``name`` under ``cache/<kind>/<digest of key>/``, built by ``command(output)`` where it is not there yet, and
    kept only if ``works(output)``; ``None`` when it cannot be built. The file appears whole or not at all: a
    build that runs beside another of the same helper renames its own output into place."""
    built = cache_root() / kind / hashlib.sha256(key).hexdigest()[:16] / name
    if built.exists():
        return built
    built.parent.mkdir(parents=True, exist_ok=True)
    partial = built.with_name(f".{name}.{os.getpid()}")
    try:
        ok = subprocess.run(command(partial), capture_output=True, timeout=BUILD_TIMEOUT).returncode == 0
        ok = ok and (works is None or works(partial))
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        partial.unlink(missing_ok=True)
        return None
    os.replace(partial, built)
    return built


__all__ = ["built_once"]
