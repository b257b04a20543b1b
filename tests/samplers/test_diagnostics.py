import math

import numpy as np
import pytest
import torch

from ebmlab.samplers import HMC
from ebmlab.samplers.base import SampleRun
from ebmlab.samplers.diagnostics import (
    effective_sample_size,
    monte_carlo_errors,
    split_rhat,
    summarize,
    tail_effective_sample_size,
)


def ar1(rho, t=1000, c=40, seed=0, d=1):
    """AR(1) chains started in their stationary law N(0, 1): mixed from the first draw."""
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


def _arviz_cases() -> dict[str, np.ndarray]:
    """Six sets of 4 chains x 200 draws, (chain, draw), from numpy's seeded PCG64 (the same
    numbers on every machine): independent normals, AR(1) with rho 0.9, one chain
    shifted, binary draws (every draw tied), chains that repeat their last draw 70 % of
    the time (as rejections do), and one chain three times wider around 100."""
    rng = np.random.default_rng(7)
    c, t = 4, 200
    cases = {"iid": rng.standard_normal((c, t))}
    ar, e = np.zeros((c, t)), rng.standard_normal((c, t))
    for i in range(1, t):
        ar[:, i] = 0.9 * ar[:, i - 1] + e[:, i]
    cases["ar1"] = ar
    cases["shifted"] = rng.standard_normal((c, t)) + np.array([0, 0, 0, 0.5])[:, None]
    cases["binary"] = (rng.random((c, t)) < 0.3).astype(float)
    sticky, keep = rng.standard_normal((c, t)), rng.random((c, t)) < 0.7
    for i in range(1, t):
        sticky[:, i] = np.where(keep[:, i], sticky[:, i - 1], sticky[:, i])
    cases["sticky"] = sticky
    cases["offset100"] = rng.standard_normal((c, t)) * np.array([1, 1, 1, 3])[:, None] + 100
    return cases


# ArviZ 0.23.4 (numpy 2.4.6, scipy 1.17.1) on those draws: rhat(method="rank"),
# ess(method="bulk"), mcse(method="mean"), mcse(method="sd"), ess(method="tail")
ARVIZ = {
    "iid": (1.001352422824363, 763.8583735943981, 0.03428640487903205, 0.023100766768935556,
            708.8887192718626),
    "ar1": (1.1013694145510489, 34.047688783040414, 0.41006974652084455, 0.14823680211955517,
            131.8629444842332),
    "shifted": (1.02967976577149, 140.56463878610097, 0.08540086975894937, 0.02292464829069506,
                771.3543388349345),
    "binary": (0.9973814522819018, 777.4023392730793, 0.016325813823607652,
               0.007442094484159863, 777.4023392730796),
    "sticky": (1.047953182903295, 106.15044600573077, 0.10605464524859842, 0.06553852921787297,
               103.23232119293232),
    "offset100": (1.1516575608946005, 899.2768570405237, 0.06115725219317037,
                  0.4779142542363255, 41.050141829379875),
}  # fmt: skip


def _all_diagnostics(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (split_rhat(x), effective_sample_size(x), *monte_carlo_errors(x),
            tail_effective_sample_size(x))  # fmt: skip


def test_diagnostics_agree_with_arviz_to_rounding():
    """R-hat (bulk and folded), bulk and tail ESS and both Monte Carlo errors against
    ArviZ's, a second implementation of Vehtari et al. (2021), on draws with ties,
    autocorrelation, a shifted chain and a wide one; and the same numbers for each
    coordinate when the six sit side by side in one run, whatever the other
    coordinates' locations."""
    cases = _arviz_cases()
    joint = torch.from_numpy(np.stack([v.T for v in cases.values()], -1))  # (T, C, 6)
    columns = zip(*_all_diagnostics(joint), strict=True)
    for (name, draws), column in zip(cases.items(), columns, strict=True):
        x = torch.from_numpy(draws.T[..., None])  # (T, C, 1)
        alone = _all_diagnostics(x)
        for ours, both, theirs in zip(alone, column, ARVIZ[name], strict=True):
            assert float(ours) == pytest.approx(theirs, rel=1e-9), name
            assert float(both) == pytest.approx(theirs, rel=1e-9), name


def test_draws_that_never_vary_have_no_rhat_and_count_in_full():
    x = torch.ones(100, 4, 2, dtype=torch.float64)
    assert split_rhat(x).isnan().all()  # as ArviZ: between and within variances are 0
    assert (effective_sample_size(x) == 400).all()


def test_rhat_flags_chains_that_disagree():
    x = torch.randn(500, 4, 1, generator=torch.Generator().manual_seed(0))
    assert float(split_rhat(x)) < 1.01
    x[:, 0] += 2.0
    assert float(split_rhat(x)) > 1.1


def test_many_short_mixed_chains_fail_rhat_and_the_warning_says_why():
    """Chains in their stationary law have nothing left to forget, yet 256 chains of 400
    draws at autocorrelation 0.9 give R-hat above 1.01: each half-chain holds a handful of
    effective draws, and R-hat ~ sqrt(1 + M / ESS) over M half-chains (Vats & Knudson
    2021). The warning gives that count; the same draws in 16 chains pass."""
    info = {"acceptance_rate": 1.0, "n_divergent": 0, "n_grad_evals": 0, "n_kept_steps": 400}
    short = SampleRun(samples=ar1(0.9, t=400, c=256, seed=0), final=None, info=info)
    diagnostics = summarize(short, warn=False)
    ess, halves = diagnostics.min_ess, 512
    assert diagnostics.max_rhat > 1.03
    assert diagnostics.max_rhat == pytest.approx(math.sqrt(1 + halves / ess), abs=0.03)
    (problem,) = [p for p in diagnostics.problems if p.startswith("R-hat")]
    assert f"this run has {ess / halves:.1f}" in problem and "at 50 effective draws" in problem
    long = SampleRun(samples=ar1(0.9, t=6400, c=16, seed=1), final=None,
                     info={**info, "n_kept_steps": 6400})  # fmt: skip
    assert summarize(long, warn=False).max_rhat < 1.01


def test_summary_string():
    energy = lambda x: 0.5 * (x**2).sum(1)  # noqa: E731
    run = HMC(0.3, 5).run(energy, torch.randn(16, 3), 50, thin=1, generator=0)
    text = str(summarize(run))
    assert "ESS min" in text and "R-hat" in text


def test_needs_enough_draws():
    with pytest.raises(ValueError, match="at least 4 draws"):
        effective_sample_size(torch.randn(3, 2, 1))
