import pytest
import torch

from ebmlab.energies import BernoulliRBM, BoltzmannMachine
from ebmlab.partition import binary_states
from ebmlab.samplers import BlockGibbs, Gibbs, ParallelTempering


def exact_probs(energy, d):
    states = binary_states(d)
    with torch.no_grad():
        return torch.softmax(-energy(states).double(), 0)


def empirical(x, d):
    codes = (x.long() * (1 << torch.arange(d))).sum(1)
    return torch.bincount(codes, minlength=2**d).double() / len(x)


def random_bm(d=5, seed=0, scale=1.0):
    torch.manual_seed(seed)
    bm = BoltzmannMachine(d)
    with torch.no_grad():
        bm.weight.normal_(0, scale)
        bm.b.normal_(0, scale)
    return bm


@pytest.mark.parametrize("scan", ["sequential", "random"])
@pytest.mark.parametrize("fast", [True, False])
def test_gibbs_matches_enumerated_boltzmann_machine(scan, fast):
    bm = random_bm()
    sampler = Gibbs(scan, model=bm if fast else None)
    traj = sampler.sample(bm, torch.zeros(200, 5), 100, burn_in=20, thin=1, generator=1)
    tv = 0.5 * (empirical(traj.reshape(-1, 5), 5) - exact_probs(bm, 5)).abs().sum()
    assert tv < 0.03


def test_total_variation_check_detects_the_wrong_model():
    bm, other = random_bm(seed=0), random_bm(seed=1)
    traj = Gibbs(model=other).sample(other, torch.zeros(200, 5), 100, thin=1, generator=1)
    tv = 0.5 * (empirical(traj.reshape(-1, 5), 5) - exact_probs(bm, 5)).abs().sum()
    assert tv > 0.1


def test_block_gibbs_matches_enumerated_rbm():
    torch.manual_seed(0)
    rbm = BernoulliRBM(6, 3, init_std=1.0)
    with torch.no_grad():
        rbm.b.normal_()
        rbm.c.normal_()
    traj = BlockGibbs(rbm).sample(rbm, torch.zeros(500, 6), 60, burn_in=10, thin=1, generator=2)
    tv = 0.5 * (empirical(traj.reshape(-1, 6), 6) - exact_probs(rbm, 6)).abs().sum()
    assert tv < 0.04


def test_block_gibbs_caches_the_free_energy():
    rbm = BernoulliRBM(6, 3, init_std=1.0)
    run = BlockGibbs(rbm).run(rbm, torch.ones(4, 6), 3, generator=0)
    with torch.no_grad():
        torch.testing.assert_close(run.final.energy, rbm.free_energy(run.final.x))


def test_free_energy_sums_out_the_hidden_units():
    rbm = BernoulliRBM(4, 3, init_std=1.0)
    v = binary_states(4)
    h = binary_states(3)
    joint = rbm.joint_energy(v.repeat_interleave(8, 0), h.repeat(16, 1)).view(16, 8)
    torch.testing.assert_close(rbm.free_energy(v), -torch.logsumexp(-joint, 1))


def test_gibbs_rejects_non_binary_start():
    with pytest.raises(ValueError, match="x0 must be binary"):
        Gibbs().sample(random_bm(), torch.full((2, 5), 0.5), 1)
    with pytest.raises(TypeError, match="couplings"):
        Gibbs(model=object())


def test_gibbs_with_couplings_samples_tempered_targets():
    """In a temperature ladder the fast path must draw from beta E, not from E."""
    bm = random_bm(seed=3, scale=1.5)
    pt = ParallelTempering(Gibbs(model=bm), [1.0, 0.3])
    run = pt.run(bm, torch.zeros(200, 5), 100, burn_in=20, thin=1, generator=0)
    cold = 0.5 * (empirical(run.samples.reshape(-1, 5), 5) - exact_probs(bm, 5)).abs().sum()
    assert cold < 0.03
    beta_bm = lambda x: 0.3 * bm(x)  # noqa: E731
    hot_traj = (
        Gibbs(model=bm)
        .tempered(torch.full((200,), 0.3))
        .sample(beta_bm, torch.zeros(200, 5), 100, burn_in=20, thin=1, generator=1)
    )
    tv_hot = 0.5 * (empirical(hot_traj.reshape(-1, 5), 5) - exact_probs(beta_bm, 5)).abs().sum()
    assert tv_hot < 0.03
