"""optgym train threshold: clang's heuristic with its cost threshold moved, as an ordinary policy."""

from __future__ import annotations

import json

import numpy as np
import pytest

from optgym.corpus import Corpus
from optgym.policies import resolve_policy
from optgym.problems import get_problem
from optgym.rollout import rollout
from optgym.train.threshold import ThresholdConfig, threshold_policy, train_threshold

PROBLEM = get_problem("inline-size")
NAMES = [s.name for s in PROBLEM.expected_features() if s.name not in PROBLEM.hidden_features]


@pytest.mark.parametrize(("up", "down"), [(None, None), (5, None), (None, 5), (0, 2)])
def test_the_policy_moves_clangs_threshold_exactly(up, down, corpus_dir, toolchain):
    """Every decision of a real compile is clang's, moved exactly as asked (d = threshold − cost)."""
    policy = threshold_policy(NAMES, up=up, down=down)
    checked = 0
    for module in Corpus(corpus_dir):
        run = rollout(PROBLEM, module, toolchain, policy, record_features=True)
        assert run.result.ok
        if run.trajectory.features is None or not len(run.trajectory.actions):
            continue
        f = run.trajectory.features
        d = f[:, NAMES.index("threshold")] - f[:, NAMES.index("cost_estimate")]
        h = run.trajectory.heuristic
        expected = np.where(h == 1, d > (-np.inf if down is None else down),
                            d >= (np.inf if up is None else -up))  # fmt: skip
        assert np.array_equal(run.trajectory.actions, expected.astype(np.int64))
        checked += len(d)
    assert checked > 100


def test_train_threshold_picks_a_candidate_and_writes_a_servable_policy(corpus_dir, tmp_path):
    run = tmp_path / "run"
    train_threshold(ThresholdConfig(str(corpus_dir), str(run), split=None, up=[None, 5], workers=1),
                    say=lambda s: None)  # fmt: skip
    table = json.loads((run / "candidates.json").read_text())
    assert [c["name"] for c in table["candidates"]] == ["upnone-downnone", "up5-downnone"]
    none = table["candidates"][0]
    assert none["total_ratio"] == 1.0 and none["regressed"] == 0 and none["improved"] == 0
    best = min(table["candidates"], key=lambda c: c["total_ratio"])
    assert table["chosen"] == best["name"]
    metrics = json.loads((run / "final" / "metrics.json").read_text())
    assert metrics["chosen"] == best["name"] and metrics["all"]["size_ratio"] == pytest.approx(best["total_ratio"])
    assert resolve_policy(str(run)).identity.startswith("mlp:")
