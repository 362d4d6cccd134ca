"""Tensor specs as LLVM's ``TensorSpec::toJSON`` writes them, and their raw byte layout.

LLVM writes tensors as raw bytes in the host's native byte order, one after another in header order,
so a whole observation is one fixed-size record: we describe it with a numpy structured dtype and
decode it with a single ``np.frombuffer`` call (the per-decision hot path).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from optgym.protocol.errors import ProtocolError

#: LLVM's tensor type names (``SUPPORTED_TENSOR_TYPES`` in TensorSpec.h) → numpy dtypes, native order.
DTYPES: Mapping[str, np.dtype] = {
    "int8_t": np.dtype(np.int8),
    "uint8_t": np.dtype(np.uint8),
    "int16_t": np.dtype(np.int16),
    "uint16_t": np.dtype(np.uint16),
    "int32_t": np.dtype(np.int32),
    "uint32_t": np.dtype(np.uint32),
    "int64_t": np.dtype(np.int64),
    "uint64_t": np.dtype(np.uint64),
    "float": np.dtype(np.float32),
    "double": np.dtype(np.float64),
}

#: A tensor larger than this (elements) in a header is treated as garbage rather than allocated.
MAX_ELEMENTS = 1 << 24
#: More dimensions than numpy's oldest limit (NPY_MAXDIMS = 32) is garbage too.
MAX_DIMS = 32


@dataclass(frozen=True)
class TensorSpec:
    """One named tensor: what LLVM calls a feature, the advice, or the score."""

    name: str
    type: str
    shape: tuple[int, ...]
    port: int = 0

    @property
    def dtype(self) -> np.dtype:
        return DTYPES[self.type]

    @property
    def elements(self) -> int:
        return math.prod(self.shape)  # Python ints: np.prod(int64) would wrap on a garbage header

    @property
    def nbytes(self) -> int:
        return self.elements * self.dtype.itemsize

    @classmethod
    def from_json(cls, obj: Any) -> TensorSpec:
        """Validate one header entry; anything malformed is a :class:`ProtocolError`."""
        if not isinstance(obj, dict):
            raise ProtocolError(f"tensor spec is not an object: {obj!r:.200}")
        name, type_, shape, port = obj.get("name"), obj.get("type"), obj.get("shape"), obj.get("port", 0)
        if not isinstance(name, str) or not name:
            raise ProtocolError(f"tensor spec without a name: {obj!r:.200}")
        if not isinstance(type_, str) or type_ not in DTYPES:
            raise ProtocolError(f"tensor {name!r}: unknown type {type_!r} (known: {', '.join(DTYPES)})")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise ProtocolError(f"tensor {name!r}: shape must be a list of non-negative ints, got {shape!r}")
        if not isinstance(port, int) or isinstance(port, bool):
            raise ProtocolError(f"tensor {name!r}: port must be an int, got {port!r}")
        spec = cls(name=name, type=type_, shape=tuple(shape), port=port)
        if len(shape) > MAX_DIMS or any(d > MAX_ELEMENTS for d in shape) or spec.elements > MAX_ELEMENTS:
            raise ProtocolError(f"tensor {name!r}: shape {shape!r:.200} is beyond any LLVM feature")
        return spec

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type, "port": self.port, "shape": list(self.shape)}


class RecordLayout:
    """The byte layout of one observation: the tensors of ``specs`` back to back, unpadded."""

    def __init__(self, specs: Sequence[TensorSpec]) -> None:
        self.specs = tuple(specs)
        names = [s.name for s in self.specs]
        if len(set(names)) != len(names):
            raise ProtocolError(f"duplicate tensor names in header: {names}")
        try:
            self.dtype = np.dtype(
                {
                    "names": names,
                    "formats": [(s.dtype, s.shape) if s.shape else s.dtype for s in self.specs],
                    "offsets": list(np.cumsum([0] + [s.nbytes for s in self.specs[:-1]], dtype=np.int64)),
                    "itemsize": sum(s.nbytes for s in self.specs),
                }
            )
        except ValueError as e:  # e.g. a record of 2 GiB or more: numpy's offsets are C ints
            raise ProtocolError(f"header describes a record numpy cannot lay out: {e}") from None
        self.nbytes = self.dtype.itemsize

    def decode(self, raw: bytes) -> np.void:
        """One record as a numpy structured scalar: ``rec["callee_users"]`` is a view, no copy."""
        if len(raw) != self.nbytes:
            raise ProtocolError(f"observation has {len(raw)} tensor bytes, header says {self.nbytes}")
        return np.frombuffer(raw, dtype=self.dtype, count=1)[0]

    def encode(self, values: Mapping[str, Any]) -> bytes:
        """The inverse of :meth:`decode`, for tests and for replaying transcripts."""
        return b"".join(encode_tensor(spec, values[spec.name]) for spec in self.specs)


def encode_tensor(spec: TensorSpec, value: Any) -> bytes:
    """The raw bytes LLVM reads for ``spec`` (e.g. the advice the host writes back)."""
    array = np.asarray(value, dtype=spec.dtype)
    if array.size != spec.elements:
        raise ProtocolError(f"tensor {spec.name!r} needs {spec.elements} elements, got {array.size}")
    return array.tobytes()
