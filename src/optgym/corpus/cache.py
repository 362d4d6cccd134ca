"""A small on-disk cache of JSON results, keyed by everything that determines them.

Used for the heuristic's per-module sizes now (and evaluation results later). The key hashes the
module's content, the flags and the compiler identity, so a changed module, flag or compiler never
reads a stale entry. Entries carry a format version and are written atomically.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from optgym.files import atomic_write_bytes, cache_root

#: 2: compile results carry ``data_bytes`` (Berkeley ``data``) beside ``text_bytes``
CACHE_FORMAT_VERSION = 2


class ResultCache:
    """JSON values under ``<root>/<namespace>/<hash[:2]>/<hash>.json``."""

    def __init__(self, namespace: str, root: Path | None = None) -> None:
        self.directory = (root or cache_root()) / namespace

    @staticmethod
    def key(parts: Sequence[str]) -> str:
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()

    def sharded(self, key: str) -> Path:
        """``<namespace>/<key[:2]>/<key>``: two hex digits of fan-out keep a directory's listing short. A JSON
        entry adds ``.json``; a caller keeping several files per key (the trajectory store) uses it as a folder."""
        return self.directory / key[:2] / key

    def _path(self, key: str) -> Path:
        return self.sharded(key).with_suffix(".json")

    def get(self, key: str) -> dict[str, Any] | None:
        try:
            entry = json.loads(self._path(key).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        if entry.get("format_version") != CACHE_FORMAT_VERSION:
            return None
        return entry["value"]

    def put(self, key: str, value: dict[str, Any]) -> None:
        entry = {"format_version": CACHE_FORMAT_VERSION, "value": value}
        atomic_write_bytes(self._path(key), json.dumps(entry, sort_keys=True).encode())
