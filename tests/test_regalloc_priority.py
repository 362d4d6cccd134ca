"""Register-allocation priority on real clang-22: the stream, the log-linear scorer's answers, programs that
still run the same in any order, the export, and optgym-cc serving all three decisions of one compile."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
from test_regalloc_evict import PRESSURE_SOURCE
from test_serve import CC, run

from optgym.policies import resolve_policy
from optgym.policies.scorer import CandidateScorer, LogLinearScorer
from optgym.problems import get_problem
from optgym.problems.regalloc_priority import CEILING
from optgym.rollout import plain_compile, rollout
from optgym.rollout.rollout import DecisionPoint
from optgym.toolchain.sizes import object_sizes

PRIORITY, EVICT, INLINE = get_problem("regalloc-priority"), get_problem("regalloc-evict"), get_problem("inline-size")
START = CandidateScorer.initial("regalloc-priority")
#: Every answer below 1: clang's cast makes them all 0, and the queue falls back to virtual register order.
FLAT = START.with_parameters(np.array([0.0, 0.0, 0.0, -50.0]))
#: The lightest spill weight first: the opposite of the start.
LIGHTEST = START.with_parameters(np.array([0.0, 0.0, -1.0, 20.0]))
#: A program around ``pressure`` whose output depends on every value the allocator had to keep.
MAIN_SOURCE = r"""
#include <stdio.h>
static unsigned long h = 1469598103934665603UL;
void use(long a, long b, long c, long d, long e, long f, long g, long k) {
  long v[8] = {a, b, c, d, e, f, g, k};
  for (int i = 0; i < 8; i++) h = (h ^ (unsigned long)v[i]) * 1099511628211UL;
}
void pressure(long *a, int n);
int main(void) {
  long a[64];
  for (int i = 0; i < 64; i++) a[i] = i * 2654435761L + 7;
  pressure(a, 64);
  printf("%lx\n", h);
  return 0;
}
"""


@pytest.fixture(scope="module")
def pressure_corpus(toolchain, tmp_path_factory):
    from conftest import _corpus

    return _corpus(toolchain, tmp_path_factory.mktemp("priority"), {"pressure": (".c", PRESSURE_SOURCE)})


def test_the_stream_and_the_start_rule(pressure_corpus, toolchain, no_leftovers):
    """Three features per live range; the start answers 10⁶ · spill weight (the ceiling for a range that must
    not spill, whose weight clang sends as inf)."""
    seen = []

    def check(point: DecisionPoint) -> tuple[float, float]:
        f = point.features()
        answer = START(point)[0]
        assert f["li_size"].shape == f["stage"].shape == f["weight"].shape == (1,)
        assert answer == pytest.approx(min(1e6 * float(f["weight"][0]), CEILING), rel=1e-12)
        names = ["li_size", "stage", "weight"]  # the scorer's fast read equals the matrix one, inf included
        assert point.firsts(names) == point.rows(names)[:, 0].tolist()
        assert answer == pytest.approx(float(START.values(point.rows(names))[0]), rel=1e-12)
        seen.append((int(f["li_size"][0]), int(f["stage"][0]), float(f["weight"][0])))
        return answer, 0.0

    out = rollout(PRIORITY, pressure_corpus["pressure"], toolchain, check)
    assert out.result.ok and out.result.decisions == len(seen) > 10
    assert all(size >= 0 and stage >= 1 for size, stage, _ in seen)
    assert any(stage > 1 for _, stage, _ in seen)  # split or spilled ranges come back with a later stage
    unspillable = np.finfo(np.float32).max  # clang's inf, as optgym reads it (finite, for networks)
    assert any(weight == unspillable for _, _, weight in seen) and any(0 < weight < 1 for _, _, weight in seen)
    assert (out.trajectory.heuristic == -1).all()  # the stream carries no default answer


def test_any_order_is_a_correct_program_and_the_order_changes_the_code(pressure_corpus, toolchain, tmp_path):
    """Each rule's object, linked with a driver, prints what clang's own does — and the rules give different
    code (the lever is real)."""
    module = pressure_corpus["pressure"]
    objects = {}
    for name, policy in {"start": START, "flat": FLAT, "lightest": LIGHTEST}.items():
        out = rollout(PRIORITY, module, toolchain, policy, keep_object=tmp_path / f"{name}.o")
        assert out.result.ok and out.result.decisions > 0, out.result.detail
        objects[name] = (tmp_path / f"{name}.o").read_bytes()
    assert plain_compile(PRIORITY, module, toolchain, keep_object=tmp_path / "clang.o").ok
    assert len({*objects.values(), (tmp_path / "clang.o").read_bytes()}) >= 3
    (tmp_path / "main.c").write_text(MAIN_SOURCE)
    printed = set()
    for name in [*objects, "clang"]:
        exe = tmp_path / f"{name}.exe"
        subprocess.run([str(toolchain.clang), "-O0", str(tmp_path / "main.c"), str(tmp_path / f"{name}.o"), "-o",
                        str(exe)], check=True)  # fmt: skip
        printed.add(subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout)
    assert len(printed) == 1 and printed.pop().strip() != ""


def test_an_exported_priority_scorer_answers_as_trained(pressure_corpus, toolchain, tmp_path, no_leftovers):
    """``optgym export`` of a log-linear scorer: optgym serves its embedded weights exactly, and the graph —
    what any other ONNX runtime runs — gives the same priority at every real decision."""
    from optgym.policies.export import export_policy
    from optgym.policies.exported import ACTION, INPUT, _session, read_policy_bytes

    trained = START.with_parameters(np.array([0.3, -0.5, 0.8, 12.0]))
    trained.languages = ["C"]
    metadata = export_policy(trained.save(tmp_path / "scorer"), tmp_path / "priority.onnx")
    assert metadata["form"] == "log-linear-scorer" and metadata["columns"] == ["li_size", "stage", "weight"]
    served = resolve_policy(str(tmp_path / "priority.onnx"), "regalloc-priority").build()
    assert isinstance(served, LogLinearScorer) and served.languages == ["C"]
    assert np.array_equal(served.parameters(), trained.parameters())
    graph = _session(read_policy_bytes(tmp_path / "priority.onnx"), tmp_path / "priority.onnx")
    answers: list[tuple[float, float, float]] = []

    def all_three(point: DecisionPoint) -> tuple[float, float]:
        (by_graph,) = graph.run([ACTION], {INPUT: point.rows(trained.features)})
        answers.append((trained(point)[0], served(point)[0], float(by_graph[0, 0])))
        return answers[-1][1], 0.0

    out = rollout(PRIORITY, pressure_corpus["pressure"], toolchain, all_three)
    assert out.result.ok and len(answers) == out.result.decisions > 0
    assert all(a == b and c == pytest.approx(a, rel=1e-12) for a, b, c in answers), answers
    assert len({a for a, _, _ in answers}) > 3


def test_log_linear_parameters_round_trip_and_respect_the_ceiling(tmp_path):
    scorer = START.with_parameters(np.array([1.0, 0.0, 2.0, 5.0]))
    again = CandidateScorer.load(scorer.save(tmp_path / "p"))
    assert isinstance(again, LogLinearScorer) and np.array_equal(again.parameters(), scorer.parameters())
    values = again.scores({"li_size": [1.0, 100.0, 1e9], "stage": [1, 1, 1], "weight": [1.0, 1.0, 1e300]})
    assert values[0] == pytest.approx(np.e**5) and values[1] == pytest.approx(100 * np.e**5)
    assert values[2] == CEILING  # clipped below clang's unsigned cast, no overflow on the way
    with pytest.raises(ValueError, match="expected 4 parameters"):
        scorer.with_parameters(np.zeros(3))


def test_optgym_cc_serves_inlining_eviction_and_priority_in_one_compile(pressure_corpus, toolchain, tmp_path):
    """Three channels of one compile, each answered by its own policy, give the object a rollout with the same
    three policies gives — and not clang's."""
    from test_two_channels import HEAVIEST

    (tmp_path / "pressure.c").write_text(PRESSURE_SOURCE)
    evict_dir, priority_dir = HEAVIEST.save(tmp_path / "evict"), LIGHTEST.save(tmp_path / "priority")
    served = run([CC, "-Oz", "-c", "pressure.c", "-o", "served.o"], tmp_path, OPTGYM_POLICY="never",
                 OPTGYM_EVICT_POLICY=str(evict_dir), OPTGYM_PRIORITY_POLICY=str(priority_dir),
                 OPTGYM_STRICT="1")  # fmt: skip
    assert served.returncode == 0 and served.stderr == "", served.stderr
    never = resolve_policy("never").build()
    three = rollout(INLINE, pressure_corpus["pressure"], toolchain, never,
                    companions=[(EVICT, HEAVIEST), (PRIORITY, LIGHTEST)])  # fmt: skip
    assert three.result.ok
    assert object_sizes(tmp_path / "served.o").text_bytes == three.result.metrics["text_bytes"]
    clang = run([CC, "-Oz", "-c", "pressure.c", "-o", "clang.o"], tmp_path, OPTGYM_POLICY="heuristic",
                OPTGYM_EVICT_POLICY="heuristic", OPTGYM_PRIORITY_POLICY="heuristic")  # fmt: skip
    assert clang.returncode == 0
    assert (tmp_path / "clang.o").read_bytes() != (tmp_path / "served.o").read_bytes()


def test_an_es_worker_compiles_beside_its_fixed_companion(pressure_corpus, toolchain, tmp_path, no_leftovers):
    """``train es --with regalloc-evict=POLICY``: each perturbed priority scorer is measured in a compile whose
    eviction that policy decides — the size of the pair, against clang alone."""
    from test_two_channels import HEAVIEST

    from optgym.corpus.portable import portable_modules
    from optgym.parallel.portable import portable_path
    from optgym.train.es import ESTask, es_rollout
    from optgym.train.evaluation import companion_factories

    module = pressure_corpus["pressure"]
    params = LIGHTEST.parameters().astype(np.float32)  # as ES sends them to its workers
    policy = LIGHTEST.with_parameters(params.astype(np.float64))
    with_evict = companion_factories("regalloc-priority", [("regalloc-evict", str(HEAVIEST.save(tmp_path / "e")))], 1)
    (source,) = portable_modules([module], 1)
    task = ESTask("regalloc-priority", source, module.name, portable_path(str(START.save(tmp_path / "s")), 1), params,
                  120.0, (0, 1), with_evict)  # fmt: skip
    out = es_rollout(task)
    pair = rollout(PRIORITY, module, toolchain, policy, companions=[(EVICT, HEAVIEST)]).result
    alone = rollout(PRIORITY, module, toolchain, policy).result
    clang = plain_compile(PRIORITY, module, toolchain)
    assert out["status"] == "ok" and out["decisions"] == pair.decisions
    assert out["text_bytes"] == pair.metrics["text_bytes"] != alone.metrics["text_bytes"]
    assert out["heuristic_text_bytes"] == clang.metrics["text_bytes"]
    with pytest.raises(Exception, match="decided once"):
        companion_factories("regalloc-priority", [("regalloc-priority", str(tmp_path / "s"))], 1)


def test_env_steps_with_random_priorities_pass_gymnasiums_checks(pressure_corpus, no_leftovers):
    """The gymnasium env of the problem: a ``Box`` action (any sample is a valid priority), gymnasium's own
    ``check_env``, and an episode of random priorities ends in a measured, rewarded compile."""
    from gymnasium.utils.env_checker import check_env

    import optgym

    env = optgym.make("regalloc-priority", corpus=pressure_corpus.root, report_timing=False)
    assert env.action_space.shape == (1,) and env.action_space.high[0] == CEILING
    check_env(env.unwrapped, skip_render_check=True)
    env.action_space.seed(3)
    obs, info = env.reset(options={"module": "pressure"})
    steps, terminated, truncated = 0, False, False
    while not (terminated or truncated):
        assert env.observation_space.contains(obs)
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        steps += 1
    assert terminated and info["status"] == "ok" and steps == info["decisions"] > 10
    expected = 1 - (info["policy_text_bytes"] + 0.01) / (info["heuristic_text_bytes"] + 0.01)
    assert reward == pytest.approx(expected) and info["heuristic_text_bytes"] > 0
    env.close()


def test_train_es_refuses_a_companion_it_cannot_load_and_leaves_no_run(pressure_corpus, tmp_path):
    from typer.testing import CliRunner

    from optgym.cli import app

    base = ["train", "es", "--problem", "regalloc-priority", "--corpus", str(pressure_corpus.root),
            "--iterations", "1", "-j", "1", "--no-final-eval"]  # fmt: skip
    missing = CliRunner().invoke(app, [*base, "-o", str(tmp_path / "a"), "--with", f"regalloc-evict={tmp_path}/no"])
    assert missing.exit_code != 0 and not (tmp_path / "a").exists()
    malformed = CliRunner().invoke(app, [*base, "-o", str(tmp_path / "b"), "--with", "regalloc-evict"])
    assert malformed.exit_code != 0 and "PROBLEM=POLICY" in malformed.output and not (tmp_path / "b").exists()


@pytest.mark.parametrize(("language", "decides"), [(None, None), ("C", ["C"])])
def test_train_es_continues_the_shipped_scorer(pressure_corpus, tmp_path, language, decides):
    """``--warmstart pretrained``: ES starts from the scorer shipped in the package (its embedded training policy,
    kept as RUN/start), not from the start rule, and the result decides the languages it was trained on."""
    from typer.testing import CliRunner

    from optgym.cli import app
    from optgym.policies import pretrained_path
    from optgym.policies.embedded import load_embedded

    run = tmp_path / "run"
    args = ["train", "es", "--problem", "regalloc-priority", "--corpus", str(pressure_corpus.root), "--warmstart",
            "pretrained", "--iterations", "1", "--directions", "1", "-j", "1", "--no-final-eval", "-o", str(run),
            *(["--language", language] if language else [])]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    shipped = load_embedded(pretrained_path("regalloc-priority"))
    assert shipped is not None and shipped.languages == ["C"]
    started = CandidateScorer.load(run / "snapshots" / "00000000" / "policy")
    np.testing.assert_array_equal(started.parameters(), shipped.parameters())
    assert not np.array_equal(started.parameters(), START.parameters())
    assert started.languages == decides
    assert CandidateScorer.load(run / "start").languages == ["C"]  # what it started from, as shipped
