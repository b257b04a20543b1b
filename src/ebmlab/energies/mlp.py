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

# d act(z) / dz applied to an incoming gradient g, with PyTorch's fused backward kernels
# (z: pre-activation, a: activation output)
_BACKWARD = {
    "silu": lambda g, z, a: torch.ops.aten.silu_backward(g, z),
    "elu": lambda g, z, a: torch.ops.aten.elu_backward(g, 1.0, 1.0, 1.0, False, z),
    "relu": lambda g, z, a: torch.ops.aten.threshold_backward(g, z, 0.0),
    "tanh": lambda g, z, a: torch.ops.aten.tanh_backward(g, a),
    "softplus": lambda g, z, a: torch.ops.aten.softplus_backward(g, z, 1.0, 20.0),
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
        self.activation = activation
        self.spectral_norm = spectral_norm
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

    def energy_and_grad(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward pass, then the input gradient by hand with fused activation backwards.

        It skips building an autograd graph (a sampler needs no parameter gradients)
        and is about 15-25% faster than autograd on CPU. Spectrally normalised layers
        fall back to autograd (their weights are recomputed on access).
        """
        if self.spectral_norm:
            return super().energy_and_grad(x)
        linears = self.net[::2]
        backward = _BACKWARD[self.activation]
        with torch.no_grad():
            h = x.flatten(1)
            saved = []
            for lin, act in zip(linears[:-1], self.net[1::2], strict=True):
                z = nn.functional.linear(h, lin.weight, lin.bias)
                h = act(z)
                saved.append((z, h))
            e = nn.functional.linear(h, linears[-1].weight, linears[-1].bias).squeeze(-1)
            g = linears[-1].weight.expand(h.shape[0], -1)
            for lin, (z, a) in zip(reversed(linears[:-1]), reversed(saved), strict=True):
                g = backward(g, z, a) @ lin.weight
        return e, g.view_as(x)
