import math

import pytest
import torch

from ebmlab.energies import Banana, DiagonalGaussian, DoubleWell, Funnel, Gaussian, GaussianMixture
from ebmlab.partition import quadrature_log_partition
from ebmlab.testing import assert_mean_close


def correlated_gaussian():
    cov = torch.tensor([[1.0, 0.8], [0.8, 2.0]])
    return Gaussian(torch.tensor([0.5, -1.0]), cov)


def two_d_models():
    return {
        "gaussian": (correlated_gaussian(), ((-8, 9), (-10, 8))),
        "diagonal": (
            DiagonalGaussian(torch.tensor([0.0, 1.0]), torch.tensor([0.5, 2.0])),
            ((-4, 4), (-15, 17)),
        ),
        "mixture": (
            GaussianMixture(
                torch.tensor([0.3, 0.7]),
                torch.tensor([[-2.0, 0.0], [2.0, 1.0]]),
                torch.stack([torch.eye(2) * 0.5, torch.tensor([[1.0, 0.3], [0.3, 0.5]])]),
            ),
            ((-7, 7), (-6, 7)),
        ),
        "banana": (Banana(curvature=0.5), ((-6, 6), (-8, 20))),
        "double_well": (DoubleWell(dim=2, depth=2.0), ((-3, 3), (-8, 8))),
        "funnel": (Funnel(dim=2, scale=1.0), ((-7, 7), (-40, 40))),
    }


@pytest.mark.parametrize("name", list(two_d_models()))
def test_log_partition_matches_quadrature(name):
    model, bounds = two_d_models()[name]
    est = quadrature_log_partition(model, bounds, n_points=1024)
    assert abs(est.log_z - float(model.log_partition())) < 2e-3 + 3 * est.stderr


@pytest.mark.parametrize("name", list(two_d_models()))
def test_samples_have_the_moments_of_the_density(name):
    """Sample means equal quadrature means of exp(-E)/Z, within 4 standard errors."""
    from ebmlab.partition import grid_points

    model, bounds = two_d_models()[name]
    pts, cell = grid_points(bounds, 1024)
    with torch.no_grad():
        w = torch.exp(-model(pts.float()).double() - float(model.log_partition())) * cell
    mean = (w[:, None] * pts).sum(0) / w.sum()
    x = model.sample(50_000, torch.Generator().manual_seed(1))
    assert_mean_close(x, mean)
    assert_mean_close(x**2, (w[:, None] * pts**2).sum(0) / w.sum(), what="second moment")


def test_normalized_mixture_has_the_given_component_weights():
    """log p(x) = log sum_k pi_k N(x; mu_k, Sigma_k), against scipy's normal densities."""
    from scipy.stats import multivariate_normal

    pi = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    means = torch.tensor([[-2.0, 0.0], [2.0, 1.0], [0.0, -3.0]], dtype=torch.float64)
    covs = torch.stack(
        [torch.eye(2) * 0.1, torch.tensor([[1.0, 0.3], [0.3, 0.5]]), torch.eye(2) * 4.0]
    ).double()
    mix = GaussianMixture.normalized(pi, means, covs)
    x = torch.randn(50, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 2
    terms = torch.stack([
        float(p) * torch.from_numpy(multivariate_normal(m.numpy(), c.numpy()).pdf(x.numpy()))
        for p, m, c in zip(pi, means, covs, strict=True)
    ], dim=1)  # fmt: skip
    torch.testing.assert_close(mix.log_prob(x), terms.sum(1).log())
    torch.testing.assert_close(mix.mixture_weights(), pi)
    # the responsibilities p(k | x); the covariances differ, so a stray log-determinant
    # term in them would move every row
    torch.testing.assert_close(mix.component_posterior(x), terms / terms.sum(1, keepdim=True))


def test_gaussian_sample_covariance():
    g = correlated_gaussian()
    x = g.sample(200_000, torch.Generator().manual_seed(0))
    torch.testing.assert_close(torch.cov(x.T), g.covariance, atol=0.02, rtol=0.02)


def test_log_prob_of_standard_normal():
    g = DiagonalGaussian(torch.zeros(3), torch.ones(3))
    x = torch.randn(5, 3)
    expected = torch.distributions.Normal(0.0, 1.0).log_prob(x).sum(1)
    torch.testing.assert_close(g.log_prob(x), expected)


def test_funnel_log_partition_in_ten_dimensions():
    f = Funnel(dim=10)
    assert float(f.log_partition()) == pytest.approx(5 * math.log(2 * math.pi) + math.log(3.0))
    x = f.sample(100_000, torch.Generator().manual_seed(0))
    assert_mean_close(x[:, :1], torch.zeros(1))
    assert abs(float(x[:, 0].std()) - 3.0) < 0.05


def test_double_well_is_symmetric_and_bimodal():
    x = DoubleWell(dim=3, depth=3.0).sample(40_000, torch.Generator().manual_seed(0))
    frac_right = float((x[:, 0] > 0).double().mean())
    assert abs(frac_right - 0.5) < 4 * math.sqrt(0.25 / len(x))
    assert float((x[:, 0].abs() < 0.3).double().mean()) < 0.05


def test_bad_parameters_are_rejected():
    with pytest.raises(ValueError, match="positive definite"):
        Gaussian(torch.zeros(2), torch.tensor([[1.0, 2.0], [2.0, 1.0]]))
    with pytest.raises(ValueError, match="covariance must end in shape"):
        Gaussian(torch.zeros(2), torch.eye(3))
    with pytest.raises(ValueError, match="std must be > 0"):
        DiagonalGaussian(torch.zeros(2), torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match="dim must be >= 2"):
        Funnel(dim=1)
    with pytest.raises(TypeError, match="n must be an integer"):
        Banana().sample(2.5)
