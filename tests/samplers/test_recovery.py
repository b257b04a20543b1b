"""Diffusion recovery: blurring, the conditional sampler and the level-by-level sampler,
checked on standard normal data, whose every blurred marginal is N(0, I)."""

import pytest
import torch
from torch import nn

from ebmlab.energies import GaussianMixture, NoiseConditionalEnergy
from ebmlab.losses import diffusion_recovery_likelihood_loss
from ebmlab.samplers.recovery import OneLevel, RecoverySampler, blur, noise_schedule, recover
from ebmlab.testing import assert_mean_close

SIGMAS = noise_schedule(4, 0.1, 0.9)


class StandardNormalLevels(nn.Module):
    """E(x, t) = |x|^2 / 2 at every level: exact for N(0, I) data (the blur keeps the
    variance)."""

    n_levels, dim = len(SIGMAS), 2

    def __init__(self) -> None:
        super().__init__()
        self.unused = nn.Parameter(torch.zeros(()))

    def energy_at(self, x, level):
        return 0.5 * (x**2).sum(1)


def test_blur_matches_its_closed_form():
    x = torch.full((20000, 2), 2.0)
    level = torch.full((20000,), 2)
    x_t, x_next = blur(x, SIGMAS, level, torch.Generator().manual_seed(0))
    alphas = (1 - SIGMAS**2).sqrt()
    abar = float(alphas[:2].prod())
    assert_mean_close(x_t, torch.full((2,), 2.0 * abar))
    assert_mean_close(x_next, torch.full((2,), 2.0 * abar * float(alphas[2])))
    assert_mean_close((x_t - 2.0 * abar) ** 2, torch.full((2,), 1 - abar**2), what="variance")


@pytest.mark.parametrize("t", [0, 3])
def test_recover_samples_the_gaussian_posterior(t):
    """p(x_t | x_{t+1}) = N(alpha x_{t+1}, sigma^2) for standard normal marginals."""
    n = 4000
    x_next = torch.full((n, 2), 1.5)
    level = torch.full((n,), t)
    draws = recover(
        StandardNormalLevels(), x_next, level, SIGMAS, 400, 0.02, torch.Generator().manual_seed(1)
    )
    alpha, sigma = float((1 - SIGMAS[t] ** 2).sqrt()), float(SIGMAS[t])
    assert_mean_close(draws, torch.full((2,), 1.5 * alpha))
    ratio = draws.var(0) / sigma**2
    assert ((ratio > 0.93) & (ratio < 1.07)).all(), ratio


def test_adjusted_recovery_keeps_the_conditional_exact_at_a_large_step():
    """With a step as large as the conditional variance, unadjusted Langevin draws a
    Gaussian conditional about twice too wide (its stationary variance is
    v / (1 - h / (2 v))); the Metropolis-adjusted steps keep it exact."""
    n, t = 4000, 0
    x_next = torch.full((n, 2), 1.5)
    level = torch.full((n,), t)
    alpha, sigma = float((1 - SIGMAS[t] ** 2).sqrt()), float(SIGMAS[t])
    step_scale = 0.8 * alpha**2  # of (sigma / alpha)^2: h = 0.8 sigma^2
    ratios = {}
    for adjusted in (False, True):
        draws = recover(
            StandardNormalLevels(), x_next, level, SIGMAS, 200, step_scale,
            torch.Generator().manual_seed(2), adjusted=adjusted,
        )  # fmt: skip
        ratios[adjusted] = draws.var(0) / sigma**2
    assert_mean_close(draws, torch.full((2,), 1.5 * alpha))
    assert ((ratios[True] > 0.93) & (ratios[True] < 1.07)).all(), ratios
    assert (ratios[False] > 1.4).all(), ratios
    with pytest.raises(ValueError, match="adjusted"):
        recover(
            StandardNormalLevels(), x_next, level, SIGMAS, 1, 0.1, None,
            clamp=(-1.0, 1.0), adjusted=True,
        )  # fmt: skip


class StandardNormal(nn.Module):
    """E(x) = |x|^2 / 2 over every axis but the first: N(0, I) of any row shape."""

    def __init__(self) -> None:
        super().__init__()
        self.unused = nn.Parameter(torch.zeros(()))

    def energy(self, x):
        return 0.5 * (x**2).flatten(1).sum(1)


def test_one_level_recovers_image_shaped_rows_from_their_blur():
    """An unconditional energy's recovery from one blur of N(0, I) rows shaped (2, 3):
    p(x | x~) = N(alpha x~, sigma^2) on every pixel, as the JEM recipe's ``drl``
    objective samples it."""
    n, sigma = 4000, torch.tensor([0.3])
    x = torch.randn(n, 2, 3, generator=torch.Generator().manual_seed(3))
    level = torch.zeros(n, dtype=torch.long)
    _, blurred = blur(x, sigma, level, torch.Generator().manual_seed(4))
    assert blurred.shape == x.shape
    draws = recover(OneLevel(StandardNormal()), blurred, level, sigma, 400, 0.02, torch.Generator())
    alpha = float((1 - sigma**2).sqrt())
    residual = (draws - alpha * blurred).flatten(1)
    assert_mean_close(residual, torch.zeros(6))
    ratio = residual.var(0) / 0.09
    assert ((ratio > 0.93) & (ratio < 1.07)).all(), ratio


def test_recovery_sampler_returns_the_data_law_level_by_level():
    sampler = RecoverySampler(SIGMAS, steps=200, step_scale=0.05)
    levels = sampler.sample(StandardNormalLevels(), 4000, generator=2, return_levels=True)
    assert levels.shape == (len(SIGMAS) + 1, 4000, 2)
    assert_mean_close(levels[-1], torch.zeros(2))
    ratio = levels[-1].var(0)
    assert ((ratio > 0.9) & (ratio < 1.1)).all(), ratio


def test_loss_runs_on_a_noise_conditional_network_and_checks_its_levels():
    model = NoiseConditionalEnergy(2, len(SIGMAS), hidden=(16,))
    loss, metrics = diffusion_recovery_likelihood_loss(
        model, torch.randn(32, 2), SIGMAS, langevin_steps=3, generator=torch.Generator()
    )
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    assert set(metrics) == {"energy_data", "energy_sample"}
    with pytest.raises(ValueError, match="4 levels"):
        diffusion_recovery_likelihood_loss(NoiseConditionalEnergy(2, 3), torch.randn(4, 2), SIGMAS)


def test_bad_schedules():
    for bad in ([], [0.1, 0.0], [0.5, 1.0], [[0.1]]):
        with pytest.raises(ValueError, match="sigmas must be"):
            RecoverySampler(bad)
    with pytest.raises(ValueError, match="last must be in"):
        noise_schedule(4, 0.1, 1.5)


def test_resampled_starts_draw_a_recovery_conditional_with_two_modes():
    """From a wide noise level the recovery conditional of a two-mode energy has both
    modes; short-run Langevin from x~ / alpha stays in the nearer one, the
    importance-resampled start gives each its exact weight (quadrature)."""
    mix = GaussianMixture.isotropic(torch.tensor([[-2.0], [2.0]]), 0.3)
    sigmas, n, x_tilde = [0.8], 4000, 0.3
    centre, width = x_tilde / 0.6, 0.8 / 0.6
    grid = torch.linspace(-6, 6, 20001)[:, None]
    log_p = -mix.energy(grid) - (grid[:, 0] - centre) ** 2 / (2 * width**2)
    exact = float(torch.softmax(log_p, 0)[grid[:, 0] > 0].sum())  # 0.745

    def right_mode_share(candidates: int) -> float:
        draws = recover(
            OneLevel(mix), torch.full((n, 1), x_tilde), torch.zeros(n, dtype=torch.long),
            torch.tensor(sigmas, dtype=torch.float64), 30, 0.1,
            torch.Generator().manual_seed(0), candidates=candidates,
        )  # fmt: skip
        return float((draws > 0).double().mean())

    mcse = (exact * (1 - exact) / n) ** 0.5
    assert abs(right_mode_share(500) - exact) < 4 * mcse
    assert right_mode_share(1) - exact > 0.2  # Langevin: 0.9995
    with pytest.raises(ValueError, match="candidates must be"):
        right_mode_share(0)
