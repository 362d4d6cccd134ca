"""Register-allocation eviction on real clang-22: the stream's shape, masks, refused actions, size reward."""

from __future__ import annotations

import numpy as np
import pytest

import optgym
from optgym.problems import get_problem
from optgym.problems.regalloc_evict import CANDIDATES, NOTHING
from optgym.rollout import plain_compile, rollout
from optgym.rollout.rollout import DecisionPoint

#: Many values live across a loop: at -Oz on x86-64 the greedy allocator runs out of free registers and
#: asks the eviction advisor (the test corpora's small programs never do).
PRESSURE_SOURCE = r"""
extern void use(long, long, long, long, long, long, long, long);
void pressure(long *a, int n) {
  long s0 = a[0], s1 = a[1], s2 = a[2], s3 = a[3], s4 = a[4], s5 = a[5], s6 = a[6], s7 = a[7];
  long s8 = a[8], s9 = a[9], s10 = a[10], s11 = a[11], s12 = a[12], s13 = a[13], s14 = a[14], s15 = a[15];
  for (int i = 0; i < n; i++) {
    s0 += a[i] * s15; s1 ^= s0 + s14; s2 += s1 * s13; s3 ^= s2 + s12; s4 += s3 * s11; s5 ^= s4 + s10;
    s6 += s5 * s9; s7 ^= s6 + s8; s8 += s7 * i; s9 ^= s8 + s0; s10 += s9 * s1; s11 ^= s10 + s2;
    s12 += s11 * s3; s13 ^= s12 + s4; s14 += s13 * s5; s15 ^= s14 + s6;
    if (s0 & 1) use(s0, s1, s2, s3, s4, s5, s6, s7);
  }
  use(s8, s9, s10, s11, s12, s13, s14, s15);
  use(s0, s1, s2, s3, s4, s5, s6, s7);
}
"""


@pytest.fixture(scope="module")
def pressure_corpus(toolchain, tmp_path_factory):
    from conftest import _corpus

    return _corpus(toolchain, tmp_path_factory.mktemp("pressure"), {"pressure": (".c", PRESSURE_SOURCE)})


def lowest_weight(point: DecisionPoint) -> int:
    """The default advisor's rule, roughly: evict the candidate whose heaviest interfering live range is
    lightest, if lighter than the register being allocated; otherwise evict nothing."""
    f = point.features()
    weight = f["use_def_density"].ravel()
    allowed = f["mask"].ravel() != 0
    costs = np.where(allowed[:NOTHING], weight[:NOTHING], np.inf)
    best = int(np.argmin(costs))
    return NOTHING if allowed[NOTHING] and not costs[best] < weight[NOTHING] else best


def test_stream_has_the_expected_features_and_masks(pressure_corpus, toolchain, no_leftovers):
    problem = get_problem("regalloc-evict")
    masks = []

    def record(point: DecisionPoint) -> int:
        masks.append(point.features()["mask"].ravel().copy())
        return lowest_weight(point)

    out = rollout(problem, pressure_corpus["pressure"], toolchain, record)
    assert out.result.ok and out.result.decisions == len(masks) > 0
    assert all(m.shape == (CANDIDATES,) for m in masks)
    assert all(m.any() for m in masks)  # every decision has a legal answer
    assert any(m[:NOTHING].any() for m in masks)  # some offer a register to evict
    assert (out.trajectory.heuristic == -1).all()  # the stream carries no default answer
    plain = plain_compile(problem, pressure_corpus["pressure"], toolchain)
    assert plain.metrics["text_bytes"] > 0 and out.result.metrics["text_bytes"] > 0


def test_a_masked_action_is_refused_not_sent(pressure_corpus, toolchain, no_leftovers):
    """clang crashes (SIGSEGV) on an index whose mask is 0; the episode stops the compile instead."""
    problem = get_problem("regalloc-evict")

    def masked(point: DecisionPoint) -> int:
        mask = point.features()["mask"].ravel()
        return int(np.flatnonzero(mask == 0)[0])

    out = rollout(problem, pressure_corpus["pressure"], toolchain, masked)
    assert out.result.status == "invalid_action"
    assert "not valid at this decision" in out.result.detail and str(NOTHING) in out.result.detail
    assert out.result.decisions == 0  # refused before anything was sent


def test_env_observations_masks_and_size_reward(pressure_corpus, no_leftovers):
    env = optgym.make("regalloc-evict", corpus=pressure_corpus.root, report_timing=False)
    assert env.action_space.n == CANDIDATES and env.observation_space["mask"].shape == (1, CANDIDATES)
    obs, info = env.reset(options={"module": "pressure"})
    assert "heuristic_action" not in info
    assert info["action_mask"].dtype == bool and info["action_mask"].any()
    steps = 0
    while True:  # the last legal candidate at every decision
        assert env.observation_space.contains(obs)  # gymnasium's check_env would step unmasked random actions
        obs, reward, terminated, truncated, info = env.step(int(np.flatnonzero(info["action_mask"])[-1]))
        steps += 1
        if terminated or truncated:
            break
    assert steps == info["decisions"] and info["status"] in ("ok", "compile_error")  # clang may run out of registers
    if terminated:
        expected = 1 - (info["policy_text_bytes"] + 0.01) / (info["heuristic_text_bytes"] + 0.01)
        assert reward == pytest.approx(expected) and info["heuristic_text_bytes"] > 0
    env.close()


def test_env_step_with_a_masked_action_truncates_the_episode(pressure_corpus, no_leftovers):
    env = optgym.make("regalloc-evict", corpus=pressure_corpus.root)
    _, info = env.reset(options={"module": "pressure"})
    invalid = int(np.flatnonzero(~info["action_mask"])[0])
    _, reward, terminated, truncated, info = env.step(invalid)
    assert truncated and not terminated and reward == 0.0 and info["status"] == "invalid_action"
    env.close()
