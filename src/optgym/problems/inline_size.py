"""Inlining for size (``-Oz``): LLVM's MLGO inliner advisor, decided by the host.

At every call site the inliner considers, clang-22 sends 38 int64 features of the call site,
caller and callee, plus ``inlining_default`` — the answer its own heuristic would give — and reads
back ``inlining_decision`` (non-zero: inline). Replaying ``inlining_default`` gives an object
byte-identical to a plain compile, so the plain compile's size is the heuristic's size.

Reward, as MLGO: ``1 - (policy_text + δ) / (heuristic_text + δ)`` on the Berkeley ``text`` of the
object (``.text*`` + ``.rodata*`` + ``.eh_frame`` + ``.gcc_except_table*``), δ = 0.01 by default.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from optgym.problems.base import DEFAULT_DELTA, FeatureView, ObjectSizeObjective, Problem, register
from optgym.protocol import Observation, TensorSpec
from optgym.toolchain.llvm import Hook

if TYPE_CHECKING:
    from gymnasium import spaces

#: The features clang-22's inline advisor sends (llvm/Analysis/InlineModelFeatureMaps.h), by name.
FEATURES = (
    "sroa_savings", "sroa_losses", "load_elimination", "call_penalty", "call_argument_setup",
    "load_relative_intrinsic", "lowered_call_arg_setup", "indirect_call_penalty", "jump_table_penalty",
    "case_cluster_penalty", "switch_default_dest_penalty", "switch_penalty", "unsimplified_common_instructions",
    "num_loops", "dead_blocks", "simplified_instructions", "constant_args", "constant_offset_ptr_args",
    "callsite_cost", "cold_cc_penalty", "last_call_to_static_bonus", "is_multiple_blocks", "nested_inlines",
    "nested_inline_cost_estimate", "threshold", "callee_basic_block_count", "callsite_height", "node_count",
    "nr_ctant_params", "cost_estimate", "edge_count", "caller_users", "caller_conditionally_executed_blocks",
    "caller_basic_block_count", "callee_conditionally_executed_blocks", "callee_users",
    "is_callee_avail_external", "is_caller_avail_external",
)  # fmt: skip
HEURISTIC = "inlining_default"


@register
class InlineSize(ObjectSizeObjective, Problem):
    name = "inline-size"
    env_id = "optgym/InlineSize-v0"
    #: ``-inliner-interactive-include-default``: every decision also carries the heuristic's own answer.
    hook = Hook(
        "inliner",
        ("-enable-ml-inliner=release", "-inliner-interactive-include-default"),
        channel="-inliner-interactive-channel-base",
    )
    serve_variable = "OPTGYM_POLICY"  # what optgym-cc reads the policy's spec from
    pretrained = "inline-size.onnx"
    advice_name = "inlining_decision"
    hidden_features = (HEURISTIC,)
    heuristic_in_stream = True  # -inliner-interactive-include-default
    reference_policy = "never"
    decision_subject = ("inline-ml", "Callee")  # one remark per decision, in order (verified on clang-22)

    def __init__(self, delta: float = DEFAULT_DELTA, size_increase_threshold: int | None = 1000) -> None:
        """``delta`` is MLGO's reward smoothing. ``size_increase_threshold`` lifts the ML advisor's
        stop-once-size-doubles rule, which differs from the heuristic at -O1..-O3 (not at -Os/-Oz);
        ``None`` keeps clang's default."""
        super().__init__(delta)
        self.size_increase_threshold = size_increase_threshold

    def compile_flags(self) -> list[str]:
        if self.size_increase_threshold is None:
            return []
        return ["-mllvm", f"-ml-advisor-size-increase-threshold={self.size_increase_threshold}"]

    def expected_features(self) -> tuple[TensorSpec, ...]:
        return tuple(TensorSpec(name, "int64_t", (1,)) for name in (*FEATURES, HEURISTIC))

    def action_space(self) -> spaces.Discrete:
        from gymnasium import spaces  # not at import: the policy server never needs gymnasium

        return spaces.Discrete(2)

    def heuristic_action(self, view: FeatureView, obs: Observation) -> int:
        return int(view.scalar(obs, HEURISTIC) != 0)

    def decision_margin(self, features: Mapping[str, np.ndarray]) -> np.ndarray | None:
        """``|threshold - cost_estimate|``: clang's inline cost model inlines below the threshold."""
        if "threshold" not in features or "cost_estimate" not in features:
            return None
        return np.abs(np.asarray(features["threshold"], np.float64) - np.asarray(features["cost_estimate"], np.float64))
