"""optgym train threshold: clang's heuristic with its cost threshold moved, as an ordinary policy."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import recorded_decisions, traced_decisions

from optgym.corpus import Corpus
from optgym.policies import PolicyError, resolve_policy, shipped_path, shipped_provenance
from optgym.policies.mlp import MLPPolicy
from optgym.problems import get_problem
from optgym.problems.normalize import VocabError
from optgym.rollout import rollout
from optgym.train.run import RunError
from optgym.train.threshold import ThresholdConfig, parse_shift, threshold_policy, train_threshold

PROBLEM = get_problem("inline-size")
NAMES = [s.name for s in PROBLEM.expected_features() if s.name not in PROBLEM.hidden_features]


@pytest.mark.parametrize(
    ("cxx", "c"),
    # node_count: 6 in the C module, 383–418 in the C++ one, so the ≥ 400 gate opens and closes within it
    [(None, None), (5, None), (None, 5), (0, 20), ((20, 3), (10, 2)),
     ("10/2+40/3@is_callee_avail_external<=0", "30@callee_basic_block_count<=2+5"),
     ("100/2@node_count>=400+10/3", "50@node_count>=3@callee_users<=2"),
     ("no40@callee_users>=2+10/2", "no1000"), ("no0", "no30@callee_basic_block_count>=2+20")],
)  # fmt: skip
def test_the_policy_moves_clangs_threshold_exactly_per_language(cxx, c, corpus_dir, toolchain):
    """Every decision of a real compile is clang's, moved exactly as asked in that module's language
    (d = threshold − cost): the tests' corpus has C and C++ modules."""
    policy = threshold_policy(NAMES, cxx=cxx, c=c)
    checked = {"C": 0, "C++": 0}
    withdrawals = 0
    for module, f, actions, heuristic in recorded_decisions(policy, corpus_dir, toolchain):
        lang = "C++" if module.language == "C++" else "C"
        d = f[:, NAMES.index("threshold")] - f[:, NAMES.index("cost_estimate")]
        clangs = heuristic == 1
        added, withdrawn = np.zeros_like(clangs), np.zeros_like(clangs)
        for rule in parse_shift(cxx if lang == "C++" else c) or ():
            admitted = rule.admits(-d)
            for feature, op, bound in rule.gates:
                value = f[:, NAMES.index(feature)]
                admitted &= value <= bound if op == "<=" else value >= bound
            if rule.refuse:
                withdrawn |= admitted
            else:
                added |= admitted
        # additions apply where clang says no, withdrawals where it says yes
        expected = (clangs & ~withdrawn) | (~clangs & added)
        withdrawals += int((clangs & withdrawn).sum())
        assert np.array_equal(actions, expected.astype(np.int64)), module.name
        checked[lang] += len(d)
    assert checked["C"] >= 1 and checked["C++"] > 100
    if any(rule.refuse for shift in (parse_shift(cxx), parse_shift(c)) for rule in shift or ()):
        assert withdrawals > 0, "a withdrawing rule that takes none of clang's inlines away tests nothing"


def test_the_policy_needs_the_language():
    point = type("P", (), {"heuristic": 0, "language": None, "vector": lambda self: np.zeros(len(NAMES), np.float32)})
    with pytest.raises(VocabError, match="language"):
        threshold_policy(NAMES, cxx=5, c=None)(point())


@pytest.mark.parametrize(
    "text",
    [
        "ten",
        "10/x",
        "10@callee_users",
        "10@<=3",
        "10+",
        "10@callee_users<=two",
        "10@node_count>=x",
        "no-5",
        "nox",
        "no",
    ],
)
def test_a_malformed_candidate_is_a_clear_error(text):
    with pytest.raises(RunError, match="threshold candidate"):
        parse_shift(text)


def test_a_rule_gating_on_an_unknown_feature_is_a_clear_error():
    with pytest.raises(RunError, match="no_such_feature"):
        threshold_policy(NAMES, cxx="10@no_such_feature<=1", c=None)


def test_train_threshold_tunes_each_language_and_writes_a_servable_policy(corpus_dir, tmp_path):
    run = tmp_path / "run"
    train_threshold(ThresholdConfig(str(corpus_dir), str(run), split=None, up=["none", "5", "20/3"], workers=1),
                    say=lambda s: None)  # fmt: skip
    table = json.loads((run / "candidates.json").read_text())
    assert [c["up"] for c in table["candidates"]] == ["none", "5", "20/3"]
    none = table["candidates"][0]
    for lang in ("C", "C++"):
        assert none[lang]["total_ratio"] == 1.0 and none[lang]["regressed"] == 0 and none[lang]["improved"] == 0
        best = min(table["candidates"], key=lambda c, lang=lang: c[lang]["total_ratio"])
        assert table["chosen"][lang] == best["up"]
    metrics = json.loads((run / "final" / "metrics.json").read_text())
    assert metrics["chosen"] == table["chosen"] and metrics["all"]["modules_ok"] >= 2
    assert resolve_policy(str(run)).identity.startswith("mlp:")
    # the recorded configuration reproduces the run
    from typer.testing import CliRunner

    from optgym.cli import app

    again = tmp_path / "again"
    result = CliRunner().invoke(app, ["train", "--config", str(run / "config.toml"), "-o", str(again)])
    assert result.exit_code == 0, result.output
    assert json.loads((again / "candidates.json").read_text())["chosen"] == table["chosen"]


def test_languages_not_tuned_keep_clangs_decisions(corpus_dir, tmp_path):
    """``--languages C++`` compiles only the C++ modules of the sample; C keeps clang's own decisions."""
    run = tmp_path / "run"
    train_threshold(ThresholdConfig(str(corpus_dir), str(run), split=None, up=["none", "10/2+30@callee_users<=3"],
                                    workers=1, final_eval=False, languages=["C++"]), say=lambda s: None)  # fmt: skip
    table = json.loads((run / "candidates.json").read_text())
    assert all("C" not in c and c["C++"]["evaluated"] >= 1 for c in table["candidates"])
    assert table["chosen"]["C"] == "none"
    with pytest.raises(RunError, match="languages"):
        train_threshold(ThresholdConfig(str(corpus_dir), str(tmp_path / "bad"), languages=["Rust"]))


def test_every_sample_must_keep_the_bar(corpus_dir, tmp_path):
    """With ``samples=2`` each candidate is figured on the union of two module samples and on each alone;
    a candidate is chosen only if its share of modules > 1 % worse is within the bar on both."""
    run = tmp_path / "run"
    cfg = ThresholdConfig(str(corpus_dir), str(run), split=None, up=["none", "20", "40"], workers=1,
                          final_eval=False, sampling_rate=0.6, samples=2, max_regressed=0.0)  # fmt: skip
    train_threshold(cfg, say=lambda s: None)
    table = json.loads((run / "candidates.json").read_text())
    for lang in ("C", "C++"):
        for c in table["candidates"]:
            one, two = (f["evaluated"] for f in c[lang]["samples"])
            assert max(one, two) <= c[lang]["evaluated"] <= one + two
        chosen = next(c for c in table["candidates"] if c["up"] == table["chosen"][lang])
        assert all(f["regressed_over_1pct"] == 0 for f in chosen[lang]["samples"])
        kept = [c for c in table["candidates"] if all(f["regressed_over_1pct"] == 0 for f in c[lang]["samples"])]
        assert chosen[lang]["total_ratio"] == min(c[lang]["total_ratio"] for c in kept)


@pytest.mark.parametrize("cxx", [(10, 2), "60/2@node_count>=8@is_callee_avail_external<=0"])
def test_the_exported_graph_reads_the_language_as_the_policy_does(cxx, trace_dir, tmp_path):
    """Also with ≤ and ≥ gates: the graph computes them as the numpy policy does."""
    from typer.testing import CliRunner

    from optgym.cli import app
    from optgym.policies.exported import OnnxPolicy

    policy_dir = threshold_policy(NAMES, cxx=cxx, c=0).save(tmp_path / "policy")
    result = CliRunner().invoke(app, ["export", str(policy_dir), "-o", str(tmp_path / "t.onnx")])
    assert result.exit_code == 0, result.output
    exported, trained = OnnxPolicy.load(tmp_path / "t.onnx"), MLPPolicy.load(policy_dir)
    raw, h = traced_decisions(trace_dir, NAMES)
    for cxx in (0, 1):
        ours = exported.actions(raw, h, np.full(len(h), cxx))
        assert np.array_equal(ours, trained.logits(raw, h, cxx).argmax(-1))
    assert not np.array_equal(exported.actions(raw, h, np.zeros(len(h))), exported.actions(raw, h, np.ones(len(h))))


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["clang", "-Oz", "-c", "f.c"], "C"),
        (["clang++", "-Oz", "-c", "f.c"], "C++"),  # clang++ compiles .c as C++
        (["clang", "-c", "f.cc", "-o", "f.o"], "C++"),
        (["clang++", "-x", "c", "-c", "f.cc"], "C"),
        (["clang", "-xc++", "-c", "f.c"], "C++"),
    ],
)
def test_driver_language(argv, expected):
    from optgym.toolchain.language import driver_language

    assert driver_language(argv) == expected


def test_one_decision_at_a_time_decides_as_the_batch(corpus_dir, toolchain):
    """A served build asks one decision at a time: derived inputs computed as scalars, and the normalizer
    skipped when the first layer reads none of its outputs (the threshold policy's case). Both must
    give the batched path's logits — and so its decisions — on a real compile's decision points."""
    gated = threshold_policy(NAMES, cxx=(10, 2), c=3)
    rng = np.random.default_rng(0)
    dense = gated.with_parameters(gated.parameters() + rng.normal(0, 1e-3, gated.parameters().shape))
    assert gated._extras_rows is not None and dense._extras_rows is None
    features, heuristic, cxx = [], [], []
    for module in Corpus(corpus_dir):
        run = rollout(PROBLEM, module, toolchain, gated, record_features=True)
        if run.trajectory.features is not None and len(run.trajectory.actions):
            features.append(run.trajectory.features)
            heuristic.append(run.trajectory.heuristic)
            cxx.append(np.full(len(run.trajectory.actions), int(module.language == "C++")))
    f, h, c = np.concatenate(features), np.concatenate(heuristic), np.concatenate(cxx)
    assert len(f) > 100 and 0 < c.mean() < 1
    for policy in (gated, dense):
        batched = policy.logits(f, h, c)
        one_by_one = np.stack([policy.logits(f[i], int(h[i]), int(c[i])) for i in range(len(f))])
        np.testing.assert_allclose(one_by_one, batched, rtol=1e-12, atol=1e-9)  # a matmul sums in its own order
        assert np.array_equal(one_by_one.argmax(1), batched.argmax(1))


def test_the_hand_set_rule_stays_a_named_baseline(corpus_dir, toolchain):
    """``--policy rule`` is the hand-set inline rule whatever ships as ``pretrained``: a file of its own, the one its
    provenance describes (a threshold run), that departs from clang's decisions on C++ and only there."""
    import hashlib

    path, provenance = (
        shipped_path("rule", "inline-size"),
        json.loads(shipped_provenance("rule", "inline-size").read_text()),
    )
    assert provenance["algorithm"] == "threshold" and provenance["policy"] == path.name
    assert hashlib.sha256(path.read_bytes()).hexdigest() == provenance["sha256"]
    rule = resolve_policy("rule").build()
    departed = {}
    for module in Corpus(corpus_dir).modules:
        run = rollout(PROBLEM, module, toolchain, rule)
        assert run.result.ok, run.result.status
        departed[module.language] = departed.get(module.language, False) or bool(
            np.any(run.trajectory.actions != run.trajectory.heuristic)
        )
    assert departed == {"C": False, "C++": True}, departed
    with pytest.raises(PolicyError, match="decides inline-size, not regalloc-evict"):
        resolve_policy("rule", "regalloc-evict")
