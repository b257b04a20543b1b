"""A multilayer-perceptron energy for vectors: E(x) = MLP(x), a free-form neural energy."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import nn

from ebmlab import _checks
from ebmlab.energies.base import EnergyModel

ACTIVATIONS = {
    "silu": nn.SiLU,
    "elu": nn.ELU,
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "softplus": nn.Softplus,
}


class MLPEnergy(EnergyModel):
    """E(x) = MLP(x) with smooth activations (SiLU by default, so Langevin gradients are smooth).

    ``spectral_norm`` wraps each linear layer in spectral normalisation, which bounds the
    Lipschitz constant of E and tames sampler gradients.
    """

    def __init__(
        self,
        dim: int,
        hidden: Sequence[int] = (128, 128),
        activation: str = "silu",
        spectral_norm: bool = False,
    ) -> None:
        super().__init__()
        _checks.positive_int("dim", dim)
        _checks.one_of("activation", activation, list(ACTIVATIONS))
        for width in hidden:
            _checks.positive_int("hidden width", width)
        self.dim = dim
        sizes = [dim, *hidden, 1]
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(itertools.pairwise(sizes)):
            lin = nn.Linear(a, b)
            layers.append(nn.utils.parametrizations.spectral_norm(lin) if spectral_norm else lin)
            if i < len(sizes) - 2:
                layers.append(ACTIVATIONS[activation]())
        self.net = nn.Sequential(*layers)

    def energy(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1)).squeeze(-1)
