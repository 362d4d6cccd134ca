"""Corpus modules addressed by content, so workers need not share a filesystem with the driver.

A :class:`ModuleRef` names a corpus module by its digest (the hash every per-module cache is keyed by)
and carries its bytes — bitcode and ``.cmd`` — as a Ray object (put in the object store once per
driver connection, however many tasks and fan-outs name it) or, without Ray, inline. On a worker,
:meth:`ModuleRef.materialize` writes them once per node to ``$OPTGYM_CACHE_DIR/modules/<digest>/``
and returns an ordinary :class:`~optgym.corpus.Module` there: later tasks on that node, in any worker
process and any later run, find the directory and fetch nothing. The digest is checked before the
directory is published, so a corrupt transfer can never poison the cache (files and directories travel the
same way: :mod:`optgym.parallel.portable`).

Every fan-out over corpus modules makes its tasks with :func:`portable_modules` (refs under Ray, the modules
themselves locally) and opens the module in the task with :func:`local_module`, so no task names a corpus path.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optgym.corpus.corpus import Module
from optgym.errors import CorpusError
from optgym.files import cache_root
from optgym.parallel.portable import fetch_payload, publish_once

_BITCODE, _COMMAND = "module.bc", "module.cmd"


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
            publish_once(final, self._fill)
        return module

    def _fill(self, staging: Path) -> None:
        bitcode, command = fetch_payload(self.payload)
        if module_digest(bitcode, command) != self.digest:
            raise CorpusError(f"module {self.name}: fetched bytes do not match digest {self.digest[:12]}…")
        (staging / _BITCODE).write_bytes(bitcode)
        (staging / _COMMAND).write_bytes(command)


def _read(module: Module) -> tuple[bytes, bytes]:
    try:
        return module.bitcode.read_bytes(), module.command.read_bytes()
    except FileNotFoundError as e:
        raise CorpusError(f"module {module.name}: {e.filename} is missing") from None


def upload(modules: Sequence[Module], address: str) -> list[ModuleRef]:
    """Refs to ``modules`` with their bytes in the object store of the cluster at ``address``.

    Each distinct content is put once per connection: a trainer naming the same modules every
    iteration uploads them once.
    """
    from optgym.parallel.ray_backend import connect, uploads

    ray = connect(address)
    refs = []
    for module in modules:
        digest = module.digest
        if digest not in uploads:
            bitcode, command = _read(module)
            if module_digest(bitcode, command) != digest:
                raise CorpusError(f"module {module.name} changed while it was being read")
            uploads[digest] = ray.put((bitcode, command))
        refs.append(ModuleRef(module.name, digest, uploads[digest]))
    return refs


#: What a task carries for a module: the :class:`Module` (local workers read the corpus where it is) or, when
#: the fan-out goes to Ray, a :class:`ModuleRef`; a worker turns either into files with :func:`local_module`.
PortableModule = Module | ModuleRef


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
    return list(upload(modules, address))


def local_module(module: PortableModule) -> Module:
    """On a worker: the module of :func:`portable_modules` as files on this node."""
    return module.materialize() if isinstance(module, ModuleRef) else module
