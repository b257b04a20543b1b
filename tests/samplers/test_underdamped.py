"""Underdamped Langevin (BAOAB, OBABO) and SGHMC recover a correlated Gaussian."""

import pytest
import torch

from ebmlab.energies import Gaussian
from ebmlab.samplers import SGHMC, ParallelTempering, UnderdampedLangevin
from ebmlab.samplers.diagnostics import effective_sample_size
from ebmlab.testing import assert_mean_close

MEAN = torch.tensor([1.0, -1.0])
COV = torch.tensor([[1.0, 0.8], [0.8, 1.5]])


def second_moments_close(sampler, steps=1500):
    x0 = torch.randn(64, 2, generator=torch.Generator().manual_seed(5)) * 3
    traj = sampler.sample(Gaussian(MEAN, COV), x0, steps, burn_in=300, thin=1, generator=11)
    assert_mean_close(traj.reshape(-1, 2), MEAN, ess=effective_sample_size(traj))
    c = traj.reshape(-1, 2) - MEAN
    products = torch.stack([c[:, 0] ** 2, c[:, 1] ** 2, c[:, 0] * c[:, 1]], 1)
    ess = effective_sample_size(products.reshape(traj.shape[0], 64, 3))
    expected = torch.stack([COV[0, 0], COV[1, 1], COV[0, 1]])
    assert_mean_close(products, expected, ess=ess, what="second moments")


@pytest.mark.parametrize(
    "sampler",
    [
        UnderdampedLangevin(0.7, friction=1.0),  # BAOAB is exact on Gaussians at any stable h
        UnderdampedLangevin(0.2, friction=1.0, scheme="obabo"),
        SGHMC(0.01, momentum_decay=0.1),
    ],
    ids=["baoab", "obabo", "sghmc"],
)
def test_recovers_mean_and_covariance(sampler):
    second_moments_close(sampler)


def test_moment_check_catches_a_large_sghmc_step():
    with pytest.raises(AssertionError):
        second_moments_close(SGHMC(0.3, momentum_decay=0.3))


def test_one_gradient_per_step_and_momentum_persists():
    sampler = UnderdampedLangevin(0.3)
    run = sampler.run(Gaussian(MEAN, COV), torch.zeros(8, 2), 10, generator=0)
    assert run.info["n_grad_evals"] == 8 * 11  # init + one per step
    assert run.final.momentum.abs().sum() > 0


def test_tempered_kernels_in_parallel_tempering():
    pt = ParallelTempering(UnderdampedLangevin(0.5), [1.0, 0.5, 0.25])
    kernel = pt.base.tempered(torch.tensor([1.0, 0.25]))
    torch.testing.assert_close(kernel.step_size, torch.tensor([0.5, 1.0]))
    second_moments_close(ParallelTempering(UnderdampedLangevin(0.5), [1.0, 0.5]), steps=600)


def test_bad_input():
    with pytest.raises(ValueError, match="friction"):
        UnderdampedLangevin(0.1, friction=0.0)
    with pytest.raises(ValueError, match="scheme"):
        UnderdampedLangevin(0.1, scheme="leapfrog")
    with pytest.raises(ValueError, match="noise_estimate must be below momentum_decay"):
        SGHMC(0.01, momentum_decay=0.1, noise_estimate=0.2)
    with pytest.raises(ValueError, match="momentum_decay"):
        SGHMC(0.01, momentum_decay=0.0)
