"""Register-allocation eviction for size: which live range the greedy allocator evicts, decided by the host.

When the greedy register allocator finds no free register for a virtual register, clang-22's
interactive eviction advisor (``-regalloc-enable-advisor=release`` with a channel base) sends one
column per candidate: 32 physical registers of the allocation order, plus column 32, the virtual
register being allocated itself. Each of the 20 features has shape ``[1, 33]`` (``mask`` says which
candidates may be evicted at all); ``progress`` is the share of live ranges left. The host answers
``index_to_evict``: a column whose ``mask`` is 1 — evict what occupies that register — or 32, evict
nothing (the virtual register goes on to be split or spilled).

The shape is the same on every target (checked on x86-64, AArch64 and a Cortex-M4's Thumb-2,
tests/test_targets.py): the columns are registers of the allocation order, and a target with fewer
leaves the rest masked — on the Cortex-M4 only the first 14 columns are ever legal — so nothing here
depends on the target; the mask does. Column 32 can be masked too (2 of 38 decisions on x86-64 and 1 of 42
on the Cortex-M4 in the tests' pressure module): clang must then evict.

The stream carries no answer of the default advisor, so the heuristic is measured, not replayed:
the baseline is the plain compile (the default advisor, same flags). An index the mask rules out
would crash clang (SIGSEGV); :meth:`~optgym.problems.base.Problem.invalid_action` stops it first.

Objective, for optgym's size target: the object's Berkeley ``text``, rewarded as inline-size is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from optgym.problems.base import FeatureView, ObjectSizeObjective, Problem, register
from optgym.protocol import Observation, TensorSpec
from optgym.toolchain.llvm import Hook

if TYPE_CHECKING:
    from gymnasium import spaces

CANDIDATES = 33  # 32 physical registers + the virtual register being allocated
NOTHING = CANDIDATES - 1  # column 32: evict nothing

#: Per-candidate features of clang-22's eviction advisor (llvm/lib/CodeGen/MLRegAllocEvictAdvisor.cpp), in
#: stream order, with their stream types.
INT_FEATURES = ("mask", "is_free", "is_hint", "is_local", "max_stage", "min_stage")
FEATURES = (
    "mask", "is_free", "nr_urgent", "nr_broken_hints", "is_hint", "is_local", "nr_rematerializable",
    "nr_defs_and_uses", "weighed_reads_by_max", "weighed_writes_by_max", "weighed_read_writes_by_max",
    "weighed_indvars_by_max", "hint_weights_by_max", "start_bb_freq_by_max", "end_bb_freq_by_max",
    "hottest_bb_freq_by_max", "liverange_size", "use_def_density", "max_stage", "min_stage",
)  # fmt: skip
PROGRESS = "progress"


@register
class RegallocEvict(ObjectSizeObjective, Problem):
    name = "regalloc-evict"
    env_id = "optgym/RegallocEvict-v0"
    hook = Hook(
        "regalloc-evict", ("-regalloc-enable-advisor=release",), channel="-regalloc-evict-interactive-channel-base"
    )
    serve_variable = "OPTGYM_EVICT_POLICY"  # what optgym-cc reads the policy's spec from
    pretrained = "regalloc-evict.onnx"
    advice_name = "index_to_evict"

    #: Where a candidate scorer starts (optgym.policies.scorer): the default advisor's rule, roughly — evict
    #: what interferes with the lightest heaviest live range, unless the register being allocated is lighter.
    scorer_start: ClassVar[Mapping[str, float]] = {
        name: -1.0 if name == "use_def_density" else 0.0 for name in FEATURES if name != "mask"
    }

    def expected_features(self) -> tuple[TensorSpec, ...]:
        per_candidate = tuple(
            TensorSpec(name, "int64_t" if name in INT_FEATURES else "float", (1, CANDIDATES)) for name in FEATURES
        )
        return (*per_candidate, TensorSpec(PROGRESS, "float", (1,)))

    def action_space(self) -> spaces.Discrete:
        from gymnasium import spaces  # not at import: the policy server never needs gymnasium

        return spaces.Discrete(CANDIDATES)

    def action_mask(self, view: FeatureView, obs: Observation) -> np.ndarray:
        return view.tensor(obs, "mask") != 0
