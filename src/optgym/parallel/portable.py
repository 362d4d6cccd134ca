"""Files and directories addressed by content, so workers need not share a filesystem with the driver.

A :class:`TreeRef` names a file or directory (a policy directory, a vocab) by its digest and carries its bytes
as a Ray object (put in the object store once per driver connection, however many tasks and fan-outs name it)
or, without Ray, inline. On a worker, :meth:`TreeRef.materialize` writes them once per node to
``$OPTGYM_CACHE_DIR/trees/<digest>/`` and returns a path there: later tasks on that node, in any worker process
and any later run, find the directory and fetch nothing. The digest is checked before the directory is
published, so a corrupt transfer can never poison the cache.

Corpus modules travel the same way (:mod:`optgym.corpus.portable`, with :func:`publish_once` and
:func:`fetch_payload`), and so do the files a trained policy's factory names (:mod:`optgym.policies.portable`).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optgym.errors import OptgymError
from optgym.files import cache_root


def publish_once(final: Path, fill: Callable[[Path], None]) -> None:
    """Make directory ``final`` by ``fill(staging)`` and an atomic rename, at most once per node.

    A file lock makes the workers of a node wait for the one that fetches, instead of each fetching; the
    rename means a reader sees the complete directory or none.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if final.exists():
            return
        staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
        try:
            fill(staging)
            os.rename(staging, final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


def tree_digest(entries: Sequence[tuple[str, bytes]]) -> str:
    """The content hash of a file or directory given as ``(relative path, bytes)`` pairs ("" for a file)."""
    h = hashlib.sha256()
    for rel, data in sorted(entries):
        h.update(rel.encode() + b"\0" + len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def read_tree(path: Path) -> list[tuple[str, bytes]]:
    """A file (``[("", bytes)]``) or every file under a directory, by relative path."""
    if path.is_file():
        return [("", path.read_bytes())]
    return [(f.relative_to(path).as_posix(), f.read_bytes()) for f in sorted(path.rglob("*")) if f.is_file()]


@dataclass(frozen=True)
class TreeRef:
    """A file or directory by content — what a trained policy's factory names by path. ``materialize()``
    gives a path to an identical copy on this node (``$OPTGYM_CACHE_DIR/trees/<digest>/<name>``), of the
    type the factory had (``str`` or ``Path``)."""

    name: str
    digest: str
    payload: Any  # a Ray ObjectRef of the entries, or the entries
    as_str: bool = True

    @classmethod
    def inline(cls, path: Path | str) -> TreeRef:
        entries = read_tree(Path(path))
        return cls(Path(path).name, tree_digest(entries), entries, isinstance(path, str))

    def materialize(self) -> str | Path:
        final = cache_root() / "trees" / self.digest
        if not final.is_dir():
            publish_once(final, self._fill)
        path = final / self.name
        return str(path) if self.as_str else path

    def _fill(self, staging: Path) -> None:
        entries = fetch_payload(self.payload)
        if tree_digest(entries) != self.digest:
            raise OptgymError(f"{self.name}: fetched bytes do not match digest {self.digest[:12]}…")
        for rel, data in entries:
            target = staging / self.name / rel if rel else staging / self.name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)


def materializing_builder(builder: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """A policy factory's builder, called with its path arguments materialized on this node first."""
    return builder(*(a.materialize() if isinstance(a, TreeRef) else a for a in args), **kw)


def fetch_payload(payload: Any) -> Any:
    """A content ref's payload: the bytes themselves, or (on a Ray worker) what its ObjectRef holds."""
    if isinstance(payload, tuple | list):
        return payload
    import ray  # a payload that is not bytes is an ObjectRef: we are in a Ray worker

    return ray.get(payload)


def upload_tree(path: Path | str, address: str) -> TreeRef:
    """A ref to the file or directory at ``path`` with its bytes in the object store (once per content)."""
    from optgym.parallel.ray_backend import connect, uploads

    ray = connect(address)
    entries = read_tree(Path(path))
    digest = tree_digest(entries)
    if digest not in uploads:
        uploads[digest] = ray.put(entries)
    return TreeRef(Path(path).name, digest, uploads[digest], isinstance(path, str))


#: What a task carries for a file or directory (a policy template): its path (local workers read it where it is)
#: or, when the fan-out goes to Ray, a :class:`TreeRef`; a worker turns either into a path with :func:`local_path`.
PortablePath = str | Path | TreeRef


def portable_path(path: str | Path, workers: int | None = None, ray_address: str | None = None) -> PortablePath:
    """``path`` as a task of such a fan-out should carry it: a :class:`TreeRef` under Ray, else the path."""
    from optgym.parallel.executor import ray_backend_address

    address = ray_backend_address(workers, ray_address)
    return upload_tree(path, address) if address is not None else path


def local_path(path: PortablePath) -> str | Path:
    """On a worker: the file or directory of :func:`portable_path` on this node."""
    return path.materialize() if isinstance(path, TreeRef) else path
