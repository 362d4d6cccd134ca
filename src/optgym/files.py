"""optgym's own files: the cache directory, atomic writes, and reading its on-disk formats (every one carries a
``format_version``, checked the same way)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any


def cache_root() -> Path:
    """``$OPTGYM_CACHE_DIR``, else ``~/.cache/optgym``."""
    return Path(os.environ.get("OPTGYM_CACHE_DIR") or Path.home() / ".cache" / "optgym")


#: How long a dead process's private directory is left before another process removes it. The owner's death is
#: read from its pid, which another PID namespace sharing ``/tmp`` cannot see; no compile lasts this long, so age
#: alone keeps a live directory of such a neighbour safe.
STALE_AFTER_SECONDS = 3600.0
_swept: set[str] = set()  # the prefixes this process has swept


def private_tempdir(prefix: str) -> tempfile.TemporaryDirectory[str]:
    """A temporary directory of this process, ``<prefix><pid>-XXXXXXXX``, removed by its owner when done.

    Why the pid: a process killed mid-compile (a training run stopped with ``kill -TERM``, a server killed with
    its build) never runs its cleanup, and the directory would stay. The first call for ``prefix`` in each process
    removes such leftovers: directories of ``prefix`` whose owner is gone, older than :data:`STALE_AFTER_SECONDS`.
    """
    if prefix not in _swept:
        _swept.add(prefix)
        _remove_orphans(Path(tempfile.gettempdir()), prefix)
    return tempfile.TemporaryDirectory(prefix=f"{prefix}{os.getpid()}-")


def _remove_orphans(parent: Path, prefix: str) -> None:
    now = time.time()
    for entry in parent.glob(f"{prefix}*-*"):
        owner = entry.name[len(prefix) :].partition("-")[0]
        try:
            old = now - entry.lstat().st_mtime > STALE_AFTER_SECONDS
        except OSError:
            continue
        if owner.isdigit() and old and not _alive(int(owner)):
            shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write via a temporary file in the same directory and rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_versioned(path: Path, *, error: type[Exception], what: str, missing: str, max_version: int) -> dict[str, Any]:
    """The JSON (``.json``) or TOML (``.toml``) object at ``path``, as a clear ``error`` when it is missing,
    unparsable, or written by a newer optgym (``format_version`` > ``max_version``).

    ``what`` names the format in messages ("trace", "search", "config"); ``missing`` says what a missing
    file means ("not a training run").
    """
    path = Path(path)
    toml = path.suffix == ".toml"
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise error(f"{path} not found: {missing}") from None
    try:
        data = tomllib.loads(text) if toml else json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as e:
        raise error(f"{path} is not valid {'TOML' if toml else 'JSON'}: {e}") from None
    if not isinstance(data, dict):
        raise error(f"{path} does not hold an object")
    if data.get("format_version", 0) > max_version:
        raise error(f"{path} has {what} format {data['format_version']}; this optgym reads ≤ {max_version}")
    return data
