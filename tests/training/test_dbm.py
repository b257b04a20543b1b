import itertools

import torch

from ebmlab.energies import DeepBoltzmannMachine
from ebmlab.learning.rbm import DBMLearning
from ebmlab.partition import binary_states


def small_dbm(seed=0):
    torch.manual_seed(seed)
    dbm = DeepBoltzmannMachine(5, 3, 2, init_std=1.0).double().requires_grad_(False)
    dbm.b.normal_()
    dbm.c1.normal_()
    dbm.c2.normal_()
    return dbm


def brute_joint(dbm):
    v, h1, h2 = binary_states(5).double(), binary_states(3).double(), binary_states(2).double()
    combos = list(itertools.product(range(len(v)), range(len(h1)), range(len(h2))))
    vi, h1i, h2i = (torch.tensor(c) for c in zip(*combos, strict=True))
    e = dbm.joint_energy(v[vi], h1[h1i], h2[h2i]).view(len(v), len(h1) * len(h2))
    return v, e


def test_exact_free_energy_and_log_partition_match_brute_force():
    dbm = small_dbm()
    v, e = brute_joint(dbm)
    torch.testing.assert_close(dbm.free_energy(v), -torch.logsumexp(-e, 1))
    torch.testing.assert_close(dbm.log_partition(), torch.logsumexp(-e.flatten(), 0))


def test_gibbs_matches_the_exact_visible_marginal():
    dbm = small_dbm()
    v_all = binary_states(5).double()
    p = torch.softmax(-dbm.free_energy(v_all), 0)
    gen = torch.Generator().manual_seed(0)
    v, _, _ = dbm.gibbs(
        torch.zeros(6000, 5, dtype=torch.float64),
        torch.zeros(6000, 2, dtype=torch.float64),
        50,
        gen,
    )
    codes = (v.long() * (1 << torch.arange(5))).sum(1)
    emp = torch.bincount(codes, minlength=32).double() / len(v)
    assert 0.5 * (emp - p).abs().sum() < 0.04


def test_learning_raises_the_likelihood_of_the_data():
    teacher = small_dbm(1)
    v_all = binary_states(5).double()
    p = torch.softmax(-teacher.free_energy(v_all), 0)
    gen = torch.Generator().manual_seed(0)
    data = v_all[torch.multinomial(p, 3000, replacement=True, generator=gen)]
    student = DeepBoltzmannMachine(5, 3, 2).double()

    def nll():
        with torch.no_grad():
            return float(student.free_energy(data).mean() + student.log_partition())

    before = nll()
    learner = DBMLearning(student, n_chains=200, k=1)
    opt = torch.optim.SGD(student.parameters(), lr=0.05, momentum=0.5)
    for step in range(400):
        learner.accumulate(data[(step * 50) % 3000 : (step * 50) % 3000 + 50], gen)
        opt.step()
    teacher_nll = float(teacher.free_energy(data).mean() + teacher.log_partition())
    assert nll() < before - 0.3 and nll() < teacher_nll + 0.15


def test_greedy_pretraining_alone_beats_the_independent_pixel_model_by_nats():
    from ebmlab.data import load_dataset
    from ebmlab.learning.rbm import pretrain_dbm

    train = load_dataset("digits", "train", transform="binary")
    test = load_dataset("digits", "test", transform="binary")
    torch.manual_seed(0)
    dbm = DeepBoltzmannMachine(64, 12, 12).double()

    def log_likelihood():
        with torch.no_grad():
            return float(-dbm.free_energy(test.x.double()).mean() - dbm.log_partition())

    with torch.no_grad():
        dbm.W1.zero_()
        dbm.b.copy_(torch.logit(train.x.double().mean(0).clamp(1e-3, 1 - 1e-3)))
    independent = log_likelihood()  # W = 0: pixels independent at their base rates
    pretrain_dbm(dbm, train.x, 10, batch_size=20, generator=torch.Generator().manual_seed(0))
    assert log_likelihood() > independent + 3.0


def test_mean_field_bound_lies_above_the_exact_free_energy_and_is_tight_without_w2():
    """F(v) <= E_q[E] - H(q) for every v, with a gap (the KL from q to the posterior)
    that vanishes when W2 = 0 makes the posterior factorise; a q that is not the fixed
    point (no iterations from a cold start) gives a looser bound."""
    dbm = small_dbm()
    v = binary_states(5).double()
    exact, bound = dbm.free_energy(v), dbm.free_energy_bound(v, n_iter=50)
    gap = bound - exact
    assert bool((gap >= -1e-9).all()) and float(gap.max()) > 1e-3
    assert float((dbm.free_energy_bound(v, n_iter=0) - exact).mean()) > float(gap.mean())
    dbm.W2.zero_()
    torch.testing.assert_close(dbm.free_energy_bound(v), dbm.free_energy(v))
    assert dbm.enumerable and not DeepBoltzmannMachine(5, 21, 2).enumerable
