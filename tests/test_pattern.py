"""``optgym train pattern``: compass search of the inline allowance, its replayed candidates checked against real
compiles by clang-22."""

from __future__ import annotations

import csv
import itertools
import shutil

import numpy as np
import pytest
from conftest import CXX_SOURCE, _corpus

from optgym.corpus import Corpus
from optgym.corpus.portable import portable_modules
from optgym.evaluate.benchmark import recorded_compiles
from optgym.parallel.portable import portable_path
from optgym.policies.allowance import allowance_policy, trainable
from optgym.policies.mlp import MLPPolicy
from optgym.train.evaluation import evaluate
from optgym.train.pattern import (
    Measured,
    PatternConfig,
    PatternTask,
    Recorded,
    Trajectories,
    compile_recorded,
    config_from_run,
    improves,
    inline_logit,
    ranking,
    repair_move,
    replays,
    sample_halves,
    sweep_order,
    train_pattern,
    training_sample,
)
from optgym.train.run import RunError, read_state

GATES = ["at_most:callee_users:2", "at_least:node_count:8", "at_most:callee_basic_block_count:4"]


def _config(corpus_dir, output, **kw) -> PatternConfig:
    """A search of the whole test corpus (no split, both languages), in this process (one worker)."""
    options = {"gates": GATES, "workers": 1, "final_eval": False}
    return PatternConfig(str(corpus_dir), str(output), **{**options, **kw})


def _with_bias(policy: MLPPolicy, bias: float) -> np.ndarray:
    theta = policy.parameters()
    theta[np.flatnonzero(trainable(policy))[-1]] = bias
    return theta


def test_a_replayed_candidate_compiles_to_the_size_the_replay_gives(corpus_dir, tmp_path):
    """The cache's premise on real compiles: a candidate that takes every recorded decision as recorded compiles to
    the recorded bytes and decisions; one that takes any differently really decides differently."""
    policy = allowance_policy(GATES)
    template = portable_path(str(policy.save(tmp_path / "template")), 1)
    (zoo,) = [m for m in Corpus(corpus_dir) if m.language == "C++"]
    (source,) = portable_modules([zoo], 1)

    def compiled(bias: float) -> Recorded:
        out = compile_recorded(PatternTask("inline-size", source, zoo.name, template, _with_bias(policy, bias), 120.0))
        return Recorded(out["inputs"], out["actions"], out["text_bytes"], out["heuristic_text_bytes"])

    recorded = compiled(0.25)
    assert len(recorded.actions) and recorded.inputs.shape == (len(recorded.actions), len(policy.extras))
    table = Trajectories()
    records, held = [recorded], [table.add(recorded)]
    same = differs = 0
    for bias in (0.25 + 1 / 64, 0.5, 1.0, -0.5, 2.0):
        weights, b = inline_logit(policy.with_parameters(_with_bias(policy, bias)))
        again = compiled(bias)
        if replays(recorded, weights, b):
            same += 1
            assert again.text_bytes == recorded.text_bytes and np.array_equal(again.actions, recorded.actions)
        else:
            differs += 1
            assert not np.array_equal(again.actions, recorded.actions), bias
        records.append(again)
        held.append(table.add(again))
    assert same and differs, "both kinds of candidate must occur, or the check tests one side only"

    # held in one table, each distinct row once, the trajectories replay exactly where their whole rows do
    assert len(table.rows) == len({row.tobytes() for r in records for row in r.inputs})
    assert len(table.rows) < sum(len(r.actions) for r in records), "no row repeats: nothing to share"
    for bias in (0.25, 0.25 + 1 / 64, 0.5, 1.0, -0.5, 2.0, -4.5):
        weights, b = inline_logit(policy.with_parameters(_with_bias(policy, bias)))
        for record, trajectory in zip(records, held, strict=True):
            assert (table.first_replayed([trajectory], weights, b) is trajectory) == replays(record, weights, b)


def test_a_search_keeps_only_smaller_moves_and_its_figure_is_a_real_compiles(corpus_dir, tmp_path):
    """Two sweeps on real compiles: every kept move lowers the total, no kept move passes the cap, replay saves
    compiles, and the final policy compiled by ``optgym evaluate`` gives exactly the total the search reported."""
    run = tmp_path / "pattern"
    results = train_pattern(_config(corpus_dir, run, sweeps=2, step=0.5, min_step=0.125), say=lambda s: None)
    rows = list(csv.DictReader((run / "progress.csv").open()))
    modules = len(Corpus(corpus_dir))
    assert len(rows) >= 2 * len(GATES) + 2
    kept = [float(r["total_ratio"]) for r in rows if r["kept"] == "1"]
    assert all(a > b for a, b in itertools.pairwise(kept))
    assert all(int(r["worse"]) == 0 for r in rows if r["kept"] == "1")  # 2 % of 3 modules: none may be worse
    assert int(rows[-1]["compiles"]) < (len(rows) + 1) * modules, "replay saved no compile"
    assert results["replay_mismatches"] == 0
    assert recorded_compiles(run) == int(rows[-1]["compiles"])  # what the benchmark counts against its budget

    final = MLPPolicy.load(run / "final" / "policy")
    searched = final.parameters()[np.flatnonzero(trainable(final))]
    assert np.array_equal(searched * 64, np.round(searched * 64)), "a weight float32 may not hold exactly"
    report = evaluate(str(run / "final" / "policy"), corpus_dir, workers=1, progress=False)
    ours, clangs = sum(r.texts[1] for r in report), sum(r.texts[0] for r in report)
    assert ours / clangs == pytest.approx(results["sample_ratio"], abs=0)


def test_with_halves_the_searched_policy_leaves_neither_half_larger_on_real_compiles(corpus_dir, tmp_path):
    """``--halves`` end to end on real compiles: the run records it (a resume keeps it), and from clang's decisions
    (every weight 0) the final policy, compiled afresh by ``optgym evaluate``, is no larger than clang on either
    half. This corpus offers no move that would grow a half: the refusal is tested on its own
    (test_with_halves_a_move_that_grows_either_half_is_not_kept)."""
    run = tmp_path / "pattern"
    results = train_pattern(_config(corpus_dir, run, sweeps=2, step=0.5, min_step=0.125, halves=True),
                            say=lambda s: None)  # fmt: skip
    assert config_from_run(run).halves is True
    report = evaluate(str(run / "final" / "policy"), corpus_dir, workers=1, progress=False)
    half = sample_halves([m.name for m in Corpus(corpus_dir)], seed=0)
    assert set(half.values()) == {0, 1}, "a corpus in one half tests nothing"
    for side in (0, 1):
        rows = [r for r in report if half[r.module] == side]
        assert sum(r.texts[1] for r in rows) <= sum(r.texts[0] for r in rows), side
    ours, clangs = sum(r.texts[1] for r in report), sum(r.texts[0] for r in report)
    assert ours / clangs == pytest.approx(results["sample_ratio"], abs=0)


def test_a_ranked_search_takes_its_best_probe_first_and_its_seed_does_not_steer_it(corpus_dir, tmp_path):
    """``--order ranked`` on real compiles: each sweep probes every live coordinate from one point, then takes the
    move :func:`ranking` puts first without compiling it again, and every later move only if it still improves;
    the kept totals fall. Two seeds on the same modules (the whole corpus: no sample to draw) end at the same
    weights, which a seeded order does not promise."""
    finals = []
    for seed in (1, 2):
        run = tmp_path / f"ranked-{seed}"
        results = train_pattern(_config(corpus_dir, run, sweeps=2, step=0.5, min_step=0.125, order="ranked",
                                        seed=seed), say=lambda s: None)  # fmt: skip
        rows = list(csv.DictReader((run / "progress.csv").open()))
        assert {r["phase"] for r in rows} <= {"probe", "apply"} and rows[0]["phase"] == "probe"
        kept = [r for r in rows if r["kept"] == "1"]
        assert kept, "nothing was learned: the test checks no move"
        assert all(float(a["total_ratio"]) > float(b["total_ratio"]) for a, b in itertools.pairwise(kept))
        for sweep in {r["sweep"] for r in kept}:
            probes = [r for r in rows if r["sweep"] == sweep and r["phase"] == "probe" and r["better"] == "1"]
            first = next(r for r in rows if r["sweep"] == sweep and r["phase"] == "apply")
            best = min(probes, key=lambda r: (int(r["worse"]), float(r["total_ratio"])))
            assert (first["coordinate"], first["value"], first["kept"]) == (best["coordinate"], best["value"], "1")
            last_probe = [r for r in rows if r["sweep"] == sweep and r["phase"] == "probe"][-1]
            assert first["compiles"] == last_probe["compiles"], "the best probe is taken without another compile"
        assert results["replay_mismatches"] == 0
        final = MLPPolicy.load(run / "final" / "policy")
        finals.append(final.parameters()[np.flatnonzero(trainable(final))])
    assert np.array_equal(finals[0], finals[1])


def test_a_ranked_sweep_spends_the_cap_on_regressions_last():
    current = Measured(text_bytes=1000, heuristic_text_bytes=1100, worse=1, compiles=0, failed=0)
    free, costly, fewer = Measured(990, 1100, 1, 0, 0), Measured(900, 1100, 2, 0, 0), Measured(995, 1100, 0, 0, 0)
    assert sorted([costly, free, fewer], key=lambda m: ranking(m, current)) == [fewer, free, costly]
    assert ranking(Measured(980, 1100, 1, 0, 0), current) < ranking(free, current), "then the fewest bytes"


def test_the_trajectory_store_changes_what_a_search_compiles_never_what_it_finds(corpus_dir, tmp_path, monkeypatch):
    """A second run of the same recipe replays the first's trajectories from the store: it compiles nothing, yet
    every row of its progress (candidates, totals, the compile count its budget is held to) is the first's, and
    both are a run's without the store."""
    monkeypatch.setenv("OPTGYM_CACHE_DIR", str(tmp_path / "cache"))
    options = {"sweeps": 2, "step": 0.5, "min_step": 0.125, "order": "ranked"}
    results = {}
    for name, store in (("first", True), ("second", True), ("without", False)):
        results[name] = train_pattern(_config(corpus_dir, tmp_path / name, store=store, **options), say=lambda s: None)

    def rows(name: str) -> list[dict[str, str]]:
        return [{k: v for k, v in r.items() if k != "from_store"}
                for r in csv.DictReader((tmp_path / name / "progress.csv").open())]  # fmt: skip

    assert rows("first") == rows("second") == rows("without") and len(rows("first")) > 2
    assert results["first"]["from_store"] == 0 and results["without"]["from_store"] == 0
    assert results["second"]["from_store"] == results["second"]["compiles"] > 0, "the second run compiled"
    assert any((tmp_path / "cache" / "trajectories").rglob("*.npz"))


@pytest.mark.parametrize("new_machine", [False, True])
def test_a_resumed_search_continues_from_its_last_sweep(corpus_dir, tmp_path, new_machine):
    """Resumed where it ran, or on a new machine from what ``maintainer.keep_steps --run`` kept of it (no
    TensorBoard log) copied back to its path."""
    run = tmp_path / "pattern"
    train_pattern(_config(corpus_dir, run, sweeps=1), say=lambda s: None)
    if new_machine:
        from maintainer.keep_steps import keep_run

        assert keep_run(run, tmp_path / "kept") > 0
        assert not list((tmp_path / "kept").rglob("events.out.tfevents*"))
        shutil.rmtree(run)
        shutil.copytree(tmp_path / "kept", run)
    first = read_state(run / "snapshots" / f"{1:08d}")
    cfg = config_from_run(run)
    cfg.sweeps = 2
    said: list[str] = []
    train_pattern(cfg, resume=True, say=said.append)
    assert any("after sweep 1" in line for line in said)
    second = read_state(run / "snapshots" / f"{2:08d}")
    assert second["compiles"] > first["compiles"]
    sweeps = {r["sweep"] for r in csv.DictReader((run / "progress.csv").open())}
    assert sweeps == {"1", "2"}


def test_restarts_keep_the_search_with_the_fewest_bytes_on_the_pool_and_resume_past_finished_ones(corpus_dir, tmp_path):
    """``restarts=2``: two searches, each on its own sample (the first drawn as a lone search of the seed draws
    it), and the allowance kept is the one with the fewest bytes on the pool both were drawn from, a figure real
    compiles by ``optgym evaluate`` give exactly. Resumed, a finished search is not run again."""
    run = tmp_path / "restarts"
    train_pattern(_config(corpus_dir, run, sample=2, sweeps=1, step=0.5, restarts=2, seed=1), say=lambda s: None)
    first = training_sample(config_from_run(run / "restarts" / "0"))
    lone = training_sample(_config(corpus_dir, tmp_path / "lone", sample=2, seed=1))
    assert [m.name for m in first] == [m.name for m in lone]
    assert config_from_run(run / "restarts" / "1").restart == 1  # its own draw (3 modules leave no other to draw)

    rows = list(csv.DictReader((run / "restarts.csv").open()))
    assert [int(r["modules"]) for r in rows] == [len(Corpus(corpus_dir))] * 2
    (kept,) = [r for r in rows if r["kept"] == "1"]
    assert min(rows, key=lambda r: (int(r["past_cap"]), int(r["text_bytes"]))) is kept
    final = MLPPolicy.load(run / "final" / "policy")
    searched = MLPPolicy.load(run / "restarts" / kept["restart"] / "final" / "policy")
    assert np.array_equal(final.parameters(), searched.parameters())
    report = evaluate(str(run / "final" / "policy"), corpus_dir, workers=1, progress=False)
    assert sum(r.texts[1] for r in report) == int(kept["text_bytes"])

    said: list[str] = []
    train_pattern(config_from_run(run), resume=True, say=said.append)
    assert not any(" of 2" in line for line in said), "a finished search ran again"
    assert any("on the pool" in line for line in said)


def test_the_evaluate_sample_is_left_out_of_training(corpus_dir, tmp_path):
    """``--hold-out-every K`` trains on none of the modules ``optgym evaluate --every K`` checks."""
    from optgym.cli import sample_modules

    trained = {m.name for m in training_sample(_config(corpus_dir, tmp_path / "p", hold_out_every=2))}
    checked = set(sample_modules(Corpus(corpus_dir), None, 2) or [])
    assert trained and checked and not trained & checked
    assert trained | checked == {m.name for m in Corpus(corpus_dir)}


@pytest.mark.parametrize(("option", "message"), [({"step": 0.3}, "power of two"), ({"max_worse": 1.0}, "share"),
                                                  ({"hold_out_every": 1}, "2 or more"),
                                                  ({"order": "random"}, "one of seeded, ranked"),
                                                  ({"restarts": 0}, "at least one search"),
                                                  ({"repair": True}, "needs --order ranked")])  # fmt: skip
def test_a_bad_recipe_is_refused_before_the_run_directory_exists(corpus_dir, tmp_path, option, message):
    with pytest.raises(RunError, match=message):
        train_pattern(_config(corpus_dir, tmp_path / "p", **option), say=lambda s: None)
    assert not (tmp_path / "p").exists()


def test_a_move_is_kept_only_for_fewer_bytes_within_the_cap():
    current = Measured(text_bytes=1000, heuristic_text_bytes=1100, worse=2, compiles=0, failed=0)
    assert improves(Measured(999, 1100, 2, 0, 0), current, cap=2)
    assert not improves(Measured(900, 1100, 3, 0, 0), current, cap=2), "bytes must not buy a regression past the cap"
    assert not improves(Measured(1000, 1100, 2, 0, 0), current, cap=2), "a tie is no improvement"


def test_a_start_past_the_cap_keeps_its_own_count_as_the_cap():
    """A warm start with more regressions than the cap allows: its count is the bound, lowered by every move that
    cuts it. Bytes never buy a regression, and fewer regressions never buy bytes."""
    past = Measured(text_bytes=1000, heuristic_text_bytes=1100, worse=5, compiles=0, failed=0)
    assert improves(Measured(990, 1100, 5, 0, 0), past, cap=2)
    assert improves(Measured(990, 1100, 3, 0, 0), past, cap=2)
    assert improves(Measured(1000, 1100, 4, 0, 0), past, cap=2), "at equal bytes, fewer regressions is progress"
    assert not improves(Measured(1050, 1100, 4, 0, 0), past, cap=2), "fewer regressions must not cost bytes"
    assert not improves(Measured(500, 1100, 6, 0, 0), past, cap=2)


def test_a_repair_buys_back_regressions_at_the_fewest_bytes_each():
    current = Measured(text_bytes=1000, heuristic_text_bytes=1100, worse=5, compiles=0, failed=0)
    probes = [Measured(1005, 1100, 6, 0, 0), Measured(1030, 1100, 4, 0, 0), Measured(1040, 1100, 1, 0, 0),
              Measured(1100, 1100, 0, 0, 0)]  # fmt: skip
    assert repair_move(probes, current) == 2, "40 bytes for 4 modules is cheaper than 30 for 1 or 100 for 5"
    assert repair_move(probes[:2], current) == 1
    assert repair_move([Measured(990, 1100, 5, 0, 0), probes[0]], current) is None, "no probe leaves fewer worse"
    assert repair_move([Measured(1020, 1100, 4, 0, 0), Measured(1040, 1100, 3, 0, 0)], current) == 0, "ties: first"


#: A module that inlining past clang's choice only makes larger: ``mix``'s body copied into eight callers.
GROWS = r"""
int sink(int);
static int mix(int x) { return sink(x * 5) * 3; }
int g0(int x) { return mix(x) + 1; }
int g1(int x) { return mix(x) + 2; }
int g2(int x) { return mix(x) + 3; }
int g3(int x) { return mix(x) + 4; }
int g4(int x) { return mix(x) + 5; }
int g5(int x) { return mix(x) + 6; }
int g6(int x) { return mix(x) + 7; }
int g7(int x) { return mix(x) + 8; }
"""


def test_a_start_past_the_cap_is_repaired_where_no_move_improves_on_real_compiles(toolchain, tmp_path):
    """The case that held d35 at its start, on two real modules: an allowance of 0.375 (the bias) shrinks ``zoo``
    by 14 % and leaves ``grows`` more than 1 % larger. Any step that saves bytes keeps ``grows`` worse, and the step
    that brings it back costs ``zoo``'s savings, so without ``repair`` the search ends where it began, past a cap
    of 0; with it, the first sweep takes that step, bytes spent for the regression, and the run ends under the cap."""
    corpus = _corpus(toolchain, tmp_path / "two", {"zoo": (".cpp", CXX_SOURCE), "grows": (".c", GROWS)})
    gates = ["at_most:callee_users:1"]
    start = allowance_policy(gates)
    theta = start.parameters()
    theta[np.flatnonzero(trainable(start))[-1]] = 0.375
    start.with_parameters(theta).save(tmp_path / "start")
    ends = {}
    for repair in (False, True):
        run = tmp_path / f"repair-{repair}"
        cfg = PatternConfig(str(corpus.root), str(run), gates=gates, workers=1, final_eval=False,
                            warmstart=str(tmp_path / "start"), max_worse=0.0, order="ranked", repair=repair,
                            sweeps=3, step=0.25, min_step=0.125)  # fmt: skip
        ends[repair] = train_pattern(cfg, say=lambda s: None)
        rows = list(csv.DictReader((run / "progress.csv").open()))
        repairs = [r for r in rows if r["phase"] == "repair"]
        if not repair:
            assert not repairs
            continue
        (taken,) = repairs
        probes = [r for r in rows if r["sweep"] == taken["sweep"] and r["phase"] == "probe"]
        assert not any(r["better"] == "1" for r in probes), "a repair only where no probe improves"
        fewer = [r for r in probes if int(r["worse"]) < ends[False]["sample_worse"]]
        assert (taken["coordinate"], taken["value"]) == (fewer[0]["coordinate"], fewer[0]["value"])
    assert ends[False]["sample_worse"] == 1, "the case is gone: the test checks no repair"
    assert ends[True]["sample_worse"] == 0
    assert ends[True]["sample_ratio"] > ends[False]["sample_ratio"], "bytes were spent for the regression"


def test_with_halves_a_move_that_grows_either_half_is_not_kept():
    current = Measured(1000, 1100, 0, 0, 0, halves=(600, 400))
    assert improves(Measured(990, 1100, 0, 0, 0, halves=(590, 400)), current, cap=0, halves=True)
    assert improves(Measured(950, 1100, 0, 0, 0, halves=(540, 410)), current, cap=0), "without halves: the total"
    assert not improves(Measured(950, 1100, 0, 0, 0, halves=(540, 410)), current, cap=0, halves=True)
    assert not improves(Measured(1000, 1100, 0, 0, 0, halves=(600, 400)), current, cap=0, halves=True)


def test_the_sample_is_halved_by_whole_packages_in_a_seeded_balanced_order():
    names = [f"p{k}/m{j}.o" for k in range(9) for j in range(k + 1)]
    halves = sample_halves(names, seed=3)
    assert set(halves) == set(names) and set(halves.values()) == {0, 1}
    for k in range(9):
        assert len({halves[f"p{k}/m{j}.o"] for j in range(k + 1)}) == 1, "a package is never split"
    sizes = [sum(1 for h in halves.values() if h == side) for side in (0, 1)]
    assert abs(sizes[0] - sizes[1]) <= 9, sizes
    assert sample_halves(names, seed=3) == halves
    assert any(sample_halves(names, seed=s) != halves for s in range(4, 10))


def test_a_warm_starts_untried_coordinates_come_first_in_its_first_sweep():
    plain = sweep_order(seed=3, sweep=1, count=6)
    assert sorted(plain) == list(range(6)) and plain == sweep_order(seed=3, sweep=1, count=6)
    ordered = sweep_order(seed=3, sweep=1, count=6, first=[4, 1])
    assert set(ordered[:2]) == {4, 1} and ordered[2:] == [k for k in plain if k not in (1, 4)]
    assert ordered[:2] == [k for k in plain if k in (1, 4)]


def test_a_warm_start_is_where_the_search_begins_and_another_layout_is_refused(corpus_dir, tmp_path):
    """The start's weights, snapped to a grid of 2⁻¹² (float32 then holds every step's result), are snapshot 0; a
    start with other gates is refused before the run directory exists."""
    start = allowance_policy(GATES)
    theta = start.parameters()
    coordinates = np.flatnonzero(trainable(start))
    theta[coordinates] = [0.3, -0.1, 0.2, 0.05]  # not on the grid
    start.with_parameters(theta).save(tmp_path / "imitated")
    run = tmp_path / "pattern"
    train_pattern(_config(corpus_dir, run, sweeps=1, warmstart=str(tmp_path / "imitated")), say=lambda s: None)
    first = np.asarray(read_state(run / "snapshots" / f"{0:08d}")["params"])
    stored = MLPPolicy.load(tmp_path / "imitated").parameters()[coordinates]
    assert np.array_equal(first, np.round(stored * 4096) / 4096) and np.abs(first - stored).max() <= 2**-13
    assert not np.array_equal(first, np.zeros(len(coordinates)))

    allowance_policy(GATES[1:]).save(tmp_path / "other")  # GATES[:2] would be grown to GATES: see test_allowance
    with pytest.raises(RunError, match="are not the first of"):
        train_pattern(_config(corpus_dir, tmp_path / "p2", warmstart=str(tmp_path / "other")), say=lambda s: None)
    assert not (tmp_path / "p2").exists()
