"""Decoding and encoding LLVM's training-log stream (``llvm/Analysis/Utils/TrainingLogger.h``).

The stream is::

    {"features":[spec…],"score":spec?,"advice":spec?}\\n       header, once
    {"context":"name"}\\n                                       switches the context
    {"observation":N}\\n <tensor bytes in header order> \\n     one decision point
    {"outcome":N}\\n <score tensor bytes> \\n                   a reward (training logs only)

:class:`StreamDecoder` is incremental: feed it bytes as they come from a pipe and pull complete
events. Anything that does not follow the format raises :class:`ProtocolError` at once; bytes left
over at :meth:`StreamDecoder.close` mean the stream was cut short and raise too, so a caller never
sees partial data as if it were whole.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from optgym.protocol.errors import ProtocolError
from optgym.protocol.tensors import RecordLayout, TensorSpec, encode_tensor

_OBSERVATION = b'{"observation":'
_HEADER = b'{"features":'  # how every header line starts (LLVM writes the key first)

#: Longest control line accepted; a header of 100 IR2Vec-sized features is far below this.
MAX_LINE = 1 << 20


@dataclass(frozen=True)
class Header:
    features: tuple[TensorSpec, ...]
    advice: TensorSpec | None = None
    score: TensorSpec | None = None
    layout: RecordLayout = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "layout", RecordLayout(self.features))

    @property
    def feature_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.features)

    def to_json(self) -> dict[str, Any]:
        obj: dict[str, Any] = {"features": [s.to_json() for s in self.features]}
        if self.score is not None:
            obj["score"] = self.score.to_json()
        if self.advice is not None:
            obj["advice"] = self.advice.to_json()
        return obj


@dataclass(frozen=True)
class Context:
    name: str


@dataclass(frozen=True)
class Observation:
    """One decision point. ``raw`` is the tensor bytes exactly as the compiler wrote them."""

    index: int
    raw: bytes
    layout: RecordLayout = field(repr=False, compare=False)

    @property
    def record(self) -> np.void:
        return self.layout.decode(self.raw)

    def as_dict(self) -> dict[str, np.ndarray]:
        """Every feature as an array of its header shape (copies, safe to keep)."""
        rec = self.record
        return {s.name: np.array(rec[s.name], dtype=s.dtype).reshape(s.shape) for s in self.layout.specs}


@dataclass(frozen=True)
class Outcome:
    index: int
    raw: bytes
    score: TensorSpec = field(repr=False, compare=False)

    @property
    def value(self) -> np.ndarray:
        return np.frombuffer(self.raw, dtype=self.score.dtype).reshape(self.score.shape)


Event = Header | Context | Observation | Outcome


def _json(line: bytes) -> Any:
    try:
        return json.loads(line)
    except (ValueError, RecursionError) as e:  # bad UTF-8/JSON, a 5000-digit int, [[[[… nested too deep
        raise ProtocolError(f"control line is not JSON ({e}): {line[:200]!r}") from None


@functools.lru_cache(maxsize=16)
def _header_line(line: bytes) -> Header:
    """The header a line describes. Remembered: a long-lived host (optgym-cc's policy server) sees the
    same header from every compile, and parsing and laying it out cost ~0.5 ms a compile. A
    :class:`Header` is immutable, so sharing one is safe; a malformed line raises every time."""
    return _parse_header(_json(line))


def _parse_header(obj: Any) -> Header:
    if not isinstance(obj, dict) or not isinstance(obj.get("features"), list):
        raise ProtocolError(f"header must be an object with a 'features' list, got {obj!r:.200}")
    unknown = set(obj) - {"features", "advice", "score"}
    if unknown:
        raise ProtocolError(f"header has unknown keys {sorted(unknown)}")
    features = tuple(TensorSpec.from_json(f) for f in obj["features"])
    advice = TensorSpec.from_json(obj["advice"]) if "advice" in obj else None
    score = TensorSpec.from_json(obj["score"]) if "score" in obj else None
    return Header(features=features, advice=advice, score=score)


class StreamDecoder:
    """Incremental decoder. ``feed`` bytes, then iterate ``events()`` until it stops yielding."""

    def __init__(self, sessions: bool = False) -> None:
        """``sessions``: the stream may hold one session after another (a link's ThinLTO backends on one
        channel), each starting with its own header line."""
        self._sessions = sessions
        self._buffer = bytearray()
        self.header: Header | None = None
        self._pending: tuple[str, int] | None = None  # ("observation"|"outcome", index) awaiting tensor bytes
        self._observations: dict[str, int] = {}  # per context name, as LLVM's ObservationIDs
        self._context: str | None = None

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def events(self) -> Iterator[Event]:
        """Yield every complete event in the buffer, in order."""
        while (event := self.next_event()) is not None:
            yield event

    def next_event(self) -> Event | None:
        """The next complete event, or ``None`` if more bytes are needed."""
        if self._pending is not None:
            return self._take_tensors()
        newline = self._buffer.find(b"\n")
        # Check a complete line too, or the verdict on a long line would depend on how it was chunked.
        if newline > MAX_LINE or (newline < 0 and len(self._buffer) > MAX_LINE):
            raise ProtocolError(f"no newline in the first {MAX_LINE} bytes of a control line")
        if newline < 0:
            return None
        line = bytes(self._buffer[:newline])
        del self._buffer[: newline + 1]
        if self.header is not None and line.startswith(_OBSERVATION) and line.endswith(b"}"):
            digits = line[len(_OBSERVATION) : -1]
            if digits.isdigit() and len(digits) < 19:  # LLVM's exact form: skip the JSON parser (hot path)
                return self._control({"observation": int(digits)}, line)
        if self.header is None or (self._sessions and line.startswith(_HEADER)):
            self.header = _header_line(line)
            self._observations.clear()  # a new session numbers its observations from 0 again
            self._context = None
            return self.header
        return self._control(_json(line), line)

    def _control(self, obj: Any, line: bytes) -> Event | None:
        if not isinstance(obj, dict) or len(obj) != 1:
            raise ProtocolError(f"expected a one-key control object, got {line[:200]!r}")
        ((key, value),) = obj.items()
        if key == "context":
            if not isinstance(value, str):
                raise ProtocolError(f"context name must be a string, got {value!r:.200}")
            self._context = value
            return Context(value)
        if key not in ("observation", "outcome"):
            raise ProtocolError(f"unknown control key {key!r} in {line[:200]!r}")
        if self._context is None:
            raise ProtocolError(f"{key} before any context line")
        if key == "outcome" and (self.header is None or self.header.score is None):
            raise ProtocolError("outcome record but the header declares no score tensor")
        if not isinstance(value, int) or isinstance(value, bool):
            raise ProtocolError(f"{key} index must be an int, got {value!r:.200}")
        seen = self._observations.get(self._context, 0)
        # LLVM numbers observations per context from 0 and tags an outcome with the last one's number.
        expected = seen if key == "observation" else seen - 1
        if value != expected or expected < 0:
            raise ProtocolError(f"{key} {value} out of sequence in context {self._context!r}")
        if key == "observation":
            self._observations[self._context] = seen + 1
        self._pending = (key, value)
        return self._take_tensors()

    def _take_tensors(self) -> Event | None:
        assert self._pending is not None and self.header is not None
        kind, index = self._pending
        size = self.header.layout.nbytes if kind == "observation" else self.header.score.nbytes  # type: ignore[union-attr]
        if len(self._buffer) < size + 1:
            return None
        raw = bytes(self._buffer[:size])
        if self._buffer[size] != 0x0A:
            raise ProtocolError(f"{kind} {index}: tensor bytes not followed by a newline")
        del self._buffer[: size + 1]
        self._pending = None
        if kind == "observation":
            return Observation(index=index, raw=raw, layout=self.header.layout)
        return Outcome(index=index, raw=raw, score=self.header.score)  # type: ignore[arg-type]

    def close(self) -> None:
        """Declare end of stream; raise if it ended inside an event or before the header."""
        if self._pending is not None:
            kind, index = self._pending
            raise ProtocolError(f"stream cut short inside {kind} {index} ({len(self._buffer)} bytes buffered)")
        if self._buffer:
            raise ProtocolError(f"stream cut short: {len(self._buffer)} bytes of an unfinished line")
        if self.header is None:
            raise ProtocolError("stream ended before the header")


def decode_stream(data: bytes) -> list[Event]:
    """Decode a complete stream; a truncated or malformed one raises :class:`ProtocolError`."""
    decoder = StreamDecoder()
    decoder.feed(data)
    events = list(decoder.events())
    decoder.close()
    return events


def _line(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def encode_header(header: Header) -> bytes:
    return _line(header.to_json())


def encode_context(name: str) -> bytes:
    return _line({"context": name})


def encode_observation(header: Header, index: int, values: dict[str, Any]) -> bytes:
    return _line({"observation": index}) + header.layout.encode(values) + b"\n"


def encode_outcome(header: Header, index: int, value: Any) -> bytes:
    if header.score is None:
        raise ProtocolError("header declares no score tensor")
    return _line({"outcome": index}) + encode_tensor(header.score, value) + b"\n"
