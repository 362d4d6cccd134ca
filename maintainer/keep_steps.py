#!/usr/bin/env python3
"""Keep the finished steps of an ``optgym benchmark run`` in the repository, so a new machine can continue it.

    .venv/bin/python -m maintainer.keep_steps OUT DEST     # copy what a rerun needs out of OUT into DEST
    cp -r DEST/. OUT/                                       # on a new machine: then rerun the same command
    .venv/bin/python -m maintainer.keep_steps --run RUN DEST   # one run directory, to continue with --resume

Why: a registered recipe of several hours outlives a session, and this workplace's machines do not always
outlive one. Nineteen sessions of runs were lost with one machine, together with a claim's policies before
their unseen set was measured. A benchmark run skips every step whose marker (``OUT/done``) exists. So
the markers, plus the files the later steps and the leaderboard read, are enough to go on from where the
old machine stopped.

What is kept, for each step with a marker:
- the run's ``config.toml`` and ``progress.csv``;
- its ``final/`` directory (the policy and its metrics);
- every snapshot's ``validation.json`` (how its final policy was chosen, and the compiles the budget counts).
For a finished search, only its ``search.json`` (its summary: the compiles the budget counts). Its states are
read by the imitation alone, which has its own marker. Left out: snapshots' models, TensorBoard logs and
caches. A step cut off before its marker is started again on the new machine.

With ``--run``, one run directory started by hand (a registered ``optgym train pattern`` of several hours, say) is
kept whole but for its TensorBoard logs, finished or not: copied back to the same path on a new machine, its
``--resume RUN`` goes on from its last snapshot. A pattern search's snapshots are a few kilobytes each.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

#: Files of a finished run or search directory that a rerun or the leaderboard reads.
KEPT = ("config.toml", "progress.csv", "final/**/*", "snapshots/*/validation.json", "search.json")


def finished_runs(out: Path) -> list[Path]:
    """The run and search directories of the steps ``out`` has markers for."""
    runs = []
    for marker in sorted((out / "done").glob("*.json")):
        command = json.loads(marker.read_text())["command"]  # the step's pinned command
        if "-o" in command:
            runs.append(Path(command[command.index("-o") + 1]))
    return runs


def keep(out: Path, dest: Path) -> int:
    """Copy ``out``'s markers and its finished runs' kept files into ``dest``; returns the files copied."""
    return _copy([*sorted((out / "done").glob("*.json")), *_kept_files(out)], out, dest)


#: The files of a run directory that no resume or report reads.
LEFT_OUT = "events.out.tfevents*"


def keep_run(run: Path, dest: Path) -> int:
    """Copy every file of the run directory ``run`` into ``dest`` but its TensorBoard logs; returns the files."""
    return _copy([f for f in sorted(run.rglob("*")) if f.is_file() and not f.match(LEFT_OUT)], run, dest)


def _copy(files: list[Path], root: Path, dest: Path) -> int:
    for source in files:
        target = dest / source.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    return len(files)


def _kept_files(out: Path) -> list[Path]:
    files = []
    for run in finished_runs(out):
        if not run.resolve().is_relative_to(out.resolve()):
            raise ValueError(f"{run} is outside {out}: its steps' -o must be under the benchmark's output")
        files += [f for pattern in KEPT for f in sorted(run.glob(pattern)) if f.is_file()]
    return files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="the benchmark run's output directory (-o), or with --run a run's")
    parser.add_argument("dest", type=Path, help="where to keep the files (a directory in the repository)")
    parser.add_argument("--run", action="store_true", help="OUT is one run directory: keep it all but its logs")
    args = parser.parse_args()
    copied = keep_run(args.out, args.dest) if args.run else keep(args.out, args.dest)
    print(f"kept {copied} files in {args.dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
