"""Equilibrium Matching's loss: its c(gamma) checked through the minimiser in closed form."""

import pytest
import torch

from ebmlab._checks import ArgumentError
from ebmlab.losses import equilibrium_matching_loss
from ebmlab.losses.flow_matching import equilibrium_scale


def test_truncated_decay_is_constant_then_falls_to_zero_at_the_data():
    t = torch.tensor([0.0, 0.5, 0.8, 0.9, 1.0])
    assert torch.allclose(equilibrium_scale(t), torch.tensor([4.0, 4.0, 4.0, 2.0, 0.0]))


@pytest.mark.parametrize("decay_start,scale", [(0.8, 4.0), (0.5, 1.0)])
def test_the_loss_is_least_at_the_gain_its_decay_implies(decay_start, scale):
    """Data at one point m, noise x0 ~ N(0, I), and the energy E(x) = k |x - m|^2 / 2,
    whose field k (m - x_gamma) = k (1 - gamma) (m - x0) regresses on c(gamma) (m - x0):
    L(k) = E|m - x0|^2 E[(k (1 - gamma) - c(gamma))^2], least at
    k* = E[(1 - gamma) c] / E[(1 - gamma)^2] = 3 lambda ((1 - (1 - a)^2) / 2 + (1 - a)^2 / 3),
    and L(k* + d) - L(k*) = E|m - x0|^2 d^2 / 3. Without the decay k* would be 3 lambda
    / 2, which moves these differences by 16 % or more."""
    a, lam = decay_start, scale
    k_star = 3 * lam * ((1 - (1 - a) ** 2) / 2 + (1 - a) ** 2 / 3)
    m = torch.tensor([1.0, -2.0], dtype=torch.float64)
    x1 = m.expand(400_000, 2)
    spread = float(m.square().sum() + 2)  # E|m - x0|^2

    def loss(k: float) -> float:
        def energy(x):
            return 0.5 * k * (x - m).square().sum(1)

        g = torch.Generator().manual_seed(0)  # the same noise and times for every k
        out, _ = equilibrium_matching_loss(energy, x1, decay_start=a, scale=scale, generator=g)
        return float(out.detach())

    base = loss(k_star)
    for d in (-1.0, 0.5, 2.0):
        assert loss(k_star + d) - base == pytest.approx(spread * d * d / 3, rel=0.05)
    # a scale other than the loss's own would move the minimum: a negative control
    assert loss(k_star * 0.8) - base > 0.01 * spread
    with pytest.raises(ArgumentError, match="decay_start must be < 1"):
        equilibrium_matching_loss(lambda x: x.sum(1), x1[:4], decay_start=1.0)
