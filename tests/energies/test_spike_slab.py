"""The spike-and-slab RBM against exact answers: quadrature over v and s, enumeration of
the spikes, and the exact moments of its Gaussian mixture."""

import math

import pytest
import torch

from ebmlab.energies import SpikeSlabRBM
from ebmlab.energies.boltzmann import binary_states
from ebmlab.partition import exact_log_partition, log_partition
from ebmlab.partition.quadrature import quadrature_log_partition


def random_model(n_visible: int, n_hidden: int, seed: int = 0) -> SpikeSlabRBM:
    torch.manual_seed(seed)
    model = SpikeSlabRBM(n_visible, n_hidden, init_std=0.8).double()
    with torch.no_grad():
        model.mu.normal_()
        model.c.normal_()
        model.b.normal_(0, 0.3)
        model.log_psi.normal_(-1, 0.5)
        model.log_alpha.normal_(0, 0.3)
        model.log_lambda.normal_(0, 0.3)
    return model.requires_grad_(False)


def mixture_moments(model: SpikeSlabRBM) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and variance of v, from the Gaussian of v given each spike state."""
    h = binary_states(model.n_hidden).double()
    p = torch.softmax(model.hidden_log_weights(h), 0)
    means, seconds = [], []
    for state in h:
        precision = torch.diag(model.visible_precision + model.spike_penalty @ state)
        precision -= (model.W * (state / model.alpha)) @ model.W.T
        cov = torch.linalg.inv(precision)
        mean = model.b + cov @ model.W @ (model.mu * state)
        means.append(mean)
        seconds.append(cov.diagonal() + mean**2)
    mean = (p[:, None] * torch.stack(means)).sum(0)
    return mean, (p[:, None] * torch.stack(seconds)).sum(0) - mean**2


def test_exact_log_partition_matches_quadrature_over_the_visible_plane():
    model = random_model(2, 3)
    exact = exact_log_partition(model).log_z
    quadrature = quadrature_log_partition(model, [(-15, 15), (-15, 15)], 1024).log_z
    assert exact == pytest.approx(quadrature, rel=1e-8)


def test_integrating_the_slab_gives_the_joint_energy_and_the_spike_conditional():
    model = random_model(3, 1)
    v = torch.randn(4, 3, dtype=torch.double)
    s = torch.linspace(-30, 30, 20001, dtype=torch.double)
    for on in (0.0, 1.0):
        h = torch.full((len(s), 1), on, dtype=torch.double)
        for row in v:
            energies = model.slab_energy(row.expand(len(s), 3), s[:, None], h)
            integral = torch.logsumexp(-energies, 0) + math.log(float(s[1] - s[0]))
            joint = model.joint_energy(row[None], h[:1])
            assert float(-joint) == pytest.approx(float(integral), rel=1e-9)
    off, on = (model.joint_energy(v, torch.full((4, 1), x, dtype=torch.double)) for x in (0, 1))
    assert torch.allclose(model.hidden_probs(v)[:, 0], torch.sigmoid(off - on))


def test_free_energy_sums_the_joint_energy_over_spikes():
    model = random_model(3, 4)
    v = torch.randn(5, 3, dtype=torch.double)
    h = binary_states(4).double()
    joint = torch.stack([model.joint_energy(v, state.expand(5, 4)) for state in h], 1)
    assert torch.allclose(model.free_energy(v), -torch.logsumexp(-joint, 1))


def test_block_gibbs_recovers_the_exact_mean_and_variance():
    model = random_model(2, 3)
    generator = torch.Generator().manual_seed(5)
    v = model.gibbs(torch.zeros(20000, 2, dtype=torch.double), 300, generator)
    mean, var = mixture_moments(model)
    stderr = (var / len(v)).sqrt()
    assert torch.all((v.mean(0) - mean).abs() < 5 * stderr)
    assert torch.allclose(v.var(0), var, rtol=0.05)


def test_every_spike_state_is_normalisable_even_with_large_weights():
    model = SpikeSlabRBM(5, 4, init_std=10.0).double().requires_grad_(False)
    weights = model.hidden_log_weights(binary_states(4).double())
    assert torch.isfinite(weights).all()


@pytest.mark.slow
def test_ais_agrees_with_enumeration_within_five_hundredths_of_a_nat():
    model = random_model(4, 5, seed=1)
    estimate = log_partition(model, "ais", n_temperatures=500, generator=0)
    exact = log_partition(model, "auto")
    assert exact.method == "enumeration"
    assert abs(estimate.log_z - exact.log_z) < 0.05
    assert estimate.stderr < 0.03
