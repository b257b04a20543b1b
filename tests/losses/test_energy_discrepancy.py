"""Energy discrepancy recovers the parameters of models that contain the data's law."""

import pytest
import torch

from ebmlab.losses import energy_discrepancy_loss


def fit(energy, params, x, steps=250, **kw):
    opt = torch.optim.Adam(params, lr=0.05)
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        loss, _ = energy_discrepancy_loss(energy, x, generator=gen, **kw)
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_gaussian_perturbation_recovers_mean_and_scale():
    x = 1.5 + 0.5 * torch.randn(2000, 2, generator=torch.Generator().manual_seed(1))
    mean = torch.zeros(2, requires_grad=True)
    log_std = torch.zeros(2, requires_grad=True)

    def energy(z):
        return (((z - mean) / log_std.exp()) ** 2).sum(1) / 2

    fit(energy, [mean, log_std], x, scale=0.5, n_negatives=16)
    torch.testing.assert_close(mean.detach(), torch.full((2,), 1.5), atol=0.05, rtol=0)
    torch.testing.assert_close(log_std.exp().detach(), torch.full((2,), 0.5), atol=0.05, rtol=0)


def test_bernoulli_perturbation_recovers_unit_probabilities():
    p = torch.tensor([0.1, 0.5, 0.8, 0.95])
    x = (torch.rand(2000, 4, generator=torch.Generator().manual_seed(2)) < p).float()
    logits = torch.zeros(4, requires_grad=True)
    fit(lambda z: -z @ logits, [logits], x, perturbation="bernoulli", scale=0.2, n_negatives=16)
    torch.testing.assert_close(torch.sigmoid(logits).detach(), p, atol=0.04, rtol=0)


def test_stabiliser_bounds_the_loss_below():
    """With w = 1 the loss is at least log(1 / M) whatever the energy; with w = 0 a model
    that puts the data at the bottom of a steep well drives it towards minus infinity."""
    x = torch.zeros(64, 2)

    def steep(z):
        return 1e5 * (z**2).sum(1)

    m = 8
    stabilised, _ = energy_discrepancy_loss(steep, x, n_negatives=m, w=1.0)
    plain, _ = energy_discrepancy_loss(steep, x, n_negatives=m, w=0.0)
    assert float(stabilised) >= -torch.log(torch.tensor(float(m))) - 1e-6
    assert float(plain) < -100


def test_bad_input():
    x = torch.randn(4, 2)
    with pytest.raises(ValueError, match="perturbation"):
        energy_discrepancy_loss(lambda z: z.sum(1), x, perturbation="uniform")
    with pytest.raises(ValueError, match=r"flip probability below 0\.5"):
        energy_discrepancy_loss(lambda z: z.sum(1), x, perturbation="bernoulli", scale=0.6)
    with pytest.raises(ValueError, match="n_negatives"):
        energy_discrepancy_loss(lambda z: z.sum(1), x, n_negatives=0)
