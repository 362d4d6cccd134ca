"""What every decision problem tells the rest of optgym.

A problem is one compiler decision made by a policy instead of the compiler's heuristic: the
flags that route it to the host, the features it sends, the heuristic's answer when the stream
carries one, the action space, and how a finished compile is measured and rewarded. Everything
above this layer (rollout, env, training, evaluation, the policy server) is written against
:class:`Problem` only, so a new problem on clang is one new file in this folder (it registers itself
with :func:`register`): its clang hook, and — when ``optgym-cc`` serves it — the environment variable
naming its policy and the file of the policy shipped for it, are class attributes there. The toolchain
checks the hooks the registry's problems declare (``optgym doctor``), ``--policy pretrained`` loads the
declared file, and the launcher's literal channel table is tested against the registry.

Shapes of the problems this interface is made for:

* inline-size (clang): 38 int64 [1] features + ``inlining_default``; ``Discrete(2)``; size reward.
* regalloc eviction (clang): 20 features of shape [1, 33] + ``progress``; an index action whose
  valid values are given by the ``mask`` feature (:meth:`Problem.action_mask`); no heuristic answer
  in the stream; size reward (a reward from the allocator's spill remarks would name its file in
  :meth:`Problem.compile_flags` and read it in :meth:`Problem.measure`).
* regalloc priority (clang): ``li_size``, ``stage``, ``weight`` of shape [1]; the action is a number (the
  range's priority), no heuristic answer in the stream; size reward.
* the .NET JIT's CSE (``compiler = "superpmi"``): a different compiler and text protocol; the problem
  file is still the only problem-specific piece, the session comes from that compiler's toolchain.
"""

from __future__ import annotations

import struct
import sys
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from optgym.errors import OptgymError
from optgym.protocol import Header, Observation, TensorSpec, encode_tensor
from optgym.toolchain.llvm import Hook
from optgym.toolchain.sizes import object_sizes

if TYPE_CHECKING:  # gymnasium only where spaces are built: the policy server never imports it
    from gymnasium import spaces

Metrics = dict[str, int]  # byte counts of a compile's object (text_bytes, dottext_bytes)
DEFAULT_DELTA = 0.01  # MLGO's reward smoothing


class ProblemError(OptgymError):
    """The compiler's stream does not carry what the problem needs (a missing feature, say)."""


class InvalidAction(OptgymError):
    """An action the compiler would crash on (an eviction index whose mask bit is 0, say)."""


class FeatureView:
    """Maps a compiler's header onto the features a problem expects, by name.

    Built once per compile from the header; the per-decision methods are the host's hot path.
    """

    def __init__(self, header: Header, expected: Sequence[TensorSpec], hidden: Sequence[str] = ()) -> None:
        by_name = {s.name: s for s in header.features}
        missing = [s.name for s in expected if s.name not in by_name]
        if missing:
            raise ProblemError(f"the compiler does not send the features {missing}; it sends {sorted(by_name)}")
        for spec in expected:
            got = by_name[spec.name]
            if got.shape != spec.shape or got.type != spec.type:
                raise ProblemError(
                    f"feature {spec.name!r}: compiler sends {got.type}{list(got.shape)}, "
                    f"expected {spec.type}{list(spec.shape)}"
                )
        self.header = header
        self.names = tuple(s.name for s in expected if s.name not in hidden)
        self.specs = tuple(by_name[n] for n in self.names)
        # Byte offsets of every tensor, for reading single values without decoding the record.
        self._offsets: dict[str, int] = {}
        self._elements: dict[str, int] = {}
        self._dtypes: dict[str, np.dtype] = {}
        self._firsts: dict[tuple[str, ...], list[tuple[struct.Struct, int]]] = {}
        self._scalars: dict[str, tuple[struct.Struct, int]] = {}
        pos = 0
        for s in header.features:
            self._offsets[s.name], self._elements[s.name] = pos, s.elements
            self._dtypes[s.name] = s.dtype  # the record's field type, elementwise
            pos += s.nbytes
        # Fast path: every tensor in the stream is int64 → one frombuffer + one gather per decision.
        self._word_index: np.ndarray | None = None
        if all(s.type == "int64_t" for s in header.features):
            words = [np.arange(self._offsets[n] // 8, self._offsets[n] // 8 + by_name[n].elements) for n in self.names]
            self._word_index = np.concatenate(words) if words else np.zeros(0, dtype=np.int64)
        starts = np.cumsum([0] + [s.elements for s in self.specs]).tolist()
        self._starts = [(s.name, starts[i], starts[i + 1], s.shape) for i, s in enumerate(self.specs)]

    def vector(self, obs: Observation) -> np.ndarray:
        """The visible features, flattened in expected order (float32) — what a network takes."""
        if self._word_index is not None:
            return np.frombuffer(obs.raw, dtype=np.int64)[self._word_index].astype(np.float32)
        rec = obs.record
        return _finite(np.concatenate([np.asarray(rec[n], dtype=np.float32).ravel() for n in self.names]))

    def as_dict(self, obs: Observation) -> dict[str, np.ndarray]:
        """The visible features by name, each of its declared shape and dtype (fresh arrays)."""
        if self._word_index is not None:  # one gather into a fresh array, then views into it
            words = np.frombuffer(obs.raw, dtype=np.int64)[self._word_index]
            return {name: words[start:stop].reshape(shape) for name, start, stop, shape in self._starts}
        rec = obs.record
        return {s.name: _finite(np.array(rec[s.name], dtype=s.dtype).reshape(s.shape)) for s in self.specs}

    def rows(self, obs: Observation, names: Sequence[str]) -> np.ndarray:
        """Features ``names``, each flattened to one row of a float64 matrix (finite): a candidate problem's
        columns side by side, read straight from the raw bytes — no record decode, no dict."""
        out = np.empty((len(names), self._elements[names[0]]), dtype=np.float64)
        for row, name in enumerate(names):
            out[row] = self.tensor(obs, name)
        return _finite(out)

    def firsts(self, obs: Observation, names: Sequence[str]) -> list[float]:
        """The first element of each of ``names`` as Python floats, finite as :meth:`rows` makes them (NaN → 0,
        ±inf → the largest double): one ``struct`` unpack per feature and no numpy — for problems that ask
        once per live range, where numpy's per-call cost on three numbers would be most of the host's time."""
        readers = self._firsts.get(tuple(names))
        if readers is None:
            readers = [(struct.Struct("<" + _STRUCT_CODES[self._dtypes[n].kind, self._dtypes[n].itemsize]),
                        self._offsets[n]) for n in names]  # fmt: skip
            self._firsts[tuple(names)] = readers
        out = []
        for reader, offset in readers:
            (x,) = reader.unpack_from(obs.raw, offset)
            out.append(0.0 if x != x else max(min(float(x), sys.float_info.max), -sys.float_info.max))
        return out

    def scalar(self, obs: Observation, name: str) -> int | float:
        """The first element of feature ``name``, read straight from the raw bytes (no record decode): one
        ``struct`` unpack, a fifth of a numpy view's cost — inlining reads its heuristic's answer so at every
        decision."""
        reader = self._scalars.get(name)
        if reader is None:
            dtype = self._dtypes[name]
            reader = self._scalars[name] = (struct.Struct("<" + _STRUCT_CODES[dtype.kind, dtype.itemsize]),
                                            self._offsets[name])  # fmt: skip
        return reader[0].unpack_from(obs.raw, reader[1])[0]

    def tensor(self, obs: Observation, name: str, count: int | None = None) -> np.ndarray:
        """Feature ``name`` flattened (its first ``count`` elements), a read-only view of the raw bytes."""
        count = self._elements[name] if count is None else count
        return np.frombuffer(obs.raw, dtype=self._dtypes[name], count=count, offset=self._offsets[name])


#: ``struct`` codes of the stream's tensor types (little-endian, standard sizes), by numpy kind and item size.
_STRUCT_CODES = {
    ("i", 8): "q", ("i", 4): "i", ("i", 2): "h", ("i", 1): "b", ("u", 8): "Q", ("u", 4): "I", ("u", 2): "H",
    ("u", 1): "B", ("f", 8): "d", ("f", 4): "f",
}  # fmt: skip


def _finite(values: np.ndarray) -> np.ndarray:
    """``values`` with NaN replaced by 0 (and ±inf by the extreme finite values), in place. clang-22's eviction
    advisor sends NaN in ``use_def_density`` for some candidates; a network's input, and what a gymnasium
    ``Box`` contains, must be finite."""
    if values.dtype.kind == "f":
        np.nan_to_num(values, copy=False, nan=0.0)
    return values


class Problem(ABC):
    """One decision problem. Subclasses set the class attributes and implement the methods."""

    name: ClassVar[str]  # CLI and optgym.make name, e.g. "inline-size"
    env_id: ClassVar[str]  # gymnasium id, e.g. "optgym/InlineSize-v0"
    compiler: ClassVar[str] = "clang"
    #: The clang hook that routes its decisions to the host: the ``-mllvm`` options and the channel option.
    hook: ClassVar[Hook]
    advice_name: ClassVar[str]  # the advice tensor the compiler reads
    #: The environment variable that names its policy in ``optgym-cc`` (``None``: the launcher does not serve
    #: it). optgym_cc.CHANNELS, the launcher's own table, repeats it; a test holds the two together.
    serve_variable: ClassVar[str | None] = None
    #: The file of the policy optgym ships for it in ``optgym/policies/pretrained`` — what ``--policy
    #: pretrained`` loads and ``optgym-cc`` serves by default (``None``: none is shipped).
    pretrained: ClassVar[str | None] = None
    #: Whether each decision's stream carries the compiler heuristic's own answer (``heuristic_action``):
    #: where it does, a host can always send clang's answer instead of a policy's, byte-identically.
    heuristic_in_stream: ClassVar[bool] = False

    def __init__(self, **options: Any) -> None:
        if options:
            raise TypeError(f"{type(self).__name__} takes no options {sorted(options)}")

    # -- compile flags ---------------------------------------------------------------------

    def channel_flags(self, base: str) -> list[str]:
        """Flags that send this decision to the host over ``<base>.in``/``<base>.out``: on clang, its
        :attr:`hook`'s options with the channel put in."""
        return self.hook.flags(base)

    def compile_flags(self) -> list[str]:
        """Flags every compile of this problem gets, interactive or not (remarks, thresholds)."""
        return []

    # -- features and actions -----------------------------------------------------------------

    @abstractmethod
    def expected_features(self) -> Sequence[TensorSpec]:
        """Every feature the problem reads from the stream, the heuristic's answer included."""

    hidden_features: ClassVar[tuple[str, ...]] = ()  # read by the problem, never shown to a policy

    def visible_features(self) -> list[str]:
        """The features a policy sees, in the problem's order: a :class:`FeatureView`'s ``names``, the columns of
        every trace, vocab and policy."""
        return [s.name for s in self.expected_features() if s.name not in self.hidden_features]

    #: A simple policy (``optgym.rollout.simple``) every evaluation also compiles, for reference: never-inline
    #: for inlining; ``None`` where no simple policy means anything (an eviction index is per decision).
    reference_policy: ClassVar[str | None] = None

    #: Problems a few-weight scorer (optgym.policies.scorer) decides: its per-feature weights at the start;
    #: ``None``: not such a problem. ``scorer_form`` "pick": the action picks one of several candidates, each
    #: described by a column of every feature (eviction); "log-linear": the action is one number,
    #: ``min(e^(b + Σ w_f ln x_f), scorer_ceiling)``, starting at ``b = scorer_bias_start`` (priority).
    scorer_start: ClassVar[Mapping[str, float] | None] = None
    scorer_form: ClassVar[str] = "pick"
    scorer_bias_start: ClassVar[float] = 0.0
    scorer_ceiling: ClassVar[float] = float("inf")

    #: What each decision is about, by name, for offline tools: the optimization-record pass that writes
    #: one remark per decision and the remark argument naming the subject (see ``toolchain.remarks``).
    decision_subject: ClassVar[tuple[str, str] | None] = None

    def view(self, header: Header) -> FeatureView:
        """Check a compiler's header and build the per-decision view of it."""
        if header.advice is None or header.advice.name != self.advice_name:
            raise ProblemError(
                f"{self.name}: the compiler's header has advice {header.advice}, expected {self.advice_name!r}"
            )
        return FeatureView(header, self.expected_features(), self.hidden_features)

    def observation_space(self) -> spaces.Dict:
        """A ``Dict`` of the visible features, each a ``Box`` of its own shape and dtype."""
        from gymnasium import spaces

        boxes: dict[str, spaces.Space] = {}
        for spec in self.expected_features():
            if spec.name in self.hidden_features:
                continue
            info = np.iinfo(spec.dtype) if spec.dtype.kind in "iu" else np.finfo(spec.dtype)
            boxes[spec.name] = spaces.Box(low=info.min, high=info.max, shape=spec.shape, dtype=spec.dtype)
        return spaces.Dict(boxes)

    @abstractmethod
    def action_space(self) -> spaces.Space:
        """The actions a policy may take."""

    def heuristic_action(self, view: FeatureView, obs: Observation) -> int | None:
        """The compiler heuristic's answer at this decision, if the stream carries it."""
        return None

    def decision_margin(self, features: Mapping[str, np.ndarray]) -> np.ndarray | None:
        """How far each decision (rows of ``features``, raw values by name) is from the heuristic's
        turning point — small: the heuristic nearly decided otherwise. ``None`` when the problem cannot
        tell. A search without a scoring policy tries the smallest margins first."""
        return None

    def action_mask(self, view: FeatureView, obs: Observation) -> np.ndarray | None:
        """Which actions are valid here (``None``: all of them)."""
        return None

    def invalid_action(self, view: FeatureView, obs: Observation, action: Any) -> str | None:
        """Why ``action`` must not reach the compiler here (``None``: it may). An eviction index the
        mask rules out crashes clang, so the episode refuses it instead of sending it."""
        mask = self.action_mask(view, obs)
        if mask is None:
            return None
        index = int(action)
        if 0 <= index < len(mask) and mask[index]:
            return None
        valid = np.flatnonzero(mask).tolist()
        return f"{self.name}: action {index} is not valid at this decision (valid: {valid})"

    def encode_action(self, header: Header, action: Any) -> bytes:
        """The advice tensor's bytes for ``action``."""
        assert header.advice is not None
        return encode_tensor(header.advice, action)

    # -- outcome -------------------------------------------------------------------------------

    @abstractmethod
    def measure(self, obj: bytes) -> Metrics:
        """Metrics of a successful compile whose object file is ``obj``."""

    @abstractmethod
    def reward(self, policy: Mapping[str, float], baseline: Mapping[str, float]) -> float:
        """The episode's reward: the policy's compile against the heuristic's."""


class ObjectSizeObjective:
    """Mixin for problems judged by object size, as MLGO: ``measure`` reads the Berkeley ``text``
    (``.text*`` + ``.rodata*`` + ``.eh_frame`` + ``.gcc_except_table*``) and ``.text*`` of the object;
    ``reward`` is ``1 - (policy_text + δ) / (heuristic_text + δ)`` with δ = ``self.delta``."""

    def __init__(self, delta: float = DEFAULT_DELTA) -> None:
        self.delta = delta

    def measure(self, obj: bytes) -> Metrics:
        sizes = object_sizes(obj)
        return {"text_bytes": sizes.text_bytes, "dottext_bytes": sizes.dottext_bytes, "data_bytes": sizes.data_bytes}

    def reward(self, policy: Mapping[str, float], baseline: Mapping[str, float]) -> float:
        return 1.0 - (policy["text_bytes"] + self.delta) / (baseline["text_bytes"] + self.delta)


_REGISTRY: dict[str, type[Problem]] = {}


def problem_flags(problems: Sequence[Problem], bases: Sequence[str]) -> list[str]:
    """What a compile deciding ``problems`` adds to its command line: each problem's own flags, then the
    channel of each over its FIFO pair ``bases[i]`` (see :class:`optgym.toolchain.interactive.InteractiveCompile`)."""
    flags = [f for problem in problems for f in problem.compile_flags()]
    return flags + [f for problem, base in zip(problems, bases, strict=True) for f in problem.channel_flags(base)]


def register(cls: type[Problem]) -> type[Problem]:
    """Class decorator: make a problem known to ``optgym.make``, the CLI, gymnasium and the policy server."""
    _REGISTRY[cls.name] = cls
    return cls


def registry() -> Mapping[str, type[Problem]]:
    """Every registered problem by name, in registration order (this package's modules by file name)."""
    return _REGISTRY


def servable() -> list[type[Problem]]:
    """The problems ``optgym-cc`` serves (a :attr:`Problem.serve_variable`), in registration order: the order of
    the launcher's channel table and of the policies it hands a server."""
    return [cls for cls in _REGISTRY.values() if cls.serve_variable is not None]
