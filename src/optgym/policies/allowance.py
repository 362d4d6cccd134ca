"""A learned allowance over clang's inline threshold: a small policy family that ES can actually train.

Why a family of its own: a network that reads all of clang's features and starts at clang's answers
flips almost no decision under a small perturbation, and a less sure one inlines everywhere at once
and makes modules 6–60 % larger (docs/experiments/2026-11-25-learned-inliner.md). Single-flip
searches, though, keep finding the same kind of gain at ``-Oz``: call sites whose cost is *just above*
clang's threshold, where inlining lets the callee's last copy go. So the learned part here is only how
far above the threshold a call site may be and still be inlined, per call site::

    inline  ⇔  4·h + m + a(x) > 0,    a(x) = b + Σ_j w_j · g_j(x)

``h`` is clang's own answer and ``m = sign(t − c)·log1p(|t − c|)/8`` the margin of the threshold ``t``
over the cost estimate ``c`` (:mod:`optgym.problems.inputs`). Where clang says no (``h = 0``, ``m ≤ 0``),
the call site is inlined when its cost is within ``exp(8·a) − 1`` of the threshold; where clang says yes
the ``4`` keeps it, unless ``a`` falls far below zero. ``g_j`` are 0/1 gates on clang's raw features
(``at_most:callee_users:2`` …). The gates are a fixed ladder of bounds, a basis like a histogram's
bins; the weights ``w`` and ``b`` are what training sets. At ``w = 0, b = 0`` the policy is clang's, but for a
call site clang refuses although its cost is under the threshold (``m > 0``), which it would inline: measured, the
start compiles all 190 AArch64 C++ training modules to clang's own bytes.

It is an ordinary :class:`~optgym.policies.mlp.MLPPolicy` with no hidden layer whose weights on the
normalized features are zero: a served decision skips the normalizer, as the shipped rule's does, and it
exports to ONNX like any policy. :func:`trainable` names the parameters ES perturbs: the gates' weights
and the bias, a dozen numbers, not the whole first layer.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from optgym.errors import OptgymError
from optgym.policies.mlp import MLPPolicy
from optgym.problems import get_problem
from optgym.problems.inputs import HEURISTIC_INPUT, parse_extras
from optgym.problems.normalize import PER_FEATURE, Vocab

MARGIN_INPUT = "margin:threshold-cost_estimate"
#: The inputs before the gates, with set weights: clang's answer and the margin.
LEADING = (HEURISTIC_INPUT, MARGIN_INPUT)
#: The start's weight on clang's answer: larger than any margin plus a small allowance, so an allowance
#: near zero adds inlines and never withdraws one of clang's.
HEURISTIC_WEIGHT = 4.0
#: The default ladder of gates: callee users (a callee inlining can delete), ``available_externally``
#: (an ``extern template`` member, never deleted), module size in functions, callee size in blocks, and
#: constant arguments (the callee's body folds). Bounds are powers of two or four, a basis spread over
#: each feature's range, not values tuned on any corpus. Each gate is the *rarer* side of its feature:
#: a gate that holds almost everywhere is the bias under another name, and ES's per-parameter steps
#: then move the bias several times over — the first AArch64 run (docs/experiments) sank every
#: allowance below zero that way, where no perturbation changes a decision and learning stops. For the
#: same reason ``cxx`` is left out: add it when training on both languages at once.
DEFAULT_GATES = (
    "at_most:callee_users:1",
    "at_most:callee_users:2",
    "at_most:callee_users:4",
    "at_least:is_callee_avail_external:1",
    "at_least:node_count:64",
    "at_least:node_count:256",
    "at_most:callee_basic_block_count:1",
    "at_most:callee_basic_block_count:4",
    "at_least:nr_ctant_params:1",
)


class AllowanceError(OptgymError):
    """An allowance policy asked for with gates that are not 0/1 inputs of the problem's features."""


def allowance_policy(
    gates: Sequence[str] = DEFAULT_GATES,
    problem: str = "inline-size",
    vocab: Vocab | None = None,
    heuristic_weight: float = HEURISTIC_WEIGHT,
) -> MLPPolicy:
    """The family's start: clang's decisions (``w = 0``, ``b = 0``), the gates as its derived inputs. The
    normalized features are read at weight 0, so ``vocab`` changes no decision; give one where something else
    reads them (PPO's env normalizes its observations with it).

    ``heuristic_weight`` W is the fixed weight on clang's answer. At the default 4 an allowance only adds
    inlines. Below 1 the family can also *withdraw* clang's inlines: where clang says yes, the call site stays
    inlined while ``W + m + a(x) > 0``, so a negative allowance drops the inlines whose cost is just under the
    threshold (``m`` small). The start is still clang's wherever clang's yes has ``m > −W``, which is every yes
    clang gives on the ThinLTO backends traced (docs/experiments/2026-11-25-thinlto.md)."""
    if not heuristic_weight > 0:
        raise AllowanceError(f"the weight on clang's answer must be positive, not {heuristic_weight}")
    decided = get_problem(problem)
    features = decided.visible_features()
    for name in ("threshold", "cost_estimate"):
        if name not in features:
            raise AllowanceError(f"an allowance needs clang's {name!r} feature, which {problem} does not send")
    if not gates:
        raise AllowanceError("an allowance needs at least one gate")
    if vocab is None:  # the normalized features get zero weight
        vocab = Vocab({name: [0.0] for name in features}, problem=problem)
    extras = [*LEADING, *gates]
    parsed = parse_extras(extras, features)
    if any(kind in (HEURISTIC_INPUT, "margin") for kind, _, _ in parsed[len(LEADING) :]):
        raise AllowanceError(
            f"gates are 0/1 inputs (at_most:F:K, at_least:F:K, cxx, callee_survives), not {list(gates)}"
        )
    width = len(features) * PER_FEATURE
    weights = np.zeros((width + len(extras), 2))
    weights[width, 1] = heuristic_weight
    weights[width + 1, 1] = 1.0
    return MLPPolicy([(weights, np.zeros(2))], vocab, problem=problem, extras=extras)


def is_allowance(policy: MLPPolicy) -> bool:
    """Whether ``policy`` is of this family: no hidden layer, inputs clang's answer and the margin, then gates."""
    return not policy.hidden and tuple(policy.extras[: len(LEADING)]) == LEADING


def trainable(policy: MLPPolicy) -> np.ndarray:
    """A 0/1 mask over :meth:`MLPPolicy.parameters`: the gates' weights on the inline logit, and its bias."""
    if not is_allowance(policy):
        raise AllowanceError("not an allowance policy: no hidden layer, inputs heuristic and margin, then gates")
    ((weights, _bias),) = policy.weights
    mask_w, mask_b = np.zeros_like(weights), np.zeros(2)
    mask_w[policy.normalizer.width + len(LEADING) :, 1] = 1.0
    mask_b[1] = 1.0
    return np.concatenate([mask_w.ravel(), mask_b])


def check_start(policy: MLPPolicy, gates: Sequence[str], heuristic_weight: float = HEURISTIC_WEIGHT) -> None:
    """Refuse a warm start that is not this family with exactly these ``gates`` and weight on clang's answer.

    Why a warm start at all: an allowance imitated from a search (``optgym train imitate --allowance``) gets
    the signs of the gates from thousands of labelled call sites, where ES from clang's decisions sets them
    in its first noisy steps and keeps them (docs/experiments/2026-11-26-validation.md). ES then trains the
    same parameters further, so the start must have the layout :func:`trainable` masks, gate for gate."""
    if not is_allowance(policy):
        raise AllowanceError("the warm start is not an allowance policy (optgym train imitate --allowance makes one)")
    have = gates_of(policy)
    if have != list(gates):
        raise AllowanceError(f"the warm start's gates are {have}, not the {list(gates)} asked for")
    ((weights, _bias),) = policy.weights
    weight = float(weights[policy.normalizer.width, 1])
    if not np.isclose(weight, heuristic_weight, rtol=1e-6, atol=0.0):  # a stored policy holds float32 weights
        raise AllowanceError(f"the warm start weighs clang's answer {weight:g}, not {heuristic_weight:g}")


def unscaled(policy: MLPPolicy) -> MLPPolicy:
    """An allowance in the family's own form, the margin's weight 1: its inline logit divided by that weight, the
    same decisions. PPO trains a copy whose logit is scaled by ``1/temperature`` (``--temperature 0.125``: the
    weight on clang's answer is 32, on the margin 8), which ES and the pattern search take as a start only so."""
    if not is_allowance(policy):
        raise AllowanceError("not an allowance policy: no hidden layer, inputs heuristic and margin, then gates")
    ((weights, bias),) = policy.weights
    scale = float(weights[policy.normalizer.width + 1, 1])
    if not scale > 0 or scale == 1.0:
        return policy
    weights, bias = weights.copy(), bias.copy()
    weights[:, 1] /= scale
    bias[1] /= scale
    return MLPPolicy([(weights, bias)], policy.vocab, problem=policy.problem, activation=policy.activation,
                     source=policy.source, extras=policy.extras, languages=policy.languages)  # fmt: skip


def with_gates(policy: MLPPolicy, gates: Sequence[str]) -> MLPPolicy:
    """``policy`` (an allowance) reading ``gates``: its own gates, which must come first and in order, then the
    new ones at weight 0, so every decision stays what it was. How a trained allowance learns an input it did not
    have (``callee_survives``, say) from where it stands instead of from clang's decisions."""
    have = gates_of(policy)
    if not is_allowance(policy) or list(gates[: len(have)]) != have:
        raise AllowanceError(f"the allowance's gates {have} are not the first of {list(gates)}")
    ((weights, bias),) = policy.weights
    grown = np.zeros((weights.shape[0] + len(gates) - len(have), weights.shape[1]))
    grown[: weights.shape[0]] = weights
    return MLPPolicy([(grown, bias)], policy.vocab, problem=policy.problem, activation=policy.activation,
                     source=policy.source, extras=[*LEADING, *gates], languages=policy.languages)  # fmt: skip


def gates_of(policy: MLPPolicy) -> list[str]:
    """The gates an allowance policy reads, in the order of its weights."""
    return list(policy.extras[len(LEADING) :])


def describe(policy: MLPPolicy) -> list[tuple[str, float]]:
    """``(input, weight)`` of the allowance's bias and gates: what a trained policy learned, to print."""
    ((weights, bias),) = policy.weights
    first_gate = policy.normalizer.width + len(LEADING)
    return [("bias", float(bias[1]))] + [
        (gate, float(weights[first_gate + i, 1])) for i, gate in enumerate(gates_of(policy))
    ]


__all__ = [
    "DEFAULT_GATES",
    "AllowanceError",
    "allowance_policy",
    "check_start",
    "describe",
    "gates_of",
    "is_allowance",
    "trainable",
    "unscaled",
    "with_gates",
]
