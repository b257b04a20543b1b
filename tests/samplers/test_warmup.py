"""Stan's warm-up from any start: the window schedule, per-chain step sizes, restarts of
stuck chains, clear errors for starts no step size can leave, and the warnings of a run
whose chains are stuck or that fails a convergence check."""

import math
import re
import warnings
from types import SimpleNamespace

import pytest
import torch

from ebmlab._checks import ArgumentError
from ebmlab.energies import DiagonalGaussian
from ebmlab.samplers import HMC, NUTS, AdaptiveHMC
from ebmlab.samplers.adaptation import ChainGroups, WarmupTuning, WarmupWindows
from ebmlab.samplers.base import SamplerState, SampleRun
from ebmlab.samplers.diagnostics import (
    SamplingWarning,
    effective_sample_size,
    split_rhat,
    summarize,
)
from ebmlab.samplers.integrators import DenseMass
from ebmlab.testing import assert_mean_close

# the log sigma marginal of a regression with flat priors: 434 rows, residual sd 18
N_ROWS, SQUARES = 434, 434 * 18.0**2


def log_sigma_energy(x: torch.Tensor) -> torch.Tensor:
    return (N_ROWS - 1) * x[:, 0] + 0.5 * SQUARES * torch.exp(-2 * x[:, 0])


def log_sigma_mean() -> float:
    """exp(-2x) is Gamma((N - 1) / 2, rate S / 2): E[x] = (log(S/2) - digamma((N-1)/2)) / 2."""
    shape = torch.tensor((N_ROWS - 1) / 2, dtype=torch.float64)
    return float((math.log(SQUARES / 2) - torch.special.digamma(shape)) / 2)


def test_windows_follow_stans_schedule():
    # Stan's 1000 warm-up steps: buffer 75, windows 25, 50, 100, 200, 500 (stretched), 50
    assert WarmupWindows.plan(1000).mass_updates == (100, 150, 250, 450, 950)
    assert WarmupWindows.plan(1000).checks == (75, 100, 150, 250, 450, 950)
    assert WarmupWindows.plan(300).mass_updates == (100, 250)
    # below 150 steps: 15 % and 10 % buffers, one window between; below 20: none
    assert WarmupWindows.plan(100).checks == (15, 90)
    assert WarmupWindows.plan(19).checks == ()


@pytest.mark.parametrize(
    "sampler",
    [
        pytest.param(NUTS(), id="nuts", marks=pytest.mark.slow),
        pytest.param(AdaptiveHMC(), id="ahmc"),
    ],
)
def test_a_chain_started_in_a_steep_region_does_not_stay_stuck(sampler):
    """32 chains from uniform(-2, 2) as Stan starts them: with the step size pooled and
    no restart, chain 22 (at -1.56) diverged on all 600 steps and the pooled mean was
    2.754 (R-hat 1.10) against the exact 2.893."""
    x0 = torch.rand(32, 1, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 4 - 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplingWarning)  # a restart is said, and allowed
        run = sampler.run(log_sigma_energy, x0, 300, burn_in=300, thin=1, generator=0)
    draws = run.samples
    ess = float(effective_sample_size(draws).min())
    mcse = float(draws.std()) / math.sqrt(ess)
    assert abs(float(draws.mean()) - log_sigma_mean()) < 4 * mcse
    assert float(split_rhat(draws).max()) <= 1.01
    assert run.info["stuck_chains"] == [] and run.info["n_divergent"] == 0


@pytest.mark.parametrize("dim", [2, 50, 784])
def test_far_behind_flags_only_chains_far_above_the_typical_set(dim):
    """Chains drawn from a D-dimensional Gaussian spread their energies by about
    sqrt(D / 2): none of 4096 is far behind; chains 300 + 30 sqrt(D) above are, and
    tempered chains are never compared."""
    g = torch.Generator().manual_seed(dim)
    x = torch.randn(4096, dim, generator=g, dtype=torch.float64)
    energy = 0.5 * (x * x).sum(1)
    tuning = WarmupTuning(0.8, adapt_mass=True)
    state = SamplerState.start(x, energy, None, 0)
    assert not bool(tuning.far_behind(state).any())
    lagging = torch.zeros(4096, dtype=torch.bool)
    lagging[[3, 700, 4000]] = True
    far = energy + lagging * (300 + 30 * dim**0.5)
    assert torch.equal(tuning.far_behind(state.replace(energy=far)), lagging)
    tempered = tuning.tempered(torch.rand(4096, generator=g, dtype=torch.float64))
    assert not bool(tempered.far_behind(state.replace(energy=far)).any())


def minor_mode_energy(x: torch.Tensor) -> torch.Tensor:
    """Eight coordinates: the first from two Gaussians of sd 0.25 at -3 and +3, the
    one at +3 weighted e^-40 (the energy between them rises 32 nats above its bottom),
    the others standard normal: like posteriordb's Lotka-Volterra model, a minor mode
    40 nats up that holds the chains that start near it."""
    wells = torch.stack([-8 * (x[:, 0] + 3) ** 2, -40 - 8 * (x[:, 0] - 3) ** 2], 1)
    return -torch.logsumexp(wells, 1) + 0.5 * (x[:, 1:] ** 2).sum(1)


@pytest.mark.parametrize("margin", [None, 25.0], ids=["default", "wider"])
def test_chains_caught_in_a_minor_mode_are_brought_to_the_major_one(margin, monkeypatch):
    """Half the chains start in the minor mode, 40 nats (13 of the margin's units for
    D = 8) above the major one, behind a barrier no trajectory crosses. Restarted at
    the windows' ends, they sample the major mode: x_0 has mean -3 and sd 0.25 there.
    With the margin at 25 units they stay, and the chains disagree (R-hat 1.67: the
    control)."""
    if margin is not None:
        monkeypatch.setattr(WarmupTuning, "BEHIND", margin)
    g = torch.Generator().manual_seed(3)
    x0 = torch.randn(32, 8, generator=g, dtype=torch.float64) * 0.25
    x0[:, 0] += torch.where(torch.arange(32) % 2 == 0, -3.0, 3.0).double()
    run = AdaptiveHMC().run(minor_mode_energy, x0, 300, burn_in=200, thin=1, generator=0)
    first = run.samples[..., 0]
    if margin is not None:
        assert float(split_rhat(run.samples).max()) > 1.2 and bool((first.mean(0) > 0).any())
        return
    # generators 0-4 give R-hat 1.005-1.008 and means within 2 errors of -3
    assert float(split_rhat(run.samples).max()) <= 1.02
    assert_mean_close(first.flatten(), -3.0, ess=effective_sample_size(run.samples)[0])
    assert abs(float(first.std()) - 0.25) < 0.025


def badly_scaled_regression() -> tuple[torch.Tensor, torch.Tensor]:
    """434 rows of uncentred predictors on scales 1 to 100 and an interaction (an
    indicator, a score around 100, their product, an age around 23), y with noise of
    sd 18: the benchmark's regression, whose posterior is strongly correlated."""
    g = torch.Generator().manual_seed(434)
    n = 434
    hs = (torch.rand(n, generator=g, dtype=torch.float64) < 0.79).double()
    iq = 100 + 15 * torch.randn(n, generator=g, dtype=torch.float64)
    age = 17 + 12 * torch.rand(n, generator=g, dtype=torch.float64)
    X = torch.stack([torch.ones(n, dtype=torch.float64), hs, iq, hs * iq, age], 1)
    beta = torch.tensor([-10.0, 50.0, 0.95, -0.48, 0.2], dtype=torch.float64)
    return X, X @ beta + 18 * torch.randn(n, generator=g, dtype=torch.float64)


@pytest.mark.slow
def test_adaptive_hmc_samples_a_badly_scaled_regression_from_stans_starts():
    """Flat priors on the coefficients, sigma uniform (sampled as log sigma): the
    posterior mean of the coefficients is the least-squares fit, and exp(-2 log sigma)
    is Gamma((N - P - 1) / 2, rate RSS / 2). From uniform(-2, 2), most chains take 100
    to 250 warm-up steps to come in; their draws, left in the mass estimate, made it
    thousands of times too large (on the benchmark's regression, R-hat 11.5 with the
    diagonal mass and 10.1 with the dense one). The restarts and the estimate are the
    same code for both masses; the dense one's run is the shorter (8 s against 38 s), and
    `python -m benchmarks.posteriors --diagonal` runs the diagonal one."""
    X, y = badly_scaled_regression()
    n, p = X.shape

    def energy(theta: torch.Tensor) -> torch.Tensor:
        beta, log_sigma = theta[:, :p], theta[:, p]
        rss = ((y - beta @ X.T) ** 2).sum(1)
        return n * log_sigma + 0.5 * rss * torch.exp(-2 * log_sigma) - log_sigma

    fit = torch.linalg.lstsq(X, y[:, None]).solution[:, 0]
    rss = float(((y - X @ fit) ** 2).sum())
    shape = torch.tensor((n - p - 1) / 2, dtype=torch.float64)
    log_sigma = (math.log(rss / 2) - torch.special.digamma(shape)) / 2
    exact = torch.cat([fit, log_sigma.reshape(1)])
    x0 = torch.rand(32, p + 1, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with pytest.warns(SamplingWarning, match=r"chain\(s\) \[\d.*far behind"):
        run = AdaptiveHMC(dense_mass=True).run(energy, x0 * 4 - 2, 300, burn_in=300, thin=1,
                                               generator=0)  # fmt: skip
    draws = run.samples
    mcse = draws.flatten(0, 1).std(0) / effective_sample_size(draws).sqrt()
    assert float(split_rhat(draws).max()) <= 1.01
    assert bool(((draws.mean((0, 1)) - exact).abs() < 4 * mcse).all())


def test_adaptive_hmc_keeps_its_trajectory_length_while_the_step_is_too_small():
    """A step too small for the trajectory within ``max_leapfrog`` steps (chains far
    out in a steep region, early in warm-up) caps that step's trajectory, but leaves
    the adapted length: clamping it to max_leapfrog x step forgot it, and on the
    benchmark's badly scaled regression the length then crawled back from 0.01 at the
    adapter's rate for the rest of warm-up (R-hat 11.5)."""
    target = lambda x: 0.5 * (x * x).sum(1)  # noqa: E731
    sampler = AdaptiveHMC(max_leapfrog=16)
    x0 = torch.randn(8, 2, generator=torch.Generator().manual_seed(0))
    state = sampler.begin_warmup(sampler.init(x0, target), 100)
    state = state.replace(step_size=torch.tensor(1e-3), trajectory_length=2.0, search_due=False)
    after = sampler.step(state, target, torch.Generator().manual_seed(1))
    assert after.trajectory_length == 2.0  # the cap bound, the length is kept
    # the first step's Halton jitter is 1/2: half the capped 16 steps of 1e-3
    assert after.n_grad_evals - state.n_grad_evals == 8
    state = state.replace(step_size=torch.tensor(0.25))
    after = sampler.step(state, target, torch.Generator().manual_seed(1))
    assert after.trajectory_length != 2.0  # within the cap it adapts


def test_adaptive_hmc_finds_the_unit_gaussians_trajectory_length():
    """On a D-dimensional unit Gaussian with unit mass, x(t) = x cos t + p sin t, so
    ChEES(t) = D sin^2 t; under the jitter uT it averages D (1/2 - sin(2T) / (4T)),
    and ChEES / T^(1/4) peaks at T = 2.09. The length used to be floored at the
    current step size, which dual averaging sets near 10x its value for a few steps
    after each restart: T jumped to 8-11 and stayed near 12."""
    x0 = torch.randn(256, 50, generator=torch.Generator().manual_seed(0))
    sampler = AdaptiveHMC(adapt_mass=False)
    run = sampler.run(lambda x: 0.5 * (x * x).sum(1), x0, 1, burn_in=400, generator=0)
    assert 1.2 < run.final.trajectory_length < 3.2


def test_nuts_tunes_one_step_size_per_chain_or_one_for_all():
    target = lambda x: 0.5 * (x * x / torch.tensor([0.01, 1.0])).sum(1)  # noqa: E731
    x0 = torch.randn(16, 2, generator=torch.Generator().manual_seed(1))
    run = NUTS(max_depth=4).run(target, x0, 10, burn_in=100, generator=0)
    per_chain = run.final.step_size
    pooled = NUTS(max_depth=4, pool_step_size=True).run(target, x0, 10, burn_in=100, generator=0)
    # the gradients each chain's own trees used, and those the lockstep batch computed
    assert 0 < run.info["n_grad_evals_used"] < run.info["n_grad_evals"]
    assert isinstance(per_chain, torch.Tensor) and per_chain.shape == (16,)
    assert float(per_chain.max()) > float(per_chain.min()) > 0
    assert isinstance(pooled.final.step_size, float) and pooled.final.step_size > 0


@pytest.mark.slow
def test_a_pooled_step_size_reaches_the_trees_it_was_tuned_for():
    """Before, trees kept the step size they started with while the pooled dual
    averaging moved on: on this Gaussian the step shrank to 1e-34 at an acceptance
    that stayed near 0.2, then became NaN, every step divergent."""
    target = lambda x: 0.5 * (x * x / torch.tensor([0.01, 1.0])).sum(1)  # noqa: E731
    x0 = torch.randn(16, 2, generator=torch.Generator().manual_seed(1))
    run = NUTS(pool_step_size=True).run(target, x0, 200, burn_in=300, thin=1, generator=0)
    assert run.info["n_divergent"] == 0 and run.info["acceptance_rate"] > 0.6
    squares = run.samples**2
    assert_mean_close(squares.reshape(-1, 2), torch.tensor([0.01, 1.0]),
                      ess=effective_sample_size(squares))  # fmt: skip


def test_stuck_chains_are_restarted_during_warmup_with_a_warning():
    """Chains that never move in the initial buffer take the positions of chains that
    do, and the warning names them."""
    x0 = torch.rand(32, 1, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 4 - 2
    with pytest.warns(SamplingWarning, match=r"restarted chain\(s\) \[\d+.*at the positions"):
        run = AdaptiveHMC().run(log_sigma_energy, x0, 50, burn_in=300, thin=1, generator=0)
    assert run.info["stuck_chains"] == []


def test_a_restart_of_many_chains_is_named_in_one_short_line():
    """Dozens of chains far behind are listed by their first few and their number, not
    one by one."""
    target = DiagonalGaussian(torch.zeros(20), torch.logspace(-2, 0, 20))
    x0 = torch.randn(200, 20, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        AdaptiveHMC().run(target, x0, 1, burn_in=40, generator=0)
    message = next(str(w.message) for w in caught if "restarted" in str(w.message))
    assert re.search(r"restarted chain\(s\) \[(\d+, ){8}\.\.\. \(\d\d in all\)\]", message)
    assert len(message) < 600


def test_starts_that_no_step_size_can_leave_are_refused_naming_the_chain():
    def finite_above(x):  # a log density defined for x < 5 only
        return torch.where(x[:, 0] < 5, 0.5 * x[:, 0] ** 2, torch.inf)

    with pytest.raises(ArgumentError, match=r"chain 0's start x0\[0\] = \[10\]"):
        NUTS().run(finite_above, torch.full((4, 1), 10.0), 5, burn_in=30)
    # some chains finite: the others are restarted at them, and the warning says why
    x0 = torch.tensor([[10.0], [0.5], [1.0], [-0.5]])
    with pytest.warns(SamplingWarning, match=r"restarted chain\(s\) \[0\].*not finite"):
        run = NUTS().run(finite_above, x0, 5, burn_in=30, generator=0)
    assert bool((run.final.x < 5).all())

    def only_at_zero(x):  # finite at 0 alone: every leapfrog step leaves it
        return torch.where(x[:, 0] == 0, x[:, 0] ** 2, torch.nan)

    with pytest.raises(ArgumentError, match="chain 0 at x = \\[0\\] finds no step size"):
        NUTS().run(only_at_zero, torch.zeros(2, 1), 5, burn_in=30)


def test_a_start_far_out_in_a_tail_finds_its_tiny_step_and_is_brought_in():
    """A chain started where the energy is 1e108 (as an ARMA model's errors grow like
    |theta|^t from Stan's starts) needs a first step near 1e-55, which Stan's search
    finds by halving as far as the dtype allows; the chain, far behind the others, is
    then restarted among them, and the run ends where the target is."""

    def energy(x):  # 2 cosh(x): a log-concave target whose tails grow like e^|x|
        return torch.exp(x[:, 0]) + torch.exp(-x[:, 0])

    x0 = torch.tensor([[250.0], [0.5], [-0.3], [1.0], [0.0], [-1.0]], dtype=torch.float64)
    with pytest.warns(SamplingWarning, match=r"restarted chain\(s\) \[0\]"):
        run = NUTS().run(energy, x0, 50, burn_in=100, generator=0)
    assert bool((run.samples.abs() < 10).all())


def test_a_chain_stuck_while_sampling_is_named():
    scale = torch.ones(40)
    scale[3] = 1e6  # chain 3's target is a thousand times narrower than the step
    x0 = torch.randn(40, 2, generator=torch.Generator().manual_seed(0)) * 1e-3

    def energy(x):
        return 0.5 * (x * x).sum(1) * scale

    with pytest.warns(SamplingWarning, match=r"chain\(s\) \[3\] moved on \[0.0\]"):
        run = HMC(0.5, 5).run(energy, x0, 100, generator=0)
    assert run.info["stuck_chains"] == [3]


def test_summarize_warns_of_each_failed_check():
    g = torch.Generator().manual_seed(0)
    apart = torch.randn(200, 4, 1, generator=g) + torch.tensor([0.0, 0.0, 0.0, 3.0])[:, None]
    info = {"acceptance_rate": 0.9, "n_divergent": 20, "n_grad_evals": 1, "n_kept_steps": 200}
    run = SampleRun(samples=apart, final=None, info=info)
    with pytest.warns(SamplingWarning) as caught:
        diagnostics = summarize(run)
    message = str(caught[0].message)
    assert "R-hat" in message and "bulk ESS" in message and "20 of 800" in message
    assert "WALNUTS" in message  # the sampler that halves its steps where they diverge
    assert len(diagnostics.problems) == 3 and "warning: R-hat" in str(diagnostics)
    # well-mixed chains with enough draws pass every check, silently
    good = SampleRun(samples=torch.randn(500, 4, 2, generator=g), final=None,
                     info={**info, "n_divergent": 0})  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error", SamplingWarning)
        assert summarize(good).problems == []
    few = SampleRun(samples=torch.randn(20, 4, 2, generator=g), final=None,
                    info={**info, "n_divergent": 0})  # fmt: skip
    assert any("bulk ESS" in p for p in summarize(few, warn=False).problems)


def test_summarize_names_a_dense_mass_for_correlated_draws_that_mix_poorly():
    """Chains that disagree along the long axis of a correlation of 0.999 (condition
    number about 2000): after a diagonal mass the summary says a dense one may mix
    faster; not after a dense mass, not for uncorrelated draws, not when the checks pass."""
    g = torch.Generator().manual_seed(0)
    z = torch.randn(200, 4, 2, generator=g)
    z[:, :, 0] += torch.tensor([0.0, 0.0, 0.0, 3.0])  # one chain apart: R-hat fails
    corr = torch.tensor([[1.0, 0.0], [0.999, (1 - 0.999**2) ** 0.5]])
    info = {"acceptance_rate": 0.9, "n_divergent": 0, "n_grad_evals": 1, "n_kept_steps": 200}

    def problems(samples, mass):
        run = SampleRun(samples=samples, final=SimpleNamespace(inv_mass=mass), info=info)
        return summarize(run, warn=False).problems

    diagonal, dense = torch.ones(2), DenseMass(torch.eye(2))
    hinted = problems(z @ corr.T, diagonal)
    assert "R-hat" in hinted[0] and "dense_mass=True" in hinted[-1]
    assert float(re.search(r"condition number (\d+)", hinted[-1])[1]) > 100
    assert not any("dense" in p for p in problems(z @ corr.T, dense))
    assert not any("dense" in p for p in problems(z, diagonal))
    few = z[:4] @ corr.T  # 16 draws of 2 coordinates: too few to estimate a covariance
    assert problems(few, diagonal) and not any("dense" in p for p in problems(few, diagonal))
    well_mixed = torch.randn(500, 4, 2, generator=g) @ corr.T
    assert problems(well_mixed, diagonal) == []
    # a warm-up that refused the dense mass (the posterior changes shape) is not told to
    # use one
    run = SampleRun(samples=z @ corr.T, info=info,
                    final=SimpleNamespace(inv_mass=diagonal, refused_spread=91.3))  # fmt: skip
    refused = summarize(run, warn=False).problems
    assert "want dense masses 91 apart" in refused[-1] and "SoftAbsHMC" in refused[-1]
    assert not any("dense_mass=True" in p for p in refused)


def test_dual_averaging_of_chains_that_finish_at_different_times():
    # NUTS's chains end their trees at different steps: updating only the rows that
    # finished equals each chain's own adapter updated on its own transitions.
    from ebmlab.samplers.adaptation import DualAveraging

    steps = torch.tensor([0.1, 0.5], dtype=torch.float64)
    both = DualAveraging.start(steps, 0.8)
    alone = [DualAveraging.start(steps[i : i + 1], 0.8) for i in range(2)]
    rows = [torch.tensor(r) for r in ([True, False], [True, True], [False, True], [True, False])]
    accepts = torch.tensor([[0.3, 0.9], [0.95, 0.2], [0.5, 0.6], [0.7, 0.99]], dtype=torch.float64)
    for row, accept in zip(rows, accepts, strict=True):
        both, step = both.update(accept, row)
        for i in range(2):
            if row[i]:
                alone[i], own = alone[i].update(accept[i : i + 1])
                torch.testing.assert_close(step[i : i + 1], own)
    assert both.count.tolist() == [3, 2]
    for i in range(2):
        torch.testing.assert_close(both.final_step_size[i : i + 1], alone[i].final_step_size)


@pytest.mark.parametrize("shape", [(7,), (7, 3)])
def test_chain_groups_sum_each_groups_chains(shape):
    groups = ChainGroups.of(torch.tensor([2.0, 0.5, 2.0, 1.0, 0.5, 2.0, 1.0]))
    x = torch.randn(shape, dtype=torch.float64)
    expected = x.new_zeros((3, *shape[1:])).index_add_(0, groups.index, x)
    sizes = groups.sizes.view(-1, *[1] * (len(shape) - 1))
    torch.testing.assert_close(groups.sums(x), expected)
    torch.testing.assert_close(groups.means(x), expected / sizes)


@pytest.mark.cuda
@pytest.mark.parametrize("kernel", [NUTS(), AdaptiveHMC()], ids=["nuts", "adaptive-hmc"])
def test_a_seeded_warmup_gives_the_same_draws_on_every_cuda_run(kernel):
    """The pooled window statistics add the chains in a fixed order (CUDA's atomic
    index_add_ would not), so that a seed fixes the draws on a GPU as on a CPU."""
    target = DiagonalGaussian(torch.zeros(6), torch.linspace(0.5, 1.5, 6)).cuda().double()
    x0 = torch.rand(64, 6, dtype=torch.float64, device="cuda") * 4 - 2
    runs = [kernel.run(target, x0, 40, burn_in=60, thin=1, generator=5, graphs=False).samples
            for _ in range(2)]  # fmt: skip
    assert torch.equal(runs[0], runs[1])
