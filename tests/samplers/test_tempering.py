import pytest
import torch

from ebmlab.data.toys import EightGaussians
from ebmlab.energies import DiagonalGaussian, DoubleWell, GaussianMixture
from ebmlab.samplers import MALA, NUTS, AdaptiveHMC, Langevin, ParallelTempering, anneal
from ebmlab.samplers.diagnostics import effective_sample_size, split_rhat
from ebmlab.samplers.tempering import _count_round_trips, tuned_ladder


def mode_weights(toy, x):
    return (
        torch.bincount(toy.component(x.reshape(-1, 2)), minlength=8).double()
        / x.reshape(-1, 2).shape[0]
    )


@pytest.mark.slow
def test_parallel_tempering_finds_all_eight_modes_where_langevin_cannot():
    toy = EightGaussians(std=0.1)  # barriers of ~29 nats between neighbouring modes

    def energy(x):
        return -toy.log_prob(x)

    x0 = torch.tensor([2.0, 0.0]).repeat(256, 1)  # every chain starts in one mode
    pt = ParallelTempering(MALA(0.01), ParallelTempering.geometric_ladder(8, 0.005))
    traj = pt.sample(energy, x0, 1500, burn_in=500, thin=5, generator=0)
    assert (mode_weights(toy, traj) - 1 / 8).abs().max() < 0.02

    single = Langevin(0.01).sample(energy, x0, 1500, burn_in=500, thin=5, generator=0)
    assert (mode_weights(toy, single) - 1 / 8).abs().max() > 0.1


@pytest.mark.slow
def test_nuts_as_the_base_kernel_balances_two_separated_modes():
    toy = EightGaussians(std=0.1)

    def energy(x):  # two opposite modes of the ring, 4 apart: ~800 nats of barrier
        return -torch.logaddexp(toy.log_prob(x), toy.log_prob(-x))

    x0 = torch.tensor([2.0, 0.0]).repeat(64, 1)
    nuts = NUTS(0.05, max_depth=4)
    pt = ParallelTempering(nuts, ParallelTempering.geometric_ladder(8, 0.002))
    traj = pt.sample(energy, x0, 150, burn_in=50, thin=5, generator=0)
    assert abs(float((traj[..., 0] > 0).double().mean()) - 0.5) < 0.1
    single = nuts.sample(energy, x0, 50, thin=5, generator=0)
    assert bool((single[..., 0] > 0).all())


@pytest.mark.parametrize(
    "kernel",
    [
        pytest.param(AdaptiveHMC(), id="ahmc"),
        pytest.param(NUTS(max_depth=4), id="nuts", marks=pytest.mark.slow),
    ],
)
def test_adaptive_base_kernels_tune_a_mass_per_temperature(kernel):
    scales = torch.tensor([0.05, 0.3, 1.0])
    target = DiagonalGaussian(torch.zeros(3), scales)
    betas = [1.0, 0.5, 0.25]
    pt = ParallelTempering(kernel, betas)
    run = pt.run(target, torch.randn(200, 3), 150, burn_in=300, thin=1, generator=0)
    inv_mass = run.final.replicas.inv_mass.view(3, 200, 3)
    assert (inv_mass == inv_mass[:, :1]).all()  # one mass per temperature
    # each the variance of its tempered target, scales**2 / beta, from 200 chains (sd ~10%);
    # one mass pooled over the ladder would be off by a factor 2.3 at beta = 1
    for k, beta in enumerate(betas):
        ratio = inv_mass[k, 0] / (scales**2 / beta)
        assert ((ratio > 0.6) & (ratio < 1.5)).all(), (beta, ratio)
    cold = run.samples.reshape(-1, 3)
    ess = effective_sample_size(run.samples).clamp_min(1)
    assert ((cold.mean(0) / (scales / ess.sqrt())).abs() < 4).all()
    assert ((cold.var(0) / scales**2 - 1).abs() < 4 * (2 / ess).sqrt()).all()
    assert (torch.as_tensor(run.final.replicas.step_size) != kernel.step_size).all()
    assert run.info["acceptance_rate"] > 0
    with pytest.raises(ValueError, match="a tempered kernel for 6 chains got x0 with 4"):
        kernel.tempered(torch.ones(6)).init(torch.zeros(4, 3), target)


def test_swaps_preserve_cached_energies_and_gradients():
    g = DiagonalGaussian(torch.zeros(2), torch.ones(2))
    pt = ParallelTempering(MALA(0.3), [1.0, 0.5, 0.25])
    run = pt.run(g, torch.randn(16, 2), 20, generator=0)
    rep = run.final.replicas
    betas = pt.betas.repeat_interleave(16)
    torch.testing.assert_close(rep.energy, betas * g.energy(rep.x))
    torch.testing.assert_close(rep.grad, betas[:, None] * rep.x)
    rates = ParallelTempering.swap_rates(run.final)
    assert rates.shape == (2,) and (rates > 0).all()


def test_anneal_moves_samples_to_the_target():
    target = DiagonalGaussian(torch.tensor([3.0, -3.0]), torch.ones(2))
    base = DiagonalGaussian(torch.zeros(2), torch.ones(2))
    betas = torch.linspace(0, 1, 50).tolist()
    x = anneal(
        MALA(0.2), target, base.sample(2000), betas, steps_per_beta=5, base_energy=base, generator=0
    )
    assert (x.mean(0) - target.mean).abs().max() < 0.15


def test_ladder_validation():
    with pytest.raises(ValueError, match=r"betas must start at 1\.0"):
        ParallelTempering(MALA(0.1), [0.5, 0.25])
    with pytest.raises(ValueError, match="at least two"):
        ParallelTempering(MALA(0.1), [1.0])
    with pytest.raises(TypeError, match="base must be a Sampler"):
        ParallelTempering("mala", [1.0, 0.5])
    ladder = ParallelTempering.geometric_ladder(4, 0.001)
    assert ladder[0] == pytest.approx(1.0) and ladder[-1] == pytest.approx(0.001)


def test_adaptive_hmc_in_the_ladder_keeps_the_cold_replicas_stable_on_two_modes():
    """The step size follows the worst temperature: tuned to the ladder's mean acceptance,
    the cold replicas (whose fitted mass spans both modes) diverge by the hundreds."""
    target = GaussianMixture.isotropic(torch.tensor([[-2.0, 0.0], [2.0, 0.0]]), std=0.5)
    x0 = torch.randn(128, 2, generator=torch.Generator().manual_seed(0))
    pt = ParallelTempering(AdaptiveHMC(), ParallelTempering.geometric_ladder(4, 0.1))
    run = pt.run(target, x0, 300, burn_in=300, thin=1, generator=0)
    assert run.info["n_divergent"] == 0
    assert abs(float((run.samples[..., 0] > 0).double().mean()) - 0.5) < 0.05
    assert float(split_rhat(run.samples).max()) < 1.05


def ring_energy():
    ring = EightGaussians(std=0.1)
    return lambda x: -ring.log_prob(x)


@pytest.mark.slow
def test_tuned_ladder_equalises_swap_rejection():
    energy, x0 = ring_energy(), torch.tensor([2.0, 0.0]).repeat(64, 1)
    spreads = {}
    for tune in (False, True):
        pt = ParallelTempering(
            MALA(0.005), ParallelTempering.geometric_ladder(6, 0.005), tune_ladder=tune
        )
        state = pt.run(energy, x0, 600, burn_in=600, generator=0).final
        rates = pt.swap_rates(state)
        spreads[tune] = float(rates.max() - rates.min())
        assert pt.barrier(state) == pytest.approx(float((1 - rates).sum()))
        assert int(state.round_trips) > 0
        betas = state.betas
        assert betas[0] == 1 and betas[-1] == pytest.approx(0.005) and (betas.diff() < 0).all()
    assert spreads[True] < 0.05 < spreads[False]


@pytest.mark.slow
def test_tuned_ladder_on_a_deep_double_well_keeps_mode_weights():
    """Energy barrier 20 between x = -1 and x = 1: equal mass on both sides."""
    well = DoubleWell(dim=1, depth=20.0)
    x0 = torch.ones(64, 1)
    ladder = tuned_ladder(MALA(0.02), well, x0, 0.01, pilot_steps=300, generator=1)
    assert ladder[0] == 1 and ladder[-1] == pytest.approx(0.01) and len(ladder) >= 3
    pt = ParallelTempering(MALA(0.02), ladder, tune_ladder=True)
    draws = pt.sample(well, x0, 1500, burn_in=500, thin=1, generator=2)
    right = float((draws > 0).double().mean())
    assert abs(right - 0.5) < 0.02


def test_round_trips_count_hottest_to_coldest_and_back():
    n = 1  # one chain per temperature; 3 temperatures, walkers 0..2
    last_end = torch.zeros(3, dtype=torch.int8)
    trips = torch.zeros((), dtype=torch.long)
    # slots (coldest, middle, hottest) hold these walkers, step by step: walker 0 goes
    # coldest -> hottest (steps 1-2), walker 2 hottest -> coldest -> hottest (steps 1-4)
    for walkers in ([0, 1, 2], [1, 2, 0], [2, 1, 0], [1, 0, 2], [0, 1, 2]):
        last_end, trips = _count_round_trips(torch.tensor(walkers), last_end, trips, n)
    assert int(trips) == 2


@pytest.mark.parametrize("swap_every", [1, 2, 3])
def test_swap_rounds_alternate_even_and_odd_pairs_whatever_the_local_steps(swap_every):
    # The pairs alternate by swap round, not by step: with an even number of local
    # steps per round, counting steps proposed only the even pairs and no walker ever
    # crossed the ladder.
    g = DiagonalGaussian(torch.zeros(1), torch.ones(1))
    pt = ParallelTempering(MALA(0.3), [1.0, 0.7, 0.5, 0.35], swap_every=swap_every)
    run = pt.run(g, torch.zeros(16, 1), 12 * swap_every, generator=0)
    assert run.final.swaps_proposed.tolist() == [16 * 6] * 3
    assert int(run.final.round_trips) > 0
