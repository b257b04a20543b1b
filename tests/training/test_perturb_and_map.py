"""Perturb-and-MAP learning: moment matching with MAP states of Gumbel-perturbed
models, scored by exact likelihood."""

import pytest
import torch

from ebmlab.energies import BernoulliRBM, BoltzmannMachine
from ebmlab.learning import PerturbAndMAP
from ebmlab.losses import exact_nll
from ebmlab.samplers import Gibbs


def _data_of(truth: BoltzmannMachine) -> torch.Tensor:
    start = torch.zeros(2000, truth.n_visible, dtype=torch.float64)
    return Gibbs("sequential", model=truth).sample(truth, start, 200, generator=0)


def test_a_boltzmann_machine_learns_close_to_the_truth():
    torch.manual_seed(0)
    truth = BoltzmannMachine(8).double()
    with torch.no_grad():
        truth.weight.normal_(0, 0.8)
        truth.b.normal_(0, 0.5)
    data = _data_of(truth)
    torch.manual_seed(1)
    bm = BoltzmannMachine(8).double()
    start_nll = float(exact_nll(bm, data).detach())
    rule = PerturbAndMAP(bm)
    optimizer = torch.optim.Adam(bm.parameters(), lr=0.02)
    generator = torch.Generator().manual_seed(2)
    for _ in range(30):
        for batch in data.split(100):
            optimizer.zero_grad()
            rule.loss(batch, generator).backward()
            optimizer.step()
    best = float(exact_nll(truth, data).detach())
    learned = float(exact_nll(bm, data).detach())
    assert start_nll - best > 2.5 and learned - best < 0.2, (start_nll, learned, best)


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
    states = PerturbAndMAP(rbm).negatives(n, torch.Generator().manual_seed(4))
    assert states.shape == (n, 8) and set(states.unique().tolist()) <= {0.0, 1.0}
    p = torch.sigmoid(torch.cat([rbm.b, rbm.c])).detach()
    stderr = (p * (1 - p) / n).sqrt()
    assert torch.all((states.mean(0) - p).abs() < 4 * stderr)


def test_bad_input():
    with pytest.raises(ValueError, match="BoltzmannMachine or BernoulliRBM"):
        PerturbAndMAP(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="n_samples"):
        PerturbAndMAP(BoltzmannMachine(4), n_samples=0)
    with pytest.raises(ValueError, match="at most 20"):
        PerturbAndMAP(BernoulliRBM(30, 25)).negatives(2)
