"""Mixture log-likelihoods against the closed form of a Gaussian mixture."""

import math

import pytest
import torch

from ebmlab._checks import ArgumentError
from ebmlab.evaluation import log_likelihood, mixture_log_likelihood
from ebmlab.partition import LogZEstimate


def gaussian(mean: float, sd: float):
    def energy(x: torch.Tensor) -> torch.Tensor:
        return 0.5 * ((x[:, 0] - mean) / sd) ** 2 + 7.0  # an offset log Z absorbs

    return energy, math.log(sd * math.sqrt(2 * math.pi)) - 7.0


def test_mixture_of_separately_normalised_energies_is_the_gaussian_mixture():
    """The equal mixture of N(-2, 1) and N(3, 0.5), each energy offset by 7 nats, gives
    the mixture's density row by row (the energies in float32); the log Z errors enter
    weighted by each component's mean posterior probability, and the bounds by each
    log Z's."""
    (e0, z0), (e1, z1) = gaussian(-2.0, 1.0), gaussian(3.0, 0.5)
    gen = torch.Generator().manual_seed(0)
    x = torch.cat(
        [torch.randn(300, 1, generator=gen) - 2, 0.5 * torch.randn(100, 1, generator=gen) + 3]
    )
    normal = torch.distributions.Normal
    exact = torch.logsumexp(
        torch.stack([normal(-2.0, 1.0).log_prob(x[:, 0]), normal(3.0, 0.5).log_prob(x[:, 0])]), 0
    ) - math.log(2)
    estimates = [LogZEstimate(z0, 0.3, lower=z0 - 1), LogZEstimate(z1, 0.4, lower=z1 - 2)]
    ll = mixture_log_likelihood([e0, e1], x, estimates)
    assert ll.mean == pytest.approx(float(exact.mean()), abs=1e-5)
    assert ll.data_stderr == pytest.approx(float(exact.std() / 20), rel=1e-4)
    assert ll.stderr == pytest.approx(math.hypot(0.75 * 0.3, 0.25 * 0.4), abs=1e-3)
    assert ll.lower == -math.inf  # no upper bound on log Z
    assert ll.mean < ll.upper < ll.mean + 2  # each log Z at its lower bound
    assert ll.log_z_method == ", per component"
    one = mixture_log_likelihood([e0], x[:300], [estimates[0]])
    assert one == log_likelihood(e0, x[:300], estimates[0])  # one component: the plain case


def test_mixture_log_likelihood_refuses_mismatched_components():
    energy, z = gaussian(0.0, 1.0)
    x = torch.zeros(4, 1)
    with pytest.raises(ArgumentError, match="one length, got 2 and 1"):
        mixture_log_likelihood([energy, energy], x, [LogZEstimate(z)])
    with pytest.raises(ArgumentError, match="must hold LogZEstimates"):
        mixture_log_likelihood([energy], x, [z])
    with pytest.raises(ArgumentError, match="at least one row"):
        mixture_log_likelihood([energy], x[:0], [LogZEstimate(z)])
