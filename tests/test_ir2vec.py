"""tools/ir2vec_vocab.py against the real clang-22: a vocabulary it trains turns on the inliner's IR2Vec
features, and clang refuses a malformed one with a message that says so."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "ir2vec_vocab.py"
DIM = 8  # not upstream's 75: the point is that the features take the vocabulary's dimension


def _load_tool():
    spec = importlib.util.spec_from_file_location("ir2vec_vocab", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


ir2vec = _load_tool()


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
