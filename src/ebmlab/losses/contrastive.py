"""Contrastive divergence: pull down the energy of data, pull up that of samples.

The log-likelihood gradient of p = exp(-E)/Z is (Song & Kingma 2021, eq. 4; Tomczak 2024, eq. 6.23)

    grad_theta log p(x) = -grad_theta E(x) + E_{x' ~ p}[grad_theta E(x')],

and replacing the expectation by model samples gives the surrogate loss

    L = mean E(x_data) - mean E(x_sample)

whose gradient is the negative of that estimate (the contrastive-divergence
update of LeCun et al. 2006, §2; Tomczak 2024, eq. 6.25 with f = -E).
"""

from __future__ import annotations

import torch

from ebmlab import _checks
from ebmlab.energies.base import EnergyLike, as_energy_fn


def contrastive_divergence_loss(
    energy: EnergyLike,
    x_data: torch.Tensor,
    x_sample: torch.Tensor,
    *,
    l2: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CD surrogate loss with optional energy-magnitude penalty ``l2 * mean(E^2)``.

    The penalty (Du & Mordatch 2019) keeps energies near zero so that their
    difference, not their level, carries the signal. Returns ``(loss, metrics)``.

    Args:
        x_data: training examples (B, ...).
        x_sample: model samples (negatives), x_data's event shape.
    """
    _checks.tensor("x_data", x_data, min_ndim=2, floating=True, finite=True)
    _checks.tensor("x_sample", x_sample, min_ndim=2, floating=True, finite=True)
    _checks.positive("l2", l2, allow_zero=True)
    fn = as_energy_fn(energy)
    e_data = fn(x_data)
    e_sample = fn(x_sample.detach())
    loss = e_data.mean() - e_sample.mean()
    if l2:
        loss = loss + l2 * (e_data.pow(2).mean() + e_sample.pow(2).mean())
    metrics = {
        "energy_data": float(e_data.detach().mean()),
        "energy_sample": float(e_sample.detach().mean()),
        "energy_gap": float(e_sample.detach().mean() - e_data.detach().mean()),
    }
    return loss, metrics
