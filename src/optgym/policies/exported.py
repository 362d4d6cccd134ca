"""An exported policy file as optgym reads it: its metadata keys and graph names, the checks every load makes
(:func:`check_metadata`), and :class:`OnnxPolicy`, which runs the graph on onnxruntime — for exports that embed
no policy directory, and for the full check of one whose graph was laid out anew (:mod:`optgym.policies.embedded`).
Writing an export is :mod:`optgym.policies.export`."""

from __future__ import annotations

import copy
import hashlib
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from optgym.policies.mlp import PolicyFileError
from optgym.policies.scorer import LOG_LINEAR_FORM, RESIDUAL_FORM
from optgym.problems.inputs import reads_linkage
from optgym.problems.normalize import Vocab, VocabError
from optgym.rollout.rollout import DecisionPoint
from optgym.toolchain.language import is_cxx

if TYPE_CHECKING:
    import onnx

EXPORT_KIND = "optgym-onnx-policy"
EXPORT_FORMAT_VERSION = 1
META_KEY, VOCAB_KEY, DIGEST_KEY = "optgym", "optgym.vocab", "optgym.digest"
INPUT, HEURISTIC, CXX, LOGITS, ACTION = "features", "heuristic", "cxx", "logits", "action"
SURVIVES = "callee_survives"  # the graph input of a policy that reads the callee's linkage
MASK, SCORES = "mask", "scores"  # a candidate scorer's graph (see export.build_scorer_model)
SCORER_FORM = "candidate-scorer"
SUFFIX = ".onnx"


class ExportError(PolicyFileError):
    """A run that cannot be exported, or an exported file that must not be used."""


def graph_digest(model: onnx.ModelProto) -> str:
    """sha256 over what decides — every node and every initializer's values — independent of how
    protobuf lays the bytes out, so a re-saved file keeps its digest and a damaged one does not."""
    from onnx import helper, numpy_helper

    h = hashlib.sha256()
    for n in model.graph.node:
        attrs = sorted((a.name, repr(helper.get_attribute_value(a))) for a in n.attribute)
        h.update(repr((n.op_type, list(n.input), list(n.output), attrs)).encode())
    for init in sorted(model.graph.initializer, key=lambda t: t.name):
        array = numpy_helper.to_array(init)
        h.update(repr((init.name, str(array.dtype), array.shape)).encode())
        h.update(np.ascontiguousarray(array).tobytes())
    return h.hexdigest()


def read_policy_bytes(path: Path) -> bytes:
    """An exported file's bytes, or a clear error naming it."""
    try:
        return path.read_bytes()
    except OSError as e:
        raise ExportError(f"cannot read policy {path}: {e}") from None


def check_metadata(path: Path, props: dict[str, str]) -> dict[str, Any]:
    """The ``optgym`` metadata of an exported file, checked (present, JSON, kind, format version): one check
    for both ways of loading an export (onnxruntime, and the embedded numpy policy)."""
    if META_KEY not in props:
        raise ExportError(f"{path} is an ONNX model but not an optgym policy (no '{META_KEY}' metadata)")
    try:
        metadata = json.loads(props[META_KEY])
    except ValueError as e:
        raise ExportError(f"{path}: its '{META_KEY}' metadata is not JSON: {e}") from None
    if not isinstance(metadata, dict):
        raise ExportError(f"{path}: its '{META_KEY}' metadata is not a JSON object")
    if metadata.get("kind") != EXPORT_KIND:
        raise ExportError(f"{path}: metadata kind {metadata.get('kind')!r}, expected {EXPORT_KIND!r}")
    version = metadata.get("format_version")
    if not isinstance(version, int) or version > EXPORT_FORMAT_VERSION:
        raise ExportError(f"{path} has export format {version!r}; this optgym reads ≤ {EXPORT_FORMAT_VERSION}")
    return metadata


class OnnxPolicy:
    """An exported policy, run by onnxruntime; called on a :class:`DecisionPoint` like ``MLPPolicy``
    (``(action, log_prob)``; greedy unless made :meth:`stochastic`)."""

    def __init__(self, path: Path, session: Any, metadata: dict[str, Any], vocab: Vocab | None) -> None:
        self.path, self.session, self.metadata, self.vocab = path, session, metadata, vocab
        self.problem: str = metadata["problem"]
        self.source: dict[str, Any] = dict(metadata.get("source") or {})
        if metadata.get("compiler"):
            self.source.setdefault("compiler", metadata["compiler"])
        self._features: list[str] = list(metadata["features"])
        self._needs_heuristic = "heuristic" in (metadata.get("extras") or [])
        self._needs_language = "cxx" in (metadata.get("extras") or [])
        self.reads_callee_linkage = reads_linkage(metadata.get("extras") or [])
        self.languages: list[str] | None = metadata.get("languages")  # the families it decides; None: all
        self.greedy = True
        self.rng = np.random.default_rng()

    @property
    def feature_names(self) -> list[str]:
        """What the server checks against the compiler's header before serving."""
        return self._features

    @classmethod
    def load(cls, path: Path | str) -> OnnxPolicy:
        """Parse, verify (kind, version, digest, checker, input width) and open an exported policy."""
        import onnx

        path = Path(path)
        data = read_policy_bytes(path)
        try:
            model = onnx.load_model_from_string(data)
            onnx.checker.check_model(model)
        except Exception as e:  # protobuf's DecodeError, onnx's ValidationError: the file is damaged
            raise ExportError(f"{path} is not a valid ONNX policy (damaged or not ONNX): {_first_line(e)}") from None
        props = {p.key: p.value for p in model.metadata_props}
        metadata = check_metadata(path, props)
        if props.get(DIGEST_KEY) != graph_digest(model):
            raise ExportError(f"{path} is damaged: its graph does not match the digest recorded at export")
        # an MLP takes [N, features]; a scorer [columns, K] (its features are the columns and the mask)
        scorer = metadata.get("form") in (SCORER_FORM, LOG_LINEAR_FORM, RESIDUAL_FORM)
        features = metadata.get("columns" if scorer else "features")
        dims = model.graph.input[0].type.tensor_type.shape.dim if model.graph.input else []
        if not isinstance(features, list) or len(dims) != 2 or dims[0 if scorer else 1].dim_value != len(features):
            raise ExportError(f"{path}: the graph's input does not take the {len(features or [])} recorded features")
        vocab = None
        if VOCAB_KEY in props:
            try:
                vocab = Vocab.from_json(props[VOCAB_KEY], f"{path}:{VOCAB_KEY}")
            except VocabError as e:
                raise ExportError(str(e)) from None
        return cls(path, _session(data, path), metadata, vocab)

    def stochastic(self, seed: int | None = None) -> OnnxPolicy:
        """The same graph, sampling actions from its softmax (trace's ``collect`` mode)."""
        clone = copy.copy(self)  # shares the session: onnxruntime's run() is thread-safe
        clone.greedy, clone.rng = False, np.random.default_rng(seed)
        return clone

    def outputs(
        self,
        raw: np.ndarray,
        heuristic: np.ndarray | int | None = None,
        cxx: np.ndarray | int | None = None,
        survives: np.ndarray | int | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(logits [N, A], actions [N])`` for raw feature vectors ``[N, F]`` (and the heuristic's
        decisions ``[N]``, the C++ flag and whether the callee survives, which policies with those derived
        inputs need)."""
        x = np.ascontiguousarray(raw, dtype=np.float64).reshape(-1, len(self._features))
        feeds = {INPUT: x}
        for name, needed, value, what in (
            (HEURISTIC, self._needs_heuristic, heuristic, "the heuristic's decision"),
            (CXX, self._needs_language, cxx, "the module's language"),
            (SURVIVES, self.reads_callee_linkage, survives, "the callee's linkage"),
        ):
            if not needed:
                continue
            if value is None:
                raise ExportError(f"{self.path} reads {what}, and none was given")
            feeds[name] = np.broadcast_to(np.asarray(value, dtype=np.float64), (len(x),)).copy()
        logits, actions = self.session.run([LOGITS, ACTION], feeds)
        return logits, actions

    def logits(
        self,
        raw: np.ndarray,
        heuristic: np.ndarray | int | None = None,
        cxx: np.ndarray | int | None = None,
        survives: np.ndarray | int | None = None,
    ) -> np.ndarray:
        return self.outputs(raw, heuristic, cxx, survives)[0]

    def actions(
        self,
        raw: np.ndarray,
        heuristic: np.ndarray | int | None = None,
        cxx: np.ndarray | int | None = None,
        survives: np.ndarray | int | None = None,
    ) -> np.ndarray:
        """The graph's own greedy decisions (its ArgMax node) for raw feature vectors ``[N, F]``."""
        return self.outputs(raw, heuristic, cxx, survives)[1]

    def __call__(self, point: DecisionPoint) -> tuple[int, float]:
        survives = point.callee_survives if self.reads_callee_linkage else None
        logits, actions = self.outputs(point.vector(), point.heuristic, is_cxx(point.language), survives)
        row = logits[0]
        if row.size == 2:  # the binary case in plain floats, as MLPPolicy: it runs between two of clang's decisions
            a, b = float(row[0]), float(row[1])
            top = max(a, b)
            lse = top + math.log(math.exp(a - top) + math.exp(b - top))
            p1 = math.exp(b - lse)
            action = int(actions[0]) if self.greedy else int(self.rng.random() < p1)
            return action, (b if action else a) - lse
        top = float(row.max())
        log_p = row - (top + math.log(float(np.exp(row - top).sum())))
        if self.greedy:
            action = int(actions[0])
        else:
            cdf = np.cumsum(np.exp(log_p))
            action = min(int(np.searchsorted(cdf, self.rng.random() * cdf[-1], side="right")), len(row) - 1)
        return action, float(log_p[action])


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def _session(data: bytes, path: Path) -> Any:
    """An onnxruntime session on one thread: a build runs many compiles at once, each decision is
    tiny (a [1, F] input), and a thread pool per session would only fight the compilers for cores."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(data, sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime's own exception types live in a private module
        raise ExportError(f"onnxruntime cannot run {path}: {_first_line(e)}") from None


__all__ = [
    "ACTION",
    "CXX",
    "DIGEST_KEY",
    "EXPORT_FORMAT_VERSION",
    "EXPORT_KIND",
    "HEURISTIC",
    "INPUT",
    "LOGITS",
    "MASK",
    "META_KEY",
    "SCORER_FORM",
    "SCORES",
    "SUFFIX",
    "VOCAB_KEY",
    "ExportError",
    "OnnxPolicy",
    "check_metadata",
    "graph_digest",
    "read_policy_bytes",
]
