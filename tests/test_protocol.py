"""The protocol layer: LLVM's interactive training-log stream and optgym's transcripts, over bytes.

Property tests generate whole streams (headers of every LLVM tensor type and odd shapes, contexts
that are revisited, observations with arbitrary values including NaNs, outcomes), encode them with
the module's own encoders and check that decoding — at once, incrementally in any chunking, or cut
short anywhere — gives back exactly what went in or raises :class:`ProtocolError`. Fuzz tests check
that garbage never leaks another exception type and never hangs.
"""

from __future__ import annotations

import io
import json
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from optgym.protocol import (
    DTYPES,
    Context,
    Header,
    Observation,
    Outcome,
    ProtocolError,
    RecordLayout,
    StreamDecoder,
    TensorSpec,
    decode_stream,
    encode_context,
    encode_header,
    encode_observation,
    encode_outcome,
    encode_tensor,
)
from optgym.protocol.stream import MAX_LINE
from optgym.protocol.tensors import MAX_ELEMENTS
from optgym.protocol.transcript import MAGIC, TranscriptWriter, parse_transcript, read_transcript

pytestmark = pytest.mark.timeout(120)  # "never hang": a decoder loop that stops consuming fails here

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

LLVM_TYPES = sorted(DTYPES)


# --------------------------------------------------------------------------------------------------
# Strategies: a stream is a header plus a script of events, with the bytes and the expected events.


@dataclass
class Stream:
    header: Header
    data: bytes = b""
    expected: list[tuple] = field(default_factory=list)  # ("header", h) | ("context", n) | ("obs", i, raw, values) | …
    boundaries: list[int] = field(default_factory=list)  # byte offset after each event (header first)

    def add(self, encoded: bytes, expected: tuple) -> None:
        self.data += encoded
        self.expected.append(expected)
        self.boundaries.append(len(self.data))


shapes = st.one_of(
    st.just(()),  # a scalar, as LLVM's TensorSpec with shape {} would never be, but the format allows
    st.lists(st.integers(0, 4), min_size=1, max_size=3).map(tuple),  # multi-dim, zero-size dims
)
names = st.text(min_size=1, max_size=6)  # any unicode, including what JSON must escape


@st.composite
def tensor_specs(draw: st.DrawFn, name: str | None = None) -> TensorSpec:
    return TensorSpec(
        name=name if name is not None else draw(names),
        type=draw(st.sampled_from(LLVM_TYPES)),
        shape=draw(shapes),
        port=draw(st.integers(0, 3)),
    )


@st.composite
def headers(draw: st.DrawFn) -> Header:
    feature_names = draw(st.lists(names, min_size=0, max_size=5, unique=True))
    features = tuple(draw(tensor_specs(n)) for n in feature_names)
    advice = draw(st.none() | tensor_specs())
    score = draw(st.none() | tensor_specs())
    return Header(features=features, advice=advice, score=score)


def tensor_values(spec: TensorSpec) -> st.SearchStrategy[np.ndarray]:
    # hypothesis' float elements include NaN (with any payload), ±inf, -0.0 and subnormals
    return hnp.arrays(spec.dtype, spec.shape)


def raw_of(spec: TensorSpec, value: np.ndarray) -> bytes:
    """The bytes LLVM would write, computed without the module: native order, C order."""
    assert value.dtype == spec.dtype and value.shape == spec.shape
    return np.ascontiguousarray(value).tobytes()


@st.composite
def streams(draw: st.DrawFn, header: Header | None = None, max_events: int = 12) -> Stream:
    header = header if header is not None else draw(headers())
    s = Stream(header)
    s.add(encode_header(header), ("header", header))
    counts: dict[str, int] = {}  # observations per context name, persisting across revisits
    context: str | None = None
    for _ in range(draw(st.integers(0, max_events))):
        choices = ["context"]
        if context is not None:
            choices.append("obs")
            if header.score is not None and counts[context] > 0:
                choices.append("outcome")
        kind = draw(st.sampled_from(choices))
        if kind == "context":
            context = draw(st.sampled_from(sorted(counts)) | names) if counts else draw(names)
            counts.setdefault(context, 0)
            s.add(encode_context(context), ("context", context))
        elif kind == "obs":
            assert context is not None
            values = {f.name: draw(tensor_values(f)) for f in header.features}
            raw = b"".join(raw_of(f, values[f.name]) for f in header.features)
            index = counts[context]
            counts[context] += 1
            s.add(encode_observation(header, index, values), ("obs", index, raw, values))
        else:
            assert context is not None and header.score is not None
            value = draw(tensor_values(header.score))
            index = counts[context] - 1
            s.add(encode_outcome(header, index, value), ("outcome", index, raw_of(header.score, value)))
    return s


def check_event(event: Any, expected: tuple, header: Header) -> None:
    kind = expected[0]
    if kind == "header":
        assert isinstance(event, Header)
        assert event == expected[1]
        assert event.feature_names == tuple(f.name for f in header.features)
        assert event.layout.nbytes == sum(f.nbytes for f in header.features)
    elif kind == "context":
        assert event == Context(expected[1])
    elif kind == "obs":
        _, index, raw, values = expected
        assert isinstance(event, Observation)
        assert event.index == index
        assert event.raw == raw
        as_dict = event.as_dict()
        assert list(as_dict) == [f.name for f in header.features]
        for f in header.features:
            got = as_dict[f.name]
            assert got.dtype == f.dtype
            assert got.shape == f.shape
            assert got.tobytes() == values[f.name].tobytes()  # bytewise: NaN payloads, -0.0 included
    else:
        _, index, raw = expected
        assert isinstance(event, Outcome)
        assert event.index == index
        assert event.raw == raw
        assert event.value.dtype == header.score.dtype
        assert event.value.shape == header.score.shape
        assert event.value.tobytes() == raw


def check_events(events: list, s: Stream, upto: int | None = None) -> None:
    expected = s.expected if upto is None else s.expected[:upto]
    assert len(events) == len(expected)
    for event, exp in zip(events, expected, strict=True):
        check_event(event, exp, s.header)


def decode_chunked(data: bytes, sizes: list[int]) -> list:
    """Feed ``data`` in chunks of ``sizes`` (cycled), pulling events after each feed, then close."""
    decoder, events, pos, i = StreamDecoder(), [], 0, 0
    while pos < len(data):
        size = sizes[i % len(sizes)]
        decoder.feed(data[pos : pos + size])
        pos, i = pos + size, i + 1
        events.extend(decoder.events())
    events.extend(decoder.events())
    decoder.close()
    assert decoder.buffered == 0
    return events


def outcome_of(fn, *args) -> tuple[str, Any]:
    """("ok", events) or ("error", None); any exception other than ProtocolError propagates."""
    try:
        return "ok", fn(*args)
    except ProtocolError:
        return "error", None


# --------------------------------------------------------------------------------------------------
# 1. Round trip


@given(streams())
@FAST
def test_round_trip(s: Stream) -> None:
    check_events(decode_stream(s.data), s)


@given(streams(), streams())
@FAST
def test_sessions_one_after_another_on_one_stream(first: Stream, second: Stream) -> None:
    """The backends of one link share a channel, one session after another: each starts with its header and
    numbers its observations from 0 again. A decoder told so decodes both; one that is not refuses the second
    header."""
    decoder = StreamDecoder(sessions=True)
    decoder.feed(first.data + second.data)
    events = list(decoder.events())
    decoder.close()
    count = len(first.expected)
    check_events(events[:count], first)
    check_events(events[count:], second)
    with pytest.raises(ProtocolError):
        decode_stream(first.data + second.data)


def test_golden_bytes_as_llvm_writes_them() -> None:
    """Hand-written bytes in LLVM's layout, independent of the module's encoders."""
    header = (
        b'{"features":[{"name":"callee_users","port":0,"shape":[1],"type":"int64_t"},'
        b'{"name":"grid","port":0,"shape":[2,3],"type":"float"}],'
        b'"score":{"name":"reward","port":0,"shape":[1],"type":"float"},'
        b'"advice":{"name":"inlining_decision","port":0,"shape":[1],"type":"int64_t"}}\n'
    )
    grid = struct.pack("=6f", 0.5, 1.5, 2.5, -1.0, 0.0, 3.25)
    data = (
        header
        + b'{"context":"main"}\n'
        + b'{"observation":0}\n'
        + struct.pack("=q", 7)
        + grid
        + b"\n"
        + b'{"context":"f"}\n'
        + b'{"observation":0}\n'
        + struct.pack("=q", -1)
        + grid
        + b"\n"
        + b'{"context":"main"}\n'
        + b'{"observation":1}\n'
        + struct.pack("=q", 10)  # the record may contain 0x0A bytes anywhere
        + struct.pack("=6f", *[0.0] * 6)
        + b"\n"
        + b'{"outcome":1}\n'
        + struct.pack("=f", 2.0)
        + b"\n"
    )
    h, c1, o1, c2, o2, c3, o3, out = decode_stream(data)
    assert isinstance(h, Header)
    assert h.feature_names == ("callee_users", "grid")
    assert h.advice == TensorSpec("inlining_decision", "int64_t", (1,))
    assert h.score == TensorSpec("reward", "float", (1,))
    assert h.layout.nbytes == 8 + 24
    assert [c1, c2, c3] == [Context("main"), Context("f"), Context("main")]
    assert [o1.index, o2.index, o3.index] == [0, 0, 1]  # numbered per context, kept on revisit
    assert o1.as_dict()["callee_users"].tolist() == [7]
    assert o1.as_dict()["grid"].tolist() == [[0.5, 1.5, 2.5], [-1.0, 0.0, 3.25]]
    assert o1.record["callee_users"][0] == 7  # the zero-copy structured view
    assert o2.as_dict()["callee_users"].tolist() == [-1]
    assert o3.as_dict()["callee_users"].tolist() == [10]
    assert isinstance(out, Outcome) and out.index == 1 and out.value.tolist() == [2.0]


def test_encoders_write_the_wire_format() -> None:
    spec = TensorSpec("x", "int32_t", (2,))
    header = Header(features=(spec,), score=TensorSpec("r", "double", ()))
    assert encode_context("m") == b'{"context":"m"}\n'
    assert encode_observation(header, 3, {"x": [1, 2]}) == b'{"observation":3}\n' + struct.pack("=2i", 1, 2) + b"\n"
    assert encode_outcome(header, 0, 1.5) == b'{"outcome":0}\n' + struct.pack("=d", 1.5) + b"\n"
    assert json.loads(encode_header(header)) == {
        "features": [{"name": "x", "type": "int32_t", "port": 0, "shape": [2]}],
        "score": {"name": "r", "type": "double", "port": 0, "shape": []},
    }


def test_header_with_only_zero_size_features() -> None:
    header = Header(features=(TensorSpec("a", "float", (0,)), TensorSpec("b", "int8_t", (2, 0))))
    data = encode_header(header) + encode_context("c") + encode_observation(header, 0, {"a": [], "b": []})
    _, _, obs = decode_stream(data)
    assert obs.raw == b""
    d = obs.as_dict()
    assert d["a"].shape == (0,) and d["b"].shape == (2, 0)


# --------------------------------------------------------------------------------------------------
# 2. Incremental decoding


@given(streams(), st.lists(st.integers(1, 64), min_size=1, max_size=20))
@FAST
def test_incremental_random_chunks(s: Stream, sizes: list[int]) -> None:
    check_events(decode_chunked(s.data, sizes), s)


@given(streams(max_events=6))
@settings(max_examples=25, deadline=None)
def test_incremental_one_byte_chunks(s: Stream) -> None:
    check_events(decode_chunked(s.data, [1]), s)


@given(streams())
@FAST
def test_incremental_yields_each_event_as_soon_as_complete(s: Stream) -> None:
    """Feeding exactly up to an event boundary yields that event, not later; no event before it."""
    decoder, got = StreamDecoder(), []
    start = 0
    for boundary in s.boundaries:
        chunk = s.data[start:boundary]
        decoder.feed(chunk[:-1])
        assert list(decoder.events()) == []  # one byte short of the event: nothing yet
        decoder.feed(chunk[-1:])
        new = list(decoder.events())
        assert len(new) == 1
        got += new
        start = boundary
    decoder.close()
    check_events(got, s)


# --------------------------------------------------------------------------------------------------
# 3. Truncation


@given(st.data(), streams())
@FAST
def test_truncation(data: st.DataObject, s: Stream) -> None:
    cut = data.draw(st.integers(0, len(s.data) - 1), label="cut")
    prefix = s.data[:cut]
    if cut in s.boundaries:
        check_events(decode_stream(prefix), s, upto=s.boundaries.index(cut) + 1)
    else:
        with pytest.raises(ProtocolError):
            decode_stream(prefix)
        # incrementally, the complete events before the cut come out and nothing partial does
        complete = sum(1 for b in s.boundaries if b <= cut)
        decoder = StreamDecoder()
        decoder.feed(prefix)
        check_events(list(decoder.events()), s, upto=complete)
        with pytest.raises(ProtocolError):
            decoder.close()


def test_truncation_every_cut_of_one_stream() -> None:
    """Exhaustively, for one stream with every kind of event."""
    header = Header(
        features=(TensorSpec("a", "int64_t", (2,)), TensorSpec("b", "double", ())),
        score=TensorSpec("r", "float", (1,)),
    )
    data = b"".join(
        [
            encode_header(header),
            encode_context("x"),
            encode_observation(header, 0, {"a": [10, 10], "b": 10.0}),  # 0x0A bytes inside tensors
            encode_outcome(header, 0, [1.0]),
        ]
    )
    ends = {
        len(encode_header(header)),
        len(encode_header(header)) + len(encode_context("x")),
        len(data) - len(encode_outcome(header, 0, [1.0])),
        len(data),
    }
    for cut in range(len(data) + 1):
        if cut in ends:
            assert len(decode_stream(data[:cut])) == 1 + sorted(ends).index(cut)
        else:
            with pytest.raises(ProtocolError):
                decode_stream(data[:cut])


# --------------------------------------------------------------------------------------------------
# 4. Garbage

SIMPLE = Header(features=(TensorSpec("a", "int32_t", (2,)),), score=TensorSpec("r", "float", ()))
SIMPLE_HEADER = encode_header(SIMPLE)
NOSCORE = Header(features=(TensorSpec("a", "int32_t", (2,)),))


def obs_bytes(index: int, header: Header = SIMPLE) -> bytes:
    return encode_observation(header, index, {"a": [1, 2]})


@given(st.binary(max_size=300))
@FUZZ
def test_fuzz_random_bytes(data: bytes) -> None:
    whole = outcome_of(decode_stream, data)
    if not data.endswith(b"\n"):  # every valid stream ends with a newline
        assert whole[0] == "error"
    if whole[0] == "ok":
        assert isinstance(whole[1][0], Header)


@given(st.binary(max_size=300), st.lists(st.integers(1, 17), min_size=1, max_size=5))
@FUZZ
def test_fuzz_random_bytes_after_a_valid_header(tail: bytes, sizes: list[int]) -> None:
    data = SIMPLE_HEADER + tail
    whole = outcome_of(decode_stream, data)
    if not tail.endswith(b"\n") and tail:
        assert whole[0] == "error"
    if whole[0] == "ok":
        assert whole[1][0] == SIMPLE
        assert all(isinstance(e, Context | Observation | Outcome) for e in whole[1][1:])
    chunked = outcome_of(decode_chunked, data, sizes)
    assert chunked[0] == whole[0]  # the verdict does not depend on how bytes arrived
    if whole[0] == "ok":
        assert [(type(e), getattr(e, "index", None), getattr(e, "raw", None)) for e in chunked[1]] == [
            (type(e), getattr(e, "index", None), getattr(e, "raw", None)) for e in whole[1]
        ]


control_lines = st.one_of(
    st.builds(encode_context, st.sampled_from(["a", "b"])),
    st.integers(-1, 3).map(lambda i: b'{"observation":%d}\n' % i),
    st.integers(-1, 3).map(lambda i: b'{"outcome":%d}\n' % i),
    st.binary(min_size=0, max_size=12),  # tensor bytes of the wrong length, or noise
    st.just(b"\n"),
    st.sampled_from([b"{}\n", b"[]\n", b"null\n", b'{"context":1}\n', b'{"observation":0.0}\n']),
)


@given(st.lists(control_lines, max_size=12), st.lists(st.integers(1, 9), min_size=1, max_size=4))
@FUZZ
def test_fuzz_plausible_event_soup(pieces: list[bytes], sizes: list[int]) -> None:
    """Near-valid streams: real control lines in random order with random tensor bytes between."""
    data = SIMPLE_HEADER + b"".join(pieces)
    whole = outcome_of(decode_stream, data)
    chunked = outcome_of(decode_chunked, data, sizes)
    assert chunked[0] == whole[0]
    if whole[0] == "ok":
        # whatever decoded must obey the numbering rules: per context from 0, outcome = last observation
        counts: dict[str, int] = {}
        context = None
        for e in whole[1][1:]:
            if isinstance(e, Context):
                context = e.name
                counts.setdefault(context, 0)
            elif isinstance(e, Observation):
                assert e.index == counts[context] and len(e.raw) == 8
                counts[context] += 1
            else:
                assert isinstance(e, Outcome) and e.index == counts[context] - 1 >= 0 and len(e.raw) == 4


@given(st.data(), streams(max_events=6))
@FUZZ
def test_fuzz_mutated_valid_stream(data: st.DataObject, s: Stream) -> None:
    """Flip, insert or delete bytes of a valid stream: decoding still only ever raises ProtocolError."""
    buf = bytearray(s.data)
    for _ in range(data.draw(st.integers(1, 4), label="mutations")):
        pos = data.draw(st.integers(0, len(buf)), label="pos")
        op = data.draw(st.sampled_from(["flip", "insert", "delete"]), label="op")
        if op == "insert" or pos == len(buf):
            buf[pos:pos] = data.draw(st.binary(min_size=1, max_size=3), label="inserted")
        elif op == "flip":
            buf[pos] ^= data.draw(st.integers(1, 255), label="xor")
        else:
            del buf[pos]
    sizes = data.draw(st.lists(st.integers(1, 32), min_size=1, max_size=4), label="sizes")
    whole = outcome_of(decode_stream, bytes(buf))
    chunked = outcome_of(decode_chunked, bytes(buf), sizes)
    assert chunked[0] == whole[0]


def spec(**overrides: Any) -> dict[str, Any]:
    return {"name": "a", "type": "float", "port": 0, "shape": [1], **overrides}


def header_line(obj: Any) -> bytes:
    return json.dumps(obj).encode() + b"\n"


BAD_HEADERS = {
    "not json": b"{features: []}\n",
    "truncated json": b'{"features":[\n',
    "invalid utf-8": b'{"features":[{"name":"\xff\xfe","type":"float","shape":[1]}]}\n',
    "lone continuation byte": b"\x80\n",
    "empty line": b"\n",
    "a list": b"[]\n",
    "a string": b'"features"\n',
    "null": b"null\n",
    "no features": b'{"score":{"name":"r","type":"float","shape":[1]}}\n',
    "features not a list": header_line({"features": {"a": 1}}),
    "unknown key": header_line({"features": [], "reward": spec()}),
    "feature not an object": header_line({"features": ["a"]}),
    "feature without name": header_line({"features": [{"type": "float", "shape": [1]}]}),
    "empty name": header_line({"features": [spec(name="")]}),
    "name not a string": header_line({"features": [spec(name=3)]}),
    "unknown type": header_line({"features": [spec(type="float32")]}),
    "type bool": header_line({"features": [spec(type="bool")]}),
    "type not a string": header_line({"features": [spec(type=4)]}),
    "missing shape": header_line({"features": [{"name": "a", "type": "float"}]}),
    "shape not a list": header_line({"features": [spec(shape=3)]}),
    "negative dim": header_line({"features": [spec(shape=[2, -1])]}),
    "bool dim": header_line({"features": [spec(shape=[True])]}),
    "float dim": header_line({"features": [spec(shape=[1.0])]}),
    "string dim": header_line({"features": [spec(shape=["1"])]}),
    "null dim": header_line({"features": [spec(shape=[None])]}),
    "port bool": header_line({"features": [spec(port=False)]}),
    "port string": header_line({"features": [spec(port="0")]}),
    "duplicate names": header_line({"features": [spec(), spec(type="int8_t")]}),
    "huge tensor": header_line({"features": [spec(shape=[MAX_ELEMENTS + 1])]}),
    "dims overflowing int64": header_line({"features": [spec(shape=[2**32, 2**32])]}),
    "dims wrapping negative in int64": header_line({"features": [spec(shape=[2**62, 2])]}),
    "dim beyond int64": header_line({"features": [spec(shape=[2**70])]}),
    "zero times a huge dim": header_line({"features": [spec(shape=[0, 10**30])]}),
    "too many dims": header_line({"features": [spec(shape=[1] * 100)]}),
    "record of 2 GiB": header_line(
        {"features": [spec(name=f"f{i}", type="double", shape=[1 << 24]) for i in range(17)]}
    ),
    "bad advice": header_line({"features": [], "advice": spec(type="half")}),
    "bad score": header_line({"features": [], "score": spec(shape=[-1])}),
    "score null": header_line({"features": [], "score": None}),
    "deeply nested": b"[" * 100_000 + b"]" * 100_000 + b"\n",
    "5000-digit dim": b'{"features":[{"name":"a","type":"float","shape":[' + b"9" * 5000 + b"]}]}\n",
}


@pytest.mark.parametrize("line", BAD_HEADERS.values(), ids=BAD_HEADERS.keys())
def test_bad_header(line: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_stream(line)
    with pytest.raises(ProtocolError):  # and incrementally, before any close()
        decoder = StreamDecoder()
        decoder.feed(line)
        list(decoder.events())


BAD_BODIES = {
    "control line not json": b'{"context":"a"}\n{observation:0}\n',
    "control line invalid utf-8": b'{"context":"\xc3"}\n',
    "control list": b"[1]\n",
    "control scalar": b"0\n",
    "control null": b"null\n",
    "control empty object": b"{}\n",
    "control two keys": b'{"context":"a","observation":0}\n',
    "unknown control key": b'{"context":"a"}\n{"decision":0}\n',
    "context not a string": b'{"context":5}\n',
    "context null": b'{"context":null}\n',
    "observation before any context": obs_bytes(0),
    "outcome before any context": b'{"outcome":0}\n' + struct.pack("=f", 1.0) + b"\n",
    "first observation numbered 1": b'{"context":"a"}\n' + obs_bytes(1),
    "negative observation index": b'{"context":"a"}\n' + obs_bytes(-1),
    "repeated observation index": b'{"context":"a"}\n' + obs_bytes(0) + obs_bytes(0),
    "skipped observation index": b'{"context":"a"}\n' + obs_bytes(0) + obs_bytes(2),
    "revisited context restarts at 0": b'{"context":"a"}\n'
    + obs_bytes(0)
    + b'{"context":"b"}\n'
    + obs_bytes(0)
    + b'{"context":"a"}\n'
    + obs_bytes(0),
    "observation index float": b'{"context":"a"}\n{"observation":0.0}\n' + struct.pack("=2i", 1, 2) + b"\n",
    "observation index bool": b'{"context":"a"}\n{"observation":false}\n' + struct.pack("=2i", 1, 2) + b"\n",
    "observation index string": b'{"context":"a"}\n{"observation":"0"}\n' + struct.pack("=2i", 1, 2) + b"\n",
    "observation index 5000 digits": b'{"context":"a"}\n{"observation":' + b"1" * 5000 + b"}\n",
    "outcome before any observation": b'{"context":"a"}\n{"outcome":0}\n' + struct.pack("=f", 1.0) + b"\n",
    "outcome with a negative index": b'{"context":"a"}\n{"outcome":-1}\n' + struct.pack("=f", 1.0) + b"\n",
    "outcome ahead of the observation": b'{"context":"a"}\n'
    + obs_bytes(0)
    + b'{"outcome":1}\n'
    + struct.pack("=f", 1.0)
    + b"\n",
    "outcome for another context": b'{"context":"a"}\n'
    + obs_bytes(0)
    + b'{"context":"b"}\n{"outcome":0}\n'
    + struct.pack("=f", 1.0)
    + b"\n",
    "tensor bytes not followed by newline": b'{"context":"a"}\n{"observation":0}\n' + struct.pack("=2i", 1, 2) + b"X",
    "one tensor byte too many": b'{"context":"a"}\n{"observation":0}\n' + struct.pack("=2i", 1, 2) + b"\0\n",
    "one tensor byte too few then a line": b'{"context":"a"}\n{"observation":0}\n' + b"\1" * 7 + b"\n" + b"{}\n",
    "score bytes not followed by newline": b'{"context":"a"}\n' + obs_bytes(0) + b'{"outcome":0}\n1234X',
}


@pytest.mark.parametrize("body", BAD_BODIES.values(), ids=BAD_BODIES.keys())
def test_bad_body(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_stream(SIMPLE_HEADER + body)


def test_bad_body_cases_are_minimal() -> None:
    """The valid counterparts decode, so each bad case fails for the reason its name says."""
    ok = [
        b'{"context":"a"}\n' + obs_bytes(0) + obs_bytes(1),
        b'{"context":"a"}\n' + obs_bytes(0) + b'{"context":"b"}\n' + obs_bytes(0) + b'{"context":"a"}\n' + obs_bytes(1),
        b'{"context":"a"}\n' + obs_bytes(0) + b'{"outcome":0}\n' + struct.pack("=f", 1.0) + b"\n",
        b'{"context":"a"}\n' + obs_bytes(0) + obs_bytes(1) + b'{"outcome":1}\n' + struct.pack("=f", 1.0) + b"\n",
        b'{"context":"a"}\n{"observation":0}\n' + b"\n" * 8 + b"\n",  # tensor bytes may be all newlines
    ]
    for body in ok:
        events = decode_stream(SIMPLE_HEADER + body)
        assert isinstance(events[-1], Observation | Outcome)


def test_outcome_without_score_spec() -> None:
    data = encode_header(NOSCORE) + b'{"context":"a"}\n' + obs_bytes(0, NOSCORE) + b'{"outcome":0}\n\n'
    with pytest.raises(ProtocolError, match="score"):
        decode_stream(data)
    with pytest.raises(ProtocolError):
        encode_outcome(NOSCORE, 0, 1.0)


def test_huge_line_without_newline() -> None:
    decoder = StreamDecoder()
    decoder.feed(b"x" * MAX_LINE)
    assert list(decoder.events()) == []  # up to MAX_LINE bytes: still waiting
    decoder.feed(b"x")
    with pytest.raises(ProtocolError):  # raised while feeding, not only at close: bounded memory
        list(decoder.events())
    with pytest.raises(ProtocolError):
        decode_stream(b"{" * (MAX_LINE + 10))
    with pytest.raises(ProtocolError):
        decode_stream(SIMPLE_HEADER + b'{"context":"' + b"a" * (MAX_LINE + 1))


def test_huge_line_verdict_does_not_depend_on_chunking() -> None:
    line = b'{"context":"' + b"a" * MAX_LINE + b'"}\n'  # a complete line longer than MAX_LINE
    data = SIMPLE_HEADER + line
    with pytest.raises(ProtocolError):
        decode_stream(data)
    with pytest.raises(ProtocolError):
        decode_chunked(data, [4096])
    fits = SIMPLE_HEADER + b'{"context":"' + b"a" * (MAX_LINE - 14) + b'"}\n'  # exactly MAX_LINE + \n
    assert decode_stream(fits)[-1] == Context("a" * (MAX_LINE - 14))
    assert decode_chunked(fits, [4096])[-1] == Context("a" * (MAX_LINE - 14))


def test_protocol_error_is_a_value_error() -> None:
    assert issubclass(ProtocolError, ValueError)


# --------------------------------------------------------------------------------------------------
# 5. encode_tensor


@given(tensor_specs(name="t"), st.integers(0, 40))
@FAST
def test_encode_tensor_rejects_wrong_element_count(spec_: TensorSpec, count: int) -> None:
    assume(count != spec_.elements)
    with pytest.raises(ProtocolError):
        encode_tensor(spec_, np.zeros(count, dtype=spec_.dtype))


@given(tensor_specs(name="t"))
@FAST
def test_encode_tensor_accepts_the_right_count_in_any_shape(spec_: TensorSpec) -> None:
    value = np.arange(spec_.elements).astype(spec_.dtype)
    raw = encode_tensor(spec_, value)  # flat
    assert raw == value.tobytes()
    assert len(raw) == spec_.nbytes
    assert encode_tensor(spec_, value.reshape(spec_.shape)) == raw


def test_encode_tensor_examples() -> None:
    scalar = TensorSpec("s", "int64_t", ())
    assert encode_tensor(scalar, 5) == struct.pack("=q", 5)
    assert encode_tensor(scalar, [5]) == struct.pack("=q", 5)
    with pytest.raises(ProtocolError):
        encode_tensor(scalar, [1, 2])
    with pytest.raises(ProtocolError):
        encode_tensor(scalar, [])
    grid = TensorSpec("g", "uint8_t", (2, 3))
    with pytest.raises(ProtocolError):
        encode_tensor(grid, [[1, 2, 3]])
    with pytest.raises(ProtocolError):
        encode_observation(Header(features=(grid,)), 0, {"g": [1, 2, 3, 4, 5, 6, 7]})
    assert encode_tensor(grid, [[1, 2, 3], [4, 5, 6]]) == bytes([1, 2, 3, 4, 5, 6])


def test_record_layout_rejects_wrong_size() -> None:
    layout = RecordLayout([TensorSpec("a", "int16_t", (3,))])
    assert layout.nbytes == 6
    with pytest.raises(ProtocolError):
        layout.decode(b"\0" * 5)
    with pytest.raises(ProtocolError):
        RecordLayout([TensorSpec("a", "float", (1,)), TensorSpec("a", "double", (1,))])


# --------------------------------------------------------------------------------------------------
# 6. Transcripts


@dataclass
class Recorded:
    data: bytes
    meta: dict[str, Any]
    out: bytes
    answers: list[bytes]
    stderr: str
    end: dict[str, Any]
    ends: list[int]  # byte offset after each record (the last one is the `end` record)
    records: list[tuple[str, Any]]  # (kind, payload) of each record, in order


json_objects = st.dictionaries(
    st.text(max_size=5), st.none() | st.booleans() | st.integers() | st.text(max_size=8), max_size=4
)


@st.composite
def transcripts(draw: st.DrawFn) -> tuple[Recorded, Stream]:
    s = draw(streams(max_events=8))
    buf = io.BytesIO()
    writer = TranscriptWriter(buf)
    ends: list[int] = []

    def mark() -> None:
        ends.append(len(buf.getvalue()))

    meta = draw(json_objects)
    writer.json("meta", meta)
    mark()
    records: list[tuple[str, Any]] = [("meta", meta)]
    # the compiler's stream in arbitrary pieces, interleaved with the host's answers
    cuts = sorted(draw(st.lists(st.integers(0, len(s.data)), max_size=6)))
    answers: list[bytes] = []
    pos = 0
    for cut in [*cuts, len(s.data)]:
        writer.record("out", s.data[pos:cut])
        mark()
        records.append(("out", s.data[pos:cut]))
        pos = cut
        if draw(st.booleans()):
            answers.append(draw(st.binary(max_size=16)))
            writer.record("in", answers[-1])
            mark()
            records.append(("in", answers[-1]))
    stderr = draw(st.text(max_size=20))
    writer.record("stderr", stderr.encode())
    mark()
    records.append(("stderr", stderr.encode()))
    end = draw(json_objects)
    writer.json("end", end)
    mark()
    records.append(("end", end))
    data = buf.getvalue()
    writer.close()
    assert buf.closed
    return Recorded(data, meta, s.data, answers, stderr, end, ends, records), s


@given(transcripts())
@FAST
def test_transcript_round_trip(ts: tuple[Recorded, Stream]) -> None:
    rec, s = ts
    assert rec.data.startswith(MAGIC)
    t = parse_transcript(rec.data)
    assert t.meta == rec.meta
    assert t.out == rec.out
    assert t.answers == rec.answers
    assert t.stderr == rec.stderr
    assert t.end == rec.end
    assert t.complete is True
    decoder = StreamDecoder()
    decoder.feed(t.out)
    events = list(decoder.events())
    decoder.close()
    check_events(events, s)


def test_transcript_file_round_trip(tmp_path) -> None:
    header = Header(features=(TensorSpec("a", "double", (2,)),), score=TensorSpec("r", "float", ()))
    stream = (
        encode_header(header)
        + encode_context("main")
        + encode_observation(header, 0, {"a": [float("nan"), -0.0]})
        + encode_outcome(header, 0, 3.0)
    )
    path = tmp_path / "episode.transcript"
    with open(path, "wb") as f:
        writer = TranscriptWriter(f)
        writer.json("meta", {"module": "a.bc", "seed": 1})
        writer.record("out", stream[:10])
        writer.record("out", stream[10:])
        writer.record("in", struct.pack("=q", 1))
        writer.record("stderr", b"warning: \xff\n")
        writer.json("end", {"returncode": 0})
    t = read_transcript(path)
    assert t.complete and t.meta == {"module": "a.bc", "seed": 1} and t.end == {"returncode": 0}
    assert t.out == stream and t.answers == [struct.pack("=q", 1)]
    assert t.stderr == "warning: \ufffd\n"
    _, ctx, obs, out = decode_stream(t.out)
    assert ctx == Context("main")
    assert obs.raw == struct.pack("=2d", float("nan"), -0.0)
    assert out.value.tolist() == 3.0


@given(st.data(), transcripts())
@FAST
def test_transcript_truncated_anywhere(data: st.DataObject, ts: tuple[Recorded, Stream]) -> None:
    rec, s = ts
    cut = data.draw(st.integers(0, len(rec.data) - 1), label="cut")
    t = parse_transcript(rec.data[:cut])  # a clean cut never raises
    assert t.complete is False and t.end is None
    # exactly the records wholly before the cut, nothing of the one it cuts into
    whole = rec.records[: sum(1 for e in rec.ends if e <= cut)]
    assert t.meta == (rec.meta if whole else {})
    assert t.out == b"".join(p for k, p in whole if k == "out")
    assert t.answers == [p for k, p in whole if k == "in"]
    assert t.stderr == "".join(p.decode() for k, p in whole if k == "stderr")
    assert rec.out.startswith(t.out)
    # the `out` prefix decodes incrementally to a prefix of the events, nothing partial
    decoder = StreamDecoder()
    decoder.feed(t.out)
    events = list(decoder.events())
    check_events(events, s, upto=len(events))


def test_transcript_truncated_at_every_byte() -> None:
    buf = io.BytesIO()
    w = TranscriptWriter(buf)
    w.json("meta", {"m": 1})
    w.record("out", SIMPLE_HEADER)
    w.record("in", b"\n\n")
    w.record("stderr", b"err")
    w.json("end", {"e": 2})
    data = buf.getvalue()
    assert parse_transcript(data).complete
    for cut in range(len(data)):
        t = parse_transcript(data[:cut])
        assert not t.complete and t.end is None
        assert SIMPLE_HEADER.startswith(t.out) and t.out in (b"", SIMPLE_HEADER)
        assert t.answers in ([], [b"\n\n"])


@given(transcripts(), st.data())
@FAST
def test_transcript_corrupt_record_header_raises(ts: tuple[Recorded, Stream], data: st.DataObject) -> None:
    rec, _ = ts
    starts = [len(MAGIC), *rec.ends[:-1]]
    i = data.draw(st.integers(0, len(starts) - 1), label="record")
    start = starts[i]
    header_end = rec.data.index(b"\n", start)
    kind, length = rec.data[start:header_end].split(b" ")
    bad = data.draw(
        st.sampled_from(
            [
                b"outs " + length,  # unknown kind
                b"OUT " + length,
                b"\xff " + length,
                kind + b" -1",
                kind + b" +" + length,
                kind + b" x" + length,
                kind + b"  " + length,
                kind + b"\t" + length,
                kind + length,  # no space
                kind + b" " + length + b" 1",
                b"",
                b" ",
                kind + b" " + b"9" * 5000,  # no record header is that long
            ]
        ),
        label="bad header",
    )
    corrupt = rec.data[:start] + bad + rec.data[header_end:]
    with pytest.raises(ProtocolError):
        parse_transcript(corrupt)


def test_transcript_other_corruption() -> None:
    buf = io.BytesIO()
    w = TranscriptWriter(buf)
    w.json("meta", {"m": 1})
    w.record("out", b"abc")
    w.json("end", {})
    good = buf.getvalue()
    assert parse_transcript(good).complete

    with pytest.raises(ProtocolError):
        parse_transcript(b"OPTGYM-TRANSCRIPT 2\n")  # bad magic
    with pytest.raises(ProtocolError):
        parse_transcript(b"\x00" + good)
    with pytest.raises(ProtocolError):  # a record not terminated by a newline
        parse_transcript(good.replace(b"out 3\nabc\n", b"out 3\nabcX"))
    with pytest.raises(ProtocolError):  # a length that points into the next record
        parse_transcript(good.replace(b"out 3\nabc\n", b"out 2\nabc\n"))
    with pytest.raises(ProtocolError):  # 64+ bytes of garbage where a record header belongs
        parse_transcript(MAGIC + b"x" * 64)
    for bad_json in (b"{", b"[1]", b"null", b"\xff", b"1" * 5000, b"[" * 100_000):
        for kind in (b"meta", b"end"):
            record = kind + b" %d\n" % len(bad_json) + bad_json + b"\n"
            with pytest.raises(ProtocolError):
                parse_transcript(MAGIC + record)
    # a prefix of the magic line (a host killed before its first flush) is an empty, incomplete transcript
    for cut in range(len(MAGIC) + 1):
        t = parse_transcript(MAGIC[:cut])
        assert not t.complete and t.out == b"" and t.meta == {}


@given(st.binary(max_size=200))
@FUZZ
def test_fuzz_transcript_garbage(tail: bytes) -> None:
    for data in (tail, MAGIC + tail):
        try:
            t = parse_transcript(data)
        except ProtocolError:
            continue
        assert isinstance(t.out, bytes) and isinstance(t.meta, dict)
        assert t.complete == (t.end is not None)
