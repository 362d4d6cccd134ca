"""What every training run directory has: its config (TOML, with versions), progress.csv, TensorBoard.

``RUN/config.toml`` holds everything needed to run the same training again — ``optgym train --config
RUN/config.toml`` does exactly that — plus, under ``[versions]``, the clang, optgym, torch and
stable-baselines3 versions and the git revision the run was made with (reproducing reads the
config, never the versions: a newer clang is allowed, and said).
"""

from __future__ import annotations

import csv
import dataclasses
import importlib.metadata
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import tomli_w

from optgym.corpus import Corpus, Module
from optgym.errors import OptgymError
from optgym.files import atomic_write_bytes, read_versioned
from optgym.policies.trained import SNAPSHOTS

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

CONFIG = "config.toml"
PROGRESS = "progress.csv"
CONFIG_FORMAT_VERSION = 1


class RunError(OptgymError):
    """A run directory that cannot be created, read or resumed."""


#: What a trainer's ``--language`` may name. A run trained on one language's modules makes a policy that decides
#: only that language (ObjC and ObjC++ go with C and C++), so clang keeps deciding the other.
LANGUAGES = ("C", "C++")


def check_language(language: str | None) -> None:
    """Refuse a ``--language`` that names no language a corpus records (None: every module)."""
    if language not in (None, *LANGUAGES):
        raise RunError(f"--language {language!r}: C or C++")


def of_language(modules: Iterable[Module], language: str | None) -> list[Module]:
    """The modules a run on ``language`` sees: all of them (None), or that language's."""
    return [m for m in modules if language in (None, m.family)]


def every_kth(names: Iterable[str], k: int) -> list[str]:
    """Every ``k``-th of ``names`` in sorted order: the fixed sample ``optgym evaluate --every K`` compiles, which a
    trainer's ``--hold-out-every K`` leaves out of its training so that the sample checks it on modules it never saw."""
    return sorted(names)[::k]


def modules_to_train_on(side: Corpus, language: str | None) -> list[Module]:
    """``of_language`` of a split side, refused while nothing is lost if it is empty: a trainer calls this before
    its run directory exists, so a run on a language the side lacks leaves nothing behind."""
    chosen = of_language(side, language)
    if not chosen:
        split = f"split {side.split}, " if side.split else ""
        raise RunError(f"{side.root} has no modules to train on ({split}language {language or 'any'})")
    return chosen


def check_choices(options: Iterable[tuple[str, str, Sequence[str]]]) -> None:
    """Refuse the first ``(option, value, choices)`` whose value is not one of its choices: a trainer checks its
    recipe this way before its run directory exists."""
    for option, value, choices in options:
        if value not in choices:
            raise RunError(f"unknown {option} {value!r}: one of {', '.join(choices)}")


def check_share(option: str, value: float | None, of: str) -> None:
    """Refuse a cap on modules more than 1 % worse that is not a share (``None``: no cap): the pattern search's
    ``--max-worse`` and the validation's ``--validation-max-worse`` alike."""
    if value is not None and not 0 <= value < 1:
        raise RunError(f"{option} {value}: a share of {of}, 0 ≤ share < 1")


def versions() -> dict[str, str]:
    """The versions a run records: clang, optgym, the git revision of the source tree, torch, SB3."""
    out: dict[str, str] = {}
    try:
        from optgym.toolchain import find_toolchain

        out["clang"] = find_toolchain().banner
    except Exception as e:  # a run may still be made (and fail later) without clang
        out["clang"] = f"unavailable: {e}"
    for dist in ("optgym", "torch", "stable-baselines3", "numpy", "gymnasium"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "absent"
    out["git"] = git_revision()
    return out


def git_revision() -> str:
    """``HEAD`` of the source tree optgym runs from (``+dirty`` with local changes), or ``unknown``."""
    src = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if rev.returncode != 0:
            return "unknown"
        dirty = subprocess.run(
            ["git", "-C", str(src), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def _toml_clean(value: Any) -> Any:
    """TOML has no null and no tuples: drop ``None`` entries, make tuples lists, paths strings."""
    if isinstance(value, dict):
        return {k: _toml_clean(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_toml_clean(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def write_config(run: Path, algorithm: str, config: dict[str, Any]) -> Path:
    """``RUN/config.toml``: ``[run]`` (algorithm and options), ``[versions]``; written atomically."""
    data = {
        "format_version": CONFIG_FORMAT_VERSION,
        "algorithm": algorithm,
        "run": _toml_clean(config),
        "versions": versions(),
    }
    path = Path(run) / CONFIG
    atomic_write_bytes(path, tomli_w.dumps(data).encode())
    return path


def read_config(path: Path) -> tuple[str, dict[str, Any], dict[str, str]]:
    """``(algorithm, options, versions)`` of a config file (or of a run directory's)."""
    path = Path(path)
    if path.is_dir():
        path = path / CONFIG
    data = read_versioned(path, error=RunError, what="config", missing="not a training run",
                          max_version=CONFIG_FORMAT_VERSION)  # fmt: skip
    return data["algorithm"], data.get("run", {}), data.get("versions", {})


Config = TypeVar("Config", bound="DataclassInstance")


def config_from(path: Path, config_class: type[Config], algorithms: Iterable[str], kind: str) -> Config:
    """``config_class`` (a trainer's dataclass) as a run of one of ``algorithms`` stored it, for ``--resume``.
    Options the class no longer has are left out, so a run an older optgym started still resumes; ``kind`` names
    the trainer in the error for a run of another one ("an ES one")."""
    algorithm, options, _ = read_config(path)
    if algorithm not in set(algorithms):
        raise RunError(f"{path} is a {algorithm} run, not {kind}")
    fields = {field.name for field in dataclasses.fields(config_class)}
    return config_class(**{k: v for k, v in options.items() if k in fields})


def prepare_run_dir(run: Path, *, resume: bool) -> Path:
    """Create ``run`` for a new run (it must not hold one already) or check it for a resume."""
    run = Path(run)
    if resume:
        if not (run / CONFIG).is_file():
            raise RunError(f"{run} has no {CONFIG}: nothing to resume")
        return run
    if (run / CONFIG).exists():
        raise RunError(f"{run} already holds a run; use --resume {run} to continue it, or another -o")
    run.mkdir(parents=True, exist_ok=True)
    return run


class ProgressCSV:
    """``progress.csv``, appended a row at a time (a resumed run continues the same file).

    When a row brings a column the file lacks, the file is rewritten once with the wider header —
    atomically, so a kill in the middle leaves the old file. ``resumed_at=(column, value)``: a run resumed
    from the snapshot at ``value`` does again what it did after it, so the rows past it (``column``, the
    run's step, above ``value``) are dropped — else a learning curve holds those steps twice.
    """

    def __init__(self, path: Path, resumed_at: tuple[str, float] | None = None) -> None:
        self.path = Path(path)
        self.fields: list[str] = []
        if self.path.exists():
            with self.path.open(newline="") as f:
                if resumed_at is None:
                    self.fields = next(csv.reader(f), [])
                    return
                reader = csv.DictReader(f)
                rows = list(reader)
                self.fields = list(reader.fieldnames or [])
            column, value = resumed_at
            kept = [r for r in rows if not r.get(column) or float(r[column]) <= value]
            if len(kept) < len(rows):
                self._rewrite(kept)

    def _rewrite(self, rows: list[dict[str, Any]]) -> None:
        import io

        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=self.fields)
        w.writeheader()
        w.writerows(rows)
        atomic_write_bytes(self.path, buf.getvalue().encode())

    def write(self, row: dict[str, Any]) -> None:
        new = [k for k in row if k not in self.fields]
        if new or not self.path.exists():
            rows = []
            if self.path.exists():
                with self.path.open(newline="") as f:
                    rows = list(csv.DictReader(f))
            self.fields += new
            self._rewrite(rows)
        with self.path.open("a", newline="") as f:
            csv.DictWriter(f, fieldnames=self.fields).writerow({k: row.get(k, "") for k in self.fields})


def percentiles(values: list[float], points: tuple[int, ...] = (10, 25, 50, 75, 90)) -> dict[str, float]:
    """MLGO's reward distribution summary: ``p10``, ``p25``, ``p50``, ``p75``, ``p90``."""
    import numpy as np

    if not values:
        return {}
    return {f"p{p}": float(np.percentile(values, p)) for p in points}


def write_snapshot(run: Path, iteration: int, fill: Callable[[Path], None], state: dict[str, Any]) -> Path:
    """``RUN/snapshots/<iteration>/``: ``fill(tmp)`` writes the files into a temporary directory, which
    is renamed into place only when complete — a kill at any moment leaves either the previous
    snapshot or the new one, never half of one. ``state.json`` holds ``state``."""
    root = Path(run) / SNAPSHOTS
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{iteration:08d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{iteration:08d}-", dir=root))
    try:
        fill(tmp)
        (tmp / "state.json").write_text(json.dumps({**state, "iteration": iteration}, indent=2))
        _fsync_tree(tmp)
        if final.exists():  # the same iteration again (a resumed run): replace it
            shutil.rmtree(final)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for stale in root.glob(".tmp-*"):  # left by a run killed mid-snapshot
        if stale != tmp:
            shutil.rmtree(stale, ignore_errors=True)
    return final


def _fsync_tree(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            with path.open("rb") as f:
                os.fsync(f.fileno())


def read_state(snapshot: Path) -> dict[str, Any]:
    return json.loads((Path(snapshot) / "state.json").read_text())


def evaluate_final(
    run: Path,
    corpus: str,
    split: str | None,
    results: dict[str, Any],
    *,
    enabled: bool = True,
    workers: int | None = None,
    timeout: float = 120.0,
    problem: str = "inline-size",
    say: Callable[[str], Any] = print,
) -> dict[str, Any]:
    """``RUN/final/policy`` compiled greedily on each side of the split (or the whole corpus), as eval
    traces in ``RUN/final/eval-<side>``; the figures go to ``RUN/final/metrics.json`` with ``results``."""
    from optgym.train.trace import trace

    results = dict(results)
    sides: list[str | None] = ["train", "test"] if split else [None]
    for side in sides if enabled else []:
        try:
            if len(Corpus(corpus, split=side)) == 0:
                continue
        except OptgymError:
            continue
        ev = trace(corpus, Path(run) / "final" / f"eval-{side or 'all'}", mode="eval",
                   policy=str(Path(run) / "final" / "policy"), split=side, workers=workers, timeout=timeout,
                   progress=False, overwrite=True, problem=problem)  # fmt: skip
        s = ev["summary"]
        keys = ("modules", "modules_ok", "text_bytes", "heuristic_text_bytes", "size_ratio")
        results[side or "all"] = {k: s[k] for k in keys}
        ratio = f"{s['size_ratio']:.4f}" if s["size_ratio"] else "—"
        say(f"final policy on {side or 'the corpus'}: {s['modules_ok']} modules, size vs heuristic {ratio}")
    atomic_write_bytes(Path(run) / "final" / "metrics.json", json.dumps(results, indent=2).encode())
    return results
