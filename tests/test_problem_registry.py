"""A new decision problem is one file: what it declares (hook, serving variable, shipped policy) reaches the
toolchain check, ``optgym doctor``, evaluation, the policy server and the launcher's channel table from the
registry alone."""

from __future__ import annotations

import os

import pytest
from typer.testing import CliRunner

import optgym_cc
from optgym.cli import app
from optgym.evaluate import evaluate
from optgym.policies import PRETRAINED_DIR, PRETRAINED_NAMES, PolicyError, pretrained_path
from optgym.problems import base, get_problem, register, registry, servable
from optgym.problems.inline_size import HEURISTIC, InlineSize
from optgym.protocol import TensorSpec
from optgym.rollout import rollout
from optgym.rollout.simple import heuristic
from optgym.serve.server import Server, channels
from optgym.toolchain.interactive import InteractiveCompile


class ToyInline(InlineSize):
    """A second view of the inliner's channel, defined here and nowhere else: three of its features (the cost
    model's estimate and threshold, and clang's own answer), under another name, served under its own variable,
    with no shipped policy."""

    name = "toy-inline"
    env_id = "optgym/ToyInline-v0"
    serve_variable = "OPTGYM_TOY_POLICY"
    pretrained = None

    def expected_features(self) -> tuple[TensorSpec, ...]:
        return tuple(TensorSpec(name, "int64_t", (1,)) for name in ("cost_estimate", "threshold", HEURISTIC))


@pytest.fixture
def toy(monkeypatch):
    """ToyInline registered for one test: the registry is a copy, put back (without the toy) afterwards."""
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))
    register(ToyInline)
    return get_problem(ToyInline.name)


def _canonical(rows):
    return [(problem, variable, os.path.realpath(path) if path else "") for problem, variable, path in rows]


def test_the_launchers_channel_table_is_the_registrys():
    """optgym_cc imports nothing of optgym, so it writes the table out: every servable problem, with the same
    variable and shipped file, in the same order."""
    assert [cls.name for cls in servable()] == [row[0] for row in optgym_cc.CHANNELS]
    assert _canonical(optgym_cc.CHANNELS) == _canonical(channels())
    assert os.path.samefile(optgym_cc.PRETRAINED_DIR, PRETRAINED_DIR)


def test_shipped_policies_are_the_ones_problems_declare():
    assert {name: cls.pretrained for name, cls in registry().items() if cls.pretrained} == PRETRAINED_NAMES
    for problem in PRETRAINED_NAMES:
        assert pretrained_path(problem).is_file(), problem


def test_a_toy_problem_is_checked_by_doctor(toy):
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 0, result.output
    (line,) = [line for line in result.output.splitlines() if line.rstrip().endswith("toy-inline")]
    assert line.split()[:3] == ["hook", "inliner", "yes"]


def test_a_toy_problem_is_evaluated(toy, corpus, toolchain):
    names = [m.name for m in corpus]
    rows = evaluate("heuristic", corpus, problem="toy-inline", workers=1, progress=False)
    assert [r.module for r in rows] == names and all(r.ok for r in rows) and sum(r.decisions for r in rows) > 0
    assert all(r.policy_text == r.heuristic_text for r in rows)  # its view carries clang's answer: replayed exactly
    never = evaluate("never", corpus, problem="toy-inline", workers=1, progress=False)
    assert sum(r.policy_text for r in never) > sum(r.heuristic_text for r in never)
    assert [r.decisions for r in rows] == [rollout(toy, m, toolchain, heuristic).result.decisions for m in corpus]


def test_a_toy_problem_is_a_channel_optgym_cc_can_serve(toy, toolchain, tmp_path):
    assert channels()[-1] == ("toy-inline", "OPTGYM_TOY_POLICY", "")  # no shipped policy: the launcher says heuristic
    with pytest.raises(PolicyError, match="ships no pretrained policy for toy-inline"):
        pretrained_path("toy-inline")
    server = Server("never", "toy-inline")
    (tmp_path / "x.c").write_text("static int twice(int x) { return 2 * x; }\nint f(int y) { return twice(y) + 1; }\n")
    argv = [str(toolchain.clang), "-Oz", "-c", "x.c", "-o", "x.o", *toy.compile_flags()]
    with InteractiveCompile(lambda base_: [*argv, *toy.channel_flags(base_)], cwd=tmp_path) as compile_:
        reply = server._drive(compile_, "c")
    assert reply["returncode"] == 0 and reply["decisions"] > 0, reply
    assert (tmp_path / "x.o").stat().st_size > 0


def test_the_toy_is_gone_after_its_test():
    assert "toy-inline" not in registry() and "toy-inline" not in [row[0] for row in channels()]
