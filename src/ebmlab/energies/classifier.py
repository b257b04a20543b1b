"""A classifier read as an energy-based model (Tomczak 2024, §6.2-6.3; Grathwohl et al.
2020).

A network NN(x) with K outputs defines E(x, y) = -NN(x)[y] (eq. 6.5), the joint
p(x, y) = exp(NN(x)[y]) / Z (eqs. 6.6-6.7), the marginal energy
E(x) = -LogSumExp_y NN(x)[y] (eqs. 6.11-6.13) and the classifier
p(y | x) = softmax(NN(x))[y] (eqs. 6.14-6.16): one network, both a classifier and
an unnormalised density.

The classifier's confidence can be tuned without touching the density: p(y | x) is
the Gibbs distribution over y at inverse temperature beta,
p(y | x) = exp(-beta E(x, y)) / sum_y' exp(-beta E(x, y')) (LeCun et al. 2006, section
"Negative Log-Likelihood Loss"; LeCun et al. 2006, eq. 1), and :meth:`ClassifierEnergy.calibrate`
fits beta on held-out data (temperature scaling, Guo et al. 2017).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.devices import widen
from ebmlab.energies.base import EnergyModel, in_chunks
from ebmlab.energies.mlp import FeedForward


class ClassifierEnergy(EnergyModel):
    """Energy view of a classifier ``net`` mapping x to K logits.

    ``energy(x)`` is the marginal (free) energy -LogSumExp_y logits; ``energy(x, y)``
    is -logits[y]. A :class:`~ebmlab.energies.mlp.FeedForward` net gets hand-fused
    input gradients; any other net uses autograd.

    Args:
        num_classes: number of classes.
    """

    def __init__(self, net: nn.Module, num_classes: int) -> None:
        super().__init__()
        if not isinstance(net, nn.Module):
            raise ArgumentError(f"net must be a torch.nn.Module, got {type(net).__name__}")
        self.net = net
        self.num_classes = _checks.positive_int("num_classes", num_classes)
        if num_classes < 2:
            raise ArgumentError(f"num_classes must be >= 2, got {num_classes}")
        self.register_buffer("beta", torch.tensor(1.0))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The network's outputs NN(x) = -E(x, y) for every class: (B, ...) -> (B, K)."""
        out = self.net(x)
        if out.ndim != 2 or out.shape[1] != self.num_classes:
            raise ArgumentError(
                f"net must return logits of shape (B, {self.num_classes}), got {tuple(out.shape)}"
            )
        return out

    def energy(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """E(x) = -logsumexp_y NN(x)[y], or with ``y`` (B,) E(x, y) = -NN(x)[y]: (B, ...) ->
        (B,)."""
        logits = self.logits(x)
        if y is None:
            return -torch.logsumexp(logits, 1)
        return -logits.gather(1, y.long().view(-1, 1)).squeeze(1)

    def predict_proba(self, x: torch.Tensor) -> torch.Tensor:
        """p(y | x) = softmax(beta NN(x)) (eq. 6.16 at inverse temperature ``beta``)."""
        return torch.softmax(self.beta * self.logits(x), 1)

    def calibrate(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Set ``beta`` to the inverse temperature that minimises the NLL of ``y`` given ``x``.

        Use held-out data (a validation split): on the training data a network is
        usually over-confident. Labels are predicted as before (argmax is unchanged by
        beta) and the density E(x) stays at beta = 1. The NLL is convex in beta, so its
        derivative, mean over rows of E_p[NN(x)] - NN(x)[y], is found to vanish by
        bisection on log beta over [1e-2, 1e2]. Returns the fitted beta.
        """
        if x.ndim < 2 or len(x) == 0:
            raise ArgumentError(f"x must be a non-empty batch (N, ...), got shape {tuple(x.shape)}")
        if y.shape != (len(x),):
            raise ArgumentError(f"y must have shape ({len(x)},), got {tuple(y.shape)}")
        y = y.long()
        if int(y.min()) < 0 or int(y.max()) >= self.num_classes:
            raise ArgumentError(f"y must hold class indices in [0, {self.num_classes})")
        with torch.no_grad():
            logits = widen(in_chunks(self.logits, x))
        target = logits.gather(1, y.view(-1, 1)).squeeze(1)

        def slope(log_beta: float) -> float:
            p = torch.softmax(math.exp(log_beta) * logits, 1)
            return float(((p * logits).sum(1) - target).mean())

        lo, hi = math.log(1e-2), math.log(1e2)
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if slope(mid) < 0 else (lo, mid)
        self.beta.fill_(math.exp(0.5 * (lo + hi)))
        return float(self.beta)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """argmax_y p(y | x) = argmin_y E(x, y)."""
        return self.logits(x).argmax(1)

    def conditional(self, y: torch.Tensor, guidance: float = 0.0) -> ClassConditionalEnergy:
        """The energy E(x, y) for fixed labels ``y`` (one per chain, or a 0-d tensor: one
        class for any batch), for sampling x ~ p(x | y); with ``guidance`` w > 0,
        x ~ p(x | y) p(y | x)^w (see :class:`ClassConditionalEnergy`)."""
        return ClassConditionalEnergy(self, y, guidance)

    def energy_and_grad(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(self.net, FeedForward):

            def head(out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                return -torch.logsumexp(out, 1), -torch.softmax(out, 1)

            return self.net.value_and_input_grad(x, head, self.grad_dtype)
        return super().energy_and_grad(x)


class ClassConditionalEnergy(EnergyModel):
    """E(x | y) = -NN(x)[y] with one fixed label per chain, or with ``guidance`` w the
    guided energy E(x, y) - w log p(y | x) = -(1 + w) NN(x)[y] + w LogSumExp_y' NN(x)[y'].

    Guidance sharpens each class's density into p(x | y) p(y | x)^w: samples that the
    classifier reads as their class with more confidence, at the price of diversity. Its
    gradient is classifier-free guidance's (Ho & Salimans 2022, eq. 6, with the
    unconditional score grad log p(x) = -grad E(x)), here from the one network that
    gives both energies; w = 0 is the plain conditional.

    Args:
        model: the classifier whose logits define E(x, y).
        y: the labels (B,), or one label (a 0-d tensor) for batches of any size.
        guidance: w >= 0.
    """

    def __init__(self, model: ClassifierEnergy, y: torch.Tensor, guidance: float = 0.0) -> None:
        super().__init__()
        self.model = model
        self.grad_dtype = model.grad_dtype
        self.guidance = _checks.positive("guidance", guidance, allow_zero=True)
        self.register_buffer("y", y.long())

    def labels(self, x: torch.Tensor) -> torch.Tensor:
        """The label of each row of ``x``."""
        return self.y.expand(len(x)) if self.y.ndim == 0 else self.y

    def _head(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The (guided) energy from the logits (B, K)."""
        chosen = logits.gather(1, y.view(-1, 1)).squeeze(1)
        if not self.guidance:
            return -chosen
        return -(1 + self.guidance) * chosen + self.guidance * torch.logsumexp(logits, 1)

    def energy(self, x: torch.Tensor) -> torch.Tensor:
        return self._head(self.model.logits(x), self.labels(x))

    def energy_and_grad(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(self.model.net, FeedForward):
            y, w = self.labels(x), self.guidance

            def head(out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                d_out = -(1 + w) * F.one_hot(y, out.shape[1]).to(out.dtype)
                if w:
                    d_out = d_out + w * torch.softmax(out, 1)
                return self._head(out, y), d_out

            return self.model.net.value_and_input_grad(x, head, self.model.grad_dtype)
        return super().energy_and_grad(x)
