import pytest
import torch

from ebmlab.data.toys import EightGaussians
from ebmlab.energies import DiagonalGaussian
from ebmlab.samplers import MALA, NUTS, AdaptiveHMC, Langevin, ParallelTempering, anneal


def mode_weights(toy, x):
    return (
        torch.bincount(toy.component(x.reshape(-1, 2)), minlength=8).double()
        / x.reshape(-1, 2).shape[0]
    )


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


def test_nuts_as_the_base_kernel_balances_two_separated_modes():
    toy = EightGaussians(std=0.1)

    def energy(x):  # two opposite modes of the ring, 4 apart: ~800 nats of barrier
        return -torch.logaddexp(toy.log_prob(x), toy.log_prob(-x))

    x0 = torch.tensor([2.0, 0.0]).repeat(64, 1)
    nuts = NUTS(0.05, max_depth=5)
    pt = ParallelTempering(nuts, ParallelTempering.geometric_ladder(8, 0.002))
    traj = pt.sample(energy, x0, 150, burn_in=50, thin=5, generator=0)
    assert abs(float((traj[..., 0] > 0).double().mean()) - 0.5) < 0.1
    single = nuts.sample(energy, x0, 150, thin=5, generator=0)
    assert bool((single[..., 0] > 0).all())
    with pytest.raises(TypeError, match="ParallelTempering use HMC, MALA, Langevin or NUTS"):
        ParallelTempering(AdaptiveHMC(), [1.0, 0.5]).sample(energy, x0, 2)


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
