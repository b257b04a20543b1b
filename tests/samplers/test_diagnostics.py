import math

import pytest
import torch

from ebmlab.samplers import HMC
from ebmlab.samplers.diagnostics import (
    effective_sample_size,
    monte_carlo_errors,
    split_rhat,
    summarize,
)


def ar1(rho, t=1000, c=40, seed=0, d=1):
    gen = torch.Generator().manual_seed(seed)
    e = torch.randn(t, c, d, generator=gen, dtype=torch.float64)
    z = torch.zeros(t, c, d, dtype=torch.float64)
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


@pytest.mark.parametrize("kind", ["correlated Gaussian", "independent Laplace"])
def test_monte_carlo_errors_match_the_spread_over_repeated_runs(kind):
    """Each of 2000 coordinates is a separate run of 4 chains x 400 draws: the spread of
    their means and sds over the runs is what the errors claim. The Gaussian formula sd
    / sqrt(2 ESS) misses it both ways (the negative control): for Laplace draws
    (kurtosis 6) the spread is sqrt(5/2) times larger; for AR(1) chains with rho = 0.6
    the squared deviations decorrelate as rho^2, so the spread is sqrt(ESS(x) /
    ESS(x^2)) = 0.73 of it."""
    runs = 2000
    if kind == "correlated Gaussian":
        x = ar1(0.6, t=400, c=4, d=runs)
    else:
        gen = torch.Generator().manual_seed(1)
        x = torch.distributions.Laplace(0.0, 1.0).icdf(
            torch.rand(400, 4, runs, generator=gen, dtype=torch.float64)
        )
    of_mean, of_sd = monte_carlo_errors(x)
    flat = x.reshape(-1, runs)
    spread_mean, spread_sd = flat.mean(0).std(), flat.std(0).std()
    # the spread of 2000 runs is known to within about 1.6 %
    assert abs(float(of_mean.mean() / spread_mean) - 1) < 0.06
    assert abs(float(of_sd.mean() / spread_sd) - 1) < 0.06
    gaussian = flat.std(0) / (2 * effective_sample_size(x)).sqrt()
    ratio = float(spread_sd / gaussian.mean())
    expected = (0.25 / (0.64 / 1.36)) ** 0.5 if kind == "correlated Gaussian" else 2.5**0.5
    assert abs(ratio / expected - 1) < 0.06


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
