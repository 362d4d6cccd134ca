"""``optgym export``: the ONNX file decides exactly as the training policy — its graph on onnxruntime and
its embedded numpy policy alike —, serves builds without torch, onnx or gymnasium, carries its
provenance, and is refused — clearly — when damaged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from optgym.cli import app
from optgym.corpus import Corpus
from optgym.policies import resolve_policy
from optgym.policies.embedded import GRAPH_SHA_KEY, POLICY_KEY, ExportedPolicy, load_embedded, read_model_fields
from optgym.policies.exported import ExportError, OnnxPolicy
from optgym.policies.mlp import MLPPolicy
from optgym.problems import get_problem
from optgym.problems.inputs import RESIDUAL_EXTRAS
from optgym.problems.normalize import Vocab
from optgym.rollout import rollout
from optgym.train.bc import BCConfig, train_bc
from optgym.train.trace import feature_matrix, iter_batches, read_meta

runner = CliRunner()
BIN = Path(sys.executable).parent
CC = str(BIN / "optgym-cc")
SOURCE = "int twice(int x) { return 2 * x; }\nint apply(int (*f)(int), int x) { return f(x) + twice(x); }\n"


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("export")


@pytest.fixture(scope="module")
def bc_run(trace_dir, vocab_path, work):
    """A real (short) behavioral-cloning run: config.toml, metrics.json, policy/."""
    run = work / "bc"
    train_bc(BCConfig(str(trace_dir), str(vocab_path), str(run), epochs=10, workers=1, evaluate=False),
             progress=False)  # fmt: skip
    return run


@pytest.fixture(scope="module")
def coin_run(bc_run, work):
    """A policy whose decisions are near coin flips (large random weights on the BC run's vocab): an
    export that were only roughly right would disagree with it somewhere."""
    base = MLPPolicy.load(bc_run / "policy")
    rng = np.random.default_rng(7)
    weights = [(rng.normal(0, 1.0, w.shape), rng.normal(0, 0.5, b.shape)) for w, b in base.weights]
    return MLPPolicy(weights, base.vocab, activation="relu", source={"algorithm": "test"}).save(work / "coin")


@pytest.fixture(scope="module")
def residual_run(bc_run, work):
    """A coin-flip policy that also reads the derived inputs (the heuristic's decision and the cost
    margin): the graph must compute them as the numpy policy does."""
    base = MLPPolicy.load(bc_run / "policy")
    shapes = [w.shape for w, _ in base.weights]
    shapes[0] = (shapes[0][0] + len(RESIDUAL_EXTRAS), shapes[0][1])
    rng = np.random.default_rng(11)
    weights = [(rng.normal(0, 1.0, shape), rng.normal(0, 0.5, shape[1])) for shape in shapes]
    weights[0][0][-2:] *= 8.0  # make the derived inputs matter
    return MLPPolicy(weights, base.vocab, extras=RESIDUAL_EXTRAS, source={"algorithm": "test"}).save(work / "res")


def _export(run: Path, out: Path) -> Path:
    result = runner.invoke(app, ["export", str(run), "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out


def _trace_vectors(trace_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """Every decision's raw features as the policies see them (DecisionPoint.vector() is float32), and
    the heuristic's decisions."""
    names = read_meta(trace_dir)["features"]
    batches = list(iter_batches(trace_dir, [*names, "heuristic"]))
    raw = np.concatenate([feature_matrix(b, names) for b in batches])
    heuristic = np.concatenate([b.column("heuristic").to_numpy() for b in batches])
    return raw.astype(np.float32), heuristic


class _Point:
    language = None

    def __init__(self, vector: np.ndarray, heuristic: int) -> None:
        self._v, self.heuristic = vector, int(heuristic)

    def vector(self) -> np.ndarray:
        return self._v


@pytest.mark.parametrize("which", ["bc", "coin", "residual"])
def test_export_decides_exactly_as_the_training_policy(which, bc_run, coin_run, residual_run, trace_dir, work):
    run = {"bc": bc_run, "coin": coin_run, "residual": residual_run}[which]
    exported = OnnxPolicy.load(_export(run, work / f"{which}.onnx"))
    trained = MLPPolicy.load(run / "policy" if which == "bc" else run)
    vectors, heuristic = _trace_vectors(trace_dir)
    assert len(vectors) > 50
    ours = [exported(_Point(v, h)) for v, h in zip(vectors, heuristic, strict=True)]
    theirs = [trained(_Point(v, h)) for v, h in zip(vectors, heuristic, strict=True)]
    assert [a for a, _ in ours] == [a for a, _ in theirs]  # every decision of the trace
    np.testing.assert_allclose([lp for _, lp in ours], [lp for _, lp in theirs], rtol=0, atol=1e-9)
    # the batched graph: logits agree to rounding, and its ArgMax node is the decision
    logits, actions = exported.outputs(vectors.astype(np.float64), heuristic)
    np.testing.assert_allclose(logits, trained.logits(vectors, heuristic), rtol=0, atol=1e-9)
    assert np.array_equal(actions, [a for a, _ in theirs])
    if which == "residual":  # the derived inputs reach the decision: flipping the heuristic bit changes some
        flipped = exported.actions(vectors.astype(np.float64), 1 - heuristic)
        assert not np.array_equal(flipped, actions)
        assert OnnxPolicy.load(work / "residual.onnx").metadata["extras"] == list(RESIDUAL_EXTRAS)
    if which == "coin":
        assert 0.05 < np.mean(actions) < 0.95, "the coin policy should make both decisions"
        sampled = [exported.stochastic(seed=1)(_Point(v, h)) for v, h in zip(vectors[:50], heuristic[:50], strict=True)]
        assert {a for a, _ in sampled} <= {0, 1} and all(lp <= 0 for _, lp in sampled)

    # What optgym serves: the embedded numpy policy. On the same inputs it decides as onnxruntime runs
    # the graph, decision by decision, and computes the training policy's logits bit for bit.
    served = resolve_policy(str(work / f"{which}.onnx")).build()
    assert isinstance(served, ExportedPolicy)
    numpy_ours = [served(_Point(v, h)) for v, h in zip(vectors, heuristic, strict=True)]
    assert [a for a, _ in numpy_ours] == [a for a, _ in ours] == [a for a, _ in theirs]
    assert [lp for _, lp in numpy_ours] == [lp for _, lp in theirs]
    assert np.array_equal(served.logits(vectors, heuristic), trained.logits(vectors, heuristic))
    assert np.array_equal(served.logits(vectors, heuristic).argmax(-1), actions)


def test_export_in_the_compile_loop_and_its_metadata(bc_run, corpus, toolchain, work):
    path = _export(bc_run, work / "policy.onnx")
    factory = resolve_policy(str(path))
    assert factory.identity.startswith("onnx:")
    problem = get_problem("inline-size")
    exported, trained = factory.build(), MLPPolicy.load(bc_run / "policy")
    for module in Corpus(corpus.root):
        a = rollout(problem, module, toolchain, exported)
        b = rollout(problem, module, toolchain, trained)
        assert a.result.ok and b.result.ok
        assert np.array_equal(a.trajectory.actions, b.trajectory.actions)
        assert a.result.metrics["text_bytes"] == b.result.metrics["text_bytes"]

    meta = exported.metadata
    assert meta["problem"] == "inline-size" and meta["features"] == trained.feature_names
    assert meta["compiler"] == toolchain.banner == exported.source["compiler"]
    prov = meta["provenance"]
    assert prov["algorithm"] == "bc" and prov["run"] == str(bc_run.resolve())
    assert prov["command"].startswith("optgym train --config ") and prov["metrics"]["decisions"] > 0
    assert prov["corpus"]["path"] == str(corpus.root) and prov["trace"]["mode"] == "record"
    assert exported.vocab is not None and exported.vocab.names == trained.feature_names
    import onnxruntime

    custom = onnxruntime.InferenceSession(str(path)).get_modelmeta().custom_metadata_map
    assert json.loads(custom["optgym"])["kind"] == "optgym-onnx-policy"  # any ONNX tool can read it
    assert Vocab.from_json(custom["optgym.vocab"]).names == trained.feature_names


def test_serving_an_export_needs_neither_torch_nor_sb3(bc_run, work, tmp_path):
    path = _export(bc_run, work / "served.onnx")
    heavy = ("torch", "stable_baselines3", "onnx", "onnxruntime", "gymnasium")
    probe = (
        'import sys; from optgym.serve.server import Server; s = Server(sys.argv[1], "inline-size"); '
        f"print(type(s.policy).__name__, sorted(m for m in {heavy!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OPTGYM_NO_GYMNASIUM": "1"})  # as the launcher starts it  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ExportedPolicy", "[]"]

    (tmp_path / "x.c").write_text(SOURCE + "int main(void) { return apply(twice, 3); }\n")
    env = {**os.environ, "OPTGYM_SERVER_IDLE": "5"}
    served = {}
    for name, policy in (("onnx", path), ("numpy", bc_run)):
        res = subprocess.run([CC, "-Oz", "-c", "x.c", "-o", f"{name}.o"], cwd=tmp_path, capture_output=True, text=True,
                             timeout=300, env={**env, "OPTGYM_POLICY": str(policy)})  # fmt: skip
        assert res.returncode == 0 and res.stderr == "", res.stderr
        served[name] = (tmp_path / f"{name}.o").read_bytes()
    assert served["onnx"] == served["numpy"]


def _damage(data: bytes, policy: MLPPolicy) -> bytes:
    """Flip one byte inside the second layer's weights: still a well-formed protobuf and ONNX model."""
    start = data.find(np.asarray(policy.weights[1][0], np.float64).tobytes()[:64])
    assert start > 0
    i = start + 1000
    return data[:i] + bytes([data[i] ^ 0x40]) + data[i + 1 :]


def test_a_damaged_export_is_refused_clearly(bc_run, work, tmp_path):
    good = _export(bc_run, work / "good.onnx").read_bytes()
    cases = {
        "truncated.onnx": (good[: len(good) // 2], "is not a valid ONNX policy"),
        "garbage.onnx": (b"\x00garbage" * 100, "is not a valid ONNX policy"),
        "flipped.onnx": (_damage(good, MLPPolicy.load(bc_run / "policy")), "is damaged"),
    }
    import onnx

    foreign = onnx.load_model_from_string(good)
    del foreign.metadata_props[:]
    cases["foreign.onnx"] = (foreign.SerializeToString(), "not an optgym policy")
    for name, (data, message) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ExportError, match=message):
            resolve_policy(str(tmp_path / name))

    # in a build: one warning and clang's own compile, or an error under OPTGYM_STRICT=1
    (tmp_path / "x.c").write_text(SOURCE)
    env = {**os.environ, "OPTGYM_SERVER_IDLE": "5", "OPTGYM_POLICY": str(tmp_path / "flipped.onnx")}
    res = subprocess.run([CC, "-Oz", "-c", "x.c", "-o", "x.o"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300, env=env)  # fmt: skip
    assert res.returncode == 0 and (tmp_path / "x.o").exists()
    (line,) = res.stderr.splitlines()
    assert line.startswith("optgym-cc: warning:") and "is damaged" in line and "compiled without optgym" in line
    strict = subprocess.run([CC, "-Oz", "-c", "x.c", "-o", "y.o"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=300, env={**env, "OPTGYM_STRICT": "1"})  # fmt: skip
    assert strict.returncode != 0 and "optgym-cc: error:" in strict.stderr and "is damaged" in strict.stderr


def test_the_embedded_policy_is_read_without_onnx_and_checked(bc_run, work, tmp_path):
    import onnx

    good = _export(bc_run, work / "embedded.onnx").read_bytes()
    model = onnx.load_model_from_string(good)
    graph, props = read_model_fields(good)  # the hand-written wire reader agrees with protobuf's
    assert graph == model.graph.SerializeToString()
    assert props == {p.key: p.value for p in model.metadata_props}
    assert POLICY_KEY in props and GRAPH_SHA_KEY in props
    trained = MLPPolicy.load(bc_run / "policy")
    probe = np.random.default_rng(3).integers(0, 1 << 10, size=(64, len(trained.feature_names))).astype(np.float64)

    # re-saved by another ONNX tool (the graph's bytes differ, not what it computes): full check, then numpy
    model.graph.doc_string = "re-saved"
    (tmp_path / "resaved.onnx").write_bytes(model.SerializeToString())
    resaved = load_embedded(tmp_path / "resaved.onnx")
    assert isinstance(resaved, ExportedPolicy) and np.array_equal(resaved.logits(probe), trained.logits(probe))

    # an export of an older optgym (no embedded policy) runs its graph on onnxruntime, as before
    old = onnx.load_model_from_string(good)
    keep = [(p.key, p.value) for p in old.metadata_props if p.key not in (POLICY_KEY, GRAPH_SHA_KEY)]
    del old.metadata_props[:]
    onnx.helper.set_model_props(old, dict(keep))
    (tmp_path / "old.onnx").write_bytes(old.SerializeToString())
    assert load_embedded(tmp_path / "old.onnx") is None
    assert isinstance(resolve_policy(str(tmp_path / "old.onnx")).build(), OnnxPolicy)

    # a damaged embedded policy (one base64 character of weights.npz) is refused, not served
    payload = json.loads(props[POLICY_KEY])
    b64 = payload["files"]["weights.npz"]["base64"]
    i = len(b64) // 2
    payload["files"]["weights.npz"]["base64"] = b64[:i] + ("A" if b64[i] != "A" else "B") + b64[i + 1 :]
    damaged = onnx.load_model_from_string(good)
    for p in damaged.metadata_props:
        if p.key == POLICY_KEY:
            p.value = json.dumps(payload)
    (tmp_path / "damaged.onnx").write_bytes(damaged.SerializeToString())
    with pytest.raises(ExportError, match="is damaged"):
        resolve_policy(str(tmp_path / "damaged.onnx"))


def test_export_refuses_what_is_not_a_run(work):
    result = runner.invoke(app, ["export", str(work), "-o", str(work / "none.onnx")])
    assert result.exit_code == 1 and "holds no trained policy" in result.output
    result = runner.invoke(app, ["export", str(work), "-o", str(work / "none.bin")])
    assert result.exit_code == 1 and ".onnx" in result.output
