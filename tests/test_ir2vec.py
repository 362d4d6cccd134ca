"""research/ir2vec_vocab.py against the real clang-22: a vocabulary it trains turns on the inliner's IR2Vec
features, and clang refuses a malformed one with a message that says so."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from research import gate_study
from research import ir2vec_vocab as ir2vec

DIM = 8  # not upstream's 75: the point is that the features take the vocabulary's dimension


pytestmark = pytest.mark.research


@pytest.fixture(scope="module")
def vocab(corpus, toolchain, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ir2vec") / "vocab.json"
    config = ir2vec.TransEConfig(dim=DIM, epochs=3, seed=1)
    summary = ir2vec.build([corpus.root], path, config=config, workers=1, progress=False, toolchain=toolchain)
    assert summary["modules"] == len(corpus) and summary["failed_modules"] == 0
    assert summary["triplets"] > 0
    return path


def test_vocabulary_layout(vocab):
    data = json.loads(vocab.read_text())
    assert list(data) == ["Opcodes", "Types", "Arguments"]
    assert {"Ret", "Call", "Load"} <= set(data["Opcodes"])
    assert {"IntegerTy", "PointerTy", "VoidTy"} <= set(data["Types"])
    assert {"Function", "Constant", "ICMP_eq", "FCMP_true"} <= set(data["Arguments"])
    assert {len(v) for section in data.values() for v in section.values()} == {DIM}
    assert ir2vec.vocab_dimension(vocab) == DIM


def test_build_is_reproducible(vocab, corpus, toolchain, tmp_path):
    again = tmp_path / "again.json"
    config = ir2vec.TransEConfig(dim=DIM, epochs=3, seed=1)
    ir2vec.build([corpus.root], again, config=config, workers=1, progress=False, toolchain=toolchain)
    assert again.read_bytes() == vocab.read_bytes()


def test_header_gains_embeddings(vocab, corpus, toolchain, no_leftovers):
    plain = ir2vec.check_embeddings(None, corpus["zoo"], toolchain)
    assert plain.status == "ok" and "callee_embedding" not in plain.features
    res = ir2vec.check_embeddings(vocab, corpus["zoo"], toolchain)
    assert res.status == "ok", res.stderr_tail
    for name in ir2vec.EMBEDDING_FEATURES:
        assert res.features[name] == ("float", (DIM,))
    assert res.features["inlining_default"] == ("int64_t", (1,))  # still the last: the heuristic's answer
    assert list(res.features)[-1] == "inlining_default"
    assert res.decisions == plain.decisions > 1
    assert res.zero_vectors == 0
    assert res.distinct_callee > 1 and res.distinct_caller > 1
    assert res.text_bytes == plain.text_bytes  # replaying the heuristic: the flags change no code


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        (lambda text, data: text[: len(text) // 2], "Error reading vocabulary"),  # cut short: not JSON
        (lambda text, data: json.dumps({"Opcodes": data["Opcodes"]}), "Missing 'Types' section"),
        (
            lambda text, data: json.dumps({**data, "Types": {k: [1.0, 2.0] for k in data["Types"]}}),
            "Vocabulary sections have different dimensions",
        ),
    ],
    ids=["truncated", "missing-section", "dimension-mismatch"],
)
def test_malformed_vocabulary_is_a_clear_compile_error(vocab, corpus, toolchain, tmp_path, mangle, message):
    text = vocab.read_text()
    bad = tmp_path / "bad.json"
    bad.write_text(mangle(text, json.loads(text)))
    res = ir2vec.check_embeddings(bad, corpus["tree"], toolchain)
    assert res.status == "compile_error"
    assert message in res.stderr_tail
    assert "Failed to load IR2Vec vocabulary" in res.stderr_tail
    assert res.decisions == 0 and not res.features  # clang stops before the inliner opens the channel


def test_missing_vocabulary_file(corpus, toolchain, tmp_path):
    res = ir2vec.check_embeddings(tmp_path / "absent.json", corpus["tree"], toolchain)
    assert res.status == "compile_error"
    assert "Failed to load IR2Vec vocabulary" in res.stderr_tail


def test_gate_study_embeddings_are_the_scanned_decisions(vocab, corpus, toolchain, tmp_path, no_leftovers):
    """The embeddings compile decides as the plain one (IR2Vec only reads the IR): same decisions, same
    features at each, plus both embeddings of the vocabulary's dimension; the second call reads the cache."""
    from optgym.problems import get_problem
    from optgym.problems.inline_size import FEATURES
    from optgym.rollout.rollout import rollout

    study = gate_study
    digest = study.hashlib.sha256(vocab.read_bytes()).hexdigest()
    task = study.EmbedTask(str(corpus.root), "zoo", "heuristic", str(vocab), digest, str(tmp_path / "cache"), 120.0)
    name, got = study.embed_module(task)
    assert name == "zoo" and isinstance(got, dict), got
    plain: list[list[int]] = []

    def recording(point):
        plain.append([int(v.ravel()[0]) for v in point.features().values()])
        return point.heuristic

    assert rollout(get_problem("inline-size"), corpus["zoo"], toolchain, recording).result.ok
    assert got["features"].tolist() == plain and got["features"].shape[1] == len(FEATURES)
    for feature in study.EMBEDDING_FEATURES:
        assert got[feature].shape == (len(plain), DIM) and np.abs(got[feature]).sum() > 0
    again = study.embed_module(task)[1]
    assert list(study.Path(task.cache).glob("*.npz")) and all(np.array_equal(got[k], again[k]) for k in got)


def test_gate_study_statistics():
    study = gate_study
    rng = np.random.default_rng(0)
    y, p = rng.integers(0, 2, 200), rng.random(200).round(1)  # rounded: ties
    pairs = [(a > b) + 0.5 * (a == b) for a in p[y == 1] for b in p[y == 0]]
    assert study.roc_auc(y, p) == pytest.approx(np.mean(pairs))
    assert study.roc_auc(y, y.astype(float)) == 1.0
    groups = [f"pkg{i % 7}" for i in range(50)]
    folds = study.grouped_folds(groups, 3, seed=1)
    assert sum(f.astype(int) for f in folds).tolist() == [1] * 50  # every flip in exactly one test fold
    for f in folds:
        inside = {g for g, t in zip(groups, f, strict=True) if t}
        assert inside and not inside & {g for g, t in zip(groups, f, strict=True) if not t}
