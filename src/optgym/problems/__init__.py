"""Decision problems, one module each; every module in this package is imported and registers itself."""

import importlib
import pkgutil

from optgym.problems.base import (
    FeatureView,
    InvalidAction,
    Metrics,
    Problem,
    ProblemError,
    problem_flags,
    register,
    registry,
    servable,
)

for _info in pkgutil.iter_modules(__path__):
    if _info.name != "base":
        importlib.import_module(f"{__name__}.{_info.name}")


def problem_class(name: str) -> type[Problem]:
    """The problem class called ``name`` (e.g. ``"inline-size"``)."""
    try:
        return registry()[name]
    except KeyError:
        raise ProblemError(f"unknown problem {name!r}; known: {', '.join(sorted(registry()))}") from None


def get_problem(name: str, **options) -> Problem:
    """An instance of the problem called ``name`` with its options."""
    return problem_class(name)(**options)


__all__ = [
    "FeatureView",
    "InvalidAction",
    "Metrics",
    "Problem",
    "ProblemError",
    "get_problem",
    "problem_class",
    "problem_flags",
    "register",
    "registry",
    "servable",
]
