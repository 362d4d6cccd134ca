"""Register-allocation priority for size: in which order the greedy allocator takes live ranges.

The greedy register allocator keeps a priority queue of live ranges and assigns the highest first;
whatever comes later finds fewer registers free and is evicted, split or spilled. clang-22's interactive
priority advisor (``-regalloc-enable-priority-advisor=release`` with a channel base) asks the host for
each range's priority as it is queued, with three features: ``li_size`` (the range's length in slot
indexes), ``stage`` (the allocator's stage for it: 1 when first queued, higher once split or spilled)
and ``weight`` (its spill weight; ``inf`` for a range that must not spill). The host answers
``priority``, a float that clang casts to ``unsigned``: equal priorities (every answer below 1, for
one) leave the order to the virtual register numbers, lowest first.

Any order is a correct allocation, so every answer is a correct program. The stream carries no answer
of the default advisor, whose rule also reads what these three features do not (the register class's
allocation priority, hints, whether the range stays in one block): the heuristic is measured, not
replayed, as in :mod:`optgym.problems.regalloc_evict`.

The policy form is a log-linear scorer (:class:`optgym.policies.scorer.LogLinearScorer`): priority =
e^b · Π_f x_f^{w_f}, clipped to the unsigned range. It starts at ``weight`` · 10⁶ — heaviest spill
weight first, the 10⁶ keeping weights (≈10⁻³) above the cast's cut to 0 — which alone makes C code 0.9968 of
the default's on a 404-module training sample (each module's own flags;
docs/experiments/2026-11-24-register-allocation.md).

Objective, for optgym's size target: the object's Berkeley ``text``, rewarded as inline-size is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar

from optgym.problems.base import ObjectSizeObjective, Problem, register
from optgym.protocol import TensorSpec
from optgym.toolchain.llvm import Hook

if TYPE_CHECKING:
    from gymnasium import spaces

FEATURES = (
    TensorSpec("li_size", "int64_t", (1,)),
    TensorSpec("stage", "int64_t", (1,)),
    TensorSpec("weight", "float", (1,)),
)
#: The largest priority sent: clang casts the float to a 32-bit unsigned (a larger value is undefined there);
#: 4·10⁹ is exact in float32.
CEILING = 4.0e9


@register
class RegallocPriority(ObjectSizeObjective, Problem):
    name = "regalloc-priority"
    env_id = "optgym/RegallocPriority-v0"
    hook = Hook(
        "regalloc-priority",
        ("-regalloc-enable-priority-advisor=release",),
        channel="-regalloc-priority-interactive-channel-base",
    )
    serve_variable = "OPTGYM_PRIORITY_POLICY"  # what optgym-cc reads the policy's spec from
    pretrained = "regalloc-priority.onnx"
    advice_name = "priority"

    scorer_form: ClassVar[str] = "log-linear"
    #: Exponents of the start rule (priority = 10⁶ · weight) and its log-scale; see the module doc.
    scorer_start: ClassVar[Mapping[str, float]] = {"li_size": 0.0, "stage": 0.0, "weight": 1.0}
    scorer_bias_start: ClassVar[float] = math.log(1e6)
    scorer_ceiling: ClassVar[float] = CEILING

    def expected_features(self) -> tuple[TensorSpec, ...]:
        return FEATURES

    def action_space(self) -> spaces.Box:
        import numpy as np
        from gymnasium import spaces  # not at import: the policy server never needs gymnasium

        return spaces.Box(low=0.0, high=CEILING, shape=(1,), dtype=np.float32)
