"""Perturb-and-MAP learning: moment matching with MAP states of Gumbel-perturbed
models, scored by exact likelihood."""

import pytest
import torch

from ebmlab.energies import BernoulliRBM, BoltzmannMachine
from ebmlab.energies.boltzmann import binary_states
from ebmlab.learning import PerturbAndMAP
from ebmlab.losses import exact_nll
from ebmlab.partition import exact_log_partition, perturbed_map
from ebmlab.samplers import Gibbs


def _data_of(truth: BoltzmannMachine) -> torch.Tensor:
    start = torch.zeros(2000, truth.n_visible, dtype=torch.float64)
    return Gibbs("sequential", model=truth).sample(truth, start, 200, generator=0)


@pytest.mark.parametrize(("perturbation", "gap"), [("joint", 0.05), ("unit", 0.2)])
def test_a_boltzmann_machine_learns_close_to_the_truth(perturbation, gap):
    """Exact samples (joint noise) reach within 0.02 nats of the true model's NLL,
    first-order noise within 0.09."""
    torch.manual_seed(0)
    truth = BoltzmannMachine(8).double()
    with torch.no_grad():
        truth.weight.normal_(0, 0.8)
        truth.b.normal_(0, 0.5)
    data = _data_of(truth)
    torch.manual_seed(1)
    bm = BoltzmannMachine(8).double()
    start_nll = float(exact_nll(bm, data).detach())
    rule = PerturbAndMAP(bm, perturbation=perturbation)
    optimizer = torch.optim.Adam(bm.parameters(), lr=0.02)
    generator = torch.Generator().manual_seed(2)
    for _ in range(30):
        for batch in data.split(100):
            optimizer.zero_grad()
            rule.loss(batch, generator).backward()
            optimizer.step()
    best = float(exact_nll(truth, data).detach())
    learned = float(exact_nll(bm, data).detach())
    assert start_nll - best > 2.5 and learned - best < gap, (start_nll, learned, best)


def test_without_couplings_perturbed_maps_are_exact_samples():
    """With W = 0 the units are independent and first-order Gumbel perturbation is the
    Gumbel-max trick per unit: the MAP states are exact draws, p(v_i = 1) = sigmoid(b_i)
    and p(h_j = 1) = sigmoid(c_j)."""
    torch.manual_seed(3)
    rbm = BernoulliRBM(5, 3).double()
    with torch.no_grad():
        rbm.W.zero_()
        rbm.b.normal_()
        rbm.c.normal_()
    n = 4000
    states = PerturbAndMAP(rbm, perturbation="unit").negatives(n, torch.Generator().manual_seed(4))
    assert states.shape == (n, 8) and set(states.unique().tolist()) <= {0.0, 1.0}
    p = torch.sigmoid(torch.cat([rbm.b, rbm.c])).detach()
    stderr = (p * (1 - p) / n).sqrt()
    assert torch.all((states.mean(0) - p).abs() < 4 * stderr)


def _coupled(model):
    torch.manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 1.5)
    return model.double()


@pytest.mark.parametrize(
    "model",
    [BoltzmannMachine(6), BernoulliRBM(6, 4), BernoulliRBM(3, 7)],
    ids=["bm", "rbm-enumerate-hidden", "rbm-enumerate-visible"],
)
def test_joint_perturbation_draws_exact_samples_and_log_z(model):
    """Gumbel noise on every configuration is the Gumbel-max trick: the MAP states'
    unit means match the exact marginals, and the mean maximum is log Z, each within 4
    standard errors, on strongly coupled models."""
    model = _coupled(model)
    n = 20000
    maxima, states = perturbed_map(model, n, torch.Generator().manual_seed(6), "joint")
    log_z = exact_log_partition(model)
    assert abs(float(maxima.mean()) - log_z.log_z) < 4 * float(maxima.std()) / n**0.5
    if isinstance(model, BoltzmannMachine):
        every = binary_states(model.n_visible).double()
        energy = model.energy(every)
    else:
        every = binary_states(model.n_visible + model.n_hidden).double()
        energy = model.energy(every[:, : model.n_visible], every[:, model.n_visible :])
    exact = (torch.softmax(-energy.detach(), 0)[:, None] * every).sum(0)
    stderr = (exact * (1 - exact) / n).sqrt()
    assert torch.all((states.mean(0) - exact).abs() < 4 * stderr + 1e-9)
    # first-order noise on the same model does not give the model's moments
    _, unit = perturbed_map(model, n, torch.Generator().manual_seed(6), "unit")
    assert torch.any((unit.mean(0) - exact).abs() > 10 * stderr)


def test_bad_input():
    with pytest.raises(ValueError, match="BoltzmannMachine or BernoulliRBM"):
        PerturbAndMAP(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="n_samples"):
        PerturbAndMAP(BoltzmannMachine(4), n_samples=0)
    with pytest.raises(ValueError, match="perturbation='joint' enumerates at most 20"):
        PerturbAndMAP(BernoulliRBM(30, 25))
    with pytest.raises(ValueError, match="perturbation must be one of"):
        PerturbAndMAP(BoltzmannMachine(4), perturbation="pairwise")
