"""``optgym export RUN -o POLICY.onnx``: a trained policy as one self-contained ONNX file.

Why one file, and why ONNX: a policy leaves the training machine to be used in somebody's build
(``OPTGYM_POLICY=policy.onnx`` with ``optgym-cc``), so it must not depend on the run directory, on
torch or on stable-baselines3, and any ONNX runtime should be able to run it. The file holds:

* **the whole decision function as a graph**, from clang's raw feature values to the action:

      features  float64 [N, F]   raw values, in the order of ``meta["features"]``
      heuristic float64 [N]      only for a policy with the ``heuristic`` derived input: clang's own
                                 decision (``meta["extras"]``, see :mod:`optgym.problems.inputs`)
      cxx       float64 [N]      only for a policy with the ``cxx`` derived input: 1 for a C++ module
        → normalization          the vocab's quantile bucketization, x, x², √x and the log z-score
                                 (:class:`~optgym.problems.normalize.Normalizer`, with its constants
                                 as initializers: nothing to keep beside the file), then the derived
                                 inputs (heuristic bit, ``margin:A-B``) computed in the graph
        → (MatMul → Add → Tanh|Relu)* → MatMul → Add
      logits    float64 [N, A]
      action    int64   [N]      ArgMax of the logits (ties → the lower action, as MLPPolicy)

  Everything is float64 so the graph computes what the numpy :class:`~optgym.policies.mlp.MLPPolicy`
  computes (also float64): the export decides *exactly* as the training policy (tests/test_export.py).
  ONNX has no searchsorted, so bucketization counts the boundaries ``≤ v`` (what
  ``np.searchsorted(side="right")`` finds) as ``Cast(distinct boundaries ≤ v) @ multiplicities``.
* **metadata** in the model's ``metadata_props`` (readable by any ONNX tool, e.g. onnxruntime's
  ``get_modelmeta().custom_metadata_map``):

      optgym         JSON: kind, format_version, problem, features, actions, network, compiler
                     (the banner of the clang the run trained with), source, provenance (run,
                     algorithm, the run's config and versions, the command that reproduces it,
                     corpus with its packages and split, trace, metrics), export (optgym, onnx,
                     opset, time, the numpy policy's identity)
      optgym.vocab   the vocab JSON the normalization was built from (to retrain or inspect)
      optgym.digest  sha256 over the graph (nodes and initializers): a damaged file is refused
                     rather than served with wrong weights
      optgym.policy  the training policy's directory (policy.json, weights.npz, vocab.json) and
      optgym.graph.sha256  the graph's bytes as written: see :mod:`optgym.policies.embedded`

Loading (:func:`load_onnx_policy`, registered with :func:`optgym.policies.register_resolver` so
``--policy POLICY.onnx`` works everywhere) checks all of that and runs the embedded policy with
numpy — the graph is for every other ONNX runtime, and for exports that embed no policy, which run
on onnxruntime on one thread. The policy server shares one loaded policy between all compiles of a build.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import json
import math
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from optgym.policies import PolicyFactory, file_identity
from optgym.policies.exported import (
    ACTION,
    CXX,
    DIGEST_KEY,
    EXPORT_FORMAT_VERSION,
    EXPORT_KIND,
    HEURISTIC,
    INPUT,
    LOGITS,
    MASK,
    META_KEY,
    SCORES,
    SUFFIX,
    SURVIVES,
    VOCAB_KEY,
    ExportError,
    OnnxPolicy,
    _session,
    graph_digest,
    read_policy_bytes,
)
from optgym.policies.mlp import MLPPolicy
from optgym.policies.scorer import (
    LOG_LINEAR_FORM,
    TINY,
    CandidateScorer,
    LogLinearScorer,
    ResidualScorer,
)

if TYPE_CHECKING:
    import onnx

#: opset 17 / IR 8: old enough for every maintained ONNX runtime, new enough for ReduceSum's axes input.
OPSET, IR_VERSION = 17, 8


# -- the graph ----------------------------------------------------------------------------------


def build_model(policy: MLPPolicy, metadata: dict[str, Any]) -> onnx.ModelProto:
    """The ONNX model computing ``policy`` from raw features (see the module doc), metadata attached."""
    from onnx import TensorProto, helper

    norm = policy.normalizer
    n_features = len(norm.names)
    # Bucketization without searchsorted: each feature's *distinct* boundaries laid end to end, with
    # their multiplicities, behind one +inf sentinel (never ≤ a value, weight 0). The cumulative sum of
    # mult_j · [bound_j ≤ v[feature_j]] taken at the end of feature f's run, minus the same at the end of
    # the run before, is the number of f's boundaries ≤ v: integer-valued doubles, exact. That is a compare
    # per distinct boundary (~1,300 for inline-size rather than 38 × 1,000) and no matrix product.
    distinct = [np.unique(b, return_counts=True) for b in norm._bounds]  # the Normalizer's own float64 constants
    flat_bounds = np.concatenate([[np.inf], *(u for u, _ in distinct)])
    feature_of = np.concatenate([[0], *(np.full(len(u), f, dtype=np.int64) for f, (u, _) in enumerate(distinct))])
    multiplicity = np.concatenate([[0.0], *(c.astype(np.float64) for _, c in distinct)])
    run_end = np.cumsum([len(u) for u, _ in distinct]).astype(np.int64)  # index of each run's last entry
    run_before = np.concatenate([[0], run_end[:-1]]).astype(np.int64)  # 0: the sentinel, whose sum is 0
    # the first layer takes [x(all features), x², √x, z] blocks; the policy's rows are feature by feature
    order = np.arange(n_features * 4).reshape(n_features, 4).T.ravel()
    consts: dict[str, np.ndarray] = {
        "bounds": flat_bounds,
        "feature_of": feature_of.astype(np.int64),
        "multiplicity": multiplicity,
        "run_end": run_end,
        "run_before": run_before,
        "bound_count": norm._count,
        "low": norm._low,
        "gap": norm._gap,
        "log_mean": norm._mean,
        "log_std": norm._std,
        "zero": np.zeros((), dtype=np.float64),
        "axis1": np.array(1, dtype=np.int64),
    }
    for i, (w, b) in enumerate(policy.weights):
        w = np.asarray(w, np.float64)
        if i == 0:  # the normalized rows are permuted; the derived inputs' rows follow them unchanged
            w = np.concatenate([w[: n_features * 4][order], w[n_features * 4 :]])
        consts[f"W{i}"], consts[f"b{i}"] = w, np.asarray(b, np.float64)
    node = helper.make_node
    nodes = [
        # x = (boundaries ≤ v counted) / boundaries of the feature
        node("Gather", [INPUT, "feature_of"], ["v_each"], axis=1),  # [N, U]: each boundary's feature value
        node("LessOrEqual", ["bounds", "v_each"], ["le"]),
        node("Where", ["le", "multiplicity", "zero"], ["counted"]),
        node("CumSum", ["counted", "axis1"], ["running"]),
        node("Gather", ["running", "run_end"], ["through_f"], axis=1),
        node("Gather", ["running", "run_before"], ["before_f"], axis=1),
        node("Sub", ["through_f", "before_f"], ["buckets"]),  # [N, F]
        node("Div", ["buckets", "bound_count"], ["x"]),
        node("Mul", ["x", "x"], ["x2"]),
        node("Sqrt", ["x"], ["sx"]),
        # z = (log(max(v - low, 0) + gap) - mean) / std
        node("Sub", [INPUT, "low"], ["shifted"]),
        node("Max", ["shifted", "zero"], ["clipped"]),
        node("Add", ["clipped", "gap"], ["gapped"]),
        node("Log", ["gapped"], ["logv"]),
        node("Sub", ["logv", "log_mean"], ["centred"]),
        node("Div", ["centred", "log_std"], ["z"]),
    ]
    extra_nodes, extra_columns = _derived_input_nodes(policy, consts)
    nodes += extra_nodes
    # [x…, x²…, √x…, z…, derived…]: W0's rows are permuted to match, which saves interleaving them
    nodes.append(node("Concat", ["x", "x2", "sx", "z", *extra_columns], ["h0"], axis=1))
    h = "h0"
    last = len(policy.weights) - 1
    for i in range(len(policy.weights)):
        out = LOGITS if i == last else f"a{i + 1}"
        nodes += [node("MatMul", [h, f"W{i}"], [f"m{i}"]), node("Add", [f"m{i}", f"b{i}"], [out])]
        if i < last:
            nodes.append(node("Tanh" if policy.activation == "tanh" else "Relu", [out], [f"h{i + 1}"]))
            h = f"h{i + 1}"
    nodes.append(node("ArgMax", [LOGITS], [ACTION], axis=1, keepdims=0, select_last_index=0))
    n_actions = policy.weights[-1][0].shape[1]
    graph_inputs = [helper.make_tensor_value_info(INPUT, TensorProto.DOUBLE, ["N", n_features])]
    if policy.inputs.needs_heuristic:
        graph_inputs.append(helper.make_tensor_value_info(HEURISTIC, TensorProto.DOUBLE, ["N"]))
    if policy.inputs.needs_language:
        graph_inputs.append(helper.make_tensor_value_info(CXX, TensorProto.DOUBLE, ["N"]))
    if policy.inputs.needs_linkage:
        graph_inputs.append(helper.make_tensor_value_info(SURVIVES, TensorProto.DOUBLE, ["N"]))
    outputs = [
        helper.make_tensor_value_info(LOGITS, TensorProto.DOUBLE, ["N", n_actions]),
        helper.make_tensor_value_info(ACTION, TensorProto.INT64, ["N"]),
    ]
    return _finish_model(nodes, graph_inputs, outputs, consts, metadata, {VOCAB_KEY: policy.vocab.to_json()})


def build_scorer_model(scorer: CandidateScorer, metadata: dict[str, Any]) -> onnx.ModelProto:
    """The ONNX model of a candidate scorer (regalloc eviction): one score per candidate column.

    features  float64 [F, K]   the scorer's columns (``metadata["columns"]``), one row per feature,
                               one column per candidate — the stream's tensors as clang sends them
    mask      float64 [K]      0 where the compiler rules the candidate out
      → scores = weights · features, −inf where masked        float64 [1, K]
        (a residual scorer adds v · tanh(Uᵀ · sign(features) ln(1 + |features|) + c), column by column)
      → action = ArgMax (ties → the first candidate, as numpy)  int64 [1]
    """
    from onnx import TensorProto, helper

    consts = {
        "weights": np.asarray(scorer.weights, np.float64).reshape(1, -1),
        "zero": np.zeros((), dtype=np.float64),
        "minus_inf": np.full((), -np.inf, dtype=np.float64),
    }
    node = helper.make_node
    residual = isinstance(scorer, ResidualScorer)
    nodes = [node("MatMul", ["weights", INPUT], ["linear" if residual else "weighted"])]
    if isinstance(scorer, ResidualScorer):
        consts |= {"one": np.ones((), np.float64), "U_t": scorer.U.T.copy(), "c": scorer.c.reshape(-1, 1),
                   "v": scorer.v.reshape(1, -1)}  # fmt: skip
        nodes += [
            node("Abs", [INPUT], ["magnitude"]),
            node("Add", ["magnitude", "one"], ["magnitude1"]),
            node("Log", ["magnitude1"], ["log1p"]),
            node("Sign", [INPUT], ["sign"]),
            node("Mul", ["sign", "log1p"], ["squashed"]),
            node("MatMul", ["U_t", "squashed"], ["pre"]),
            node("Add", ["pre", "c"], ["pre_c"]),
            node("Tanh", ["pre_c"], ["units"]),
            node("MatMul", ["v", "units"], ["residual"]),
            node("Add", ["linear", "residual"], ["weighted"]),
        ]
    nodes += [
        node("Equal", [MASK, "zero"], ["ruled_out"]),
        node("Where", ["ruled_out", "minus_inf", "weighted"], [SCORES]),
        node("ArgMax", [SCORES], [ACTION], axis=1, keepdims=0, select_last_index=0),
    ]
    inputs = [
        helper.make_tensor_value_info(INPUT, TensorProto.DOUBLE, [len(scorer.features), "K"]),
        helper.make_tensor_value_info(MASK, TensorProto.DOUBLE, ["K"]),
    ]
    outputs = [
        helper.make_tensor_value_info(SCORES, TensorProto.DOUBLE, [1, "K"]),
        helper.make_tensor_value_info(ACTION, TensorProto.INT64, [1]),
    ]
    return _finish_model(nodes, inputs, outputs, consts, metadata, {})


def build_log_linear_model(scorer: LogLinearScorer, metadata: dict[str, Any]) -> onnx.ModelProto:
    """The ONNX model of a log-linear scorer (regalloc priority): one number per column.

    features  float64 [F, K]   the scorer's features (``metadata["columns"]``), one row each, one column per
                               answer wanted (clang asks for one); finite (the stream's ``inf`` as the largest
                               double, as optgym reads it)
      → scores = b + weights · ln max(features, TINY)        float64 [1, K]
      → action = ceiling where scores ≥ ln ceiling, else e^scores   float64 [1, K]
    """
    from onnx import TensorProto, helper

    consts = {
        "weights": np.asarray(scorer.weights, np.float64).reshape(1, -1),
        "tiny": np.array(TINY, np.float64),
        "bias": np.array(scorer.bias, np.float64),
        "log_ceiling": np.array(math.log(scorer.ceiling), np.float64),
        "ceiling": np.array(scorer.ceiling, np.float64),
    }
    node = helper.make_node
    nodes = [
        node("Max", [INPUT, "tiny"], ["floored"]),
        node("Log", ["floored"], ["logs"]),
        node("MatMul", ["weights", "logs"], ["weighted"]),
        node("Add", ["weighted", "bias"], [SCORES]),
        node("Min", [SCORES, "log_ceiling"], ["capped"]),
        node("Exp", ["capped"], ["raised"]),
        node("GreaterOrEqual", [SCORES, "log_ceiling"], ["at_ceiling"]),
        node("Where", ["at_ceiling", "ceiling", "raised"], [ACTION]),
    ]
    inputs = [helper.make_tensor_value_info(INPUT, TensorProto.DOUBLE, [len(scorer.features), "K"])]
    outputs = [
        helper.make_tensor_value_info(SCORES, TensorProto.DOUBLE, [1, "K"]),
        helper.make_tensor_value_info(ACTION, TensorProto.DOUBLE, [1, "K"]),
    ]
    return _finish_model(nodes, inputs, outputs, consts, metadata, {})


def _finish_model(
    nodes: list[Any],
    inputs: list[Any],
    outputs: list[Any],
    consts: dict[str, np.ndarray],
    metadata: dict[str, Any],
    props: dict[str, str],
) -> onnx.ModelProto:
    """The checked model of a graph, with optgym's metadata (and ``props``) and the graph's digest."""
    import onnx
    from onnx import helper, numpy_helper

    initializer = [numpy_helper.from_array(np.ascontiguousarray(v), name=k) for k, v in consts.items()]
    graph = helper.make_graph(nodes, "optgym_policy", inputs, outputs, initializer=initializer)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="optgym",
        producer_version=_version("optgym"),
        doc_string=f"optgym {metadata.get('problem', '')} policy: raw features → action (see metadata 'optgym')",
    )
    model.ir_version = IR_VERSION
    helper.set_model_props(model, {META_KEY: json.dumps(metadata, sort_keys=True), **props})
    entry = model.metadata_props.add()
    entry.key, entry.value = DIGEST_KEY, graph_digest(model)
    onnx.checker.check_model(model, full_check=True)
    return model


def _derived_input_nodes(policy: MLPPolicy, consts: dict[str, np.ndarray]) -> tuple[list[Any], list[str]]:
    """Nodes computing the policy's derived inputs as ``[N, 1]`` columns, as
    :class:`~optgym.problems.inputs.PolicyInputs` does; adds their constants to ``consts``."""
    from onnx import TensorProto, helper

    from optgym.problems.inputs import CXX_INPUT, GIVEN, HEURISTIC_INPUT, MARGIN_SCALE, SURVIVES_INPUT

    node = helper.make_node
    nodes, columns = [], []
    if policy.extras:
        consts.update({"one": np.ones((), np.float64), "margin_scale": np.array(MARGIN_SCALE, np.float64),
                       "axes1": np.array([1], dtype=np.int64)})  # fmt: skip
    for j, (kind, a, b) in enumerate(policy.inputs.parsed):
        col = f"extra{j}"
        if kind in GIVEN:  # (input > 0) as 0.0 / 1.0
            source = {HEURISTIC_INPUT: HEURISTIC, CXX_INPUT: CXX, SURVIVES_INPUT: SURVIVES}[kind]
            nodes += [node("Greater", [source, "zero"], [f"{col}_bool"]),
                      node("Cast", [f"{col}_bool"], [f"{col}_flat"], to=TensorProto.DOUBLE),
                      node("Unsqueeze", [f"{col}_flat", "axes1"], [col])]  # fmt: skip
        elif kind == "deletes":  # (users ≤ K) and not (survives > 0), as 0.0 / 1.0
            consts[f"{col}_a"], consts[f"{col}_k"] = np.array([a], np.int64), np.array(float(b), np.float64)
            nodes += [node("Gather", [INPUT, f"{col}_a"], [f"{col}_va"], axis=1),
                      node("LessOrEqual", [f"{col}_va", f"{col}_k"], [f"{col}_few"]),
                      node("Greater", [SURVIVES, "zero"], [f"{col}_stays_flat"]),
                      node("Unsqueeze", [f"{col}_stays_flat", "axes1"], [f"{col}_stays"]),
                      node("Not", [f"{col}_stays"], [f"{col}_goes"]),
                      node("And", [f"{col}_few", f"{col}_goes"], [f"{col}_bool"]),
                      node("Cast", [f"{col}_bool"], [col], to=TensorProto.DOUBLE)]  # fmt: skip
        elif kind in ("at_most", "at_least"):  # (A ≤ K) or (A ≥ K) as 0.0 / 1.0
            consts[f"{col}_a"], consts[f"{col}_k"] = np.array([a], np.int64), np.array(float(b), np.float64)
            compare = "LessOrEqual" if kind == "at_most" else "GreaterOrEqual"
            nodes += [node("Gather", [INPUT, f"{col}_a"], [f"{col}_va"], axis=1),
                      node(compare, [f"{col}_va", f"{col}_k"], [f"{col}_bool"]),
                      node("Cast", [f"{col}_bool"], [col], to=TensorProto.DOUBLE)]  # fmt: skip
        else:  # sign(A - B) · log(|A - B| + 1) / scale
            consts[f"{col}_a"], consts[f"{col}_b"] = np.array([a], np.int64), np.array([b], np.int64)
            nodes += [node("Gather", [INPUT, f"{col}_a"], [f"{col}_va"], axis=1),
                      node("Gather", [INPUT, f"{col}_b"], [f"{col}_vb"], axis=1),
                      node("Sub", [f"{col}_va", f"{col}_vb"], [f"{col}_d"]),
                      node("Abs", [f"{col}_d"], [f"{col}_abs"]),
                      node("Add", [f"{col}_abs", "one"], [f"{col}_p1"]),
                      node("Log", [f"{col}_p1"], [f"{col}_log"]),
                      node("Sign", [f"{col}_d"], [f"{col}_sign"]),
                      node("Mul", [f"{col}_sign", f"{col}_log"], [f"{col}_signed"]),
                      node("Div", [f"{col}_signed", "margin_scale"], [col])]  # fmt: skip
        columns.append(col)
    return nodes, columns


# -- what a run records ---------------------------------------------------------------------------


def _version(dist: str) -> str:
    import importlib.metadata  # here, not at the top: ~10 ms of every policy server's start

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _run_root(policy_dir: Path) -> Path | None:
    """The run directory a policy directory belongs to: the nearest ancestor with a config.toml
    (``RUN/policy``, ``RUN/final/policy``, ``RUN/snapshots/N/policy``)."""
    for parent in list(policy_dir.parents)[:3]:
        if (parent / "config.toml").is_file():
            return parent
    return None


def _corpus_provenance(corpus: str | None, split: str | None) -> dict[str, Any] | None:
    """Where the corpus came from, as its description records it (packages and versions, split)."""
    if not corpus:
        return None
    out: dict[str, Any] = {"path": corpus, "split": split}
    description = _read_json(Path(corpus) / "corpus_description.json")
    if isinstance(description, dict):
        meta = description.get("optgym", {})
        out["modules"] = len(description.get("modules", []))
        out["provenance"] = meta.get("provenance")
        packages = meta.get("packages") or {}
        out["packages"] = {name: p.get("version") for name, p in packages.items() if isinstance(p, dict)}
        if isinstance(meta.get("split"), dict):
            out["stored_split"] = {k: v for k, v in meta["split"].items() if not isinstance(v, list | dict)}
    return out


def run_provenance(policy_dir: Path) -> dict[str, Any]:
    """Everything the run directory says about how the policy was made (absent parts are ``None``)."""
    run = _run_root(policy_dir)
    prov: dict[str, Any] = {"policy_dir": str(policy_dir.resolve()), "run": str(run.resolve()) if run else None}
    config: dict[str, Any] = {}
    if run is not None:
        try:
            data = tomllib.loads((run / "config.toml").read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ExportError(f"{run}/config.toml cannot be read: {e}") from None
        config = data.get("run", {})
        prov |= {
            "algorithm": data.get("algorithm"),
            "config": config,
            "versions": data.get("versions", {}),
            "command": f"optgym train --config {(run / 'config.toml').resolve()}",
        }
        for candidate in (run / "final" / "metrics.json", run / "metrics.json"):
            if (metrics := _read_json(candidate)) is not None:
                prov["metrics"] = metrics
                break
        if policy_dir.parent.parent.name == "snapshots":
            prov["snapshot"] = policy_dir.parent.name
            prov["snapshot_state"] = _read_json(policy_dir.parent / "state.json")
    trace = config.get("trace")
    trace_meta = _read_json(Path(trace) / "trace.json") if trace else None
    corpus, split = config.get("corpus"), config.get("split")
    if isinstance(trace_meta, dict):
        prov["trace"] = {k: trace_meta.get(k) for k in ("path", "mode", "policy", "corpus", "split", "decisions")}
        prov["trace"]["path"] = trace
        corpus, split = corpus or trace_meta.get("corpus"), split or trace_meta.get("split")
    prov["corpus"] = _corpus_provenance(corpus, split)
    return prov


def export_policy(run: Path | str, output: Path | str, *, provenance: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write ``run``'s policy (a run, snapshot or policy directory) as one ONNX file; its metadata.

    An MLP or a candidate scorer (:func:`build_scorer_model`). ``provenance`` replaces what the run
    directory says (for a policy directory written elsewhere from a run's snapshot). The file appears
    atomically, and is loaded back and checked against the numpy policy on random raw features before
    this returns — an export that would decide differently is never left behind.
    """
    from optgym.files import atomic_write_bytes
    from optgym.policies.trained import load_policy_dir, policy_dir_of

    run, output = Path(run), Path(output)
    found = policy_dir_of(run)
    if found is None:
        raise ExportError(f"{run} holds no trained policy (a policy directory, or a run with policy/, final/policy/ "
                          "or snapshots/N/policy/)")  # fmt: skip
    policy = load_policy_dir(found)
    kind = "scorer" if isinstance(policy, CandidateScorer) else "mlp"  # how load_embedded reads it back
    provenance = run_provenance(found) if provenance is None else provenance
    compiler = policy.source.get("compiler") or (provenance.get("versions") or {}).get("clang")
    metadata = {
        "kind": EXPORT_KIND,
        "format_version": EXPORT_FORMAT_VERSION,
        "problem": policy.problem,
        "features": policy.feature_names,
        "compiler": compiler,
        "source": {**policy.source, **({"compiler": compiler} if compiler else {})},
        "provenance": provenance,
        "export": {
            "optgym": _version("optgym"),
            "onnx": _version("onnx"),
            "opset": OPSET,
            "at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "policy_identity": f"{kind}:{file_identity(found)}",
            "command": f"optgym export {run} -o {output}",
        },
    }
    if isinstance(policy, LogLinearScorer):
        metadata |= {"form": LOG_LINEAR_FORM, "columns": policy.features, "languages": policy.languages}
        model = build_log_linear_model(policy, metadata)
    elif isinstance(policy, CandidateScorer):
        metadata |= {"form": policy.form, "columns": policy.features, "mask": policy.mask,
                     "languages": policy.languages}  # fmt: skip
        model = build_scorer_model(policy, metadata)
    else:
        metadata |= {
            "extras": policy.extras,
            "languages": policy.languages,
            "actions": int(policy.weights[-1][0].shape[1]),
            "network": {
                "hidden": policy.hidden,
                "activation": policy.activation,
                "dtype": "float64",
                "input": "raw feature values [N, F]; normalization is inside the graph",
            },
        }
        model = build_model(policy, metadata)
    # The policy directory itself rides along: optgym serves it with numpy (optgym.policies.embedded).
    from optgym.policies.embedded import GRAPH_SHA_KEY, embed_properties, load_embedded, read_model_fields

    graph_bytes, props = read_model_fields(model.SerializeToString())
    for key, value in embed_properties(found, graph_bytes or b"", props.get(VOCAB_KEY, "")).items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    data = model.SerializeToString()
    written_graph, written_props = read_model_fields(data)
    if hashlib.sha256(written_graph or b"").hexdigest() != written_props[GRAPH_SHA_KEY]:
        raise ExportError("protobuf laid the graph out differently on a second serialization: not written")
    atomic_write_bytes(output, data)
    try:
        served = load_embedded(output)
        if isinstance(policy, LogLinearScorer):
            _check_log_linear_export(policy, served, output, found)
        elif isinstance(policy, CandidateScorer):
            _check_scorer_export(policy, served, output, found)
        else:
            _check_mlp_export(policy, served, output, found)
    except BaseException:
        output.unlink(missing_ok=True)  # an export that would decide differently is never left behind
        raise
    return metadata


def _check_mlp_export(policy: MLPPolicy, served: Any, output: Path, found: Path) -> None:
    """The embedded policy and the graph (on onnxruntime) against the training policy, on random features."""
    exported = OnnxPolicy.load(output)
    rng = np.random.default_rng(0)
    probe = rng.integers(-2, 1 << 12, size=(256, len(policy.feature_names))).astype(np.float64)
    heuristic, cxx, survives = (rng.integers(0, 2, size=256) for _ in range(3))
    trained = policy.logits(probe, heuristic, cxx, survives)
    if served is None or not np.array_equal(served.logits(probe, heuristic, cxx, survives), trained):
        raise ExportError(f"the embedded policy computes differently from {found}: not written")
    if not np.array_equal(exported.actions(probe, heuristic, cxx, survives), trained.argmax(-1)):
        raise ExportError(f"the exported graph decides differently from {found} on random features: not written")


def _check_scorer_export(scorer: CandidateScorer, served: Any, output: Path, found: Path) -> None:
    """The embedded scorer (exactly) and the graph on onnxruntime (the same choice, scores within rounding:
    it sums in its own order) against the trained scorer, on random candidate tables of 33 columns (as
    eviction's), some masked."""
    session = _session(read_policy_bytes(output), output)
    rng = np.random.default_rng(0)
    assert scorer.mask is not None, "a candidate scorer reads its mask (a log-linear one is checked apart)"
    for _ in range(64):
        table = rng.integers(-4, 64, size=(len(scorer.features), 33)).astype(np.float64)
        mask = (rng.random(33) < 0.7).astype(np.float64)
        features = {**dict(zip(scorer.features, table, strict=True)), scorer.mask: mask}
        trained = scorer.scores(features)
        if served is None or not np.array_equal(served.scores(features), trained):
            raise ExportError(f"the embedded scorer computes differently from {found}: not written")
        scores, action = session.run([SCORES, ACTION], {INPUT: table, MASK: mask})  # its own summation order
        if not np.allclose(scores[0], trained, rtol=1e-12, atol=1e-12) or int(action[0]) != int(np.argmax(trained)):
            raise ExportError(f"the exported graph decides differently from {found} on random features: not written")


def _check_log_linear_export(scorer: LogLinearScorer, served: Any, output: Path, found: Path) -> None:
    """The embedded scorer (exactly) and the graph on onnxruntime (within rounding) against the trained one,
    on random features spanning what clang sends (sizes, stages, weights from 0 to the stream's ``inf``)."""
    session = _session(read_policy_bytes(output), output)
    rng = np.random.default_rng(0)
    for _ in range(16):
        table = np.exp(rng.uniform(-12.0, 12.0, size=(len(scorer.features), 64)))
        table[rng.random(table.shape) < 0.05] = 0.0
        table[rng.random(table.shape) < 0.05] = np.finfo(np.float64).max
        trained = scorer.values(table)
        features = dict(zip(scorer.features, table, strict=True))
        if served is None or not np.array_equal(served.scores(features), trained):
            raise ExportError(f"the embedded scorer computes differently from {found}: not written")
        (action,) = session.run([ACTION], {INPUT: table})
        if not np.allclose(action[0], trained, rtol=1e-12, atol=0.0):
            raise ExportError(f"the exported graph computes differently from {found} on random features: not written")


# -- loading and serving --------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _load_cached(path: str, stamp: int) -> OnnxPolicy | MLPPolicy | CandidateScorer:
    from optgym.policies.embedded import load_embedded

    return load_embedded(path) or OnnxPolicy.load(path)


def load_onnx_policy(path: str, seed: int | None = None) -> OnnxPolicy | MLPPolicy | CandidateScorer:
    """Builder run inside workers (cached per path and modification time, as the numpy policies are).

    An export that embeds its policy directory runs on numpy — the training policy itself, faster per
    decision than onnxruntime and without importing onnx (:mod:`optgym.policies.embedded`); older
    exports run their graph on onnxruntime."""
    policy = _load_cached(str(path), Path(path).stat().st_mtime_ns)
    return policy if seed is None else policy.stochastic(seed)


def is_exported_policy(path: Path) -> bool:
    return path.is_file() and path.suffix == SUFFIX


def resolve_onnx(path: Path) -> PolicyFactory | None:
    """The resolver for ``*.onnx`` files. It loads the file once here, so a damaged export is refused
    where the spec is given (with :class:`ExportError`), not later inside a worker."""
    if not is_exported_policy(path):
        return None
    load_onnx_policy(str(path))
    return PolicyFactory(str(path), f"onnx:{file_identity(path)}", load_onnx_policy, (str(path),))


__all__ = [
    "EXPORT_FORMAT_VERSION",
    "EXPORT_KIND",
    "ExportError",
    "OnnxPolicy",
    "build_model",
    "build_scorer_model",
    "export_policy",
    "graph_digest",
    "is_exported_policy",
    "load_onnx_policy",
    "resolve_onnx",
    "run_provenance",
]
