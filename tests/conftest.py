"""Fixtures: real corpora made by the tests from C and C++ programs, compiled by the real clang-22."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

import psutil
import pytest

from optgym.toolchain.process import STALE_AFTER_SECONDS, sweep_stale

# Every test run gets its own cache and FIFO root, so tests can check that nothing is left behind; the
# session removes it when it ends. A process the tests start that imports this file again (a worker
# unpickling a test's task function) inherits the run's directory instead of making one nobody removes.
# A run that ends before its session does (pytest refusing its own options, a kill) never removes it: the
# directory is named after the run's pid, and the next run removes those whose owner is gone.
_RUN_DIR_ENV = "OPTGYM_TESTS_RUN_DIR"
_OWNER = not os.environ.get(_RUN_DIR_ENV)
_PREFIX = "optgym-tests-"
if _OWNER:
    sweep_stale(Path(tempfile.gettempdir()), _PREFIX, STALE_AFTER_SECONDS)
_RUN_DIR = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-")) if _OWNER else Path(os.environ[_RUN_DIR_ENV])
os.environ[_RUN_DIR_ENV] = str(_RUN_DIR)
os.environ["OPTGYM_CACHE_DIR"] = str(_RUN_DIR / "cache")
os.environ["XDG_RUNTIME_DIR"] = str(_RUN_DIR / "run")
if _OWNER:  # a worker that imports this file after the session has removed the directory must not make it again
    (_RUN_DIR / "run").mkdir(parents=True)
os.environ.pop("OPTGYM_TRANSCRIPT", None)
# optgym-cc guards small objects of compiles with an allocator channel by default: the tests compare served
# objects with rollouts of the same policies, so they switch it off, and test_serve checks the default itself
os.environ["OPTGYM_GUARD_BELOW"] = "0"
# and compile C the shipped portfolio's ways (its pass options, and by default clang's compile too): off for
# the same reason, checked by test_portfolio
os.environ["OPTGYM_CANDIDATES"] = "0"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop the policy servers the run's compiles started, and remove the run's directory: session fixtures are
    torn down by now, and the leftover checks (:func:`no_leftovers`) ran at the end of each test that asked for
    them. A server idles on for a minute by design (``OPTGYM_SERVER_IDLE``); after a test run nothing will
    reuse it, so it goes now rather than outlive the run."""
    if _OWNER:
        _stop_servers_of_this_run()
        shutil.rmtree(_RUN_DIR, ignore_errors=True)


def _stop_servers_of_this_run() -> None:
    """Terminate every other process whose runtime directory is this run's (the servers and what they run)."""
    mine = str(_RUN_DIR / "run")
    found = []
    for process in psutil.process_iter():
        try:
            if process.pid != os.getpid() and process.environ().get("XDG_RUNTIME_DIR") == mine:
                process.terminate()
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    _, alive = psutil.wait_procs(found, timeout=5)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()


from optgym.corpus.embedded import corpus_from_sources  # noqa: E402
from optgym.problems import problem_class  # noqa: E402
from optgym.toolchain import find_toolchain  # noqa: E402

C_SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct node { int key; struct node *left, *right; };

static struct node *insert(struct node *t, int key) {
  if (!t) { t = calloc(1, sizeof *t); t->key = key; return t; }
  if (key < t->key) t->left = insert(t->left, key); else t->right = insert(t->right, key);
  return t;
}
static int height(const struct node *t) {
  if (!t) return 0;
  int l = height(t->left), r = height(t->right);
  return 1 + (l > r ? l : r);
}
static int sum(const struct node *t) { return t ? t->key + sum(t->left) + sum(t->right) : 0; }
static void release(struct node *t) { if (t) { release(t->left); release(t->right); free(t); } }
static unsigned next(unsigned *s) { *s = *s * 1103515245u + 12345u; return *s >> 16; }

int main(int argc, char **argv) {
  unsigned seed = argc > 1 ? (unsigned)atoi(argv[1]) : 7;
  struct node *t = 0;
  for (int i = 0; i < 100; i++) t = insert(t, (int)(next(&seed) % 1000));
  char buf[64];
  snprintf(buf, sizeof buf, "%d %d", height(t), sum(t));
  printf("%s %zu\n", buf, strlen(buf));
  release(t);
  return 0;
}
"""

CXX_SOURCE = r"""
#include <algorithm>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

struct Animal {
  virtual ~Animal() = default;
  virtual std::string sound() const = 0;
};
struct Dog : Animal { std::string sound() const override { return "woof"; } };
struct Cat : Animal { std::string sound() const override { return "meow"; } };

int main(int argc, char **argv) {
  std::vector<std::unique_ptr<Animal>> zoo;
  for (int i = 0; i < 10 + argc; ++i) {
    if (i % 3) zoo.push_back(std::make_unique<Dog>()); else zoo.push_back(std::make_unique<Cat>());
  }
  std::map<std::string, int> counts;
  for (const auto &a : zoo) ++counts[a->sound()];
  std::vector<std::string> words(argv, argv + argc);
  std::sort(words.begin(), words.end());
  std::ostringstream out;
  for (const auto &[k, v] : counts) out << k << '=' << v << ' ';
  std::cout << out.str() << words.size() << '\n';
  return 0;
}
"""

EMPTY_C_SOURCE = "int answer(void) { return 42; }\n"

#: Three calls of one static function, each with a constant that folds its branch away: no single inline
#: pays (the function stays for the other calls), inlining all three deletes it (clang-22 -Oz: 177 → 148 B).
FANOUT_SOURCE = r"""
extern void sink(int, int, int);
static void emit(int a, int b) { if (a > 0) sink(a, b, 1); else sink(b, a, 2); }
void f(int x) { emit(1, x); }
void g(int x) { emit(-1, x); }
void h(int x) { emit(5, x); }
"""


@pytest.fixture(scope="session")
def toolchain():
    return find_toolchain((problem_class("inline-size").hook,))


def _corpus(toolchain, root: Path, sources: dict[str, tuple[str, str]], flags=("-Oz",)):
    src_dir = root / "src"
    src_dir.mkdir(parents=True)
    paths = {}
    for name, (suffix, text) in sources.items():
        path = src_dir / f"{name}{suffix}"
        path.write_text(text)
        paths[name] = path
    return corpus_from_sources(toolchain, paths, root / "corpus", flags=tuple(flags))


@pytest.fixture(scope="session")
def corpus(toolchain, tmp_path_factory):
    """A C module, a C++ module and one without any call site, at -Oz."""
    root = tmp_path_factory.mktemp("corpus")
    return _corpus(
        toolchain, root, {"tree": (".c", C_SOURCE), "zoo": (".cpp", CXX_SOURCE), "leaf": (".c", EMPTY_C_SOURCE)}
    )


@pytest.fixture(scope="session")
def corpus_o2(toolchain, tmp_path_factory):
    """The C++ module at -O2, where the ML advisor's size-increase rule would otherwise bite."""
    root = tmp_path_factory.mktemp("corpus_o2")
    return _corpus(toolchain, root, {"zoo": (".cpp", CXX_SOURCE)}, flags=("-O2",))


@pytest.fixture(scope="session")
def corpus_dir(corpus) -> Path:
    return corpus.root


@pytest.fixture(scope="session")
def trace_dir(corpus_dir, tmp_path_factory) -> Path:
    """The heuristic's trace of ``corpus`` (shared: tests only read it)."""
    from optgym.train.trace import trace

    out = tmp_path_factory.mktemp("trace") / "trace"
    trace(corpus_dir, out, workers=1, progress=False)
    return out


@pytest.fixture(scope="session")
def vocab_path(trace_dir, tmp_path_factory) -> Path:
    from optgym.train.vocab import vocab_from_trace

    path = tmp_path_factory.mktemp("vocab") / "vocab.json"
    vocab_from_trace(trace_dir).save(path)
    return path


def recorded_decisions(policy, corpus_dir: Path, toolchain):
    """``(module, raw features, actions, clang's answers)`` of every module of ``corpus_dir`` with decisions,
    compiled by real clang-22 with ``policy`` deciding inlining (each compile must succeed)."""
    from optgym.corpus import Corpus
    from optgym.problems import get_problem
    from optgym.rollout import rollout

    for module in Corpus(corpus_dir):
        run = rollout(get_problem("inline-size"), module, toolchain, policy, record_features=True)
        assert run.result.ok, module.name
        if run.trajectory.features is not None and len(run.trajectory.actions):
            yield module, run.trajectory.features, run.trajectory.actions, run.trajectory.heuristic


def traced_decisions(trace_dir: Path, names: list[str]):
    """``(raw features, clang's answers)`` of every decision in a trace, as arrays."""
    import numpy as np

    from optgym.train.trace import feature_matrix, iter_batches

    batches = list(iter_batches(trace_dir, [*names, "heuristic"]))
    raw = np.concatenate([feature_matrix(b, names) for b in batches])
    return raw, np.concatenate([b.column("heuristic").to_numpy() for b in batches])


def runtime_leftovers() -> list[Path]:
    """Run directories (FIFOs, objects) still present under the tests' runtime root. A policy server's
    ``serve-*`` socket, lock and log are not among them: a server started by an earlier test (optgym-cc)
    idles on by design, and its lock and log are kept for the next server (tests/test_serve.py checks them)."""
    root = Path(os.environ["XDG_RUNTIME_DIR"]) / "optgym"
    return sorted(p for p in root.iterdir() if not p.name.startswith("serve-")) if root.exists() else []


MP_HELPERS = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")


def process_running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, exited but not yet reaped, is not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def live_children() -> list[psutil.Process]:
    """Descendants of this test process that are still running (zombies excluded)."""
    alive = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                child.cmdline()  # still there to be inspected
                alive.append(child)
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.fixture
def no_leftovers():
    """Assert that a test leaves no compiler process and no FIFO directory behind."""
    yield
    # multiprocessing's own helpers (forkserver, resource_tracker) outlive a pool by design
    children = [c for c in live_children() if not any(h in " ".join(c.cmdline()) for h in MP_HELPERS)]
    assert not children, f"stray processes: {[c.cmdline() for c in children]}"
    assert not runtime_leftovers(), f"leftover run directories: {runtime_leftovers()}"


@pytest.fixture
def env_modules(monkeypatch) -> list[list]:
    """The corpus modules of every env an SB3 run builds, in order: ``optgym.train.sb3.make_env`` recorded (with one
    worker the env is built in the test's own process, so a monkeypatch reaches it)."""
    from optgym.train import sb3

    built: list[list] = []
    make_env = sb3.make_env

    def recording(env_cfg, rank):
        env = make_env(env_cfg, rank)
        built.append(list(env.unwrapped.modules))
        return env

    monkeypatch.setattr(sb3, "make_env", recording)
    return built
