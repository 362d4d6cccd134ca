"""Which call sites a policy decided differently from the heuristic, named by the compiler itself.

Both compiles run through the interactive channel (the heuristic's by replaying
``inlining_default``) with ``-opt-record-file``: the inliner's optimization remarks name caller,
callee and — when the module has debug info — the source location of every decision. Diffing the
two remark multisets needs no alignment of decision numbers, which shift as soon as one decision
differs (an inlined callee brings its own call sites into the caller).
"""

from __future__ import annotations

import re
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from optgym.corpus import Module
from optgym.policies import resolve_policy
from optgym.problems import get_problem
from optgym.rollout import rollout
from optgym.rollout.simple import heuristic
from optgym.toolchain import find_toolchain
from optgym.toolchain.process import private_dir

#: Remark names that mean "inlined" (the default inliner's and the ML advisor's).
INLINED = ("Inlined", "AlwaysInline", "InliningSuccess", "InliningSuccessWithCalleeDeleted")
_DOC = re.compile(r"^--- !(\w+)")
_FIELD = re.compile(r"^(\w+):\s*(.*)$")
_CALLEE = re.compile(r"^\s*- Callee:\s*(.*)$")
_LOC = re.compile(r"File:\s*'?([^,']*)'?,\s*Line:\s*(\d+),\s*Column:\s*(\d+)")


@dataclass(frozen=True, order=True)
class CallSite:
    caller: str
    callee: str
    location: str  # "file:line:column", or "" without debug info


def _unquote(value: str) -> str:
    return value.strip().strip("'\"")


def parse_remarks(text: str) -> Counter[tuple[CallSite, bool]]:
    """(call site, inlined?) → count, over the inliner remarks of one YAML remarks file."""
    decisions: Counter[tuple[CallSite, bool]] = Counter()
    doc: dict[str, str] = {}

    def flush() -> None:
        if doc.get("Pass", "").startswith("inline") and doc.get("Callee") and doc.get("Function"):
            site = CallSite(_unquote(doc["Function"]), _unquote(doc["Callee"]), doc.get("DebugLoc", ""))
            decisions[(site, doc.get("Name", "") in INLINED)] += 1

    pending = ""  # a flow mapping ({ File: …, Line: …}) that YAML wrapped over several lines
    for line in text.splitlines():
        if pending:
            pending += " " + line.strip()
            if "}" not in line:
                continue
            line, pending = pending, ""
        elif line.startswith("DebugLoc:") and "{" in line and "}" not in line:
            pending = line
            continue
        if _DOC.match(line):
            flush()
            doc = {}
        elif (m := _FIELD.match(line)) is not None:
            key, value = m.groups()
            if key == "DebugLoc" and (loc := _LOC.search(value)):
                value = f"{loc.group(1)}:{loc.group(2)}:{loc.group(3)}"
            doc.setdefault(key, value)
        elif "Callee" not in doc and (m := _CALLEE.match(line)) is not None:
            doc["Callee"] = m.group(1)
    flush()
    return decisions


@dataclass
class SiteDiff:
    site: CallSite
    heuristic_inlined: int
    policy_inlined: int
    heuristic_kept: int
    policy_kept: int


@dataclass
class ModuleDiff:
    module: str
    heuristic_text: int
    policy_text: int
    heuristic_dottext: int
    policy_dottext: int
    sites: list[SiteDiff] = field(default_factory=list)


def diff_decisions(heuristic_remarks: str, policy_remarks: str) -> list[SiteDiff]:
    """Call sites whose inlined/kept counts differ between the two compiles."""
    h, p = parse_remarks(heuristic_remarks), parse_remarks(policy_remarks)
    sites = sorted({site for site, _ in h} | {site for site, _ in p})
    out = []
    for site in sites:
        counts = (h[(site, True)], p[(site, True)], h[(site, False)], p[(site, False)])
        if counts[0] != counts[1] or counts[2] != counts[3]:
            out.append(SiteDiff(site, *counts))
    return out


def diff_module(policy: str, module: Module, problem: str = "inline-size", seed: int = 0) -> ModuleDiff:
    """Compile ``module`` with the heuristic and with ``policy``, recording remarks, and diff them."""
    prob = get_problem(problem)
    toolchain = find_toolchain((prob.hook,))
    factory = resolve_policy(policy, problem)
    chosen = factory.build(seed=seed) if factory.stochastic else factory.build()
    workdir = private_dir()
    try:
        texts, metrics = [], []
        for name, pol in (("heuristic", heuristic), ("policy", chosen)):
            remarks = workdir / f"{name}.yaml"
            flags = ["-opt-record-file", str(remarks), "-opt-record-passes", "inline", "-opt-record-format", "yaml"]
            run = rollout(prob, module, toolchain, pol, extra_flags=flags)
            if not run.result.ok:
                raise RuntimeError(f"{module.name}: {name} compile failed: {run.result.status}: {run.result.detail}")
            texts.append(remarks.read_text() if remarks.exists() else "")
            metrics.append(run.result.metrics)
        return ModuleDiff(
            module=module.name,
            heuristic_text=metrics[0]["text_bytes"],
            policy_text=metrics[1]["text_bytes"],
            heuristic_dottext=metrics[0]["dottext_bytes"],
            policy_dottext=metrics[1]["dottext_bytes"],
            sites=diff_decisions(texts[0], texts[1]),
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def demangle(names: list[str], toolchain_dir: Path | None = None) -> dict[str, str]:
    """Readable C++ names through ``llvm-cxxfilt`` (identity for C names or without the tool)."""
    import subprocess

    tool = shutil.which("llvm-cxxfilt", path=str(toolchain_dir)) if toolchain_dir else None
    tool = tool or shutil.which("llvm-cxxfilt-22") or shutil.which("c++filt")
    if not tool or not names:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True, timeout=60).stdout
    readable = out.splitlines()
    return dict(zip(names, readable, strict=False)) if len(readable) == len(names) else {n: n for n in names}
