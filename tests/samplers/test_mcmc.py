"""Correctness of the Metropolis-corrected samplers, layered from the integrator up."""

import math

import pytest
import torch

from ebmlab.energies import DiagonalGaussian, Gaussian, as_energy_fn, energy_and_grad
from ebmlab.samplers import HMC, MALA, NUTS, AdaptiveHMC, MetropolisHastings
from ebmlab.samplers.diagnostics import effective_sample_size
from ebmlab.samplers.integrators import leapfrog
from ebmlab.testing import assert_mean_close

MEAN = torch.tensor([1.0, -1.0])
COV = torch.tensor([[1.0, 0.8], [0.8, 1.5]])


def target():
    return Gaussian(MEAN, COV)


SAMPLERS = {
    "mala": lambda: MALA(0.15),
    "hmc": lambda: HMC(0.25, 8),
    "hmc_spread_steps": lambda: HMC(0.25, 8, step_spread=4.0),
    "adaptive_hmc": lambda: AdaptiveHMC(),
    "nuts": lambda: NUTS(),
    "metropolis": lambda: MetropolisHastings(1.0),
}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n == "nuts" else n for n in SAMPLERS]
)
def test_recovers_mean_and_covariance(name):
    """Means and second moments within 4 Monte Carlo standard errors (ESS-based)."""
    sampler = SAMPLERS[name]()
    x0 = torch.randn(64, 2, generator=torch.Generator().manual_seed(5)) * 3
    traj = sampler.sample(target(), x0, 400, burn_in=300, thin=1, generator=11)
    flat = traj.reshape(-1, 2)
    assert_mean_close(flat, MEAN, ess=effective_sample_size(traj), what=f"{name} mean")
    c = flat - MEAN
    products = torch.stack([c[:, 0] ** 2, c[:, 1] ** 2, c[:, 0] * c[:, 1]], 1)
    ess = effective_sample_size(products.reshape(traj.shape[0], traj.shape[1], 3))
    expected = torch.stack([COV[0, 0], COV[1, 1], COV[0, 1]])
    assert_mean_close(products, expected, ess=ess, what=f"{name} covariance")


def test_moment_check_catches_a_biased_sampler():
    """Unadjusted Langevin with a large step inflates the variance; the check must notice."""
    from ebmlab.samplers import Langevin

    traj = Langevin(0.3).sample(target(), torch.zeros(64, 2), 400, burn_in=100, thin=1, generator=1)
    c = traj.reshape(-1, 2) - MEAN
    ess = effective_sample_size((c[:, :1] ** 2).reshape(traj.shape[0], 64, 1))
    with pytest.raises(AssertionError):
        assert_mean_close(c[:, :1] ** 2, COV[0, 0].reshape(1), ess=ess)


def test_leapfrog_conserves_energy_to_second_order():
    g = target()
    fn = g.energy
    x = torch.randn(100, 2, generator=torch.Generator().manual_seed(0))
    p = torch.randn(100, 2, generator=torch.Generator().manual_seed(1))
    errors = []
    for eps in (0.1, 0.05):
        e0, g0 = energy_and_grad(fn, x)
        steps = int(1.0 / eps)
        _, p1, e1, _ = leapfrog(fn, x, p, g0, torch.full((100,), eps), steps, torch.ones(2))
        errors.append(float(((e1 + 0.5 * (p1**2).sum(1)) - (e0 + 0.5 * (p**2).sum(1))).abs().max()))
    assert errors[0] < 0.2
    assert 2.5 < errors[0] / errors[1] < 6  # halving the step divides the error by ~4


def test_leapfrog_is_reversible():
    fn = target().energy
    x = torch.randn(10, 2)
    p = torch.randn(10, 2)
    eps = torch.full((10,), 0.1)
    _, g0 = energy_and_grad(fn, x)
    x1, p1, _, g1 = leapfrog(fn, x, p, g0, eps, 7, torch.ones(2))
    x2, p2, _, _ = leapfrog(fn, x1, -p1, g1, eps, 7, torch.ones(2))
    torch.testing.assert_close(x2, x, atol=1e-5, rtol=0)
    torch.testing.assert_close(-p2, p, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["mala", "hmc", "adaptive_hmc", "nuts"])
def test_cached_gradient_equals_autograd(name):
    sampler = SAMPLERS[name]()
    run = sampler.run(target(), torch.randn(8, 2), 5, burn_in=5, generator=0)
    e, g = energy_and_grad(target().energy, run.final.x)
    torch.testing.assert_close(run.final.grad, g)
    torch.testing.assert_close(run.final.energy, e)


@pytest.mark.parametrize("make", [lambda h: MALA(h), lambda h: HMC(h, 5)])
def test_acceptance_tends_to_one_for_small_steps_and_falls_for_huge_steps(make):
    x0 = target().sample(256, torch.Generator().manual_seed(0))
    small = make(1e-3).run(target(), x0, 20, generator=0).info["acceptance_rate"]
    huge = make(5.0).run(target(), x0, 20, generator=0).info["acceptance_rate"]
    assert small > 0.99 and huge < 0.2


def test_hmc_counts_one_gradient_per_leapfrog_step_and_divergences():
    run = HMC(0.1, 7).run(target(), torch.zeros(4, 2), 10, generator=0)
    assert run.info["n_grad_evals"] == 4 * (1 + 70)
    wild = HMC(50.0, 5, jitter=0.0).run(target(), torch.ones(16, 2), 5, generator=0)
    assert wild.info["n_divergent"] > 0 and wild.info["acceptance_rate"] < 0.1


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_same_seed_gives_identical_chains(name):
    a = SAMPLERS[name]().sample(target(), torch.zeros(6, 2), 20, burn_in=10, generator=3)
    b = SAMPLERS[name]().sample(target(), torch.zeros(6, 2), 20, burn_in=10, generator=3)
    assert torch.equal(a, b)


def test_adaptive_hmc_learns_the_scales_of_an_ill_conditioned_gaussian():
    stds = torch.logspace(-2, 0, 20)
    g = DiagonalGaussian(torch.zeros(20), stds)
    run = AdaptiveHMC().run(g, torch.randn(256, 20), 100, burn_in=300, generator=0)
    ratio = run.final.inv_mass.sqrt() / stds
    assert ratio.min() > 0.8 and ratio.max() < 1.25
    assert 0.65 < run.info["acceptance_rate"] < 0.95
    assert run.final.trajectory_length > run.final.step_size


def test_spread_step_sizes_move_where_scales_differ_by_a_hundred():
    """With scales 0.01 and 1, a fixed step of 0.1 is unstable in the narrow coordinate
    and every trajectory is rejected; step sizes spread log-uniformly over [0.1 / 30,
    0.1 * 30] include stable ones, so the chains move and the wide coordinate's variance
    is right (within 4 Monte Carlo standard errors)."""
    g = DiagonalGaussian(torch.zeros(2), torch.tensor([0.01, 1.0]))
    x0 = torch.zeros(64, 2)
    fixed = HMC(0.1, 10).run(g, x0, 100, generator=1)
    assert fixed.info["acceptance_rate"] < 0.01
    spread = HMC(0.1, 10, step_spread=30.0)
    traj = spread.sample(g, x0, 600, burn_in=100, thin=1, generator=1)
    wide = traj[..., 1:] ** 2
    assert_mean_close(
        wide.reshape(-1, 1), torch.ones(1), ess=effective_sample_size(wide), what="variance"
    )


def test_nuts_doubles_until_the_trajectory_turns():
    # On N(0, I) with step 0.1 a trajectory turns back after about pi / 0.1 = 31 steps:
    # trees stop well before the depth limit, and a depth limit of 3 gives 7 steps each.
    std = DiagonalGaussian(torch.zeros(2), torch.ones(2))
    x0 = torch.randn(32, 2, generator=torch.Generator().manual_seed(0))
    run = NUTS(0.1, adapt_mass=False).run(std, x0, 20, generator=0)
    per_step = (run.info["n_grad_evals"] / 32 - 1) / 20
    assert 15 <= per_step <= 127
    capped = NUTS(0.1, max_depth=3).run(std, x0, 20, generator=0)
    assert capped.info["n_grad_evals"] == 32 * (1 + 20 * 7)
    assert capped.info["acceptance_rate"] > 0.9 and capped.info["n_divergent"] == 0


def test_nuts_catches_u_turns_of_near_periodic_trajectories():
    # With step 0.81 on an isotropic Gaussian every coordinate has the same period of
    # 7.5 leapfrog steps; the checks across joined halves stop every chain by depth 4,
    # where the whole-stretch criterion alone lets some chains run to the depth limit.
    std = DiagonalGaussian(torch.zeros(100), torch.ones(100))
    x0 = torch.randn(200, 100, generator=torch.Generator().manual_seed(0))
    run = NUTS(0.81, max_depth=8).run(std, x0, 10, generator=0)
    assert (run.info["n_grad_evals"] / 200 - 1) / 10 <= 15


def test_nuts_stops_at_divergences_and_keeps_the_chains_finite():
    x0 = target().sample(16, torch.Generator().manual_seed(0))
    run = NUTS(50.0).run(target(), x0, 5, generator=0)
    assert run.info["n_divergent"] > 0 and torch.isfinite(run.final.x).all()
    assert run.info["n_grad_evals"] < 16 * (1 + 5 * 7)


def test_samplers_work_on_image_shaped_events():
    energy = lambda x: 0.5 * (x**2).flatten(1).sum(1)  # noqa: E731
    for sampler in (MALA(0.1), HMC(0.1, 3), MetropolisHastings(0.3), AdaptiveHMC(), NUTS()):
        out = sampler.sample(energy, torch.zeros(5, 1, 4, 4), 3, burn_in=2)
        assert out.shape == (5, 1, 4, 4)


def test_validation():
    with pytest.raises(ValueError, match="jitter must be < 1"):
        HMC(0.1, jitter=1.0)
    with pytest.raises(ValueError, match="step_spread must be >= 1"):
        HMC(0.1, step_spread=0.5)
    with pytest.raises(ValueError, match="inv_mass must be finite and > 0"):
        HMC(0.1, inv_mass=torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match="scale must be a finite number > 0"):
        MetropolisHastings(-1.0)
    with pytest.raises(TypeError, match="n_leapfrog must be an integer"):
        HMC(0.1, n_leapfrog=2.5)
    with pytest.raises(ValueError, match="max_depth must be"):
        NUTS(max_depth=0)


def test_metropolis_test_rejects_nan_and_handles_infinities():
    from ebmlab.samplers.base import accept

    log_ratio = torch.tensor([math.nan, -math.inf, math.inf, 0.0] * 100)
    ok = accept(log_ratio, torch.Generator().manual_seed(0)).view(100, 4)
    assert not ok[:, 0].any() and not ok[:, 1].any()
    assert ok[:, 2].all() and ok[:, 3].all()


def test_mala_tunes_its_step_size_to_the_target_acceptance():
    """From a step 100 times too small, dual averaging during burn-in brings MALA's mean
    acceptance to the target and the chains to the target's moments."""
    scales = torch.tensor([0.5, 1.0, 2.0, 1.5, 0.8], dtype=torch.float64)
    target = DiagonalGaussian(torch.zeros(5, dtype=torch.float64), scales)
    sampler = MALA(1e-4, target_accept=0.574)
    x0 = torch.randn(256, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    run = sampler.run(target, x0, 400, burn_in=400, thin=1, generator=1)
    assert abs(run.info["acceptance_rate"] - 0.574) < 0.08
    draws = run.samples.reshape(-1, 5)
    assert torch.allclose(draws.std(0), scales, rtol=0.1)
    assert MALA(0.1).run(target, x0, 5, generator=0).info["acceptance_rate"] > 0  # untuned
    with pytest.raises(ValueError, match="cannot be tempered"):
        sampler.tempered(torch.ones(4))


@pytest.mark.slow
def test_nuts_chains_do_not_wait_for_the_deepest_tree():
    # Without a mass, trees on a Gaussian with scales 0.1 to 3 vary from a few steps to
    # a hundred or more. Queued transitions let each chain start its next tree at once,
    # so the batch computes about what the chains use; in lockstep (run_ahead=1) every
    # step costs the deepest of 32 trees. The moments are right either way.
    g = DiagonalGaussian(torch.zeros(3), torch.tensor([0.1, 1.0, 3.0]))
    x0 = g.sample(32, torch.Generator().manual_seed(0))
    waste = {}
    for ahead in (1, 4):
        run = NUTS(0.08, adapt_mass=False, max_depth=9, run_ahead=ahead).run(
            g, x0, 50, thin=1, generator=1
        )
        waste[ahead] = run.info["n_grad_evals"] / run.info["n_grad_evals_used"]
        draws = run.samples
        assert_mean_close(draws.reshape(-1, 3) ** 2, g.std**2, ess=effective_sample_size(draws**2),
                          what=f"variance, run_ahead={ahead}")  # fmt: skip
    assert waste[1] > 2.0 and waste[4] < 0.6 * waste[1]


def test_nuts_queues_more_transitions_for_more_chains():
    # up to 64 chains queue 4 finished transitions each by default, more chains 8 (the
    # slowest of many keeps the others waiting longer); run_ahead overrides either
    g = DiagonalGaussian(torch.zeros(2), torch.ones(2))
    for chains, sampler, queue in ((64, NUTS(), 4), (65, NUTS(), 8), (65, NUTS(run_ahead=2), 2)):
        x0 = g.sample(chains, torch.Generator().manual_seed(0))
        state = sampler.step(sampler.init(x0, g), g, torch.Generator().manual_seed(1))
        assert state.trees.draws.shape[1] == queue, (chains, queue)


def test_nuts_goes_on_from_a_state_changed_between_steps():
    # Queued transitions and trees under way belong to the state they were made from: a
    # state whose positions change (a restart, a tempering swap) continues from the new
    # positions, so the next step's first leapfrog points lie next to them.
    g = DiagonalGaussian(torch.zeros(3), torch.tensor([0.1, 1.0, 10.0]))
    seen = []

    def energy(x):
        seen.append(x.detach().clone())
        return g.energy(x)

    sampler, fn = NUTS(0.05, adapt_mass=False, max_depth=9), as_energy_fn(energy)
    state = sampler.init(g.sample(32, torch.Generator().manual_seed(0)), fn)
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        state = sampler.step(state, fn, gen)
    assert bool(((state.trees.count > 0) | state.trees.building).any())  # work under way
    away = (3 * g.std).expand(32, 3)  # three sds out: the old chains are far from it
    moved = state.replace(x=away, energy=g.energy(away), grad=energy_and_grad(g, away)[1])
    seen.clear()
    sampler.step(moved, fn, gen)
    assert (seen[0] - away).abs().max() < 0.05 * 6  # one leapfrog step from the new positions
