"""optgym train search and train imitate on the tests' C++ module (zoo: ~800 decisions, STL and streams).

Budgets are tiny: the greedy pass of single flips finds its first improvement on zoo at decision 20,
so 25 compiles are enough to beat the heuristic; the file takes about half a minute on 2 cores.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from optgym.cli import app
from optgym.corpus import Corpus
from optgym.corpus.split import draw_modules
from optgym.policies import resolve_policy
from optgym.policies.allowance import DEFAULT_GATES, LEADING, allowance_policy, describe, is_allowance
from optgym.policies.trained import snapshot_dirs
from optgym.problems import get_problem
from optgym.rollout import rollout
from optgym.toolchain.process import runtime_root, sweep_stale
from optgym.train.imitate import ImitateConfig, demonstrations, logistic_regression, train_imitate
from optgym.train.search import (
    SAMPLE_STREAM,
    Candidate,
    SearchConfig,
    module_records,
    read_search,
    read_states,
    record_stem,
    search,
)

BUDGET = 25


@pytest.fixture(scope="module")
def search_dir(corpus_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("search") / "s"
    search(SearchConfig(str(corpus_dir), str(out), budget=BUDGET, workers=1, min_decisions=100), progress=False)
    return out


def _record(search_dir, module: str) -> dict:
    return next(r for r in module_records(search_dir) if r["module"] == module)


def test_search_beats_the_heuristic_on_a_cxx_module(search_dir):
    rec = _record(search_dir, "zoo")
    assert rec["status"] == "budget" and rec["compiles"] == BUDGET
    assert rec["best"]["text_bytes"] < rec["heuristic"]["text_bytes"], "a strictly smaller object"
    assert rec["start_sizes"] == rec["heuristic"], "replaying the heuristic is plain -Oz"
    assert rec["verify_compiles"] == len(rec["history"]) >= 1, "every improvement was compiled again"
    meta = read_search(search_dir)
    assert meta["summary"]["improved"] == 1 and meta["summary"]["ratio"] < 1.0
    # modules below --min-decisions are recorded as skipped (tree: a few dozen decisions; leaf: none)
    assert {r["module"]: r["status"] for r in module_records(search_dir)} == {
        "zoo": "budget", "tree": "skipped", "leaf": "skipped"
    }  # fmt: skip
    tree = read_states(search_dir, "tree")  # a skipped module keeps its (unsearched) heuristic trajectory
    assert tree is not None and not tree.column("examined").to_numpy(zero_copy_only=False).any()
    assert (tree.column("action").to_numpy() == tree.column("heuristic").to_numpy()).all()
    assert read_states(search_dir, "leaf") is None, "no decisions, no states"


def test_stored_best_reproduces_byte_exactly(search_dir, corpus_dir, toolchain, tmp_path):
    rec = _record(search_dir, "zoo")
    states = read_states(search_dir, "zoo")
    actions = states.column("action").to_numpy()
    assert len(actions) == rec["best"]["decisions"]
    obj = tmp_path / "best.o"
    run = rollout(get_problem("inline-size"), Corpus(corpus_dir)["zoo"], toolchain,
                  Candidate(actions, len(actions), lambda p: p.heuristic), keep_object=obj)  # fmt: skip
    sizes = {key: run.result.metrics[key] for key in ("text_bytes", "dottext_bytes")}  # what the record stores
    assert sizes == {"text_bytes": rec["best"]["text_bytes"], "dottext_bytes": rec["best"]["dottext_bytes"]}
    assert hashlib.sha256(obj.read_bytes()).hexdigest() == rec["best"]["digest"]
    assert np.array_equal(run.trajectory.actions, actions)
    # the stored states are those of that compile: the heuristic's answers and raw features line up
    assert np.array_equal(run.trajectory.heuristic, states.column("heuristic").to_numpy())
    assert states.column("callee_basic_block_count").to_numpy().dtype == np.int64
    assert (states.column("action").to_numpy() != states.column("heuristic").to_numpy()).sum() == rec["best"][
        "deviations"
    ]


def test_rerun_skips_finished_modules_and_extends_a_larger_budget(search_dir, corpus_dir):
    before = _record(search_dir, "zoo")
    states = record_stem(search_dir, "zoo").with_suffix(".parquet")
    stamp = states.stat().st_mtime_ns
    search(SearchConfig(str(corpus_dir), str(search_dir), budget=BUDGET, workers=1, min_decisions=100), progress=False)
    assert _record(search_dir, "zoo") == before, "nothing compiled again"
    assert states.stat().st_mtime_ns == stamp

    search(SearchConfig(str(corpus_dir), str(search_dir), budget=BUDGET + 4, workers=1, min_decisions=100,
                        modules="zoo"), progress=False)  # fmt: skip
    after = _record(search_dir, "zoo")
    assert after["compiles"] == BUDGET + 4 and after["budget"] == BUDGET + 4
    assert after["history"][: len(before["history"])] == before["history"], "continued, not restarted"
    assert after["cursor"]["position"] == before["cursor"]["position"] + 4
    assert after["best"]["text_bytes"] <= before["best"]["text_bytes"]


def test_a_missing_states_file_is_compiled_again_and_must_reproduce(search_dir, corpus_dir):
    states = record_stem(search_dir, "zoo").with_suffix(".parquet")
    before = _record(search_dir, "zoo")
    states.unlink()  # as if killed between the states file and the record
    search(SearchConfig(str(corpus_dir), str(search_dir), budget=before["budget"] + 1, workers=1, modules="zoo"),
           progress=False)  # fmt: skip
    after = _record(search_dir, "zoo")
    assert states.exists() and after["status"] == "budget"
    assert after["verify_compiles"] >= before["verify_compiles"] + 1
    assert read_states(search_dir, "zoo").schema.metadata[b"digest"].decode() == after["best"]["digest"]


def test_another_start_policy_needs_another_directory(search_dir, corpus_dir):
    from optgym.train.search import SearchError

    with pytest.raises(SearchError, match="holds a search"):
        search(SearchConfig(str(corpus_dir), str(search_dir), budget=1, start="never"), progress=False)


def test_imitate_clones_the_search_then_dagger(search_dir, tmp_path, corpus_dir, toolchain):
    demos = demonstrations(search_dir, examined_only=False)
    assert [d.module for d in demos] == ["zoo"]
    assert [d.module for d in demonstrations(search_dir, examined_only=False, skipped=True)] == ["tree", "zoo"]
    assert (demos[0].actions != demos[0].heuristic).any(), "the labels are the search's, not clang's"

    run = tmp_path / "imitate"
    cfg = ImitateConfig(search=[str(search_dir)], output=str(run), dagger_rounds=1, dagger_budget=4, epochs=5,
                        workers=1, final_eval=False)  # fmt: skip
    train_imitate(cfg, say=lambda *_: None)
    assert [p.name for p in snapshot_dirs(run)] == ["00000000", "00000001"]
    rows = (run / "progress.csv").read_text().splitlines()
    assert len(rows) == 3 and "dagger/start_vs_heuristic" in rows[0]
    dagger = json.loads((run / "dagger" / "round-01" / "search-0" / "search.json").read_text())
    assert dagger["start"].endswith("policy") and dagger["summary"]["searched"] == 1
    assert list(run.glob("events.out.tfevents.*")), "TensorBoard events"

    factory = resolve_policy(str(run))
    run_result = rollout(get_problem("inline-size"), Corpus(corpus_dir)["zoo"], toolchain, factory.build())
    assert run_result.result.ok and run_result.result.decisions > 0

    # --resume with the same number of rounds trains nothing new
    train_imitate(ImitateConfig(**{**cfg.__dict__, "search": [str(search_dir)]}), resume=True, say=lambda *_: None)
    assert len(snapshot_dirs(run)) == 2


def test_logistic_regression_finds_the_boundary_the_labels_were_drawn_from():
    rng = np.random.default_rng(0)
    x = np.column_stack([rng.normal(size=4000), np.ones(4000), rng.integers(0, 2, 4000)])
    truth = np.array([3.0, -1.0, 2.0])
    y = (rng.random(4000) < 1 / (1 + np.exp(-(x @ truth)))).astype(float)
    beta = logistic_regression(x, y, np.zeros(3))
    assert np.allclose(beta, truth, atol=0.3), beta
    # the ridge pulls only the penalized coefficient towards zero
    ridged = logistic_regression(x, y, np.array([0.0, 0.0, 1e4]))
    assert abs(ridged[2]) < 0.1 < abs(beta[2])


@pytest.fixture(scope="module")
def near_threshold_search(corpus_dir, tmp_path_factory):
    """Single flips of zoo's decisions nearest clang's threshold (8 of them refused by clang, most better
    inlined): the data an allowance learns from."""
    out = tmp_path_factory.mktemp("near") / "s"
    search(SearchConfig(str(corpus_dir), str(out), budget=30, workers=1, modules="zoo", focus=0.1, evolve=False,
                        groups=False), progress=False)  # fmt: skip
    return out


def test_imitate_fits_an_allowance_whose_boundary_is_the_regressions(
    near_threshold_search, tmp_path, corpus_dir, toolchain
):
    """``--allowance``: the learned policy is the allowance family, fitted by logistic regression on the
    examined states where clang said no, and it decides exactly where that regression says yes."""
    search_dir = near_threshold_search
    run = tmp_path / "allowance"
    said: list[str] = []
    train_imitate(ImitateConfig(search=[str(search_dir)], output=str(run), workers=1, final_eval=False,
                                allowance=list(DEFAULT_GATES), l2=1.0), say=said.append)  # fmt: skip
    assert not any("nan" in line for line in said), said  # no held-out part: the fit's own agreement is said
    policy = resolve_policy(str(run)).build()
    assert is_allowance(policy) and not policy.hidden
    learned = dict(describe(policy))
    assert any(learned.values()), "the search found inlines clang refused; the allowance moved"

    # the regression on the same states, by hand: P(inline) = σ(α·m + β + γ·g)
    examined = demonstrations(search_dir, examined_only=True)
    names = policy.feature_names
    raw = np.concatenate([np.column_stack([d.features[n] for n in names]) for d in examined])
    heuristic = np.concatenate([d.heuristic for d in examined])
    labels = np.concatenate([d.actions for d in examined])
    refused = heuristic == 0
    start = allowance_policy(DEFAULT_GATES)
    derived = start.inputs(raw[refused], heuristic[refused])[:, start.normalizer.width :]
    x = np.column_stack([derived[:, 1], np.ones(refused.sum()), derived[:, len(LEADING) :]])
    beta = logistic_regression(x, labels[refused].astype(float), np.array([0.0, 0.0, *[1.0] * len(DEFAULT_GATES)]))
    assert beta[0] > 0 and refused.sum() >= 5 and 0 < labels[refused].sum() < refused.sum()
    decided = policy.logits(raw[refused], heuristic[refused]).argmax(-1)
    assert (decided == (x @ beta > 0)).all()
    # clang's own inlines are kept, and the policy compiles the module with real clang
    assert policy.logits(raw[~refused], heuristic[~refused]).argmax(-1).all()
    result = rollout(get_problem("inline-size"), Corpus(corpus_dir)["zoo"], toolchain, policy)
    assert result.result.ok and result.result.decisions > 0


def test_search_sample_searches_the_draw_of_its_seed(corpus_dir, tmp_path):
    corpus = Corpus(corpus_dir)
    sizes = {m.name: m.bitcode.stat().st_size for m in corpus}
    meta = search(SearchConfig(str(corpus_dir), str(tmp_path / "s"), budget=1, workers=1, sample=2, seed=5,
                               evolve=False), progress=False)  # fmt: skip
    searched = sorted(r["module"] for r in meta["modules"])
    assert meta["options"]["sample"] == 2 and len(searched) == 2
    assert searched == draw_modules(sorted(sizes), 2, np.random.default_rng([5, SAMPLE_STREAM]), "size", sizes)


def test_cli_search_prints_the_table(search_dir, corpus_dir):
    result = CliRunner().invoke(app, ["train", "search", "--corpus", str(corpus_dir), "-o", str(search_dir),
                                      "--budget", "1", "--min-decisions", "100", "-j", "1"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "zoo" in result.output and "total" in result.output


def test_record_names_keep_dotted_module_names_apart(tmp_path):
    a, b = record_stem(tmp_path, "pkg/src/x.cpp.o"), record_stem(tmp_path, "pkg/src_x.cpp.o")
    assert a != b and a.with_suffix(".json").stem == a.name and "." not in a.name


def test_focus_without_a_scoring_policy_tries_the_smallest_cost_margins_first(corpus_dir, toolchain, tmp_path):
    """From the heuristic (which gives no confidence), ``--focus`` picks the decisions whose cost estimate
    is closest to the threshold: with a budget of one flip, the flip tried is the first of them."""
    problem = get_problem("inline-size")
    start = rollout(problem, Corpus(corpus_dir)["zoo"], toolchain, resolve_policy("heuristic").build(),
                    record_features=True)  # fmt: skip
    names = [s.name for s in problem.expected_features() if s.name not in problem.hidden_features]
    features = start.trajectory.features
    margin = np.abs(features[:, names.index("threshold")] - features[:, names.index("cost_estimate")])
    focus = 0.02
    chosen = np.argsort(margin, kind="stable")[: int(np.ceil(focus * len(margin)))]
    out = tmp_path / "focused"
    search(SearchConfig(str(corpus_dir), str(out), budget=2, workers=1, modules="zoo", focus=focus, evolve=False),
           progress=False)  # fmt: skip
    examined = np.flatnonzero(read_states(out, "zoo").column("examined").to_numpy(zero_copy_only=False))
    assert examined.tolist() == [int(chosen.min())]
    assert margin[examined[0]] <= np.quantile(margin, 0.05) < np.median(margin)


@pytest.fixture(scope="module")
def fanout_corpus(toolchain, tmp_path_factory):
    from conftest import FANOUT_SOURCE, _corpus

    return _corpus(toolchain, tmp_path_factory.mktemp("fanout"), {"fanout": (".c", FANOUT_SOURCE)}).root


def test_the_group_move_inlines_every_call_of_a_callee_where_no_single_flip_pays(fanout_corpus, tmp_path):
    results = {}
    for groups in (False, True):
        out = tmp_path / f"groups-{groups}"
        search(SearchConfig(str(fanout_corpus), str(out), budget=40, workers=1, evolve=False, groups=groups),
               progress=False)  # fmt: skip
        results[groups] = (_record(out, "fanout"), read_states(out, "fanout"))
    single, _ = results[False]
    assert single["best"]["text_bytes"] == single["heuristic"]["text_bytes"], "no single flip shrinks it"
    rec, states = results[True]
    assert [move for _, _, move in rec["history"]] == ["group:emit"]
    assert rec["cursor"]["groups_tried"] == ["emit"]
    assert rec["best"]["text_bytes"] < rec["heuristic"]["text_bytes"]
    # the stored states name every decision's callee (from clang's optimization record): all three
    # decisions were calls of emit, and the best answers "yes" at each
    assert states.column("subject").to_pylist() == ["emit"] * 3
    assert states.column("action").to_pylist() == [1, 1, 1]
    # clang says "no" at the first two; at the third — by then the last call — its bonus says "yes"
    assert states.column("heuristic").to_pylist() == [0, 0, 1]


def test_states_name_the_callee_of_every_decision(search_dir):
    states = read_states(search_dir, "zoo")
    subjects = states.column("subject").to_pylist()
    assert len(subjects) == states.num_rows == _record(search_dir, "zoo")["best"]["decisions"]
    assert all(subjects) and any(s.startswith("_ZNSt") for s in subjects), "mangled C++ callees, none missing"


def test_read_remarks_unquotes_yaml_scalars(tmp_path):
    record = tmp_path / "r.yaml"
    record.write_text(
        "--- !Passed\nPass:            inline-ml\nName:            InliningSuccess\nFunction:        main\n"
        "Args:\n  - Callee:          'operator''s'\n  - threshold:       '5'\n...\n"
        "--- !Missed\nPass:            inline\nName:            NoDefinition\nFunction:        main\n"
        "Args:\n  - Callee:          puts\n...\n"
    )
    from optgym.toolchain.remarks import read_remarks

    assert read_remarks(record, "inline-ml") == [
        {"Name": "InliningSuccess", "Function": "main", "Callee": "operator's", "threshold": "5"}
    ]
    assert [r["Callee"] for r in read_remarks(record, "inline")] == ["puts"]


def test_language_keeps_one_languages_modules(corpus, tmp_path):
    from optgym.train.search import SearchError, select_modules

    assert sorted(m.name for m in select_modules(corpus, None, language="C")[0]) == ["leaf", "tree"]
    assert [m.name for m in select_modules(corpus, None, language="C++")[0]] == ["zoo"]
    assert select_modules(corpus, None)[0][0].name == "zoo"  # C++ first without a language
    with pytest.raises(SearchError, match="C or C"):
        search(SearchConfig(str(corpus.root), str(tmp_path / "s"), budget=1, language="Fortran"), progress=False)
    assert not (tmp_path / "s").exists()


def test_a_search_worker_that_dies_leaves_only_what_the_next_host_sweeps(corpus_dir):
    """A worker whose driver died ends by os._exit, with no cleanup: its scratch directory must be one that
    optgym's sweep of dead hosts' run directories finds (it was a bare /tmp/optgym-search-* before)."""
    code = ("import os, sys\n"
            "from optgym.corpus import Corpus\nfrom optgym.policies import resolve_policy\n"
            "from optgym.problems import get_problem\nfrom optgym.toolchain import find_toolchain\n"
            "from optgym.train.search import Compiler\n"
            "module = next(iter(Corpus(sys.argv[1])))\n"
            "c = Compiler(get_problem('inline-size'), module, find_toolchain(),\n"
            "             resolve_policy('heuristic').build(), False)\n"
            "print(c._tmp, flush=True)\nos._exit(1)\n")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code, str(corpus_dir)], capture_output=True, text=True, timeout=120)
    left = Path(out.stdout.strip())
    assert left.is_dir() and left.parent == runtime_root(), out.stderr
    assert sweep_stale(runtime_root()) >= 1 and not left.exists()


def test_a_search_can_start_from_a_policy_that_reads_the_callee_linkage(corpus_dir, toolchain, tmp_path):
    """The shipped inliner reads whether a callee survives, which only the compile itself can tell. A search
    started from it refused to run ("none was given"); its start must be the shipped policy's own object."""
    start = resolve_policy("pretrained")
    assert getattr(start.build(), "reads_callee_linkage", False), "the case needs a policy that reads linkage"
    out = tmp_path / "s"
    search(SearchConfig(str(corpus_dir), str(out), budget=3, workers=1, min_decisions=100, start="pretrained",
                        modules="zoo"), progress=False)  # fmt: skip
    rec = _record(out, "zoo")
    assert rec["status"] != "failed", rec.get("detail")
    module = next(m for m in Corpus(corpus_dir) if m.name == "zoo")
    served = rollout(get_problem("inline-size"), module, toolchain, start.build()).result
    assert rec["start_sizes"]["text_bytes"] == int(served.metrics["text_bytes"])
    assert rec["start_sizes"] != rec["heuristic"], "the shipped inliner departs from clang on zoo"
