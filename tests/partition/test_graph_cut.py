"""Graph-cut MAP against enumeration, and perturb-and-MAP on models too wide to enumerate."""

import pytest
import torch

from ebmlab.energies import BernoulliRBM, BoltzmannMachine
from ebmlab.energies.boltzmann import binary_states
from ebmlab.partition import exact_log_partition, perturb_and_map_log_partition, perturbed_map
from ebmlab.partition.graph_cut import max_attractive
from ebmlab.partition.variational import _perturbed_cuts


def objective(x, fields, couplings, edges):
    return x @ fields + (couplings * x[..., edges[:, 0]] * x[..., edges[:, 1]]).sum(-1)


def test_minimum_cut_finds_the_enumerated_maximum():
    generator = torch.Generator().manual_seed(0)
    states = binary_states(10).double()
    for _ in range(20):
        fields = 2 * torch.randn(10, generator=generator, dtype=torch.double)
        keep = torch.rand(45, generator=generator) < 0.4
        edges = torch.triu_indices(10, 10, 1).T[keep]
        couplings = 2 * torch.rand(len(edges), generator=generator, dtype=torch.double)
        x = max_attractive(fields, couplings, edges)
        best = objective(states, fields, couplings, edges).max()
        assert float(objective(x, fields, couplings, edges)) == pytest.approx(float(best), abs=1e-6)
    with pytest.raises(ValueError, match="non-negative couplings"):
        max_attractive(fields, -couplings, edges)


def grid_machine(side: int, coupling: float = 0.4, seed: int = 0) -> BoltzmannMachine:
    """An attractive Ising grid as a Boltzmann machine (random fields, uniform couplings)."""
    torch.manual_seed(seed)
    bm = BoltzmannMachine(side * side, init_std=0.0).double()
    with torch.no_grad():
        for r in range(side):
            for c in range(side):
                i = r * side + c
                if c + 1 < side:
                    bm.weight[i, i + 1] = coupling
                if r + 1 < side:
                    bm.weight[i, i + side] = coupling
        bm.b.normal_(-2 * coupling, 0.5)  # fields that balance the couplings' pull
    return bm.requires_grad_(False)


def test_cuts_and_enumeration_agree_on_the_same_perturbations():
    bm = grid_machine(3)
    by_enumeration = perturbed_map(bm, 50, torch.Generator().manual_seed(3))
    by_cuts = _perturbed_cuts(bm, 50, torch.Generator().manual_seed(3))
    assert torch.allclose(by_cuts[0], by_enumeration[0], atol=1e-6)


def test_perturb_and_map_bounds_a_grid_too_wide_to_enumerate():
    bm = grid_machine(8)  # 64 units: cuts for MAP, elimination (width 8) for exact log Z
    exact = exact_log_partition(bm).log_z
    bound = perturb_and_map_log_partition(bm, n_samples=200, generator=0)
    assert bound.log_z > exact - 3 * bound.stderr
    assert bound.log_z < exact + 4  # 1.6 nats above, on 64 units


def test_wide_models_with_repulsive_couplings_are_refused():
    rbm = BernoulliRBM(30, 25, init_std=0.1)
    with pytest.raises(ValueError, match="graph cuts, which need non-negative couplings"):
        perturbed_map(rbm, 2, None)
    with torch.no_grad():
        rbm.W.abs_()
    maxima, states = perturbed_map(rbm, 3, torch.Generator().manual_seed(0))
    assert states.shape == (3, 55) and torch.isfinite(maxima).all()
