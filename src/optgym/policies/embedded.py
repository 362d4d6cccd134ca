"""The numpy policy inside an exported ONNX file: how optgym itself runs an export.

Why not onnxruntime: a served build asks the policy one decision at a time, between two of clang's
feature computations (~150 µs each). onnxruntime costs 28–45 µs per single-row call and numpy's
:class:`~optgym.policies.mlp.MLPPolicy` ~16 µs; importing ``onnx`` and ``onnxruntime`` adds ~0.3 s
to the start of the policy server, which the first compiles of a cold build wait for. So
``optgym export`` also embeds the training policy's directory (``policy.json``, ``weights.npz``,
``vocab.json`` — byte for byte) in the file's metadata, and optgym serves *that* with the very
class it was trained as: the decisions are the training policy's by construction, and the graph
stays what any other ONNX runtime runs (the export checks that the two agree before writing).

Reading needs neither ``onnx`` nor protobuf: :func:`read_model_fields` walks the top level of the
``ModelProto`` wire format (a handful of lines) for the graph's bytes and ``metadata_props``. What
is checked before serving:

* ``optgym.policy``  JSON ``{"format": 1, "files": {name: {"base64": …} | {"metadata": KEY}}}``:
                     the policy directory (``vocab.json`` is the ``optgym.vocab`` entry already
                     there, byte for byte, so it is referred to rather than stored twice). Its
                     files must hash to the policy identity recorded at export
                     (``metadata["export"]["policy_identity"]``).
* ``optgym.graph.sha256``  sha256 of the graph's bytes as the export wrote them. A match means the
                     graph is the one the export verified against this policy. A mismatch means a
                     damaged file — or one re-saved by another ONNX tool, which may lay the same
                     graph out differently — so the full check runs (``onnx`` and the graph digest,
                     :class:`~optgym.policies.exported.OnnxPolicy`): a damaged graph is refused as
                     before, an intact re-saved one is served from its embedded policy.

Files without ``optgym.policy`` (exports of older optgym versions) load as
:class:`~optgym.policies.exported.OnnxPolicy` and run on onnxruntime, as before.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import tempfile
from pathlib import Path
from typing import Any, cast

from optgym.policies import file_identity
from optgym.policies.exported import (
    VOCAB_KEY,
    ExportError,
    OnnxPolicy,
    check_metadata,
    read_policy_bytes,
)
from optgym.policies.mlp import MLPPolicy, PolicyFileError
from optgym.policies.scorer import CandidateScorer

POLICY_KEY, GRAPH_SHA_KEY = "optgym.policy", "optgym.graph.sha256"
EMBED_FORMAT = 1
#: ``ModelProto`` field numbers (onnx.proto): ``graph`` and ``metadata_props``.
_GRAPH_FIELD, _METADATA_FIELD = 7, 14


class WireError(ValueError):
    """Bytes that are not a well-formed protobuf message."""


def _varint(data: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise WireError("truncated or overlong varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(data: memoryview) -> list[tuple[int, int, Any]]:
    """``(field number, wire type, value)`` of one message's top level; length-delimited values are
    sub-views (not parsed further), everything else is skipped over correctly."""
    out, pos = [], 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        value: int | memoryview
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 1 or wire == 5:
            size = 8 if wire == 1 else 4
            value, pos = data[pos : pos + size], pos + size
        elif wire == 2:
            size, pos = _varint(data, pos)
            value, pos = data[pos : pos + size], pos + size
        else:  # groups (3, 4) are not in onnx.proto; 6, 7 do not exist
            raise WireError(f"wire type {wire} at byte {pos}")
        if pos > len(data) or number == 0:
            raise WireError("truncated message")
        out.append((number, wire, value))
    return out


def read_model_fields(data: bytes) -> tuple[bytes | None, dict[str, str]]:
    """``(graph bytes, metadata_props)`` of a serialized ``ModelProto``, without onnx or protobuf."""
    graph: bytes | None = None
    props: dict[str, str] = {}
    for number, wire, value in _fields(memoryview(data)):
        if wire != 2:
            continue
        if number == _GRAPH_FIELD:
            if graph is not None:  # protobuf would merge two; an export writes one
                raise WireError("two graph fields")
            graph = bytes(value)
        elif number == _METADATA_FIELD:
            entry = {n: bytes(v) for n, w, v in _fields(value) if w == 2}
            try:
                props[entry.get(1, b"").decode()] = entry.get(2, b"").decode()
            except UnicodeDecodeError as e:
                raise WireError(f"metadata that is not UTF-8: {e}") from None
    return graph, props


# -- writing (optgym export) ---------------------------------------------------------------------


def embed_properties(policy_dir: Path, graph: bytes, vocab_text: str) -> dict[str, str]:
    """The metadata entries that embed ``policy_dir`` in an export whose graph serializes to ``graph``."""
    files: dict[str, dict[str, str]] = {}
    for path in sorted(p for p in policy_dir.iterdir() if p.is_file()):
        data = path.read_bytes()
        if path.name == "vocab.json" and data == vocab_text.encode():
            files[path.name] = {"metadata": VOCAB_KEY}
        else:
            files[path.name] = {"base64": base64.b64encode(data).decode("ascii")}
    payload = {"format": EMBED_FORMAT, "files": files}
    return {POLICY_KEY: json.dumps(payload, sort_keys=True), GRAPH_SHA_KEY: hashlib.sha256(graph).hexdigest()}


# -- reading -------------------------------------------------------------------------------------


class ExportedPolicy(MLPPolicy):
    """An exported policy served by numpy: the training policy itself (:class:`MLPPolicy`, loaded from
    the embedded directory), plus the file's ``path`` and ``metadata`` as :class:`OnnxPolicy` has them."""

    path: Path
    metadata: dict[str, Any]


class ExportedScorer(CandidateScorer):
    """An exported candidate scorer served by numpy: the trained scorer, plus ``path`` and ``metadata``."""

    path: Path
    metadata: dict[str, Any]


#: How each kind of policy identity (``export.policy_identity``, "KIND:sha256") is loaded.
_EXPORTED: dict[str, type[ExportedPolicy] | type[ExportedScorer]] = {"mlp": ExportedPolicy, "scorer": ExportedScorer}


def _unpack(path: Path, props: dict[str, str], directory: Path) -> None:
    """Write the embedded policy directory's files into ``directory``."""
    try:
        payload = json.loads(props[POLICY_KEY])
        if payload.get("format") != EMBED_FORMAT:
            raise ExportError(f"{path}: embedded policy format {payload.get('format')!r}, expected {EMBED_FORMAT}")
        for name, entry in payload["files"].items():
            if "/" in name or name.startswith("."):
                raise ExportError(f"{path}: embedded policy file name {name!r}")
            if "metadata" in entry:
                data = props[entry["metadata"]].encode()
            else:
                data = base64.b64decode(entry["base64"], validate=True)
            (directory / name).write_bytes(data)
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # JSON, base64, shapes
        raise ExportError(f"{path} is damaged: its embedded policy cannot be read ({type(e).__name__})") from None


def load_embedded(path: Path | str, into: Path | None = None) -> ExportedPolicy | ExportedScorer | None:
    """The numpy policy embedded in an exported file, verified (see the module doc); ``None`` when the
    file embeds none (an older export: run it with :class:`OnnxPolicy`). ``into``: keep the embedded policy
    directory there (made if missing) instead of a temporary one."""
    path = Path(path)
    data = read_policy_bytes(path)
    try:
        graph, props = read_model_fields(data)
    except WireError as e:
        raise ExportError(f"{path} is not a valid ONNX policy (damaged or not ONNX): {e}") from None
    if graph is None:
        raise ExportError(f"{path} is not a valid ONNX policy (damaged or not ONNX): no graph")
    metadata = check_metadata(path, props)
    if POLICY_KEY not in props:
        return None
    if props.get(GRAPH_SHA_KEY) != hashlib.sha256(graph).hexdigest():
        OnnxPolicy.load(path)  # damaged (refused here, clearly) or laid out anew by another tool (fine)
    kind, _, expected = str((metadata.get("export") or {}).get("policy_identity", "")).partition(":")
    if kind not in _EXPORTED:
        raise ExportError(
            f"{path}: embedded policy of unknown kind {kind!r} (this optgym reads {', '.join(_EXPORTED)})"
        )
    with contextlib.nullcontext(str(into)) if into else tempfile.TemporaryDirectory(prefix="optgym-policy-") as tmp:
        directory = Path(tmp)
        directory.mkdir(parents=True, exist_ok=True)
        _unpack(path, props, directory)
        if file_identity(directory) != expected:
            raise ExportError(f"{path} is damaged: its embedded policy is not the one it was exported from")
        try:
            # the class's own load (a scorer's may be one of its forms): given path and metadata below
            policy = cast("ExportedPolicy | ExportedScorer", _EXPORTED[kind].load(directory))
        except (PolicyFileError, OSError, ValueError) as e:
            raise ExportError(f"{path}: its embedded policy cannot be loaded: {e}") from None
    if policy.feature_names != list(metadata.get("features") or []):
        raise ExportError(f"{path}: the embedded policy's features differ from the recorded ones")
    policy.path, policy.metadata = path, metadata
    # What the server checks against the compiler: the export's record (compiler included).
    policy.source = {**policy.source, **(metadata.get("source") or {})}
    if metadata.get("compiler"):
        policy.source.setdefault("compiler", metadata["compiler"])
    return policy


def unpack_policy(path: Path | str, directory: Path | str) -> Path:
    """Write the policy directory an exported file embeds into ``directory`` (made if missing), verified by
    :func:`load_embedded`: the training policy a run can start from again (``train es --warmstart FILE.onnx``).
    Raises :class:`ExportError` for a file that embeds none."""
    if load_embedded(path, into=Path(directory)) is None:
        raise ExportError(f"{path} embeds no optgym policy (an older export): it cannot be trained further")
    return Path(directory)


__all__ = [
    "ExportedPolicy",
    "ExportedScorer",
    "WireError",
    "embed_properties",
    "load_embedded",
    "read_model_fields",
    "unpack_policy",
]
