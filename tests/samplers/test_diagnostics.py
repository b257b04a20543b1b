import math

import pytest
import torch

from ebmlab.samplers import HMC
from ebmlab.samplers.diagnostics import effective_sample_size, split_rhat, summarize


def ar1(rho, t=1000, c=40, seed=0):
    gen = torch.Generator().manual_seed(seed)
    e = torch.randn(t, c, 1, generator=gen)
    z = torch.zeros(t, c, 1)
    z[0] = e[0]
    for i in range(1, t):
        z[i] = rho * z[i - 1] + math.sqrt(1 - rho**2) * e[i]
    return z


def test_ess_of_independent_draws_is_the_number_of_draws():
    x = torch.randn(200, 50, 3, generator=torch.Generator().manual_seed(0))
    ess = effective_sample_size(x)
    assert ((ess / 10_000 - 1).abs() < 0.1).all()


@pytest.mark.parametrize("rho", [0.5, 0.9])
def test_ess_of_ar1_matches_theory(rho):
    ess = float(effective_sample_size(ar1(rho)))
    theory = 40_000 * (1 - rho) / (1 + rho)
    assert abs(ess / theory - 1) < 0.15


def test_rhat_flags_chains_that_disagree():
    x = torch.randn(500, 4, 1, generator=torch.Generator().manual_seed(0))
    assert float(split_rhat(x)) < 1.01
    x[:, 0] += 2.0
    assert float(split_rhat(x)) > 1.1


def test_summary_string():
    energy = lambda x: 0.5 * (x**2).sum(1)  # noqa: E731
    run = HMC(0.3, 5).run(energy, torch.randn(16, 3), 50, thin=1, generator=0)
    text = str(summarize(run))
    assert "ESS min" in text and "R-hat" in text


def test_needs_enough_draws():
    with pytest.raises(ValueError, match="at least 4 draws"):
        effective_sample_size(torch.randn(3, 2, 1))
