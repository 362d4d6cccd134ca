"""The torch twin of :class:`~optgym.policies.mlp.MLPPolicy`, for training; converts both ways exactly.

Its layer layout is stable-baselines3's ``MlpPolicy`` actor (``mlp_extractor.policy_net`` +
``action_net``), so a behavioral-cloning network warm-starts PPO/A2C by plain weight copies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from optgym.policies.mlp import MLPPolicy
from optgym.problems.normalize import Vocab

_ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}


def build_mlp(
    inputs: int, hidden: Sequence[int] = (64, 64), outputs: int = 2, activation: str = "tanh"
) -> nn.Sequential:
    """``Linear → activation`` per hidden layer, then a ``Linear`` to the logits."""
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [nn.Linear(inputs, width), _ACTIVATIONS[activation]()]
        inputs = width
    layers.append(nn.Linear(inputs, outputs))
    return nn.Sequential(*layers)


def linear_layers(module: nn.Module) -> list[nn.Linear]:
    return [m for m in module.modules() if isinstance(m, nn.Linear)]


def to_numpy_policy(
    layers: Sequence[nn.Linear], vocab: Vocab, *, activation: str = "tanh", problem: str = "inline-size",
    source: dict[str, Any] | None = None, extras: Sequence[str] = (),
) -> MLPPolicy:  # fmt: skip
    """The numpy policy with these linear layers' weights (``W = weight.T``)."""
    weights = [(lin.weight.detach().cpu().numpy().T.copy(), lin.bias.detach().cpu().numpy().copy()) for lin in layers]
    return MLPPolicy(weights, vocab, activation=activation, problem=problem, source=source, extras=extras)


@torch.no_grad()
def load_numpy_weights(layers: Sequence[nn.Linear], policy: MLPPolicy) -> None:
    """Copy a numpy policy's weights into torch linear layers of the same shapes."""
    if len(layers) != len(policy.weights):
        raise ValueError(f"{len(layers)} torch layers for a {len(policy.weights)}-layer policy")
    for lin, (w, b) in zip(layers, policy.weights, strict=True):
        if tuple(lin.weight.shape) != (w.shape[1], w.shape[0]):
            raise ValueError(f"layer shape {tuple(lin.weight.shape)} does not fit weights {w.shape[::-1]}")
        lin.weight.copy_(torch.as_tensor(np.ascontiguousarray(w.T), dtype=lin.weight.dtype))
        lin.bias.copy_(torch.as_tensor(b, dtype=lin.bias.dtype))
