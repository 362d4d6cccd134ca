"""Two decisions of one compile on real clang-22: inlining (during optimization), then register
allocation's eviction (during code generation), each over its own channel and answered by its own policy."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_regalloc_evict import PRESSURE_SOURCE
from test_serve import CC, run

from optgym.policies import resolve_policy
from optgym.policies.scorer import CandidateScorer
from optgym.problems import get_problem
from optgym.rollout import plain_compile, rollout
from optgym.rollout.rollout import DecisionPoint
from optgym.toolchain.interactive import InteractiveCompile
from optgym.toolchain.sizes import object_sizes
from optgym.train.evaluation import evaluate

#: Calls to inline (``mix``, ``pressure``) and enough register pressure for the eviction advisor.
SOURCE = (
    PRESSURE_SOURCE
    + r"""
static long mix(long a, long b) { return a * 31 + (b ^ (a >> 3)); }
long drive(long *a, int n) {
  pressure(a, n);
  return mix(a[0], a[1]) + mix(a[2], mix(a[3], a[4]));
}
"""
)
INLINE, EVICT = get_problem("inline-size"), get_problem("regalloc-evict")
#: Evict the *heaviest* candidate: far from clang's default advisor, so the object must differ from clang's.
HEAVIEST = CandidateScorer({"use_def_density": 1.0}, problem="regalloc-evict")


@pytest.fixture(scope="module")
def two_corpus(toolchain, tmp_path_factory):
    from conftest import _corpus

    return _corpus(toolchain, tmp_path_factory.mktemp("two"), {"drive": (".c", SOURCE)})


@pytest.fixture(scope="module")
def heaviest_dir(tmp_path_factory):
    return HEAVIEST.save(tmp_path_factory.mktemp("heaviest") / "policy")


def _last_valid(point: DecisionPoint) -> int:
    return int(np.flatnonzero(point.features()["mask"].ravel())[-1])


def test_one_compile_sends_inlining_then_eviction_over_two_channels(two_corpus, toolchain, no_leftovers):
    module = two_corpus["drive"]
    order: list[int] = []

    def argv(inline_base: str, evict_base: str) -> list[str]:
        flags = [*INLINE.compile_flags(), *INLINE.channel_flags(inline_base), *EVICT.channel_flags(evict_base)]
        return module.argv(toolchain.clang, flags, "-")

    with InteractiveCompile(argv, channels=2) as compile_:
        assert compile_.start() is not None and compile_.channel == 0  # the optimizer's inliner comes first
        views = {}
        while (obs := compile_.next_observation()) is not None:
            channel = compile_.channel
            problem = (INLINE, EVICT)[channel]
            view = views.setdefault(channel, problem.view(compile_.header))
            order.append(channel)
            if channel == 0:
                action = problem.heuristic_action(view, obs)
            else:
                action = _last_valid(DecisionPoint(view, obs, None, 0))
            compile_.answer(problem.encode_action(compile_.header, action))
        outcome = compile_.finish()
    assert outcome.ok, outcome
    assert all(h is not None for h in compile_.headers)
    assert compile_.headers[0].advice.name == "inlining_decision"
    assert compile_.headers[1].advice.name == "index_to_evict"
    assert order.count(0) > 0 and order.count(1) > 0 and outcome.decisions == len(order)
    assert order == sorted(order)  # every inlining decision before the first eviction


def test_a_companion_decides_eviction_inside_an_inlining_episode(two_corpus, toolchain, no_leftovers):
    """clang's own inlining answered over the channel is byte-identical to a plain compile, so inlining's
    heuristic with the scorer as companion must give the object the scorer gives alone."""
    module = two_corpus["drive"]
    heuristic = resolve_policy("heuristic").build()
    both = rollout(INLINE, module, toolchain, heuristic, companions=[(EVICT, HEAVIEST)])
    alone = rollout(EVICT, module, toolchain, HEAVIEST)
    inline_only = rollout(INLINE, module, toolchain, heuristic)
    plain = plain_compile(INLINE, module, toolchain)
    assert both.result.ok and alone.result.ok and inline_only.result.ok
    assert both.result.metrics["text_bytes"] == alone.result.metrics["text_bytes"]
    assert inline_only.result.metrics["text_bytes"] == plain.metrics["text_bytes"]
    assert alone.result.metrics["text_bytes"] != plain.metrics["text_bytes"]  # the companion did decide
    # the trajectory is inlining's; the compile's decision count covers both channels
    assert len(both.trajectory.actions) == inline_only.result.decisions
    assert both.result.decisions == inline_only.result.decisions + alone.result.decisions


def test_a_companions_masked_answer_ends_the_episode_and_leaves_nothing(two_corpus, toolchain, no_leftovers):
    def masked(point: DecisionPoint) -> int:
        return int(np.flatnonzero(point.features()["mask"].ravel() == 0)[0])

    out = rollout(INLINE, two_corpus["drive"], toolchain, resolve_policy("never").build(), companions=[(EVICT, masked)])
    assert out.result.status == "invalid_action" and "not valid at this decision" in out.result.detail


def test_evaluate_with_a_companion_compares_both_policies_with_clang(two_corpus, heaviest_dir, no_leftovers):
    together = evaluate("heuristic", two_corpus, workers=1, progress=False,
                        companions=[("regalloc-evict", str(heaviest_dir))])  # fmt: skip
    alone = evaluate(str(heaviest_dir), two_corpus, problem="regalloc-evict", workers=1, progress=False)
    inlining = evaluate("heuristic", two_corpus, workers=1, progress=False)
    assert [r.status for r in together + alone + inlining] == ["ok"] * 3
    assert together[0].policy_text == alone[0].policy_text != together[0].heuristic_text
    assert inlining[0].policy_text == inlining[0].heuristic_text  # not a cached companion result


def test_evaluate_cli_records_the_companion_and_refuses_a_malformed_one(two_corpus, heaviest_dir, tmp_path):
    from typer.testing import CliRunner

    from optgym.cli import app

    base = ["evaluate", "--corpus", str(two_corpus.root), "-j", "1", "--policy", "never"]
    result = CliRunner().invoke(app, [*base, "-o", str(tmp_path / "r"), "--with", f"regalloc-evict={heaviest_dir}"])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert set(report["with"]) == {"regalloc-evict"} and report["with"]["regalloc-evict"].startswith("scorer:")
    bad = CliRunner().invoke(app, [*base, "-o", str(tmp_path / "bad"), "--with", "regalloc-evict"])
    assert bad.exit_code != 0 and "PROBLEM=POLICY" in bad.output
    twice = CliRunner().invoke(app, [*base, "-o", str(tmp_path / "twice"), "--with", "inline-size=never"])
    assert twice.exit_code != 0 and "decided once" in twice.output


def test_optgym_cc_serves_inlining_and_eviction_in_one_compile(two_corpus, toolchain, heaviest_dir, tmp_path):
    """(Allocation priority left to clang here: test_regalloc_priority serves all three channels.)"""
    (tmp_path / "drive.c").write_text(SOURCE)
    served = run([CC, "-Oz", "-c", "drive.c", "-o", "served.o"], tmp_path, OPTGYM_POLICY="never",
                 OPTGYM_EVICT_POLICY=str(heaviest_dir), OPTGYM_PRIORITY_POLICY="heuristic",
                 OPTGYM_STRICT="1")  # fmt: skip
    assert served.returncode == 0 and served.stderr == "", served.stderr
    both = rollout(INLINE, two_corpus["drive"], toolchain, resolve_policy("never").build(),
                   companions=[(EVICT, HEAVIEST)])  # fmt: skip
    assert both.result.ok
    assert object_sizes(tmp_path / "served.o").text_bytes == both.result.metrics["text_bytes"]
    # eviction alone (the inliner left to clang) is served too, and matches a rollout of it
    evict_only = run([CC, "-Oz", "-c", "drive.c", "-o", "evict.o"], tmp_path, OPTGYM_POLICY="heuristic",
                     OPTGYM_EVICT_POLICY=str(heaviest_dir), OPTGYM_PRIORITY_POLICY="heuristic",
                 OPTGYM_STRICT="1")  # fmt: skip
    assert evict_only.returncode == 0, evict_only.stderr
    alone = rollout(EVICT, two_corpus["drive"], toolchain, HEAVIEST)
    assert object_sizes(tmp_path / "evict.o").text_bytes == alone.result.metrics["text_bytes"]


def test_an_eviction_policy_that_does_not_fit_the_compiler_falls_back_to_clang(tmp_path):
    """Eviction's stream carries no answer of clang's own to send instead, so the compile is redone plainly."""
    alien = CandidateScorer({"no_such_feature": 1.0}, problem="regalloc-evict").save(tmp_path / "alien")
    (tmp_path / "drive.c").write_text(SOURCE)
    ours = run([CC, "-Oz", "-c", "drive.c", "-o", "ours.o"], tmp_path, OPTGYM_POLICY="heuristic",
               OPTGYM_EVICT_POLICY=str(alien))  # fmt: skip
    assert ours.returncode == 0
    (line,) = ours.stderr.splitlines()
    assert line.startswith("optgym-cc: warning:") and "no_such_feature" in line and "without optgym" in line
    plain = run(["/usr/lib/llvm-22/bin/clang", "-Oz", "-c", "drive.c", "-o", "plain.o"], tmp_path)
    assert plain.returncode == 0 and (tmp_path / "ours.o").read_bytes() == (tmp_path / "plain.o").read_bytes()


def test_a_scorer_for_c_leaves_cxx_compiles_to_clang(two_corpus, toolchain, tmp_path):
    """A scorer shipped for C (``languages: ["C"]``) opens no channel in a C++ compile: served by optgym-c++
    the object is clang's own, and a companion rollout of a C++ module is the inliner's alone."""
    from test_serve import CXX

    c_only = CandidateScorer({"use_def_density": 1.0}, problem="regalloc-evict", languages=["C"])
    c_only.save(tmp_path / "c-only")
    assert CandidateScorer.load(tmp_path / "c-only").languages == ["C"]
    (tmp_path / "drive.cpp").write_text(SOURCE.replace("extern void use", 'extern "C" void use'))
    served = run([CXX, "-Oz", "-c", "drive.cpp", "-o", "served.o"], tmp_path, OPTGYM_POLICY="heuristic",
                 OPTGYM_EVICT_POLICY=str(tmp_path / "c-only"), OPTGYM_STRICT="1")  # fmt: skip
    plain = run(["/usr/lib/llvm-22/bin/clang++", "-Oz", "-c", "drive.cpp", "-o", "plain.o"], tmp_path)
    assert served.returncode == plain.returncode == 0 and served.stderr == "", served.stderr
    assert (tmp_path / "served.o").read_bytes() == (tmp_path / "plain.o").read_bytes()
    # the same scorer does decide the C module
    (tmp_path / "drive.c").write_text(SOURCE)
    c_served = run([CC, "-Oz", "-c", "drive.c", "-o", "c.o"], tmp_path, OPTGYM_POLICY="heuristic",
                   OPTGYM_EVICT_POLICY=str(tmp_path / "c-only"), OPTGYM_PRIORITY_POLICY="heuristic",
                   OPTGYM_STRICT="1")  # fmt: skip
    assert c_served.returncode == 0
    alone = rollout(EVICT, two_corpus["drive"], toolchain, HEAVIEST)
    assert object_sizes(tmp_path / "c.o").text_bytes == alone.result.metrics["text_bytes"]
