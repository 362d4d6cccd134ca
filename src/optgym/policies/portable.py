"""Policy factories whose files travel by content (:mod:`optgym.parallel.portable`) to workers that do not share
the driver's filesystem."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from optgym.parallel.portable import TreeRef, materializing_builder, upload_tree
from optgym.policies import PolicyFactory


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
    return dataclasses.replace(factory, builder=materializing_builder, args=(factory.builder, *args))
