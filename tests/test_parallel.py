"""The executor contract, on the in-process and local-process backends (the Ray backend: test_parallel_ray.py).

The ``check_*`` functions are the contract itself; test_parallel_ray.py runs the same ones on a real Ray
cluster, so every backend is held to one definition: each index exactly once, a raising task reported (not
retried), at most ``2 × workers`` tasks in flight, a killed worker's task retried, a task that keeps killing
its worker reported as failed after its retries.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import process_running

from optgym.corpus import Corpus
from optgym.corpus.portable import ModuleRef, module_digest, modules_dir, portable_modules
from optgym.errors import CorpusError, OptgymError
from optgym.parallel import (
    Executor,
    InlineExecutor,
    ProcessExecutor,
    TaskFailed,
    get_executor,
    ray_backend_address,
    resolve_ray_address,
)


@dataclass(frozen=True)
class Job:
    """One test task: logs ``index pid`` when it starts (so tests see every attempt), then misbehaves on demand."""

    index: int
    log: str | None = None
    sleep: float = 0.0
    fail: str = ""  # "raise": raise ValueError; "die": SIGKILL its own worker process


def run_job(job: Job) -> int:
    if job.log:
        with open(job.log, "a") as f:
            f.write(f"{job.index} {os.getpid()}\n")
    if job.sleep:
        time.sleep(job.sleep)
    if job.fail == "raise":
        raise ValueError(f"job {job.index} fails")
    if job.fail == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    return job.index * job.index


def starts(log: Path) -> Counter[int]:
    """How often each index was started, from the log."""
    text = log.read_text() if log.exists() else ""
    return Counter(int(line.split()[0]) for line in text.splitlines())


def failed_marker(job: Job, failure: TaskFailed) -> tuple[str, int, bool, int]:
    return ("failed", job.index, failure.worker_lost, failure.attempts)


def collect(executor: Executor, jobs: list[Job], on_error=None) -> dict[int, object]:
    """Every (index, result) the executor yields, checking that no index comes twice."""
    results: dict[int, object] = {}
    for index, result in executor.map_unordered(run_job, jobs, on_error):
        assert index not in results, f"index {index} yielded twice"
        results[index] = result
    return results


# ---- the contract (shared with test_parallel_ray.py) -------------------------------------------------------


def check_complete(executor: Executor) -> None:
    jobs = [Job(i) for i in range(23)]
    assert collect(executor, jobs) == {i: i * i for i in range(23)}
    assert collect(executor, []) == {}


def check_raising_task(executor: Executor, tmp_path: Path) -> None:
    log = tmp_path / "raising.log"
    jobs = [Job(i, str(log), fail="raise" if i == 2 else "") for i in range(6)]
    results = collect(executor, jobs, on_error=failed_marker)
    assert results[2] == ("failed", 2, False, 1)
    assert {i: results[i] for i in range(6) if i != 2} == {i: i * i for i in range(6) if i != 2}
    assert starts(log)[2] == 1, "a raising function is deterministic: it is not retried"
    with pytest.raises(ValueError, match="job 2 fails"):
        collect(executor, jobs)  # without on_error the function's own exception reaches the caller


def check_bounded_in_flight(executor: Executor, tmp_path: Path) -> None:
    log = tmp_path / "bounded.log"
    jobs = [Job(i, str(log), sleep=0.2) for i in range(8 * executor.workers)]
    iterator = executor.map_unordered(run_job, jobs)
    next(iterator)
    time.sleep(0.3)  # whatever was submitted has started by now
    assert sum(starts(log).values()) <= 2 * executor.workers
    assert len(list(iterator)) == len(jobs) - 1


def check_killed_worker_is_retried(executor: Executor, tmp_path: Path) -> None:
    """SIGKILL the worker process of the first task to start, mid-task: the run still completes, once each."""
    log = tmp_path / "killed.log"
    jobs = [Job(i, str(log), sleep=0.4) for i in range(3 * executor.workers)]
    killed: list[int] = []

    def killer() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not killed:
            lines = log.read_text().splitlines() if log.exists() else []
            if lines:
                index, pid = map(int, lines[0].split())
                os.kill(pid, signal.SIGKILL)
                killed.append(index)
            time.sleep(0.01)

    thread = threading.Thread(target=killer)
    thread.start()
    try:
        results = collect(executor, jobs)
    finally:
        thread.join()
    assert killed, "no task started"
    assert results == {i: i * i for i in range(len(jobs))}
    assert starts(log)[killed[0]] >= 2, "the killed task was run again"


def check_dying_task_is_reported(executor: Executor, tmp_path: Path) -> None:
    """A task that kills its worker every time: reported after max_retries retries; the others complete."""
    log = tmp_path / "dying.log"
    jobs = [Job(i, str(log), sleep=0.05, fail="die" if i == 3 else "") for i in range(2 * executor.workers + 3)]
    results = collect(executor, jobs, on_error=failed_marker)
    attempts = executor.max_retries + 1  # type: ignore[attr-defined]
    assert results[3] == ("failed", 3, True, attempts)
    assert {i: r for i, r in results.items() if i != 3} == {i: i * i for i in range(len(jobs)) if i != 3}
    # never retried forever (a process pool reruns it once more: its first death was among others, unblamed)
    assert attempts <= starts(log)[3] <= attempts + 1
    with pytest.raises(TaskFailed, match=r"task 0 failed .* died"):
        collect(executor, [Job(3, fail="die")])


# ---- local backends ----------------------------------------------------------------------------------------


@pytest.fixture(params=["inline", "process"])
def executor(request):
    ex = InlineExecutor() if request.param == "inline" else ProcessExecutor(2)
    yield ex
    ex.close()


def test_complete(executor):
    check_complete(executor)


def test_raising_task(executor, tmp_path):
    check_raising_task(executor, tmp_path)


@pytest.mark.parametrize("every, expected", [(0.0, ["squares: 1/4", "squares: 2/4", "squares: 3/4"]), (3600.0, [])])
def test_without_a_terminal_a_long_fan_out_says_how_far_it_is(capsys, monkeypatch, every, expected):
    """In a log (no terminal) the bar is drawn only at the end: a line per finished task, at most every
    LOG_EVERY_SECONDS, and none for the last (the final bar says it)."""
    from optgym.parallel import executor

    monkeypatch.setattr(executor, "LOG_EVERY_SECONDS", every)
    results = dict(executor.run_tasks(run_job, [Job(i) for i in range(4)], workers=1, description="squares"))
    assert results == {i: i * i for i in range(4)}
    lines = [line.split(" after ")[0] for line in capsys.readouterr().out.splitlines() if " after " in line]
    assert lines == expected


def test_process_pool_bounds_tasks_in_flight(tmp_path):
    ex = ProcessExecutor(2)
    try:
        check_bounded_in_flight(ex, tmp_path)
    finally:
        ex.close()


def test_process_pool_retries_a_killed_worker(tmp_path):
    ex = ProcessExecutor(2)
    try:
        check_killed_worker_is_retried(ex, tmp_path)
    finally:
        ex.close()


def test_process_pool_reports_a_task_that_keeps_dying(tmp_path):
    ex = ProcessExecutor(2, max_retries=1)
    try:
        check_dying_task_is_reported(ex, tmp_path)
    finally:
        ex.close()


_DRIVER = """
import os, sys, time
from pathlib import Path
from optgym.parallel import ProcessExecutor

def task(directory):
    (Path(directory) / str(os.getpid())).write_text("")
    time.sleep(600)

if __name__ == "__main__":
    ex = ProcessExecutor(2)
    list(ex.map_unordered(task, [sys.argv[1]] * 2))
"""


def test_process_pool_workers_die_with_a_killed_driver(tmp_path):
    """SIGKILL the driver mid-run: its workers (the forkserver's children, not its own) go too."""
    import subprocess
    import sys

    import psutil

    script = tmp_path / "driver.py"
    script.write_text(_DRIVER)
    pids = tmp_path / "pids"
    pids.mkdir()
    # the driver's multiprocessing temp directory (the forkserver's socket) cannot be removed by a killed driver:
    # it goes under this test's directory, not /tmp
    driver = subprocess.Popen([sys.executable, str(script), str(pids)], env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        deadline = time.monotonic() + 60
        while len(list(pids.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        workers = [int(p.name) for p in pids.iterdir()]
        assert len(workers) == 2 and all(psutil.pid_exists(w) for w in workers)
    finally:
        driver.kill()
        driver.wait()
    deadline = time.monotonic() + 10
    while any(process_running(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(process_running(w) for w in workers), "workers outlived their driver"


def test_backend_selection(monkeypatch):
    monkeypatch.delenv("OPTGYM_RAY_ADDRESS", raising=False)
    assert resolve_ray_address() is None and ray_backend_address(4) is None
    assert isinstance(get_executor(1), InlineExecutor)
    ex = get_executor(2)
    assert isinstance(ex, ProcessExecutor)
    ex.close()
    monkeypatch.setenv("OPTGYM_RAY_ADDRESS", "127.0.0.1:6379")
    assert ray_backend_address(None) == ray_backend_address(4) == "127.0.0.1:6379"
    assert ray_backend_address(1) is None  # -j 1 stays in this process, even with the variable set
    assert isinstance(get_executor(1), InlineExecutor)
    assert ray_backend_address(1, "auto") == "auto"  # an explicit address always wins
    for bad in ("127.0.0.1", "http://x:1", "a b:1"):
        with pytest.raises(OptgymError, match="bad Ray address"):
            resolve_ray_address(bad)


def test_ray_address_option_is_global_and_checked(monkeypatch):
    from typer.testing import CliRunner

    from optgym.cli import app

    monkeypatch.delenv("OPTGYM_RAY_ADDRESS", raising=False)
    result = CliRunner().invoke(app, ["--ray-address", "nonsense", "doctor"])
    assert result.exit_code == 1 and "bad Ray address" in result.output
    assert "--ray-address" in CliRunner().invoke(app, ["--help"]).output


def test_ray_is_not_imported_without_an_address():
    import subprocess
    import sys

    code = ("import sys, optgym.parallel, optgym.evaluate, optgym.cli; "
            "from optgym.parallel import get_executor; get_executor(2).close(); "
            "assert 'ray' not in sys.modules, 'ray imported'")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "OPTGYM_RAY_ADDRESS"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)


# ---- modules by content ------------------------------------------------------------------------------------


def test_module_digest_matches_the_corpus(corpus):
    for module in corpus:
        assert module_digest(module.bitcode.read_bytes(), module.command.read_bytes()) == module.digest


def test_module_ref_materializes_once_per_node_without_the_corpus(corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("OPTGYM_CACHE_DIR", str(tmp_path / "node-cache"))
    refs = [ModuleRef.inline(m) for m in corpus]
    module = refs[0].materialize()
    assert module.bitcode.parent == modules_dir() / corpus.modules[0].digest
    assert module.bitcode.read_bytes() == corpus.modules[0].bitcode.read_bytes()
    assert module.cc1_args == corpus.modules[0].cc1_args
    stamp = module.bitcode.stat().st_mtime_ns
    again = ModuleRef(refs[0].name, refs[0].digest, payload=None).materialize()  # cached: payload never read
    assert again.bitcode.stat().st_mtime_ns == stamp
    bad = ModuleRef("x", "0" * 64, refs[1].payload)
    with pytest.raises(CorpusError, match="do not match"):
        bad.materialize()
    assert not (modules_dir() / ("0" * 64)).exists(), "a corrupt transfer is never published"


def test_local_fan_outs_read_the_corpus_in_place(corpus, monkeypatch):
    monkeypatch.delenv("OPTGYM_RAY_ADDRESS", raising=False)
    assert portable_modules(list(corpus), workers=2) == list(corpus)


def test_evaluation_with_module_refs_matches(corpus, tmp_path, monkeypatch):
    """evaluate_module on a ref (bytes only, the corpus gone) gives the row it gives from the corpus."""
    from dataclasses import asdict, replace

    from optgym.policies import resolve_policy
    from optgym.train.evaluation import _Task, evaluate_module

    copy = tmp_path / "c"
    shutil.copytree(corpus.root, copy)
    copied = Corpus(copy)
    task = _Task("inline-size", copied["tree"], "tree", resolve_policy("never"), "eval", 0, 120.0)
    local = evaluate_module(task)
    ref_task = replace(task, source=ModuleRef.inline(copied["tree"]))
    shutil.rmtree(copy)
    monkeypatch.setenv("OPTGYM_CACHE_DIR", str(tmp_path / "fresh-cache"))  # compile again, from the ref
    remote = evaluate_module(ref_task)
    assert {**asdict(remote), "compile_seconds": 0} == {**asdict(local), "compile_seconds": 0}


def make_policy_dir(path: Path) -> Path:
    """A real trained-policy directory (random MLP weights), as trainers export them."""
    import numpy as np

    from optgym.policies.mlp import MLPPolicy
    from optgym.problems.inline_size import FEATURES
    from optgym.problems.normalize import build_vocab

    rng = np.random.default_rng(0)
    vocab = build_vocab({name: rng.integers(0, 100, 500) for name in FEATURES}, num_buckets=16)
    return MLPPolicy.initial(vocab, hidden=(8,), seed=3).save(path)


def test_tree_ref_carries_a_policy_directory(tmp_path, monkeypatch):
    from optgym.parallel.portable import TreeRef, materializing_builder
    from optgym.policies import resolve_policy

    policy_dir = make_policy_dir(tmp_path / "run" / "policy")
    factory = resolve_policy(str(policy_dir))
    ref = TreeRef.inline(factory.args[0])
    shutil.rmtree(tmp_path / "run")
    monkeypatch.setenv("OPTGYM_CACHE_DIR", str(tmp_path / "node-cache"))
    copy = ref.materialize()
    assert isinstance(copy, str) and Path(copy).name == "policy" and Path(copy).is_dir()
    assert ref.materialize() == copy  # once per node
    policy = materializing_builder(factory.builder, ref)
    assert policy.hidden == [8]


def test_local_policies_are_left_alone(tmp_path, monkeypatch):
    from optgym.policies import resolve_policy
    from optgym.policies.portable import portable_policy

    monkeypatch.delenv("OPTGYM_RAY_ADDRESS", raising=False)
    factory = resolve_policy(str(make_policy_dir(tmp_path / "p")))
    assert portable_policy(factory, workers=2) is factory
    never = resolve_policy("never")
    assert portable_policy(never, ray_address="127.0.0.1:1") is never  # a recipe, not a path: nothing to carry


def test_a_missing_cluster_fails_fast_and_clearly(monkeypatch):
    """No head at the address: a clear error in seconds (ray.init alone retries for minutes)."""
    import socket
    import sys

    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # restored afterwards (the backend sets it)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free once closed: nothing listens there
    start = time.monotonic()
    with pytest.raises(OptgymError, match=f"no Ray cluster at 127.0.0.1:{port}"):
        get_executor(2, f"127.0.0.1:{port}")
    assert time.monotonic() - start < 30
    monkeypatch.setitem(sys.modules, "ray", None)  # as if the extra were not installed
    with pytest.raises(OptgymError, match=r"pip install 'optgym\[ray\]'"):
        get_executor(2, f"127.0.0.1:{port}")
