"""A portfolio: the compiles a build may spend on one object, in order; the smallest object is kept.

Why: for C, every decision channel an unmodified clang-22 opens is nearly spent by the shipped scorers (a
per-module oracle over ten nearby scorers buys ~0.25 % per channel:
docs/experiments/2026-11-24-register-allocation.md). What is left is per-object
luck — one object is smaller with another allocator scorer, another with an option of a pass in ``-Oz``'s
own pipeline (a threshold, or the pass skipped) — and a build that values bytes over compile time can buy
it: compile the object ``N`` ways and keep the smallest. Every candidate is a correct program by
construction (eviction and priority answers are legal choices; the pass options change how much a pass
``-Oz`` runs anyway does, never switch on a pass clang keeps off), and clang's own compile is one of them,
so no object grows.

A portfolio file (JSON, ``format`` :data:`FORMAT`) names the language family it decides and its
candidates, the first being the default build's, and ``default_candidates`` (default 1), how many of them a
build compiles unless asked for another count; each candidate ``{"name", "policies": {problem: spec},
"flags": [...]}``. A spec is ``pretrained`` (the policy shipped
for that problem), ``heuristic`` (clang's own decisions: the compile opens no channel for that problem) or a
file name relative to the portfolio's directory; a candidate without policies and
flags is clang's own compile. The shipped portfolio (:data:`PRETRAINED_PORTFOLIO`) was chosen greedily
on training modules (docs/experiments/2026-11-25-portfolio.md).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from optgym.errors import OptgymError
from optgym.policies import PRETRAINED_DIR

FORMAT = "optgym-portfolio/1"
PRETRAINED_PORTFOLIO = PRETRAINED_DIR / "portfolio-c.json"


#: The specs a candidate names without a file: the shipped policy, and clang's own decisions.
BUILTIN_SPECS = ("pretrained", "heuristic")


class PortfolioError(OptgymError):
    """A portfolio file that is missing, unreadable or malformed."""


#: Options of passes -Oz runs anyway (name → extra clang flags), the pool a portfolio candidate's flags come from
#: (``python -m maintainer.portfolio``; measured one by one by ``python -m research.levers``): unlike switching on a
#: pass clang keeps off, they change how much a pass of the default pipeline does (or skip one), never add code
#: clang does not run.
PASS_OPTIONS: dict[str, tuple[str, ...]] = {
    "no tail duplication": ("-mllvm", "-disable-tail-duplicate", "-mllvm", "-disable-early-taildup"),
    "no tail duplication in placement": ("-mllvm", "-tail-dup-placement=false"),
    "tail merge from 2 instructions": ("-mllvm", "-tail-merge-size=2"),
    "jump tables from 8 cases": ("-mllvm", "-min-jump-table-entries=8"),
    "jump tables from 3 cases": ("-mllvm", "-min-jump-table-entries=3"),
    "jump tables at density 10": ("-mllvm", "-optsize-jump-table-density=10"),
    "jump tables at density 80": ("-mllvm", "-optsize-jump-table-density=80"),
    "no phi folding": ("-mllvm", "-phi-node-folding-threshold=0", "-mllvm", "-two-entry-phi-node-folding-threshold=0"),
    "more phi folding": (
        "-mllvm",
        "-phi-node-folding-threshold=4",
        "-mllvm",
        "-two-entry-phi-node-folding-threshold=8",
    ),
    "callee-saved register cost 10": ("-mllvm", "-regalloc-csr-first-time-cost=10"),
    "no shrink wrapping": ("-mllvm", "-enable-shrink-wrap=false"),
    "no switch lookup tables": ("-mllvm", "-switch-to-lookup=false"),
}


@dataclass(frozen=True)
class Candidate:
    """One way to compile an object: a policy per decision problem, and extra clang flags."""

    name: str
    policies: tuple[tuple[str, str], ...]  # (problem, policy spec), resolved: ``pretrained`` or an absolute path
    flags: tuple[str, ...] = ()

    @property
    def is_clang(self) -> bool:
        """clang's own compile: nothing decided, nothing added."""
        return not self.policies and not self.flags

    def compile_policies(self, build: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        """The ``(problem, spec)`` pairs of this candidate's compile in a build whose policies are ``build``:
        the build's, each replaced by the candidate's for the same problem, then the candidate's others. (clang's
        own compile, :attr:`is_clang`, has none: the caller compiles it plainly.)"""
        mine = dict(self.policies)
        return [(problem, mine.pop(problem, spec)) for problem, spec in build] + list(mine.items())

    def channel_policies(self, build: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        """:meth:`compile_policies` without the ``heuristic`` ones: the decisions this candidate's compile serves
        over a channel. clang decides the others alone, at no cost (a channel's round trips cost a compile up to
        1.4x), byte for byte as a compile with no channel."""
        return [] if self.is_clang else [(p, spec) for p, spec in self.compile_policies(build) if spec != "heuristic"]

    def measured_policies(self, build: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        """The ``(problem, spec)`` pairs that measure this candidate's compile outside a build (``optgym evaluate``,
        the portfolio's chooser): :meth:`channel_policies`, or — with none left, a compile of pass options alone —
        the inliner's channel answering clang's own decisions, which is clang's compile byte for byte. (A problem
        whose stream carries no heuristic answer, as register allocation's, cannot stand in for clang.)"""
        return self.channel_policies(build) or [("inline-size", "heuristic")]

    def clashes_with(self, args: Sequence[str]) -> bool:
        """Whether the build's ``args`` set an ``-mllvm`` option this candidate sets too: clang refuses most
        options given twice ("may only occur zero or one times"), and the build's own value is the build's
        choice, so such a candidate is not compiled."""
        return not _mllvm_options(self.flags).isdisjoint(_mllvm_options(args))


def _mllvm_options(args: Sequence[str]) -> set[str]:
    """The names of the ``-mllvm`` options in ``args`` (``-mllvm -x=1`` and ``-mllvm=-x=1`` both give ``-x``)."""
    values = [b for a, b in itertools.pairwise(args) if a == "-mllvm"]
    values += [a.removeprefix("-mllvm=") for a in args if a.startswith("-mllvm=")]
    return {value.split("=", 1)[0] for value in values}


@dataclass(frozen=True)
class Portfolio:
    family: str  # "C" or "C++": the language family whose compiles the portfolio decides
    candidates: tuple[Candidate, ...]  # [0]: the default build's compile
    path: Path
    default_count: int = 1  # how many candidates a build compiles unless told (``OPTGYM_CANDIDATES``)

    def applies_to(self, build: Sequence[tuple[str, str]]) -> bool:
        """Whether a build whose policies are ``build`` compiles with this portfolio: it leaves every problem the
        first candidate names at its default, the shipped policy (a build that chose its own, or clang's,
        allocator gets what it chose). The candidate's own policy for such a problem may be another, clang's
        ``heuristic`` too: a default build is what the portfolio says it is. A problem the build does not name is
        at its default as well: a target's build names only what the target ships, and the target's portfolio
        brings its own allocator scorers (``pretrained/thumbv7em/portfolio-c/``)."""
        chosen = dict(build)
        return all(chosen.get(problem, "pretrained") == "pretrained" for problem, _ in self.candidates[0].policies)

    def first(self, count: int) -> tuple[Candidate, ...]:
        """The first ``count`` candidates (all of them when ``count`` exceeds the portfolio)."""
        if count < 1:
            raise PortfolioError(f"a portfolio compiles at least one candidate, not {count}")
        return self.candidates[:count]


def load_portfolio(path: Path | str = PRETRAINED_PORTFOLIO) -> Portfolio:
    """Read and check a portfolio file: a clear error naming the file for anything wrong in it."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise PortfolioError(f"portfolio {path}: unreadable: {e}") from e
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise PortfolioError(f"portfolio {path}: not an {FORMAT} file")
    family, entries = data.get("family"), data.get("candidates")
    if family not in ("C", "C++") or not isinstance(entries, list) or not entries:
        raise PortfolioError(f"portfolio {path}: needs a family (C or C++) and a non-empty list of candidates")
    candidates = []
    for entry in entries:
        try:
            name, policies, flags = entry["name"], dict(entry.get("policies", {})), list(entry.get("flags", []))
        except (TypeError, KeyError, ValueError) as e:
            raise PortfolioError(f"portfolio {path}: malformed candidate {entry!r}") from e
        if not all(isinstance(x, str) for x in [name, *policies, *policies.values(), *flags]):
            raise PortfolioError(f"portfolio {path}: candidate {name!r}: names, specs and flags are strings")
        resolved = []
        for problem, spec in sorted(policies.items()):
            if spec not in BUILTIN_SPECS:
                spec = str(path.parent / spec)
                if not Path(spec).exists():
                    raise PortfolioError(f"portfolio {path}: candidate {name!r}: {spec} is missing")
            resolved.append((problem, spec))
        candidates.append(Candidate(name, tuple(resolved), tuple(flags)))
    if len({c.name for c in candidates}) != len(candidates):
        raise PortfolioError(f"portfolio {path}: candidate names repeat")
    default = data.get("default_candidates", 1)
    if type(default) is not int or not 1 <= default <= len(candidates):
        raise PortfolioError(f"portfolio {path}: default_candidates is a count of its candidates, not {default!r}")
    return Portfolio(family, tuple(candidates), path, default)
