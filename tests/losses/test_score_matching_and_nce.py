import math

import torch
from torch import nn

from ebmlab.energies import DiagonalGaussian, EnergyModel
from ebmlab.losses import (
    denoising_score_matching_loss,
    nce_loss,
    score_matching_loss,
    sliced_score_matching_loss,
)


class LearnableGaussian(EnergyModel):
    """E(x) = |x - mu|^2 / (2 s^2) with learnable mu and log s (one per dimension)."""

    def __init__(self, dim):
        super().__init__()
        self.mu = nn.Parameter(torch.zeros(dim))
        self.log_s = nn.Parameter(torch.zeros(dim))

    def energy(self, x):
        return (((x - self.mu) / self.log_s.exp()) ** 2).sum(1) / 2


DATA_MEAN = torch.tensor([1.0, -2.0])
DATA_STD = torch.tensor([0.5, 2.0])


def data(n=20_000, seed=0):
    return DATA_MEAN + DATA_STD * torch.randn(n, 2, generator=torch.Generator().manual_seed(seed))


def fit(model, loss_fn, steps=600, lr=0.05, extra=()):
    opt = torch.optim.Adam([*model.parameters(), *extra], lr=lr)
    for _ in range(steps):
        loss, _ = loss_fn()
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_exact_score_matching_matches_the_closed_form_and_recovers_the_gaussian():
    x = data()
    model = LearnableGaussian(2)
    # closed form for this family: J = mean(|x - mu|^2 / (2 s^4)) - sum 1/s^2
    loss, _ = score_matching_loss(model, x)
    assert abs(float(loss.detach()) - float((x**2 / 2).sum(1).mean() - 2)) < 1e-4
    fit(model, lambda: score_matching_loss(model, x))
    assert (model.mu - DATA_MEAN).abs().max() < 0.05
    assert (model.log_s.exp() - DATA_STD).abs().max() < 0.05


def test_sliced_and_exact_score_matching_agree_in_expectation():
    x = data(2000)
    model = LearnableGaussian(2)
    with torch.no_grad():
        model.mu.copy_(torch.tensor([0.3, 0.1]))
        model.log_s.copy_(torch.tensor([0.2, -0.1]))
    exact, _ = score_matching_loss(model, x)
    sliced, _ = sliced_score_matching_loss(
        model, x, n_projections=50, generator=torch.Generator().manual_seed(0)
    )
    sliced, exact = float(sliced.detach()), float(exact.detach())
    assert abs(sliced - exact) < 0.05 * abs(exact)


def test_denoising_score_matching_recovers_the_smoothed_gaussian():
    x = data()
    model = LearnableGaussian(2)
    gen = torch.Generator().manual_seed(1)
    fit(
        model, lambda: denoising_score_matching_loss(model, x[:4000], 0.3, generator=gen), steps=800
    )
    smoothed = (DATA_STD**2 + 0.3**2).sqrt()  # the data convolved with N(0, 0.3^2)
    assert (model.mu - DATA_MEAN).abs().max() < 0.08
    assert (model.log_s.exp() - smoothed).abs().max() < 0.08


def test_nce_recovers_the_gaussian_and_its_log_partition_function():
    x = data()
    noise = DiagonalGaussian(torch.zeros(2), torch.full((2,), 3.0))
    y = noise.sample(40_000, torch.Generator().manual_seed(2))
    model = LearnableGaussian(2)
    c = nn.Parameter(torch.zeros(()))
    fit(model, lambda: nce_loss(model, c, x, y, noise.log_prob), steps=800, extra=[c])
    assert (model.mu - DATA_MEAN).abs().max() < 0.06
    assert (model.log_s.exp() - DATA_STD).abs().max() < 0.06
    true_log_z = float(torch.log(model.log_s.detach().exp() * math.sqrt(2 * math.pi)).sum())
    assert abs(float(c.detach()) - true_log_z) < 0.05


def test_contrastive_divergence_with_an_exact_sampler_reaches_the_maximum_likelihood_estimate():
    """1-D Gaussian family: with exact model samples the CD surrogate's gradient is the
    log-likelihood gradient, so training ends at the sample mean and the (biased) sample
    standard deviation of the data."""
    from ebmlab.losses import contrastive_divergence_loss

    x = 1.5 + 0.7 * torch.randn(500, 1, generator=torch.Generator().manual_seed(3))
    model = LearnableGaussian(1)
    gen = torch.Generator().manual_seed(4)
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    steps = 1500
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1 / (1 + t / 50))
    for _ in range(steps):
        with torch.no_grad():  # exact samples of the current model
            samples = model.mu + model.log_s.exp() * torch.randn(4096, 1, generator=gen)
        loss, _ = contrastive_divergence_loss(model, x, samples)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    mu, s = float(model.mu.detach()), float(model.log_s.detach().exp())
    assert abs(mu - float(x.mean())) < 0.005
    assert abs(s - float(x.std(unbiased=False))) < 0.005
