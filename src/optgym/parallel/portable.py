"""Modules (and policy files) addressed by content, so workers need not share a filesystem with the driver.

A :class:`ModuleRef` names a corpus module by its digest (the hash every per-module cache is keyed by)
and carries its bytes — bitcode and ``.cmd`` — as a Ray object (put in the object store once per
driver connection, however many tasks and fan-outs name it) or, without Ray, inline. On a worker,
:meth:`ModuleRef.materialize` writes them once per node to ``$OPTGYM_CACHE_DIR/modules/<digest>/``
and returns an ordinary :class:`~optgym.corpus.Module` there: later tasks on that node, in any worker
process and any later run, find the directory and fetch nothing. The digest is checked before the
directory is published, so a corrupt transfer can never poison the cache.

:class:`TreeRef` does the same for a file or directory (``$OPTGYM_CACHE_DIR/trees/<digest>/``), and
:func:`portable_policy` uses it for the policy directory a trained policy's factory names by path.

Every fan-out over corpus modules makes its tasks with :func:`portable_modules` (refs under Ray, the modules
themselves locally) and opens the module in the task with :func:`local_module`, so no task names a corpus path.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optgym.corpus.cache import cache_root
from optgym.corpus.corpus import Module
from optgym.errors import CorpusError, OptgymError
from optgym.policies import PolicyFactory

_BITCODE, _COMMAND = "module.bc", "module.cmd"

#: digest → Ray ObjectRef of (bitcode, command), for the current connection (see ray_backend.connect).
_uploads: dict[str, Any] = {}


def module_digest(bitcode: bytes, command: bytes) -> str:
    """The digest :attr:`Module.digest` computes from the files, computed from their bytes."""
    h = hashlib.sha256()
    for part in (bitcode, command):
        h.update(part)
        h.update(b"\0")
    return h.hexdigest()


def modules_dir() -> Path:
    """Where materialized modules live on this node: ``$OPTGYM_CACHE_DIR/modules``."""
    return cache_root() / "modules"


def _publish_once(final: Path, fill: Callable[[Path], None]) -> None:
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


@dataclass(frozen=True)
class ModuleRef:
    """A module by content: ``name`` (for reports), ``digest``, and ``payload`` — a Ray ObjectRef of
    ``(bitcode, command)`` bytes, or those bytes themselves."""

    name: str
    digest: str
    payload: Any

    @classmethod
    def inline(cls, module: Module) -> ModuleRef:
        """A ref carrying the bytes itself (no object store): local tests, pickled task files."""
        bitcode, command = _read(module)
        return cls(module.name, module_digest(bitcode, command), (bitcode, command))

    def materialize(self) -> Module:
        """The module as files on this node, fetched and written at most once per node."""
        final = modules_dir() / self.digest
        module = Module(self.name, final / _BITCODE, final / _COMMAND)
        module.__dict__["digest"] = self.digest  # cached_property: the content was verified on publish
        if not final.is_dir():
            _publish_once(final, self._fill)
        return module

    def _fill(self, staging: Path) -> None:
        bitcode, command = _fetch(self.payload)
        if module_digest(bitcode, command) != self.digest:
            raise CorpusError(f"module {self.name}: fetched bytes do not match digest {self.digest[:12]}…")
        (staging / _BITCODE).write_bytes(bitcode)
        (staging / _COMMAND).write_bytes(command)


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
            _publish_once(final, self._fill)
        path = final / self.name
        return str(path) if self.as_str else path

    def _fill(self, staging: Path) -> None:
        entries = _fetch(self.payload)
        if tree_digest(entries) != self.digest:
            raise OptgymError(f"{self.name}: fetched bytes do not match digest {self.digest[:12]}…")
        for rel, data in entries:
            target = staging / self.name / rel if rel else staging / self.name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)


def _materializing_builder(builder: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """A policy factory's builder, called with its path arguments materialized on this node first."""
    return builder(*(a.materialize() if isinstance(a, TreeRef) else a for a in args), **kw)


def _read(module: Module) -> tuple[bytes, bytes]:
    try:
        return module.bitcode.read_bytes(), module.command.read_bytes()
    except FileNotFoundError as e:
        raise CorpusError(f"module {module.name}: {e.filename} is missing") from None


def _fetch(payload: Any) -> Any:
    if isinstance(payload, tuple | list):
        return payload
    import ray  # a payload that is not bytes is an ObjectRef: we are in a Ray worker

    return ray.get(payload)


def upload(modules: Sequence[Module], address: str) -> list[ModuleRef]:
    """Refs to ``modules`` with their bytes in the object store of the cluster at ``address``.

    Each distinct content is put once per connection: a trainer naming the same modules every
    iteration uploads them once.
    """
    from optgym.parallel.ray_backend import connect

    ray = connect(address)
    refs = []
    for module in modules:
        digest = module.digest
        if digest not in _uploads:
            bitcode, command = _read(module)
            if module_digest(bitcode, command) != digest:
                raise CorpusError(f"module {module.name} changed while it was being read")
            _uploads[digest] = ray.put((bitcode, command))
        refs.append(ModuleRef(module.name, digest, _uploads[digest]))
    return refs


def upload_tree(path: Path | str, address: str) -> TreeRef:
    """A ref to the file or directory at ``path`` with its bytes in the object store (once per content)."""
    from optgym.parallel.ray_backend import connect

    ray = connect(address)
    entries = read_tree(Path(path))
    digest = tree_digest(entries)
    if digest not in _uploads:
        _uploads[digest] = ray.put(entries)
    return TreeRef(Path(path).name, digest, _uploads[digest], isinstance(path, str))


def forget_uploads() -> None:
    """Drop the object-store refs (a disconnect invalidates them)."""
    _uploads.clear()


#: What a task carries for a module: the :class:`Module` (local workers read the corpus where it is) or, when
#: the fan-out goes to Ray, a :class:`ModuleRef`; a worker turns either into files with :func:`local_module`.
PortableModule = Module | ModuleRef
#: The same for a file or directory (a policy template): its path, or a :class:`TreeRef`; see :func:`local_path`.
PortablePath = str | Path | TreeRef


def portable_modules(
    modules: Sequence[Module], workers: int | None = None, ray_address: str | None = None
) -> list[PortableModule]:
    """What the tasks of a fan-out with these arguments should carry for ``modules``: content refs when it goes
    to Ray (see :func:`~optgym.parallel.get_executor`), else the modules themselves.

    Every fan-out over corpus modules (evaluate, trace, search, ES, corpus info) goes through this, so none of
    them needs the corpus path on a worker. Locally the modules pass as they are: carrying their bytes would
    pickle every bitcode into every task and write a second copy of the corpus into the cache, for workers that
    can read the files anyway. ThinLTO backends travel as paths even to Ray: a backend reads its index and the
    modules it imports by absolute path, so its workers must see the corpus where it was made.
    """
    from optgym.parallel.executor import ray_backend_address

    address = ray_backend_address(workers, ray_address)
    if address is None or any(m.thinlto_index for m in modules):
        return list(modules)
    return upload(modules, address)


def local_module(module: PortableModule) -> Module:
    """On a worker: the module of :func:`portable_modules` as files on this node."""
    return module.materialize() if isinstance(module, ModuleRef) else module


def portable_path(path: str | Path, workers: int | None = None, ray_address: str | None = None) -> PortablePath:
    """``path`` as a task of such a fan-out should carry it: a :class:`TreeRef` under Ray, else the path."""
    from optgym.parallel.executor import ray_backend_address

    address = ray_backend_address(workers, ray_address)
    return upload_tree(path, address) if address is not None else path


def local_path(path: PortablePath) -> str | Path:
    """On a worker: the file or directory of :func:`portable_path` on this node."""
    return path.materialize() if isinstance(path, TreeRef) else path


def portable_policy(
    factory: PolicyFactory, workers: int | None = None, ray_address: str | None = None
) -> PolicyFactory:
    """``factory`` with the files it names carried by content, when a fan-out with these arguments goes to Ray.

    A trained policy's factory names its policy directory by path (``--policy runs/ppo-1``); a worker on
    another machine has no such path. Under Ray, each argument that is an existing file or directory is
    uploaded as a :class:`TreeRef` and the builder materializes it on the worker's node first. The identity
    (every cache key) is unchanged. Locally, and for built-in policies, ``factory`` is returned as it is.
    """
    from optgym.parallel.executor import ray_backend_address

    address = ray_backend_address(workers, ray_address)
    if address is None or not Path(factory.spec).exists():
        return factory
    args = tuple(upload_tree(a, address) if isinstance(a, str | Path) and Path(a).exists() else a for a in factory.args)
    if not any(isinstance(a, TreeRef) for a in args):
        return factory
    return dataclasses.replace(factory, builder=_materializing_builder, args=(factory.builder, *args))
