"""Learning rules for energies on binary vectors that avoid the partition function.

Both compare each data point x with its D single-bit flips x^(i):

- pseudo-likelihood (Besag 1975): -sum_i log p(x_i | x_-i) = sum_i softplus(E(x) - E(x^(i)));
- minimum probability flow (Sohl-Dickstein, Battaglino & DeWeese 2011), with
  single-flip connectivity: K = sum_i exp((E(x) - E(x^(i))) / 2), the initial rate of
  probability flowing out of the data under dynamics that converge to the model.

Both are consistent, cost D energy evaluations per example, and return (loss, metrics).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.energies.base import EnergyLike, as_energy_fn


def _flip_gaps(energy: EnergyLike, x: torch.Tensor) -> torch.Tensor:
    """E(x) - E(x^(i)) for every example and site, (B, D)."""
    _checks.tensor("x", x, ndim=2, floating=True)
    if not ((x == 0) | (x == 1)).all():
        raise ArgumentError("x must be binary: every value 0 or 1")
    fn = as_energy_fn(energy)
    b, d = x.shape
    flipped = x.repeat_interleave(d, 0)  # row b * d + i flips site i of example b
    sites = torch.arange(d, device=x.device).repeat(b)
    rows = torch.arange(b * d, device=x.device)
    flipped[rows, sites] = 1 - flipped[rows, sites]
    return fn(x)[:, None] - fn(flipped).view(b, d)


def pseudo_likelihood_loss(
    energy: EnergyLike, x: torch.Tensor
) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean negative log pseudo-likelihood, sum_i softplus(E(x) - E(x^(i))).

    Args:
        energy: E over binary vectors, (B, D) -> (B,).
    """
    loss = F.softplus(_flip_gaps(energy, x)).sum(1).mean()
    return loss, {"pseudo_nll": float(loss.detach())}


def minimum_probability_flow_loss(
    energy: EnergyLike, x: torch.Tensor
) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean probability flow K = sum_i exp((E(x) - E(x^(i))) / 2) over single-bit flips.

    Args:
        energy: E over binary vectors, (B, D) -> (B,).
    """
    loss = torch.exp(0.5 * _flip_gaps(energy, x)).sum(1).mean()
    return loss, {"flow": float(loss.detach())}
