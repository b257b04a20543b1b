"""Gibbs-with-Gradients and discrete Langevin against exact enumeration."""

import itertools

import pytest
import torch

from ebmlab.energies import BernoulliRBM, BoltzmannMachine, MLPEnergy
from ebmlab.partition import binary_states
from ebmlab.samplers import DiscreteLangevin, GibbsWithGradients
from ebmlab.samplers.diagnostics import effective_sample_size
from ebmlab.testing import assert_mean_close


def boltzmann(d=12, seed=0):
    torch.manual_seed(seed)
    bm = BoltzmannMachine(d, init_std=0.3)
    with torch.no_grad():
        bm.b.normal_(0, 0.5)
    return bm


def exact_means(energy, states):
    with torch.no_grad():
        p = torch.softmax(-energy(states).double(), 0)
    return (p.view(-1, *[1] * (states.ndim - 1)) * states.double()).sum(0)


def check_means(sampler, energy, x0, exact, steps=800, what="means"):
    run = sampler.run(energy, x0, steps, burn_in=200, thin=1, generator=3)
    traj = run.samples
    flat = traj.reshape(-1, *traj.shape[2:])
    assert_mean_close(flat, exact, ess=effective_sample_size(traj), what=what)
    return run


def binary_start(n, d, seed=1):
    return torch.bernoulli(torch.full((n, d), 0.5), generator=torch.Generator().manual_seed(seed))


SAMPLERS = {
    "gwg": GibbsWithGradients,
    "gwg_path": lambda: GibbsWithGradients(n_flips=3),
    "dmala": lambda **kw: DiscreteLangevin(0.5, **kw),
}
ONE_HOT_SAMPLERS = ["gwg", "dmala"]


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_boltzmann_machine_means_match_enumeration(name):
    bm = boltzmann()
    run = check_means(
        SAMPLERS[name](), bm, binary_start(64, 12), exact_means(bm, binary_states(12))
    )
    assert 0.3 < run.info["acceptance_rate"] <= 1.0


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_neural_energy_of_binary_inputs_matches_enumeration(name):
    torch.manual_seed(4)
    net = MLPEnergy(8, hidden=(16,))
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(3)
    exact = exact_means(net, binary_states(8))
    check_means(SAMPLERS[name](), net, binary_start(64, 8), exact)


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_rbm_free_energy_and_image_shaped_chains(name):
    torch.manual_seed(2)
    rbm = BernoulliRBM(9, 4)
    with torch.no_grad():
        rbm.W.normal_(0, 1.0)
    exact = exact_means(rbm, binary_states(9)).view(1, 3, 3)
    energy = lambda x: rbm(x.flatten(1))  # noqa: E731 - chains kept as (B, 1, 3, 3) images
    check_means(SAMPLERS[name](), energy, binary_start(64, 9).view(64, 1, 3, 3), exact)


@pytest.mark.parametrize("name", ONE_HOT_SAMPLERS)
def test_categorical_sites_match_enumeration(name):
    torch.manual_seed(0)
    n_sites, k = 5, 3
    w = torch.randn(n_sites * k, n_sites * k) * 0.4
    w = (w + w.T) / 2
    b = torch.randn(n_sites * k) * 0.5

    def energy(x):
        f = x.flatten(1)
        return -0.5 * ((f @ w) * f).sum(1) - f @ b

    codes = torch.tensor(list(itertools.product(range(k), repeat=n_sites)))
    states = torch.nn.functional.one_hot(codes, k).float()
    x0 = torch.nn.functional.one_hot(torch.randint(k, (64, n_sites)), k).float()
    run = check_means(SAMPLERS[name](one_hot=True), energy, x0, exact_means(energy, states))
    assert (run.samples.sum(-1) == 1).all(), "chains must stay one-hot"


def test_moment_check_catches_unadjusted_discrete_langevin():
    """DULA with a large step is biased; the same check must reject it."""
    bm = boltzmann()
    with pytest.raises(AssertionError):
        check_means(
            DiscreteLangevin(0.5, adjusted=False),
            bm,
            binary_start(64, 12),
            exact_means(bm, binary_states(12)),
        )


def test_gibbs_with_gradients_changes_one_site_per_step():
    bm = boltzmann()
    x0 = binary_start(32, 12)
    sampler = GibbsWithGradients()
    state = sampler.init(x0, bm)
    nxt = sampler.step(state, bm, torch.Generator().manual_seed(0))
    changed = (nxt.x != x0).sum(1)
    assert set(changed.tolist()) <= {0, 1}
    assert nxt.info.accept_prob.shape == (32,)
    assert ((nxt.info.accept_prob >= 0) & (nxt.info.accept_prob <= 1)).all()
    torch.testing.assert_close(changed == 1, nxt.accepted.bool())


def test_path_proposal_flips_the_odd_counts_and_corrects_for_them():
    """Flips drawn twice cancel; a path whose reverse probability is ignored is biased
    and the moment check catches it."""
    flat = torch.zeros(2, 5)
    moves = torch.tensor([[1, 3, 1], [4, 4, 0]])
    flipped, back = GibbsWithGradients(n_flips=3).sites.apply(flat, moves)
    assert flipped.tolist() == [[0, 0, 0, 1, 0], [1, 0, 0, 0, 0]]
    assert back is moves

    class ForwardOnly(GibbsWithGradients):
        def _metropolis(self, state, proposal, log_q_ratio, e_new, g_new, generator):
            return super()._metropolis(state, proposal, 0 * log_q_ratio, e_new, g_new, generator)

    bm = boltzmann()
    with pytest.raises(AssertionError):
        check_means(
            ForwardOnly(n_flips=3), bm, binary_start(64, 12), exact_means(bm, binary_states(12))
        )


def test_bad_input():
    bm = boltzmann()
    with pytest.raises(ValueError, match=r"x0 must be discrete.*continuous sampler"):
        GibbsWithGradients().sample(bm, torch.rand(4, 12), 1)
    with pytest.raises(ValueError, match="one-hot along its last dimension"):
        DiscreteLangevin(0.5, one_hot=True).sample(bm, torch.ones(4, 3, 4), 1)
    with pytest.raises(ValueError, match="step_size"):
        DiscreteLangevin(0.0)
    with pytest.raises(TypeError, match="one_hot must be a bool"):
        GibbsWithGradients(one_hot="yes")
    with pytest.raises(ValueError, match="n_flips must be 1 with one_hot=True"):
        GibbsWithGradients(n_flips=2, one_hot=True)
    with pytest.raises(ValueError, match="n_flips"):
        GibbsWithGradients(n_flips=0)
