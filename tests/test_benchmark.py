"""``optgym benchmark`` on the tiny real corpus: a spec pinning it, the leaderboard, reuse, and the checks.

The corpus is the session's three modules (real bitcode, compiled by the real clang-22) made into three
"packages" with versions and a split by package (tree trains; zoo and leaf are held out); the spec is the
shipped one with its corpus pin, entries and budgets replaced by tiny ones. Every figure asserted is
measured independently here (``evaluate`` and ``summarize``), never typed in.
"""

from __future__ import annotations

import json
import shutil
import statistics
import tomllib
from pathlib import Path

import pytest
import tomli_w
from typer.testing import CliRunner

from optgym.cli import app
from optgym.corpus import Corpus
from optgym.corpus.corpus import DESCRIPTION
from optgym.corpus.split import apply_split
from optgym.evaluate.benchmark import BenchmarkError, load_spec, names_digest, resume_args, spec_path
from optgym.policies import shipped_provenance
from optgym.policies.allowance import DEFAULT_GATES
from optgym.train.es import ESConfig, train_es
from optgym.train.evaluation import evaluate, summarize
from optgym.train.search import SearchConfig, read_search, search

runner = CliRunner()
HELD_OUT = ["leaf", "zoo"]
#: The pinned command of the tiny trained entry: one ES iteration of one direction over the one training module.
TINY_ES = ["train", "es", "--corpus", "{corpus}", "--split", "train", "--allowance", "default", "--iterations",
           "1", "--directions", "1", "--sigma", "0.3", "--seed", "{seed}", "--no-final-eval", "-o", "{run}", "-j",
           "1"]  # fmt: skip


def _packaged(source: Path, root: Path, versions: dict[str, str]) -> Path:
    """A copy of ``source`` whose modules are packages with ``versions``, split by package."""
    shutil.copytree(source, root)
    description = json.loads((root / DESCRIPTION).read_text())
    description["optgym"]["packages"] = {name: {"package": name, "version": version, "opt": "-Oz", "target": None}
                                         for name, version in versions.items()}  # fmt: skip
    (root / DESCRIPTION).write_text(json.dumps(description))
    apply_split(root, test_percent=0, seed=0, by="package", test_groups=HELD_OUT)
    return root


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("benchmark")


@pytest.fixture(scope="module")
def bench_corpus(corpus_dir, work) -> Path:
    return _packaged(corpus_dir, work / "corpus", {"tree": "1.0-1", "zoo": "2.1-3+deb12u1", "leaf": "1:0.5-2"})


@pytest.fixture(scope="module")
def tiny_spec(bench_corpus, work) -> Path:
    """The shipped spec, pinned to the tiny corpus, with the built-in entries, a given ES entry, a tiny trained
    one (two seeds) and the search bound; the rule is checked against ``work/provenance.json``."""
    data = tomllib.loads(spec_path(None).read_text())
    description = Corpus(bench_corpus).description
    test = description["optgym"]["split"]["test"]
    train = [n for n in description["modules"] if n not in test]
    versions = {n: p["version"] for n, p in description["optgym"]["packages"].items()}
    data["corpus"].update(
        training_packages={n: v for n, v in versions.items() if n not in HELD_OUT},
        heldout_packages={n: v for n, v in versions.items() if n in HELD_OUT},
        train_modules=len(train), test_modules=len(test),
        train_names_sha256=names_digest(train), test_names_sha256=names_digest(test),
    )  # fmt: skip
    entries = {e["name"]: e for e in data["entries"]}
    entries["rule"]["provenance"] = str(work / "provenance.json")
    entries["es-allowance"]["steps"] = [{"name": "es", "output": "{run}", "command": TINY_ES}]
    data["entries"] = [entries[n] for n in ("heuristic", "never", "rule", "es", "es-allowance", "search")]
    data["seeds"] = 2
    path = work / "tiny.toml"
    path.write_text(tomli_w.dumps(data))
    return path


def _figures(policy: str, corpus: Path) -> dict[str, dict]:
    """``summarize`` of ``policy`` on the held-out side, over all modules and per language: the reference."""
    heldout = Corpus(corpus, split="test")
    rows = evaluate(policy, heldout, workers=1, progress=False)
    family = {m.name: m.family for m in heldout}
    return {"all": summarize(rows), **{lang: summarize([r for r in rows if family[r.module] == lang])
                                       for lang in ("C", "C++")}}  # fmt: skip


def _provenance(corpus: Path, figures: dict[str, dict]) -> dict:
    split = Corpus(corpus).description["optgym"]["split"]
    return {"compiler": "test", "corpus": {"split": {k: split[k] for k in ("test_groups", "test_modules")}},
            "figures": {"heldout": figures}}  # fmt: skip


def _run(*args: str):
    return runner.invoke(app, ["benchmark", "run", *args])


def test_the_shipped_spec_pins_the_shipped_rules_corpus():
    spec = load_spec()
    provenance = json.loads(shipped_provenance("rule", "inline-size").read_text())  # the rule's row pins its corpus
    assert spec.corpus["training_packages"] == provenance["training_packages"]
    assert spec.corpus["heldout_packages"] == provenance["heldout_packages"]
    assert sorted(spec.corpus["heldout_packages"]) == provenance["corpus"]["split"]["test_groups"]
    assert spec.corpus["test_modules"] == provenance["corpus"]["split"]["test_modules"]
    assert {e.kind for e in spec.entries} >= {"heuristic", "never", "rule", "bc", "ppo", "es", "imitate",
                                              "es-allowance", "bound"}  # fmt: skip
    assert all(e.compiles_per_module <= spec.budget for e in spec.entries)
    assert [e.name for e in spec.entries if e.manual] == ["search"]


def test_a_variant_entry_is_its_base_with_the_options_it_adds():
    spec = load_spec()
    base, capped = spec.entry("learned"), spec.entry("learned-capped")
    assert (capped.kind, capped.policy, capped.compiles_per_module) == (base.kind, base.policy,
                                                                        base.compiles_per_module)  # fmt: skip
    assert capped.what != base.what
    for old, new in zip(base.steps, capped.steps, strict=True):
        added = ("--validation-max-worse", "0.02") if old.name in ("ppo", "linkage") else ()
        assert (new.name, new.output, new.command) == (old.name, old.output, old.command + added)


def test_a_variant_may_give_options_its_base_passes_a_new_value():
    spec = load_spec()
    base, wide = spec.entry("learned-capped-5"), spec.entry("learned-wide")
    search, widened = base.steps[0], wide.steps[0]
    assert [s.command for s in wide.steps[1:]] == [s.command for s in base.steps[1:]]
    assert len(widened.command) == len(search.command)
    changed = {(a, b) for a, b in zip(search.command, widened.command, strict=True) if a != b}
    assert changed == {("240", "720"), ("12", "4")}
    assert widened.command[widened.command.index("--sample") + 1] == "720"
    assert widened.command[widened.command.index("--budget") + 1] == "4"


@pytest.mark.parametrize(
    ("variant", "message"),
    [
        ({"variant_of": "nope"}, "no earlier entry"),
        ({"variant_of": "never", "add_options": {"x": ["-y"]}}, "names no step of never: x"),
        ({"add_options": {"x": ["-y"]}}, "add_options needs variant_of"),
        ({"set_options": {"x": {"-y": "1"}}}, "set_options needs variant_of"),
        ({"variant_of": "learned", "set_options": {"x": {"-y": "1"}}}, "set_options names no step of learned: x"),
        ({"variant_of": "learned", "set_options": {"search": {"--sigma": "1"}}}, "search passes no --sigma VALUE"),
    ],
    ids=["unknown-base", "unknown-step", "no-base", "set-no-base", "set-unknown-step", "set-unknown-option"],
)
def test_a_variant_that_names_nothing_real_is_refused(tmp_path, variant, message):
    data = tomllib.loads(spec_path(None).read_text())
    data["entries"].append({"name": "odd", "kind": "odd", **variant})
    path = tmp_path / "odd.toml"
    path.write_text(tomli_w.dumps(data))
    with pytest.raises(BenchmarkError, match=message):
        load_spec(path)


def test_check_accepts_the_pinned_corpus_and_lists_every_difference(bench_corpus, tiny_spec, corpus_dir, work):
    ok = runner.invoke(app, ["benchmark", "check", "--corpus", str(bench_corpus), "--spec", str(tiny_spec)])
    assert ok.exit_code == 0, ok.output
    other = _packaged(corpus_dir, work / "other", {"tree": "1.0-2", "zoo": "2.1-3+deb12u1", "extra": "1"})
    bad = runner.invoke(app, ["benchmark", "check", "--corpus", str(other), "--spec", str(tiny_spec)])
    assert bad.exit_code == 1
    for said in ("tree: version 1.0-2, pinned 1.0-1", "leaf 1:0.5-2 is missing", "extra 1 is not in the pin"):
        assert said in bad.output
    shipped = runner.invoke(app, ["benchmark", "check", "--corpus", str(bench_corpus)])
    assert shipped.exit_code == 1 and "abseil 20220623.1-1+deb12u2 is missing" in shipped.output
    refused = _run("--corpus", str(other), "--spec", str(tiny_spec), "-o", str(work / "refused"), "-j", "1")
    assert refused.exit_code == 1 and "not the corpus" in refused.output and not (work / "refused").exists()


def test_run_writes_the_leaderboard_and_a_rerun_reuses_it(bench_corpus, tiny_spec, work):
    given = work / "given-es"
    train_es(ESConfig(str(bench_corpus), str(given), split="train", allowance=DEFAULT_GATES, iterations=1,
                      directions=1, sigma=0.3, seed=7, workers=1, final_eval=False), say=lambda s: None)  # fmt: skip
    rule = _figures("rule", bench_corpus)  # the entry is the rule, whatever ships as pretrained
    (work / "provenance.json").write_text(json.dumps(_provenance(bench_corpus, rule)))
    out = work / "board"
    # the two seeds of the trained entry side by side: each seed's figures are still its own (asserted below)
    first = _run("--corpus", str(bench_corpus), "--spec", str(tiny_spec), "-o", str(out), "-j", "1",
                 "--entry", f"es={given}", "--seed-jobs", "2")  # fmt: skip
    assert first.exit_code == 0, first.output
    board = json.loads((out / "leaderboard.json").read_text())
    rows = {r["entry"]: r for r in board["rows"]}
    assert list(rows) == [r["entry"] for r in board["rows"]] and set(rows) == {
        "heuristic", "never", "rule", "es", "es-allowance", "search"}  # fmt: skip
    assert all(rows["heuristic"]["mean"][lang]["total_ratio"]["mean"] == 1.0 for lang in ("all", "C", "C++"))
    for name, policy in (("never", "never"), ("es", str(given))):
        reference = _figures(policy, bench_corpus)
        (seed,) = rows[name]["seeds"]
        for lang in ("all", "C", "C++"):
            assert seed["figures"][lang]["total_ratio"] == reference[lang]["total_ratio"]
            assert seed["figures"][lang]["policy_text_bytes"] == reference[lang]["policy_text_bytes"]
    assert rows["es"]["seeds"][0]["source"] == "given" and rows["es"]["given"] == [str(given)]
    assert rows["rule"]["provenance"]["status"] == "match", rows["rule"]["provenance"]
    # the trained entry: two seeds, each 1 iteration × 1 direction × 2 × the 1 training module
    trained = rows["es-allowance"]
    assert [s["source"] for s in trained["seeds"]] == ["trained", "trained"]
    assert [s["compiles"] for s in trained["seeds"]] == [2, 2] and trained["budget"]["used_compiles_per_module"] == 2
    totals = [s["figures"]["all"]["total_ratio"] for s in trained["seeds"]]
    assert trained["mean"]["all"]["total_ratio"]["mean"] == pytest.approx(statistics.fmean(totals))
    assert trained["mean"]["all"]["total_ratio"]["ci95"] is not None
    assert rows["search"]["status"] == "not run" and "--entry search=DIR" in rows["search"]["reason"]
    ranked = [r["mean"]["all"]["total_ratio"]["mean"] for r in board["rows"] if r["status"] == "ok"]
    assert ranked == sorted(ranked)
    markdown = (out / "leaderboard.md").read_text()
    assert all(f"`{name}`" in markdown for name in rows) and "not run" in markdown
    assert (out / "leaderboard.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # a rerun trains nothing and measures the same; the search bound given now, the rule's provenance wrong
    run_dir = out / "runs" / "es-allowance-s0" / "final" / "policy"
    stamps = {p: p.stat().st_mtime_ns for p in run_dir.iterdir()}
    searched = work / "search"
    search(SearchConfig(corpus=str(bench_corpus), output=str(searched), split="test", budget=3, workers=1),
           progress=False, say=lambda s: None)  # fmt: skip
    wrong = {**rule, "all": {**rule["all"], "policy_text_bytes": rule["all"]["policy_text_bytes"] + 1}}
    (work / "provenance.json").write_text(json.dumps(_provenance(bench_corpus, wrong)))
    second = _run("--corpus", str(bench_corpus), "--spec", str(tiny_spec), "-o", str(out), "-j", "1",
                  "--entry", f"es={given}", "--entry", f"search={searched}")  # fmt: skip
    assert second.exit_code == 1 and "does not match its shipped provenance" in second.output
    again = {r["entry"]: r for r in json.loads((out / "leaderboard.json").read_text())["rows"]}
    assert [s["source"] for s in again["es-allowance"]["seeds"]] == ["reused", "reused"]
    assert {p: p.stat().st_mtime_ns for p in run_dir.iterdir()} == stamps
    for name in ("never", "es", "es-allowance", "rule"):
        assert again[name]["mean"] == rows[name]["mean"]
    assert again["rule"]["provenance"]["status"] == "mismatch" and "MISMATCH" in (out / "leaderboard.md").read_text()
    bound = again["search"]
    summary = read_search(searched)["summary"]
    assert bound["bound"] and bound["status"] == "ok" and "bound, not a policy" in (out / "leaderboard.md").read_text()
    # zoo (C++) is searched, leaf (C, no call site) skipped: the bound keeps clang's object there
    figures = bound["seeds"][0]["figures"]
    assert summary["searched"] == 1 and summary["skipped"] == 1
    assert figures["C++"]["policy_text_bytes"] == summary["best_text_bytes"] <= summary["heuristic_text_bytes"]
    assert figures["C++"]["heuristic_text_bytes"] == summary["heuristic_text_bytes"]
    assert figures["C"]["total_ratio"] == 1.0 and figures["all"]["evaluated"] == 2


def test_a_failing_step_is_a_failed_row_with_its_reason(bench_corpus, tiny_spec, work):
    data = tomllib.loads(tiny_spec.read_text())
    broken = {
        "name": "broken",
        "kind": "es",
        "what": "a command optgym refuses",
        "steps": [{"name": "es", "command": ["train", "es", "--corpus", "{corpus}", "--no-such-option"]}],
    }
    data["entries"] = [e for e in data["entries"] if e["name"] == "heuristic"] + [broken]
    path = work / "broken.toml"
    path.write_text(tomli_w.dumps(data))
    result = _run(
        "--corpus", str(bench_corpus), "--spec", str(path), "-o", str(work / "broken"), "--seeds", "1", "-j", "1"
    )
    assert result.exit_code == 1
    rows = {r["entry"]: r for r in json.loads((work / "broken" / "leaderboard.json").read_text())["rows"]}
    assert rows["heuristic"]["status"] == "ok" and rows["broken"]["status"] == "failed"
    assert "--no-such-option" in rows["broken"]["reason"] and (work / "broken" / "logs" / "broken-s0-es.log").is_file()


def test_an_interrupted_trainer_step_continues_from_its_latest_snapshot(bench_corpus, tiny_spec, work):
    """A step cut short after a snapshot is continued with ``--resume``, not started over: the snapshot it had
    is the one the rerun builds on, untouched, and the run still ends with its final policy."""
    data = tomllib.loads(tiny_spec.read_text())
    (entry,) = [e for e in data["entries"] if e["name"] == "es-allowance"]
    two_iterations = [*TINY_ES[:TINY_ES.index("--iterations")], "--iterations", "2", "--snapshot-every", "1",
                      *TINY_ES[TINY_ES.index("--iterations") + 2:]]  # fmt: skip
    entry["steps"] = [{"name": "es", "output": "{run}", "command": two_iterations}]
    data["entries"] = [entry]
    spec = work / "resumable.toml"
    spec.write_text(tomli_w.dumps(data))
    out = work / "resumed"
    args = ("--corpus", str(bench_corpus), "--spec", str(spec), "-o", str(out), "--seeds", "1", "-j", "1")
    assert (first := _run(*args)).exit_code == 0, first.output
    run = out / "runs" / "es-allowance-s0"
    snapshots = sorted((run / "snapshots").iterdir())
    assert len(snapshots) >= 2
    # the interruption: no marker, no final policy, only the first snapshot left
    (out / "done" / "es-allowance-s0-es.json").unlink()
    shutil.rmtree(run / "final")
    for later in snapshots[1:]:
        shutil.rmtree(later)
    kept = {p: p.stat().st_mtime_ns for p in snapshots[0].rglob("*")}
    assert (second := _run(*args)).exit_code == 0, second.output
    command = (out / "logs" / "es-allowance-s0-es.log").read_text().splitlines()[0]
    assert f"--resume {run}" in command and "--corpus" not in command
    assert {p: p.stat().st_mtime_ns for p in snapshots[0].rglob("*")} == kept
    assert (run / "final" / "policy").is_dir() and (out / "done" / "es-allowance-s0-es.json").is_file()
    rows = {r["entry"]: r for r in json.loads((out / "leaderboard.json").read_text())["rows"]}
    assert rows["es-allowance"]["status"] == "ok", rows["es-allowance"]["reason"]


def test_resume_args_only_continue_a_trainer_with_a_snapshot(tmp_path):
    run = tmp_path / "run"
    (run / "snapshots").mkdir(parents=True)
    (run / "config.toml").write_text("")
    ppo = ["train", "ppo", "--corpus", "C", "--iterations", "300", "--no-final-eval", "-o", str(run), "-j", "1"]
    assert resume_args(ppo, run) is None  # nothing to continue from: start over
    (run / "snapshots" / "00000020").mkdir()
    assert resume_args(ppo, run) == ["train", "ppo", "--resume", str(run), "-j", "1", "--no-final-eval"]
    assert resume_args(["search", "--corpus", "C", "-o", str(run)], run) is None  # a search resumes itself
    assert resume_args(["train", "bc", "--trace", "T", "-o", str(run)], run) is None


def test_kept_steps_let_a_new_output_directory_go_on_without_training_again(bench_corpus, tiny_spec, work, tmp_path):
    """``maintainer.keep_steps``: the markers and the finished runs' small files, copied into an empty output
    directory, make a rerun reuse every finished step and measure the same figures, with no model or
    TensorBoard log kept."""
    from maintainer.keep_steps import keep

    data = tomllib.loads(tiny_spec.read_text())
    data["entries"] = [e for e in data["entries"] if e["name"] == "es-allowance"]
    spec = work / "kept.toml"
    spec.write_text(tomli_w.dumps(data))
    first_out, kept, second_out = tmp_path / "first", tmp_path / "kept", tmp_path / "second"
    common = ("--corpus", str(bench_corpus), "--spec", str(spec), "--seeds", "1", "-j", "1")
    assert (first := _run(*common, "-o", str(first_out))).exit_code == 0, first.output
    assert keep(first_out, kept) > 0
    assert not list(kept.rglob("events.out.tfevents*")) and not list(kept.rglob("model.zip"))
    shutil.copytree(kept, second_out)
    assert (second := _run(*common, "-o", str(second_out))).exit_code == 0, second.output
    rows = [json.loads((out / "leaderboard.json").read_text())["rows"][0] for out in (first_out, second_out)]
    assert [s["source"] for s in rows[1]["seeds"]] == ["reused"]
    assert rows[1]["mean"] == rows[0]["mean"] and rows[1]["seeds"][0]["compiles"] == rows[0]["seeds"][0]["compiles"]
