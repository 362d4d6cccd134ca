"""Writing an evaluation: ``report.json`` (for scripts), ``modules.csv``, ``report.md`` and PNG plots (for people).

``report.json`` is deterministic: the same policy and corpus give the same file, except the
``timing`` section (wall-clock figures live there and only there).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from optgym.files import atomic_write_bytes
from optgym.train.evaluation import GUARD_BELOW, REPORT_FORMAT_VERSION, ModuleRow, summarize

CSV_COLUMNS = ("module", "heuristic_text", "policy_text", "heuristic_dottext", "policy_dottext", "ratio",
               "decisions", "decisions_differing", "compile_seconds", "status")  # fmt: skip


def build_report(rows: Sequence[ModuleRow], identity: dict[str, Any],
                 snapshots: list[dict[str, Any]] | None = None) -> dict[str, Any]:  # fmt: skip
    """The ``report.json`` object: totals, identity (policy, compiler, corpus), failures, snapshots."""
    report: dict[str, Any] = {"format_version": REPORT_FORMAT_VERSION, **summarize(rows), **identity}
    report["failures"] = [{"module": r.module, "status": r.status, "detail": r.detail} for r in rows if not r.ok]
    if snapshots is not None:
        report["snapshots"] = snapshots
    report["timing"] = {"compile_seconds": round(sum(r.compile_seconds for r in rows), 3)}
    return report


def _csv(rows: Sequence[ModuleRow]) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for r in sorted(rows, key=lambda r: r.module):
        d = asdict(r)
        d["ratio"] = f"{r.ratio:.6f}" if r.ratio is not None else ""
        d["compile_seconds"] = f"{r.compile_seconds:.4f}"
        writer.writerow(["" if d[c] is None else d[c] for c in CSV_COLUMNS])
    return out.getvalue().encode()


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "—"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _markdown(report: dict[str, Any], rows: Sequence[ModuleRow], plots: list[str]) -> str:
    ok = sorted((r for r in rows if r.ok), key=lambda r: (r.ratio, r.module))
    lines = [
        f"# {report['policy']} vs the heuristic — {report['problem']}",
        "",
        f"Corpus `{report['corpus']}`{' split ' + report['split'] if report.get('split') else ''}; "
        f"compiler {report['compiler']}.",
        "",
        "| | heuristic | policy | ratio |",
        "|---|---:|---:|---:|",
        f"| Berkeley text (bytes) | {report['heuristic_text_bytes']} | {report['policy_text_bytes']} "
        f"| {_fmt(report['total_ratio'])} |",
        f"| .text (bytes) | {report['heuristic_dottext_bytes']} | {report['policy_dottext_bytes']} "
        f"| {_fmt(report['dottext_ratio'])} |",
        *(
            [
                f"| Berkeley text + data (what moved into writable sections counts too) | | | "
                f"{_fmt(report['text_and_data_ratio'])} |"
            ]
            if report.get("text_and_data_ratio") is not None
            else []
        ),
        *(
            [f"| never inline (bytes) | | {report['never_inline_text_bytes']} | |"]
            if report["never_inline_text_bytes"] is not None
            else []
        ),
        f"| guarded (`OPTGYM_GUARD=1`: the smaller object per module) | | | {_fmt(report['guarded_ratio'])} |",
        *(
            [
                f"| guarded below {GUARD_BELOW} B (`OPTGYM_GUARD_BELOW={GUARD_BELOW}`: the smaller where the "
                f"policy's is under that; {report['guarded_below_over_1pct']} modules > 1 % worse) | | | "
                f"{_fmt(report['guarded_below_ratio'])} |"
            ]
            if report.get("guarded_below_ratio") is not None
            else []
        ),
        "",
        f"Modules: {report['modules']} — improved {report['improved']}, regressed {report['regressed']} "
        f"({report['regressed_over_1pct']} by more than 1 %), same {report['same']}, failed {report['failed']}. "
        f"Geomean ratio {_fmt(report['geomean_ratio'])}. Decisions {report['decisions']}, "
        f"{report['decisions_differing']} differing from the heuristic.",
        "",
    ]
    for title, chosen in (("10 best modules", ok[:10]), ("10 worst modules", ok[::-1][:10])):
        lines += [f"## {title}", "", "| module | heuristic | policy | ratio | decisions | differing |",
                  "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
        lines += [f"| {r.module} | {r.heuristic_text} | {r.policy_text} | {r.ratio:.4f} | {r.decisions} "
                  f"| {r.decisions_differing} |" for r in chosen]  # fmt: skip
        lines.append("")
    if report["failures"]:
        lines += ["## Failed modules", "", "| module | status | detail |", "|---|---|---|"]
        lines += [f"| {f['module']} | {f['status']} | {f['detail'][:200]} |" for f in report["failures"]]
        lines.append("")
    if report.get("snapshots"):
        lines += ["## Snapshots", "", "| snapshot | total ratio | geomean | improved | regressed |",
                  "|---|---:|---:|---:|---:|"]  # fmt: skip
        lines += [f"| {s['snapshot']} | {_fmt(s['total_ratio'])} | {_fmt(s['geomean_ratio'])} | {s['improved']} "
                  f"| {s['regressed']} |" for s in report["snapshots"]]  # fmt: skip
        lines.append("")
    lines += [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def _plots(out: Path, rows: Sequence[ModuleRow], snapshots: list[dict[str, Any]] | None) -> list[str]:
    import itertools

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[str] = []

    def figure(name: str, title: str, xlabel: str, ylabel: str, draw) -> None:
        fig, ax = plt.subplots(figsize=(7, 4))
        draw(ax)
        ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written.append(name)

    ok = [r for r in rows if r.ok]
    if ok:
        ratios = [r.ratio for r in ok]
        savings = sorted((r.heuristic_text - r.policy_text for r in ok), reverse=True)  # type: ignore[operator]
        cumulative = list(itertools.accumulate(savings))

        def histogram(ax) -> None:
            ax.hist(ratios, bins=min(50, max(10, len(ok) // 2)), color="#4477aa")
            ax.axvline(1.0, color="black", linewidth=1)

        def saving(ax) -> None:
            ax.plot(range(1, len(cumulative) + 1), cumulative, color="#228833")
            ax.axhline(0, color="black", linewidth=1)

        figure("ratio_histogram.png", "Per-module size ratio", "policy / heuristic (Berkeley text, per module)",
               "modules", histogram)  # fmt: skip
        figure("cumulative_saving.png", "Cumulative saving over modules", "modules, largest saving first",
               "bytes saved vs heuristic (cumulative)", saving)  # fmt: skip
    if snapshots:

        def curve(ax) -> None:
            x = range(len(snapshots))
            ax.plot(x, [s["total_ratio"] for s in snapshots], marker="o", label="total ratio")
            ax.plot(x, [s["geomean_ratio"] for s in snapshots], marker="x", label="geomean ratio")
            ax.set_xticks(x, [s["snapshot"] for s in snapshots], rotation=45, ha="right")
            ax.axhline(1.0, color="black", linewidth=1)
            ax.legend()

        figure("snapshots.png", "Snapshots", "snapshot", "policy / heuristic", curve)
    return written


def write_report(out: Path, rows: Sequence[ModuleRow], identity: dict[str, Any],
                 snapshots: list[dict[str, Any]] | None = None) -> dict[str, Any]:  # fmt: skip
    """Write report.json, modules.csv, report.md and the plots under ``out``; return the report."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    report = build_report(rows, identity, snapshots)
    plots = _plots(out, rows, snapshots)
    atomic_write_bytes(out / "modules.csv", _csv(rows))
    atomic_write_bytes(out / "report.md", _markdown(report, rows, plots).encode())
    atomic_write_bytes(out / "report.json", (json.dumps(report, indent=2, sort_keys=True) + "\n").encode())
    return report
