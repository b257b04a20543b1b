"""The energy interface: p(x) = exp(-E(x)) / Z (seed 002, eq. 6.1).

Everything in ebmlab that needs an energy accepts either an :class:`EnergyModel`
or any plain callable mapping a batch ``(B, *event_shape)`` to energies ``(B,)``.
:func:`as_energy_fn` turns both into the callable form and checks the output
shape on use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Union

import torch
from torch import nn

EnergyFn = Callable[[torch.Tensor], torch.Tensor]
EnergyLike = Union["EnergyModel", EnergyFn]


class EnergyModel(nn.Module):
    """Base class of energy functions E(x); lower energy means more likely.

    Subclasses implement :meth:`energy` for a batch ``(B, *event_shape)`` and
    return ``(B,)``. ``forward`` is the energy, so a model is itself an energy
    callable.
    """

    def energy(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.energy(x)

    def unnormalized_log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """log p(x) + log Z = -E(x)."""
        return -self.energy(x)

    def score(self, x: torch.Tensor) -> torch.Tensor:
        """The score grad_x log p(x) = -grad_x E(x); Z does not depend on x."""
        return score(self, x)

    def log_ratio(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        """log p(x1)/p(x2) = E(x2) - E(x1): Z cancels (seed 001, 'ratios without Z')."""
        return self.energy(x2) - self.energy(x1)


def as_energy_fn(energy: EnergyLike) -> EnergyFn:
    """Return a callable ``x -> (B,)`` for an :class:`EnergyModel` or plain callable.

    The returned function checks that the energy has one value per batch row.
    """
    if not callable(energy):
        raise TypeError(
            f"energy must be an EnergyModel or a callable x -> (B,), got {type(energy).__name__}"
        )
    fn = energy.energy if isinstance(energy, EnergyModel) else energy

    def checked(x: torch.Tensor) -> torch.Tensor:
        e = fn(x)
        if not isinstance(e, torch.Tensor) or e.shape != x.shape[:1]:
            shape = tuple(e.shape) if isinstance(e, torch.Tensor) else type(e).__name__
            raise ValueError(
                f"energy must return one value per sample, shape ({x.shape[0]},), got {shape}"
            )
        return e

    return checked


def energy_and_grad(
    energy: EnergyFn, x: torch.Tensor, *, create_graph: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(E(x), grad_x E(x))`` with one backward pass.

    The returned energy is detached unless ``create_graph`` is set (needed when a
    loss differentiates through the gradient, e.g. score matching).
    """
    with torch.enable_grad():
        xg = x.detach().requires_grad_(True)
        e = energy(xg)
        (g,) = torch.autograd.grad(e.sum(), xg, create_graph=create_graph)
    if create_graph:
        return e, g
    return e.detach(), g.detach()


def score(energy: EnergyLike, x: torch.Tensor) -> torch.Tensor:
    """The score -grad_x E(x) of any energy."""
    return -energy_and_grad(as_energy_fn(energy), x)[1]
