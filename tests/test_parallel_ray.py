"""The Ray backend on a real local Ray cluster (``ray start --head`` on loopback, one per module).

The cluster's workers get their own ``OPTGYM_CACHE_DIR`` (the driver's cache is not theirs, as on a real
cluster), so every Ray run really compiles, and modules reach them as bytes through the object store.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from conftest import C_SOURCE, _corpus
from test_parallel import (
    check_bounded_in_flight,
    check_complete,
    check_dying_task_is_reported,
    check_killed_worker_is_retried,
    check_raising_task,
    make_policy_dir,
)

from optgym.corpus import Corpus
from optgym.corpus.info import corpus_info
from optgym.corpus.portable import ModuleRef, portable_modules
from optgym.evaluate import evaluate
from optgym.parallel import RAY_ADDRESS_ENV, run_tasks
from optgym.parallel import ray_backend as backend
from optgym.parallel.portable import TreeRef
from optgym.parallel.ray_local import LocalCluster
from optgym.policies import resolve_policy
from optgym.policies.mlp import MLPPolicy
from optgym.policies.portable import portable_policy
from optgym.train.es import ESConfig, train_es
from optgym.train.evaluation import _Task, evaluate_module
from optgym.train.search import SearchConfig, module_records, read_states, search
from optgym.train.trace import iter_batches, read_modules, trace


@dataclass(frozen=True)
class Cluster:
    address: str
    cache: Path  # the workers' OPTGYM_CACHE_DIR


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One loopback cluster for the module; stopped (its processes killed) whatever happens."""
    cache = tmp_path_factory.mktemp("ray-worker-cache")
    local = LocalCluster(num_cpus=2, env={"OPTGYM_CACHE_DIR": str(cache)})
    try:
        local.start()
        import ray  # the dev extra carries it: CI runs these tests (a missing Ray fails them, never skips)

        # test_parallel's task functions travel by value: the workers cannot import the tests directory
        ray.cloudpickle.register_pickle_by_value(sys.modules["test_parallel"])
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        yield Cluster(local.address, cache)
    finally:
        local.stop()
        assert not local.processes(), "the cluster's processes survived"


@pytest.fixture
def executor(cluster):
    ex = backend.RayExecutor(cluster.address)
    yield ex
    ex.close()


def test_contract_complete(executor):
    assert executor.workers == 2  # the cluster's CPUs
    check_complete(executor)


def test_contract_raising_task(executor, tmp_path):
    check_raising_task(executor, tmp_path)


def test_contract_bounded_in_flight(executor, tmp_path):
    check_bounded_in_flight(executor, tmp_path)


def test_killed_worker_is_retried(executor, tmp_path):
    check_killed_worker_is_retried(executor, tmp_path)


def test_task_that_keeps_killing_its_worker_is_reported(cluster, tmp_path):
    ex = backend.RayExecutor(cluster.address, max_retries=1)
    try:
        check_dying_task_is_reported(ex, tmp_path)
    finally:
        ex.close()


def _report(out: Path) -> dict:
    report = json.loads((out / "report.json").read_text())
    report.pop("timing")
    return report


def test_cli_evaluation_is_the_same_on_ray(cluster, corpus, tmp_path):
    """``optgym evaluate`` locally and with ``--ray-address``: the same report.json apart from timing."""
    env = {k: v for k, v in os.environ.items() if k != "OPTGYM_RAY_ADDRESS"}
    args = ["evaluate", "--corpus", str(corpus.root), "--policy", "random:5"]
    optgym = str(Path(sys.executable).parent / "optgym")
    subprocess.run([optgym, *args, "-o", str(tmp_path / "local"), "-j", "2"], env=env, check=True,
                   capture_output=True, timeout=300)  # fmt: skip
    on_ray = subprocess.run([optgym, "--ray-address", cluster.address, *args, "-o", str(tmp_path / "ray")],
                            env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert on_ray.returncode == 0, on_ray.stdout + on_ray.stderr
    local, remote = _report(tmp_path / "local"), _report(tmp_path / "ray")
    assert remote == local
    assert local["evaluated"] == 3 and local["failed"] == 0
    for module in corpus:  # the workers compiled bytes they got from the object store, once per node
        assert (cluster.cache / "modules" / module.digest / "module.bc").read_bytes() == module.bitcode.read_bytes()


@dataclass(frozen=True)
class _DieOnce:
    marker: str
    task: _Task


def _evaluate_or_die_once(job: _DieOnce):
    """evaluate_module, except that the first worker to evaluate ``zoo`` is SIGKILLed mid-task."""
    if job.task.module == "zoo":
        try:
            fd = os.open(job.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            pass
        else:
            os.close(fd)
            os.kill(os.getpid(), signal.SIGKILL)
    return evaluate_module(job.task)


def test_evaluation_survives_a_killed_worker_without_the_corpus(cluster, corpus, tmp_path):
    """A worker killed mid-evaluation: its module is retried, every row comes once, equal to the local rows —
    and the corpus directory is deleted before the run (the workers only ever see the uploaded bytes)."""
    copy = tmp_path / "corpus"
    shutil.copytree(corpus.root, copy)
    factory = resolve_policy("random:9")
    names = [m.name for m in corpus]
    refs = portable_modules([Corpus(copy).module(n) for n in names], ray_address=cluster.address)
    assert all(isinstance(r, ModuleRef) for r in refs)
    shutil.rmtree(copy)
    jobs = [_DieOnce(str(tmp_path / "died"), _Task("inline-size", ref, n, factory, "eval", i, 120.0))
            for i, (n, ref) in enumerate(zip(names, refs, strict=True))]  # fmt: skip
    rows = {}
    for index, row in run_tasks(_evaluate_or_die_once, jobs, progress=False, ray_address=cluster.address):
        assert index not in rows
        rows[index] = row
    assert (tmp_path / "died").exists(), "the zoo worker was killed"
    local = evaluate("random:9", corpus, workers=1, progress=False)
    strip = lambda r: {**asdict(r), "compile_seconds": 0}  # noqa: E731
    assert [strip(rows[i]) for i in range(len(names))] == [strip(r) for r in local]
    assert all(r.ok for r in local)


def _build_policy(factory) -> tuple[str, list[int]]:
    """On a worker: build the policy from its factory (its directory materialized on this node first)."""
    policy = factory.build()
    return type(policy).__name__, policy.hidden


def test_trained_policy_travels_by_content(cluster, corpus, tmp_path, monkeypatch):
    """A trained policy names its directory by path: under Ray the directory travels through the object store,
    so evaluation gives the local rows, and a worker builds the policy after the directory is gone."""
    policy_dir = str(make_policy_dir(tmp_path / "run" / "policy"))
    local = evaluate(policy_dir, corpus, workers=1, progress=False)
    monkeypatch.setenv("OPTGYM_RAY_ADDRESS", cluster.address)
    on_ray = evaluate(policy_dir, corpus, progress=False)
    strip = lambda r: {**asdict(r), "compile_seconds": 0}  # noqa: E731
    assert [strip(r) for r in on_ray] == [strip(r) for r in local] and all(r.ok for r in local)

    factory = portable_policy(resolve_policy(policy_dir))
    assert any(isinstance(a, TreeRef) for a in factory.args) and policy_dir not in factory.args
    shutil.rmtree(tmp_path / "run")
    ((_, built),) = list(run_tasks(_build_policy, [factory], progress=False))
    assert built == ("MLPPolicy", [8])
    assert (cluster.cache / "trees").is_dir()


# -- every other fan-out over corpus modules: trace, search, ES, corpus info ---------------------------------


def _fresh_corpus(toolchain, root: Path, salt: str) -> Corpus:
    """conftest's C module plus a function no other test compiles: content no Ray worker has materialized yet, so
    finding it in the workers' cache afterwards shows that it travelled by content (the tasks name no path)."""
    chain = "".join(f"static int {salt}{i}(int x) {{ return {salt}{i - 1}(x) * 3 + {salt}{i - 1}(x + {i}); }}\n"
                    for i in range(1, 6))  # fmt: skip
    chain = f"static int {salt}0(int x) {{ return x ^ 5; }}\n{chain}int {salt}(int x) {{ return {salt}5(x); }}\n"
    source = f"{C_SOURCE}\n{chain}"
    return _corpus(toolchain, root, {"tree": (".c", source)})


def _travelled(cluster: Cluster, corpus: Corpus) -> bool:
    return all((cluster.cache / "modules" / m.digest / "module.bc").is_file() for m in corpus)


def _cells(table: pa.Table) -> tuple:
    """A table's schema (with its metadata) and cells, NaN as None: unscored log-probs are NaN, never equal."""
    columns = [[None if v != v else v for v in table[name].to_pylist()] for name in table.column_names]
    return table.schema.to_string(show_schema_metadata=True), columns


def _without(rows: list[dict], *keys: str) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in keys} for row in rows]


def test_trace_on_ray_is_the_local_trace(cluster, toolchain, tmp_path, monkeypatch):
    corpus = _fresh_corpus(toolchain, tmp_path / "c", "trace")
    trace(corpus.root, tmp_path / "local", workers=1, progress=False)
    assert not _travelled(cluster, corpus)
    monkeypatch.setenv(RAY_ADDRESS_ENV, cluster.address)
    trace(corpus.root, tmp_path / "ray", progress=False)
    assert _travelled(cluster, corpus)
    local, remote = (pa.Table.from_batches(list(iter_batches(tmp_path / run))) for run in ("local", "ray"))
    assert local.num_rows > 0 and _cells(remote) == _cells(local)
    local, remote = (_without(read_modules(tmp_path / run), "compile_seconds") for run in ("local", "ray"))
    assert remote == local


def test_corpus_info_on_ray_is_the_local_info(cluster, toolchain, tmp_path, monkeypatch):
    corpus = _fresh_corpus(toolchain, tmp_path / "c", "info")
    local = corpus_info(corpus.root, decisions=True, workers=1, progress=False)
    monkeypatch.setenv(RAY_ADDRESS_ENV, cluster.address)
    remote = corpus_info(corpus.root, decisions=True, progress=False)  # the workers' own cache: compiled again
    assert _travelled(cluster, corpus)
    assert remote == local and local["heuristic"]["failed"] == 0 and local["decisions"]["decisions"] > 0


def _search_records(out: Path) -> list[dict]:
    """What a search stored, minus what depends on the clock (seconds; the candidate timeout follows the start
    compile's time)."""
    return _without(module_records(out), "seconds", "candidate_timeout")


def test_search_on_ray_returns_its_records_to_the_driver(cluster, toolchain, tmp_path, monkeypatch):
    """The records come back as return values and the driver writes them; a rerun with a larger budget ships them
    to the workers and continues there, exactly as a local rerun does."""
    corpus = _fresh_corpus(toolchain, tmp_path / "c", "search")

    def run(out: str, budget: int, workers: int | None) -> dict:
        return search(SearchConfig(str(corpus.root), str(tmp_path / out), budget=budget, workers=workers),
                      progress=False)  # fmt: skip

    run("local", 10, 1)
    monkeypatch.setenv(RAY_ADDRESS_ENV, cluster.address)
    run("ray", 10, None)
    assert _travelled(cluster, corpus)
    assert _search_records(tmp_path / "ray") == _search_records(tmp_path / "local")
    assert _cells(read_states(tmp_path / "ray", "tree")) == _cells(read_states(tmp_path / "local", "tree"))
    run("local", 14, 1)
    summary = run("ray", 14, None)["summary"]
    (record,) = _search_records(tmp_path / "ray")
    assert record["decisions"] > 5 and record["status"] == "budget"
    assert record["compiles"] == 14 and summary["compiles"] == 14, "continued from the shipped record"
    assert _search_records(tmp_path / "ray") == _search_records(tmp_path / "local")


def test_es_on_ray_is_the_local_es(cluster, toolchain, vocab_path, tmp_path, monkeypatch):
    """ES rollouts: modules and the policy template travel by content; the same rewards, the same step."""
    corpus = _fresh_corpus(toolchain, tmp_path / "c", "es")
    cfg = ESConfig(str(corpus.root), str(tmp_path / "local"), vocab=str(vocab_path), iterations=1, directions=1,
                   hidden=[8], workers=1, final_eval=False)  # fmt: skip
    train_es(cfg, say=lambda s: None)
    monkeypatch.setenv(RAY_ADDRESS_ENV, cluster.address)
    train_es(replace(cfg, output=str(tmp_path / "ray"), workers=None), say=lambda s: None)
    assert _travelled(cluster, corpus)
    rows = []
    for run in ("local", "ray"):
        with open(tmp_path / run / "progress.csv") as f:
            rows.append([{k: v for k, v in row.items() if not k.startswith("time/")} for row in csv.DictReader(f)])
    assert rows[1] == rows[0] and rows[0][0]["results/compile_failures"] == "0"
    local, remote = (MLPPolicy.load(tmp_path / run / "final" / "policy").parameters() for run in ("local", "ray"))
    assert np.array_equal(local, remote)
