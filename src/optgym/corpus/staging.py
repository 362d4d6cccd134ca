"""Writing a corpus directory so that an interrupted run never leaves half a corpus behind.

A corpus is made in a staging directory next to its destination and then swapped in with renames.
The destination may also hold things that are not the corpus but must survive a rebuild — build
logs (``logs/``) and the work area (``.optgym-work/``: build trees, downloaded sources, per-package
corpora) — so the swap carries those over from the old directory into the new one.

The swap is three renames; if a run dies between them, :func:`recover` (called before every write)
finishes or undoes it, so the next run finds either the old corpus or the new one, never a mix.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from optgym.corpus.corpus import DESCRIPTION, FORMAT_VERSION
from optgym.files import atomic_write_bytes

#: Entries of a corpus directory that are not part of the corpus and survive a swap.
WORK_DIR = ".optgym-work"
LOGS_DIR = "logs"
KEEP = (LOGS_DIR, WORK_DIR)


def _old(dest: Path) -> Path:
    return dest.with_name(f".{dest.name}.old")


def recover(dest: Path) -> None:
    """Finish (or undo) a swap that an earlier run did not complete."""
    old = _old(dest)
    if not old.exists():
        return
    if not dest.exists():  # died between "dest → old" and "staging → dest": put the old corpus back
        os.replace(old, dest)
        return
    for name in KEEP:  # died while carrying logs/work over: finish that
        if (old / name).exists() and not (dest / name).exists():
            os.replace(old / name, dest / name)
    shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def staging_dir(dest: Path) -> Iterator[Path]:
    """A fresh directory beside ``dest`` (same filesystem, so renames are atomic); removed on failure."""
    dest = Path(dest).absolute()
    dest.parent.mkdir(parents=True, exist_ok=True)
    recover(dest)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.staging-", dir=dest.parent))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def swap_in(staging: Path, dest: Path) -> None:
    """Make ``staging`` the new ``dest``, carrying ``logs/`` and ``.optgym-work/`` over from the old one.

    Logs are written straight into ``dest/logs`` while a command runs (a failing build must leave
    its log where the error message says), so ``staging`` never holds them.
    """
    dest = Path(dest).absolute()
    old = _old(dest)
    if dest.exists():
        os.replace(dest, old)
    os.replace(staging, dest)
    if old.exists():
        for name in KEEP:
            if (old / name).exists() and not (dest / name).exists():
                os.replace(old / name, dest / name)
        shutil.rmtree(old, ignore_errors=True)


def now() -> str:
    """UTC time stamp for provenance records."""
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat()


def read_description(root: Path) -> dict[str, Any]:
    """The parsed ``corpus_description.json`` of ``root`` ({} when there is none)."""
    try:
        return json.loads((Path(root) / DESCRIPTION).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def write_description(root: Path, modules: Iterable[str], optgym: Mapping[str, Any]) -> None:
    """mlgo-utils' description plus our ``optgym`` key (format version first)."""
    description = {
        "has_thinlto": False,
        "modules": list(modules),
        "optgym": {"format_version": FORMAT_VERSION, **optgym},
    }
    atomic_write_bytes(Path(root) / DESCRIPTION, json.dumps(description, indent=2).encode())


def link_or_copy(src: Path, dst: Path) -> None:
    """Hard-link ``src`` to ``dst`` (cheap, and later atomic rewrites never touch the shared inode)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
