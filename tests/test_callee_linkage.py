"""Callee linkage read from the policy's own compile (optgym.rollout.linkage) and the ``callee_survives`` input, on
real clang-22 compiles of a module whose callees are known: two external functions that stay whatever is inlined,
and two inline (``linkonce_odr``) ones whose last inlined call deletes them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import _corpus

from optgym.policies.allowance import DEFAULT_GATES, AllowanceError, allowance_policy, with_gates
from optgym.policies.mlp import MLPPolicy
from optgym.problems import get_problem
from optgym.problems.normalize import VocabError
from optgym.rollout import rollout
from optgym.rollout.decider import DecisionPoint
from optgym.rollout.linkage import REFUSAL_FLAGS, CalleeLinkage, refused_callee, without_refusals
from optgym.toolchain import object_sizes
from optgym.toolchain.remarks import read_remarks, record_flags

CXX = str(Path(sys.executable).parent / "optgym-c++")

#: Each function is called from two places with different constant arguments, so that its call sites differ in
#: features: ``stays_*`` are external (their bodies stay in the object), ``goes_*`` inline (linkonce_odr).
SOURCE = r"""
extern int sink(int);
int stays_a(int x) { int s = 0; for (int i = 0; i < x; ++i) s += sink(i * 3); return s + sink(x); }
int stays_b(int x, int y) { return sink(x) * sink(y) + sink(x ^ y) - sink(x & y); }
inline int goes_a(int x) { int s = 0; for (int i = 0; i < x; ++i) s += sink(i + 7); return s - sink(x * 5); }
inline int goes_b(int x, int y) { return sink(x + y) * sink(x - y) + sink(x * y); }
int use1(int v) { return stays_a(v) + goes_a(v) + stays_b(v, 1) + goes_b(v, 2); }
int use2(int v, int w) { return stays_a(w) - goes_a(w) + stays_b(w, v) - goes_b(v, w); }
"""


#: An inline function whose address is kept stays too; only the pass plugin knows (the symbol table does not).
KEPT = r"""
inline int kept_a(int x) { int s = 0; for (int i = 0; i < x; ++i) s += sink(i - 2); return s + sink(x * 9); }
int (*keeper)(int) = kept_a;
int use3(int v) { return kept_a(v) + kept_a(v + 1); }
"""


@pytest.fixture(scope="module")
def linkage_corpus(toolchain, tmp_path_factory):
    return _corpus(toolchain, tmp_path_factory.mktemp("linkage"), {"calls": (".cpp", SOURCE + KEPT)})


@pytest.fixture(scope="module")
def linkage_module(linkage_corpus):
    return linkage_corpus.modules[0]


class SurvivesRecorder:
    """clang's own decisions, keeping what ``callee_survives`` said at each."""

    reads_callee_linkage = True

    def __init__(self) -> None:
        self.seen: list[bool | None] = []

    def __call__(self, point: DecisionPoint) -> int:
        self.seen.append(point.callee_survives)
        return int(point.heuristic or 0)


def test_clang_names_each_refused_callee_before_the_decision(linkage_module, toolchain, tmp_path):
    """At every decision clang's heuristic refuses, the input says whether that callee stays: each is named on
    stderr before the channel asks. The optimization record names every decision's callee afterwards, the truth
    to check against. An inline function whose address is kept stays (the pass plugin, as in a served build). A
    decision clang inlines itself reads as staying."""
    problem = get_problem("inline-size")
    recorder, record = SurvivesRecorder(), tmp_path / "record.yaml"
    run = rollout(problem, linkage_module, toolchain, recorder, extra_flags=record_flags(record, "inline-ml"))
    assert run.result.ok and "not inlined" not in run.result.stderr_tail  # the refusals stay out of the tail
    callees = [r["Callee"].split("(")[0] for r in read_remarks(record, "inline-ml")]
    refused = run.trajectory.heuristic == 0
    assert len(callees) == len(recorder.seen) == len(refused)
    said: dict[str, set] = {}
    for callee, survives, no in zip(callees, recorder.seen, refused, strict=True):
        if no:
            said.setdefault(callee, set()).add(survives)
        else:
            assert survives is True
    stays = [c for c in said if "stays_" in c or "kept_" in c]
    goes = [c for c in said if "goes_" in c]
    assert stays and goes and any("kept_" in c for c in stays), said
    assert all(said[c] == {True} for c in stays), said
    assert all(said[c] == {False} for c in goes), said


def test_the_refusal_remarks_change_no_object(linkage_corpus, toolchain, tmp_path):
    """The flags that make clang name its refusals leave the object byte for byte as clang compiles it."""
    for module in linkage_corpus.modules:
        objects = []
        for extra in ((), REFUSAL_FLAGS):
            out = tmp_path / f"{len(objects)}.o"
            argv = module.argv(toolchain.clang, [*get_problem("inline-size").compile_flags(), *extra], str(out))
            done = subprocess.run(argv, cwd=module.workdir, capture_output=True, timeout=120)
            assert done.returncode == 0, done.stderr
            objects.append(out.read_bytes())
            assert (b"not inlined into" in done.stderr) == bool(extra)
        assert objects[0] == objects[1]


def test_the_linkage_reads_only_what_clang_wrote_since_the_last_decision(tmp_path):
    """A refusal belongs to the decision that follows it; a decision with none reads as staying; a line cut short
    by a read is kept and read whole later; the same decision asked twice answers the same."""
    log = tmp_path / "stderr"
    log.write_bytes(b"warning: something else\n")
    refusal = "\x1b[1mremark: \x1b[0m'{}' not inlined into 'g' because too costly to inline (cost=9, threshold=5) "
    refusal += "[-Rpass-missed=inline]\n"
    half = refusal.format("inl").encode()
    writes = [refusal.format("ext").encode(), refusal.format("inl").encode(), b"", half[:30], half[30:]]
    expected = [True, False, True, True, False]
    with open(log, "ab") as writer, open(log, "rb") as reader:
        linkage = CalleeLinkage({"ext"}, reader.fileno(), offset=len(b"warning: something else\n"))
        for i, (written, survives) in enumerate(zip(writes, expected, strict=True)):
            writer.write(written)
            writer.flush()
            decision = object()
            assert linkage.survives(decision) is survives, i
            assert linkage.survives(decision) is survives
    assert refused_callee(b"x.cc:3:5: remark: '_Z1fv' not inlined into 'g' because too costly [-Rpass-missed=inline]")
    kept = b"x.cc:1:1: warning: unused [-Wunused]\n"
    assert without_refusals(refusal.format("f").encode() + kept) == kept
    # a refusal about a call in a header comes under its include stack, which goes with it; a warning's stays
    stack = b"In file included from x.cc:4:\n\x1b[1mIn file included from\x1b[0m /usr/include/h.h:39:\n"
    assert without_refusals(kept + stack + refusal.format("f").encode() + stack + kept) == kept + stack + kept
    assert without_refusals(stack) == stack
    assert CalleeLinkage(None, None).survives(object()) is True  # nothing known: no deleting inline is added


def test_a_policy_reading_linkage_without_a_loop_that_learned_it_is_refused(linkage_module, toolchain):
    policy = allowance_policy([*DEFAULT_GATES, "callee_survives"])
    assert policy.reads_callee_linkage
    with pytest.raises(VocabError, match="linkage"):
        policy.logits(np.zeros(len(policy.feature_names)), 0, 1)


def test_a_negative_weight_on_callee_survives_withdraws_only_surviving_callees(linkage_module, toolchain):
    """An allowance that inlines past clang everywhere, with and without a strongly negative ``callee_survives``
    weight: the gate withdraws the extra inlines of surviving callees and keeps clang's own."""
    problem = get_problem("inline-size")
    greedy = allowance_policy([*DEFAULT_GATES, "callee_survives"])
    greedy.weights[0][1][1] = 2.0  # bias: inline whatever the margin
    greedy._prune()
    gated = allowance_policy([*DEFAULT_GATES, "callee_survives"])
    gated.weights[0][1][1] = 2.0
    gated.weights[0][0][-1, 1] = -3.0  # 4·h + m + 2 − 3: clang's yes stays, an extra inline of a survivor goes
    gated._prune()
    loose = rollout(problem, linkage_module, toolchain, greedy).trajectory
    tight = rollout(problem, linkage_module, toolchain, gated).trajectory
    assert (loose.actions >= loose.heuristic).all() and (tight.actions >= tight.heuristic).all()
    assert tight.actions.sum() < loose.actions.sum()


def test_with_gates_keeps_every_decision_and_refuses_other_gates():
    policy = allowance_policy()
    policy.weights[0][0][-3:, 1] = [0.5, -0.25, 0.125]
    policy._prune()
    grown = with_gates(policy, [*DEFAULT_GATES, "callee_survives"])
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 300, size=(50, len(policy.feature_names))).astype(np.float64)
    heuristic = rng.integers(0, 2, size=50)
    for survives in (0, 1):
        assert np.array_equal(grown.logits(raw, heuristic, 1, survives), policy.logits(raw, heuristic, 1))
    with pytest.raises(AllowanceError):
        with_gates(policy, ["callee_survives", *DEFAULT_GATES])


def _gated(survives_weight: float) -> MLPPolicy:
    """An allowance that inlines past clang everywhere, with ``survives_weight`` on ``callee_survives``."""
    policy = allowance_policy([*DEFAULT_GATES, "callee_survives"])
    policy.weights[0][1][1] = 2.0
    policy.weights[0][0][-1, 1] = survives_weight
    policy._prune()
    return policy


def test_optgym_cxx_learns_the_linkage_of_each_compile_it_serves(tmp_path, no_leftovers):
    """A served build of a policy that reads ``callee_survives``: the server runs each file's front end once, the
    policy's compile of its bitcode names the callees clang refuses (strict mode: any failure to supply the input
    would fail the compile), the gate changes the object, and the build sees none of the refusals."""
    (tmp_path / "calls.cpp").write_text(SOURCE)
    sizes = {}
    for name, weight in (("loose", 0.0), ("tight", -3.0)):
        _gated(weight).save(tmp_path / name)
        env = {**os.environ, "OPTGYM_POLICY": str(tmp_path / name), "OPTGYM_STRICT": "1", "OPTGYM_SERVER_IDLE": "5"}
        done = subprocess.run([CXX, "-Oz", "-c", "calls.cpp", "-o", f"{name}.o"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0 and not done.stderr, done.stderr
        sizes[name] = object_sizes(tmp_path / f"{name}.o").text_bytes
    assert sizes["tight"] < sizes["loose"], sizes


def test_a_file_that_does_not_compile_gives_clangs_own_error_once(tmp_path, no_leftovers):
    """The front end of a broken file fails quietly; the build sees clang's diagnostics once, from the compile it
    asked for, and clang's exit code."""
    (tmp_path / "bad.cpp").write_text("int f( { return 1; }\n")
    _gated(-3.0).save(tmp_path / "policy")
    env = {**os.environ, "OPTGYM_POLICY": str(tmp_path / "policy"), "OPTGYM_SERVER_IDLE": "5"}
    done = subprocess.run([CXX, "-Oz", "-c", "bad.cpp", "-o", "bad.o"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    plain = subprocess.run(["clang++-22", "-Oz", "-c", "bad.cpp", "-o", "plain.o"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=300)  # fmt: skip
    assert done.returncode == plain.returncode != 0
    assert done.stderr.count("error:") == plain.stderr.count("error:") > 0, done.stderr
    assert not (tmp_path / "bad.o").exists()


def test_a_linkage_policy_exports_and_decides_alike_on_onnxruntime(tmp_path):
    """The exported graph takes ``callee_survives`` as an input of its own, and decides as the trained policy."""
    from optgym.policies.export import export_policy
    from optgym.policies.exported import OnnxPolicy

    policy = _gated(-3.0)
    policy.weights[0][0][-4:-1, 1] = [0.5, -0.25, 0.125]
    policy._prune()
    policy.save(tmp_path / "gated")
    export_policy(tmp_path / "gated", tmp_path / "gated.onnx")
    served = OnnxPolicy.load(tmp_path / "gated.onnx")
    assert served.reads_callee_linkage
    rng = np.random.default_rng(1)
    raw = rng.integers(0, 300, size=(400, len(policy.feature_names))).astype(np.float64)
    heuristic, survives = rng.integers(0, 2, size=400), rng.integers(0, 2, size=400)
    assert np.array_equal(
        served.actions(raw, heuristic, 1, survives), policy.logits(raw, heuristic, 1, survives).argmax(-1)
    )
    assert not np.array_equal(
        served.actions(raw, heuristic, 1, survives), served.actions(raw, heuristic, 1, 1 - survives)
    )


def test_the_env_hands_callee_survives_to_an_agent_as_a_rollout_gives_it_to_a_policy(
    linkage_corpus, linkage_module, toolchain
):
    """``optgym.make(…, callee_linkage=True)``: every pending decision's ``info`` says whether its callee survives,
    the same values, decision for decision, as a policy inside a rollout reads (clang's answers in both)."""
    import optgym

    recorder = SurvivesRecorder()
    assert rollout(get_problem("inline-size"), linkage_module, toolchain, recorder).result.ok
    env = optgym.make("inline-size", corpus=linkage_corpus, callee_linkage=True)
    try:
        _, info = env.reset(options={"module": linkage_module.name})
        seen, done = [], False
        while not done:
            seen.append(bool(info["callee_survives"]))
            _, _, terminated, truncated, info = env.step(info["heuristic_action"])
            done = terminated or truncated
    finally:
        env.close()
    assert seen == recorder.seen and any(seen) and not all(seen)


def test_ppo_trains_an_allowance_grown_with_callee_survives(linkage_corpus, tmp_path):
    """``optgym train ppo --allowance default,callee_survives --warmstart ALLOWANCE``: the actor reads the new gate
    from weight 0, and the run's env workers supply it (an env without it would fail the first step)."""
    from optgym.train.sb3 import SB3Config, train_sb3

    start = allowance_policy()
    start.weights[0][1][1] = 0.5
    start._prune()
    start.save(tmp_path / "start")
    run = tmp_path / "ppo"
    cfg = SB3Config("ppo", str(linkage_corpus.root), str(run), warmstart=str(tmp_path / "start"),
                    allowance=[*DEFAULT_GATES, "callee_survives"], iterations=2, steps_per_iteration=64, workers=1,
                    final_eval=False, critic="heuristic", learning_rate=0.05)  # fmt: skip
    train_sb3(cfg, say=lambda s: None)
    final = MLPPolicy.load(run / "final" / "policy")
    assert final.extras[-1] == "callee_survives" and final.reads_callee_linkage


def test_deletes_is_few_users_and_a_callee_that_goes_batched_singly_and_exported(tmp_path):
    """``deletes:K`` is 1 exactly where ``callee_users ≤ K`` and ``callee_survives`` is 0: the same in a batch, in
    one served decision, and in the exported graph on onnxruntime; and it reads the linkage (a loop learns it)."""
    from optgym.policies.export import export_policy
    from optgym.policies.exported import OnnxPolicy

    policy = allowance_policy([*DEFAULT_GATES, "deletes:2"])
    assert policy.reads_callee_linkage
    policy.weights[0][0][-1, 1] = 3.0  # a large allowance only where the gate holds
    policy._prune()
    rng = np.random.default_rng(2)
    raw = rng.integers(0, 6, size=(400, len(policy.feature_names))).astype(np.float64)
    raw[:, policy.feature_names.index("cost_estimate")] = rng.integers(0, 300, size=400)  # a margin to move
    heuristic, survives = np.zeros(400, np.int64), rng.integers(0, 2, size=400)
    users = raw[:, policy.feature_names.index("callee_users")]
    gate = policy.inputs(raw, heuristic, 1, survives)[:, -1]
    assert np.array_equal(gate, ((users <= 2) & (survives == 0)).astype(np.float64)) and 0 < gate.sum() < 400
    single = [policy.inputs.extras_of_one(raw[i], 0, 1, int(survives[i]))[-1] for i in range(400)]
    assert np.array_equal(np.array(single), gate)
    trained = policy.logits(raw, heuristic, 1, survives).argmax(-1)
    assert trained[gate == 0].sum() < trained[gate == 1].sum()  # the allowance lives behind the gate
    policy.save(tmp_path / "deletes")
    export_policy(tmp_path / "deletes", tmp_path / "deletes.onnx")
    served = OnnxPolicy.load(tmp_path / "deletes.onnx")
    assert served.reads_callee_linkage and np.array_equal(served.actions(raw, heuristic, 1, survives), trained)
    with pytest.raises(VocabError, match="deletes:K"):
        allowance_policy([*DEFAULT_GATES, "deletes:two"])


def test_a_deletes_allowance_inlines_only_callees_that_go(linkage_module, toolchain):
    """On a real compile: past clang, the ``deletes`` allowance adds inlines only of callees clang named as going,
    where the same allowance on ``at_most:callee_users`` alone adds some of callees that stay too."""
    problem = get_problem("inline-size")
    runs = {}
    for gate in ("deletes:1000", "at_most:callee_users:1000"):
        policy = allowance_policy([*DEFAULT_GATES, gate])
        policy.weights[0][0][-1, 1] = 2.0
        policy._prune()
        recorder = SurvivesRecorder()

        def decide(point: DecisionPoint, policy: MLPPolicy = policy, recorder: SurvivesRecorder = recorder) -> int:
            recorder(point)  # what clang said of this call site's callee
            answer = policy(point)
            return int(answer[0] if isinstance(answer, tuple) else answer)

        decide.reads_callee_linkage = True  # type: ignore[attr-defined]
        run = rollout(problem, linkage_module, toolchain, decide)
        assert run.result.ok
        extra = (run.trajectory.actions == 1) & (run.trajectory.heuristic == 0)
        runs[gate] = [s for s, e in zip(recorder.seen, extra, strict=True) if e]
    assert runs["deletes:1000"] and not any(runs["deletes:1000"])  # extra inlines, none of a callee that stays
    assert any(runs["at_most:callee_users:1000"])
