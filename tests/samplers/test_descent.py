"""Equilibrium Matching's descent sampler, step by step against its definition."""

import pytest
import torch

from ebmlab._checks import ArgumentError
from ebmlab.samplers import EquilibriumDescent


@pytest.mark.parametrize("momentum", [0.0, 0.3])
def test_descent_steps_follow_their_definition(momentum):
    """Three steps on E(x) = sum_i s_i x_i^2 / 2, computed by hand: y = x + eta mu m,
    m' = -grad E(y) = -s y, x' = x + eta m'."""
    scales = torch.tensor([1.0, 4.0], dtype=torch.float64)

    def energy(x):
        return 0.5 * (scales * x * x).sum(1)

    x0 = torch.tensor([[1.0, -1.0], [0.5, 2.0]], dtype=torch.float64)
    eta = 0.1
    sampler = EquilibriumDescent(eta, momentum)
    run = sampler.run(energy, x0, 3, thin=1)
    x, m = x0.clone(), torch.zeros_like(x0)
    for k in range(3):
        y = x + eta * momentum * m
        m = -scales * y
        x = x + eta * m
        assert torch.allclose(run.samples[k], x, rtol=0, atol=1e-15)
    assert run.info["n_grad_evals"] == 3 * 2


def test_descent_reaches_the_equilibrium():
    scales = torch.tensor([0.5, 1.0])

    def energy(x):
        return 0.5 * (scales * x * x).sum(1)

    x0 = torch.ones(4, 2)
    for momentum in (0.0, 0.3):
        assert EquilibriumDescent(0.5, momentum).sample(energy, x0, 60).abs().max() < 1e-4
    with pytest.raises(ArgumentError, match="step_size"):
        EquilibriumDescent(0.0)


def test_energy_matching_generation_is_noise_free_until_tau_star():
    """Before tau_star the chains descend V deterministically (any generator gives the
    same points: x (1 - h)^k on V = |x|^2 / 2); after it the temperature adds noise."""
    from ebmlab.samplers import EnergyMatchingSampler

    def energy(x):
        return 0.5 * x.square().sum(1)

    x0 = torch.ones(3, 2, dtype=torch.float64)
    sampler = EnergyMatchingSampler(0.1, tau_star=0.5, eps_max=0.1, flow_steps=10)
    early = [sampler.sample(energy, x0, 4, generator=seed) for seed in (0, 1)]
    assert torch.equal(early[0], early[1])
    assert torch.allclose(early[0], x0 * 0.9**4, rtol=1e-12)
    late = [sampler.sample(energy, x0, 8, generator=seed) for seed in (0, 1)]
    assert not torch.equal(late[0], late[1])
