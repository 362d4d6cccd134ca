"""optgym's own files: the cache directory, atomic writes, and reading its on-disk formats (every one carries a
``format_version``, checked the same way)."""

from __future__ import annotations

import json
import os
import tempfile
import tomllib
from pathlib import Path
from typing import Any


def cache_root() -> Path:
    """``$OPTGYM_CACHE_DIR``, else ``~/.cache/optgym``."""
    return Path(os.environ.get("OPTGYM_CACHE_DIR") or Path.home() / ".cache" / "optgym")


def cache_usage(root: Path | None = None) -> dict[str, int]:
    """Bytes held by each part of the cache (``trajectories``, ``evaluate``, …), largest first. Nothing trims the
    cache, so ``optgym doctor`` shows what it holds: a user who needs the disk back deletes a part, at the price
    of recompiling what it held."""
    root = cache_root() if root is None else root
    parts = {p.name: sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) for p in root.glob("*") if p.is_dir()}
    return dict(sorted(parts.items(), key=lambda part: -part[1]))


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
