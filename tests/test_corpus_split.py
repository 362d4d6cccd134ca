"""Splits (deterministic, by package, stored without copying), merges and module filters."""

from __future__ import annotations

import json

import pytest

from optgym.corpus import Corpus, write_corpus
from optgym.corpus.corpus import DESCRIPTION
from optgym.corpus.merge import merge_corpora
from optgym.corpus.split import apply_split, compute_split
from optgym.errors import CorpusError

CMD = ["-cc1", "-triple", "x86_64-pc-linux-gnu", "-Oz", "-emit-obj", "-main-file-name", "m.c"]


def _fake_corpus(root, names, packages=None):
    """Module files need not hold real bitcode for splits and merges: nothing here compiles them."""
    corpus = write_corpus(root, ((n, b"BC" + n.encode(), CMD) for n in names))
    if packages:
        description = json.loads((root / DESCRIPTION).read_text())
        description["optgym"]["packages"] = {p: {"version": "1.0-1"} for p in packages}
        (root / DESCRIPTION).write_text(json.dumps(description))
    return corpus


def _packaged(root, n_packages=20, per_package=3):
    pkgs = [f"pkg{i:02d}" for i in range(n_packages)]
    return _fake_corpus(root, [f"{p}/m{j}.o" for p in pkgs for j in range(per_package)], pkgs)


def test_split_is_deterministic_and_by_package(tmp_path):
    names = [m.name for m in _packaged(tmp_path / "c")]
    groups, test = compute_split(names, 10, seed=3, by="package")
    assert compute_split(names, 10, seed=3, by="package") == (groups, test)
    assert len(groups) == 2 and len(test) == 6
    assert all(n.split("/")[0] in groups for n in test)
    others = {tuple(compute_split(names, 10, seed=s, by="package")[0]) for s in range(10)}
    assert len(others) > 1, "the seed must matter"
    # a group's side depends on its name and the seed, not on the listing order
    assert compute_split(list(reversed(names)), 10, seed=3, by="package")[0] == groups


def test_split_is_stored_and_selected(tmp_path):
    corpus = _packaged(tmp_path / "c")
    record = apply_split(corpus.root, test_percent=10, seed=1, by="package")
    again = apply_split(corpus.root, test_percent=10, seed=1, by="package")
    assert record == again
    train, test = Corpus(corpus.root, split="train"), Corpus(corpus.root, split="test")
    assert len(train) == 54 and len(test) == 6
    assert {m.name for m in train} | {m.name for m in test} == {m.name for m in Corpus(corpus.root)}
    assert not {m.name for m in train} & {m.name for m in test}
    assert {m.name.split("/")[0] for m in test} == set(record["test_groups"])
    with pytest.raises(CorpusError, match="no module"):
        train[test.modules[0].name]
    assert len(Corpus(corpus.root)) == 60, "Corpus(path) still sees every module"


def test_without_packages_split_is_by_module(tmp_path):
    corpus = _fake_corpus(tmp_path / "c", [f"m{i}.o" for i in range(30)])
    record = apply_split(corpus.root, test_percent=10, seed=0, by="package")
    assert record["by"] == "module" and record["test_modules"] == 3


def test_no_split_stored_is_a_clear_error(tmp_path):
    corpus = _fake_corpus(tmp_path / "c", ["a.o"])
    with pytest.raises(CorpusError, match="no split"):
        Corpus(corpus.root, split="test")
    with pytest.raises(CorpusError, match="unknown split"):
        Corpus(corpus.root, split="validation")


def test_merge_links_filters_and_refuses_collisions(tmp_path):
    a = _fake_corpus(tmp_path / "a", ["x/1.o", "x/2.o", "y/test_1.o"])
    b = _fake_corpus(tmp_path / "b", ["z/1.o"])
    merged = merge_corpora([a.root, b.root], tmp_path / "m", exclude=["*/test_*"])
    assert [m.name for m in merged] == ["x/1.o", "x/2.o", "z/1.o"]
    assert merged["z/1.o"].bitcode.stat().st_ino == b["z/1.o"].bitcode.stat().st_ino, "hard-linked, not copied"
    only = merge_corpora([a.root, b.root], tmp_path / "n", include=["x/*"])
    assert len(only) == 2
    with pytest.raises(CorpusError, match="--prefix"):
        merge_corpora([a.root, a.root], tmp_path / "o")
    with pytest.raises(CorpusError, match="distinct"):
        merge_corpora([a.root, a.root], tmp_path / "o", prefix=True)
    prefixed = merge_corpora([a.root, b.root], tmp_path / "p", prefix=True)
    assert "a/x/1.o" in [m.name for m in prefixed]


def test_rewriting_a_corpus_leaves_no_staging_and_keeps_logs(tmp_path):
    a = _fake_corpus(tmp_path / "a", ["x.o"])
    (tmp_path / "m" / "logs").mkdir(parents=True)
    (tmp_path / "m" / "logs" / "build.log").write_text("kept")
    merge_corpora([a.root], tmp_path / "m")
    merge_corpora([a.root], tmp_path / "m")
    assert (tmp_path / "m" / "logs" / "build.log").read_text() == "kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "m"]


def test_an_interrupted_swap_is_recovered(tmp_path):
    """A run killed between the renames of a swap leaves the old corpus (or the new one), never a mix."""
    from optgym.corpus.staging import recover

    a = _fake_corpus(tmp_path / "a", ["x.o"])
    merge_corpora([a.root], tmp_path / "m")
    (tmp_path / "m" / "logs").mkdir()
    # killed after "dest → .dest.old", before "staging → dest"
    (tmp_path / "m").rename(tmp_path / ".m.old")
    recover(tmp_path / "m")
    assert len(Corpus(tmp_path / "m")) == 1 and (tmp_path / "m" / "logs").is_dir()
    # killed after "staging → dest", before the logs were carried over
    (tmp_path / "m").rename(tmp_path / ".m.old")
    merge_corpora([a.root], tmp_path / "new")
    (tmp_path / "new").rename(tmp_path / "m")
    recover(tmp_path / "m")
    assert (tmp_path / "m" / "logs").is_dir() and not (tmp_path / ".m.old").exists()


def test_explicit_test_groups_are_the_test_side(tmp_path):
    """A held-out set named by hand (before any result is seen) replaces the seeded draw, and a name the
    corpus does not have is an error, not a silently smaller test side."""
    corpus = _packaged(tmp_path / "c")
    record = apply_split(corpus.root, test_percent=10, seed=1, by="package", test_groups=["pkg03", "pkg17"])
    assert record["test_groups"] == ["pkg03", "pkg17"] and record["explicit_test_groups"] == ["pkg03", "pkg17"]
    assert {m.name.split("/")[0] for m in Corpus(corpus.root, split="test")} == {"pkg03", "pkg17"}
    assert len(Corpus(corpus.root, split="train")) == 54
    with pytest.raises(CorpusError, match="pkg99"):
        apply_split(corpus.root, test_percent=10, seed=1, by="package", test_groups=["pkg03", "pkg99"])
