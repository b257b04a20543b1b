"""A classifier read as an energy-based model (seed 002, sections 6.2-6.3; Grathwohl et al. 2020).

A network NN(x) with K outputs defines E(x, y) = -NN(x)[y] (eq. 6.5), the joint
p(x, y) = exp(NN(x)[y]) / Z (eqs. 6.6-6.7), the marginal energy
E(x) = -LogSumExp_y NN(x)[y] (eqs. 6.11-6.13) and the classifier
p(y | x) = softmax(NN(x))[y] (eqs. 6.14-6.16): one network, both a classifier and
an unnormalised density.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ebmlab import _checks
from ebmlab.energies.base import EnergyModel
from ebmlab.energies.mlp import FeedForward


class ClassifierEnergy(EnergyModel):
    """Energy view of a classifier ``net`` mapping x to K logits.

    ``energy(x)`` is the marginal (free) energy -LogSumExp_y logits; ``energy(x, y)``
    is -logits[y]. A :class:`~ebmlab.energies.mlp.FeedForward` net gets hand-fused
    input gradients; any other net uses autograd.
    """

    def __init__(self, net: nn.Module, num_classes: int) -> None:
        super().__init__()
        if not isinstance(net, nn.Module):
            raise TypeError(f"net must be a torch.nn.Module, got {type(net).__name__}")
        self.net = net
        self.num_classes = _checks.positive_int("num_classes", num_classes)
        if num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {num_classes}")

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        if out.ndim != 2 or out.shape[1] != self.num_classes:
            raise ValueError(
                f"net must return logits of shape (B, {self.num_classes}), got {tuple(out.shape)}"
            )
        return out

    def energy(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.logits(x)
        if y is None:
            return -torch.logsumexp(logits, 1)
        return -logits.gather(1, y.long().view(-1, 1)).squeeze(1)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        return self.energy(x, y)

    def predict_proba(self, x: torch.Tensor) -> torch.Tensor:
        """p(y | x) = softmax(NN(x)) (eq. 6.16)."""
        return torch.softmax(self.logits(x), 1)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """argmax_y p(y | x) = argmin_y E(x, y)."""
        return self.logits(x).argmax(1)

    def conditional(self, y: torch.Tensor) -> ClassConditionalEnergy:
        """The energy E(x, y) for fixed labels ``y`` (one per chain), for sampling x ~ p(x | y)."""
        return ClassConditionalEnergy(self, y)

    def energy_and_grad(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(self.net, FeedForward):

            def head(out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                return -torch.logsumexp(out, 1), -torch.softmax(out, 1)

            return self.net.value_and_input_grad(x, head, self.grad_dtype)
        return super().energy_and_grad(x)


class ClassConditionalEnergy(EnergyModel):
    """E(x | y) = -NN(x)[y] with one fixed label per chain."""

    def __init__(self, model: ClassifierEnergy, y: torch.Tensor) -> None:
        super().__init__()
        self.model = model
        self.grad_dtype = model.grad_dtype
        self.register_buffer("y", y.long())

    def energy(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.energy(x, self.y)

    def energy_and_grad(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(self.model.net, FeedForward):
            y = self.y

            def head(out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                return -out.gather(1, y.view(-1, 1)).squeeze(1), -F.one_hot(y, out.shape[1]).to(
                    out.dtype
                )

            return self.model.net.value_and_input_grad(x, head, self.model.grad_dtype)
        return super().energy_and_grad(x)
