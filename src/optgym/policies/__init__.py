"""Policies: what decides in place of the compiler's heuristic, named by a spec string.

Every command that takes ``--policy`` resolves the spec here into a picklable :class:`PolicyFactory`:
it travels to worker processes, where :meth:`PolicyFactory.build` makes the policy *inside* the
worker (no per-decision round trip to the parent), and its :attr:`PolicyFactory.identity` keys caches.

Specs: ``heuristic``, ``never``, ``always``, ``random`` (``random:SEED``), ``pretrained`` (the policy
shipped inside the package for the problem at hand — :data:`PRETRAINED` for inlining — with its
provenance beside it), ``rule`` (the hand-set inline rule, a named baseline: :data:`BASELINES`); trained policies
(run directories, snapshots, exported files) register a resolver with :func:`register_resolver`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optgym.errors import OptgymError
from optgym.problems import registry
from optgym.rollout.rollout import Policy
from optgym.rollout.simple import SIMPLE_POLICIES, RandomPolicy


class PolicyError(OptgymError):
    """A policy spec that names nothing loadable."""


#: The shipped inline-size policy (ONNX, see optgym.policies.export) and its provenance (JSON).
PRETRAINED_DIR = Path(__file__).parent / "pretrained"
PRETRAINED = PRETRAINED_DIR / "inline-size.onnx"
PRETRAINED_PROVENANCE = PRETRAINED_DIR / "inline-size.provenance.json"


def pretrained_names() -> dict[str, str]:
    """Each registered problem's shipped policy, by file name in PRETRAINED_DIR (each an ``optgym export`` ONNX
    file): what the problem declares (``Problem.pretrained``), so a new problem ships one without an edit here."""
    return {name: cls.pretrained for name, cls in registry().items() if cls.pretrained is not None}


#: :func:`pretrained_names` of optgym's own problems (the registry at import; the functions here read it live).
PRETRAINED_NAMES = pretrained_names()
#: The guard's bound without ``OPTGYM_GUARD_BELOW`` (:mod:`optgym.serve.guard`): none. A default build compiles every
#: object once. The guard at 2 kB (:data:`SUGGESTED_GUARD_BELOW`) compiled a second time the objects where a size
#: policy's losses concentrate, but most objects of a C or C++ build are that small: it cost a default build 0.1-0.15x
#: of plain clang's CPU (graphite2 1.12x -> 1.28x, 1 kB 1.26x; cmark 1.16x -> 1.24-1.29x) for 0.01-0.1 % of size
#: (docs/experiments/2026-11-25-default-build-cost.md), past the 1.25x a drop-in compiler may cost by default.
DEFAULT_GUARD_BELOW: int | None = None
#: The bound a build that wants the guard is pointed to (``OPTGYM_GUARD_BELOW=2048``) and ``optgym evaluate`` reports.
#: Chosen on training modules: first for C compiles with the allocator's scorers (they depart from clang in every
#: compile and cannot hand a single decision back): 25 of 404 C modules > 1 % larger, 19 of them under 2 kB of text —
#: a size 229 of the 404 have, with 9 % of the bytes and 6 % of the bytes saved. Then for C++ (the inliner alone,
#: the hand rule then shipped): 3 of its 5 regressions on 408 C++ training modules are under 2 kB (357, 379,
#: 1 326 B), and the guard leaves 2 at 0.9251 of clang's size against 0.9252. Only a compile where the policy
#: departed from clang pays: the reference runs after it, for an object under the bound.
SUGGESTED_GUARD_BELOW = 2048


def pretrained_path(problem: str) -> Path:
    """Where the policy shipped for ``problem`` lives (it may be missing: see :func:`resolve_policy`)."""
    shipped = pretrained_names()
    if problem not in shipped:
        raise PolicyError(f"optgym ships no pretrained policy for {problem} (it ships: {', '.join(shipped)})")
    return PRETRAINED_DIR / shipped[problem]


def pretrained_provenance(problem: str) -> Path:
    """The provenance (JSON: data, command, compiler, figures) beside ``problem``'s shipped policy."""
    return pretrained_path(problem).with_suffix(".provenance.json")


#: Baselines shipped by name beside the pretrained policies (spec → problem → file in PRETRAINED_DIR): the policies a
#: learned one has to beat stay at hand when another ships as ``pretrained``. ``rule`` is the hand-set C++ inline
#: rule (clang's threshold moved by a margin for callees with few users, tuned by ``optgym train threshold``).
BASELINES: dict[str, dict[str, str]] = {"rule": {"inline-size": "inline-size-rule.onnx"}}


def shipped_path(spec: str, problem: str) -> Path:
    """The file a shipped spec names for ``problem``: ``pretrained`` or a baseline of :data:`BASELINES`."""
    if spec == "pretrained":
        return pretrained_path(problem)
    files = BASELINES[spec]
    if problem not in files:
        raise PolicyError(f"the {spec!r} baseline decides {', '.join(files)}, not {problem}")
    return PRETRAINED_DIR / files[problem]


def shipped_provenance(spec: str, problem: str) -> Path:
    """The provenance beside the file :func:`shipped_path` names."""
    return shipped_path(spec, problem).with_suffix(".provenance.json")


@dataclass(frozen=True)
class PolicyFactory:
    """A picklable recipe for a policy. ``build(seed)`` runs in the worker that uses the policy."""

    spec: str
    identity: str  # content hash or name: the policy part of every cache key
    builder: Callable[..., Policy] = field(compare=False, repr=False)
    args: tuple[Any, ...] = ()
    stochastic: bool = False

    def build(self, seed: int | None = None) -> Policy:
        return self.builder(*self.args, seed=seed) if self.stochastic else self.builder(*self.args)


def _simple(name: str) -> Policy:
    return SIMPLE_POLICIES[name]


def _random(seed: int | None = None) -> Policy:
    return RandomPolicy(seed)


#: Resolvers for specs that are paths: each returns a factory, or None if the path is not its kind.
_RESOLVERS: list[Callable[[Path], PolicyFactory | None]] = []


def register_resolver(resolver: Callable[[Path], PolicyFactory | None]) -> None:
    """Teach :func:`resolve_policy` a new kind of policy file or directory."""
    _RESOLVERS.append(resolver)


def file_identity(path: Path) -> str:
    """The content hash of a policy file (or of every file under a directory)."""
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        h.update(f.relative_to(path).as_posix().encode() if path.is_dir() else b"")
        h.update(f.read_bytes())
    return h.hexdigest()


def resolve_policy(spec: str, problem: str = "inline-size") -> PolicyFactory:
    """The factory for ``spec`` (see the module doc) deciding ``problem``; a clear error if it names nothing."""
    name, _, arg = spec.partition(":")
    if name == "random":
        return (
            PolicyFactory(spec, spec, _random, stochastic=True)
            if not arg
            else PolicyFactory(spec, spec, _random, (int(arg),))
        )
    if name in SIMPLE_POLICIES:
        return PolicyFactory(spec, name, _simple, (name,))
    if spec == "pretrained" or spec in BASELINES:
        shipped = shipped_path(spec, problem)
        if not shipped.exists():
            raise PolicyError(f"this optgym ships no {spec} {problem} policy ({shipped} is missing)")
        spec = str(shipped)
    path = Path(spec)
    if path.exists():
        for resolver in _RESOLVERS:
            if (factory := resolver(path)) is not None:
                return factory
        raise PolicyError(f"{spec} is not a policy optgym can load (no resolver recognises it)")
    known = ", ".join(sorted([*SIMPLE_POLICIES, "pretrained", *BASELINES]))
    raise PolicyError(f"unknown policy {spec!r}: not one of {known}, random:SEED, nor an existing path")


__all__ = [
    "BASELINES",
    "DEFAULT_GUARD_BELOW",
    "PRETRAINED",
    "PRETRAINED_NAMES",
    "PRETRAINED_PROVENANCE",
    "SUGGESTED_GUARD_BELOW",
    "PolicyError",
    "PolicyFactory",
    "file_identity",
    "pretrained_names",
    "pretrained_path",
    "pretrained_provenance",
    "register_resolver",
    "resolve_policy",
    "shipped_path",
    "shipped_provenance",
]


def _register_trained() -> None:
    """Trained policies (policy, snapshot and run directories): see :mod:`optgym.policies.trained`."""
    from optgym.policies.trained import resolve_trained

    if resolve_trained not in _RESOLVERS:
        register_resolver(resolve_trained)


_register_trained()


def _register_exported() -> None:
    """Exported policies (one ``*.onnx`` file, run by onnxruntime): see :mod:`optgym.policies.export`."""
    from optgym.policies.export import resolve_onnx

    if resolve_onnx not in _RESOLVERS:
        register_resolver(resolve_onnx)


_register_exported()
