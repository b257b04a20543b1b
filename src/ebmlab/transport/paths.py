"""Interpolation paths between paired noise and data, and their velocities.

The linear interpolant x_t = (1 - t) x0 + t x1 (Liu et al. 2023; Lipman et al. 2023
with sigma_min = 0) moves each pair at the constant velocity u = x1 - x0. A field v
that minimises E |v(x_t, t) - u|^2 over t ~ U(0, 1) and the pairs is the conditional
expectation E[x1 - x0 | x_t], whose flow carries the noise distribution to the data
distribution (Lipman et al. 2023, Thm. 2). With ``sigma`` > 0, x_t gets Gaussian noise
of that scale (the independent-coupling and OT flows of Tong et al. 2024, eq. 14), which
keeps the conditional paths from concentrating on lines.
"""

from __future__ import annotations

import torch

from ebmlab import _checks
from ebmlab.samplers.base import per_chain
from ebmlab.samplers.integrators import gaussian_noise


def linear_interpolant(
    x0: torch.Tensor,
    x1: torch.Tensor,
    t: torch.Tensor,
    *,
    sigma: float = 0.0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_t, u): the point at time ``t`` of each pair's straight path and its velocity.

    Args:
        x0: noise (B, ...).
        x1: data (B, ...), paired row by row with ``x0``.
        t: one time in [0, 1] per pair (B,).
        sigma: the standard deviation of Gaussian noise added to x_t.
        generator: source of that noise, on the data's device.
    """
    _checks.positive("sigma", sigma, allow_zero=True)
    tt = per_chain(t, x0)
    xt = x0 + tt * (x1 - x0)
    if sigma:
        xt = xt + sigma * gaussian_noise(xt, generator)
    return xt, x1 - x0
