import itertools
import math

import torch

from ebmlab.energies import BoltzmannMachine, GaussianBernoulliRBM, SubspaceRBM
from ebmlab.energies.base import _autograd_energy_and_grad
from ebmlab.partition import binary_states


def subspace_model():
    torch.manual_seed(0)
    m = SubspaceRBM(3, 2, 2, init_std=1.0).double()
    with torch.no_grad():
        m.b.normal_()
        m.c.normal_()
        m.D.normal_()
    return m


def all_hidden(m):
    """Every (h, S) configuration: h (N, M), S (N, M, K)."""
    bits = m.n_gates + m.n_gates * m.n_subspace
    states = binary_states(bits).double()
    return states[:, : m.n_gates], states[:, m.n_gates :].view(-1, m.n_gates, m.n_subspace)


def test_subspace_free_energy_sums_out_gates_and_subspace_units():
    m = subspace_model()
    x = binary_states(3).double()
    h, s = all_hidden(m)
    joint = torch.stack([m.joint_energy(xi.expand(len(h), -1), h, s) for xi in x])  # (8, N)
    torch.testing.assert_close(m.free_energy(x), -torch.logsumexp(-joint, 1))


def test_subspace_conditionals_match_brute_force():
    m = subspace_model()
    h, s = all_hidden(m)
    for x in binary_states(3).double():
        xs = x.expand(len(h), -1)
        p = torch.softmax(-m.joint_energy(xs, h, s), 0)  # p(h, S | x)
        # (6.47) gate marginals
        torch.testing.assert_close(m.gate_probs(x[None])[0], p @ h)
        # (6.46) subspace units given x and the gates
        for gates in itertools.product([0.0, 1.0], repeat=m.n_gates):
            g = torch.tensor(gates, dtype=torch.float64)
            rows = (h == g).all(1)
            cond = p[rows] / p[rows].sum()
            want = (cond[:, None, None] * s[rows]).sum(0)
            got = torch.sigmoid(m.subspace_logits(x[None], g[None]))[0]
            torch.testing.assert_close(got, want)
    # (6.45) visible units given (h, S)
    x_all = binary_states(3).double()
    for i in range(0, len(h), 7):
        e = torch.stack([m.joint_energy(xx[None], h[i : i + 1], s[i : i + 1])[0] for xx in x_all])
        p_x = torch.softmax(-e, 0)
        torch.testing.assert_close(
            torch.sigmoid(m.visible_logits(h[i : i + 1], s[i : i + 1]))[0], p_x @ x_all
        )


def test_subspace_gate_penalty_is_k_log_2():
    m = SubspaceRBM(4, 1, 5, init_std=0.0).requires_grad_(False)
    # zero weights: a gate opens only if c exceeds the K log 2 penalty
    assert float(m.gate_logits(torch.zeros(1, 4))) == -5 * math.log(2) + 5 * math.log(2)
    with torch.no_grad():
        m.D.fill_(-20.0)
    assert abs(float(m.gate_logits(torch.zeros(1, 4))) + 5 * math.log(2)) < 1e-6


def test_subspace_gibbs_matches_the_exact_marginal():
    m = subspace_model()
    x_all = binary_states(3).double()
    with torch.no_grad():
        p = torch.softmax(-m.free_energy(x_all), 0)
    x = m.gibbs(torch.zeros(4000, 3, dtype=torch.float64), 30, torch.Generator().manual_seed(0))
    codes = (x.long() * (1 << torch.arange(3))).sum(1)
    emp = torch.bincount(codes, minlength=8).double() / len(x)
    assert 0.5 * (emp - p).abs().sum() < 0.03


def test_gaussian_bernoulli_rbm():
    torch.manual_seed(0)
    m = GaussianBernoulliRBM(3, 4, sigma=0.7, learn_sigma=True, init_std=0.5).double()
    v = torch.randn(5, 3, dtype=torch.float64)
    h_all = binary_states(4).double()
    joint = torch.stack([m.joint_energy(vi.expand(16, -1), h_all) for vi in v])
    torch.testing.assert_close(m.free_energy(v), -torch.logsumexp(-joint, 1))
    # p(h | v) factorises into the sigmoid of the hidden logits
    p = torch.softmax(-joint, 1)
    torch.testing.assert_close(torch.sigmoid(m.hidden_logits(v)), p @ h_all)
    # p(v | h): -E is quadratic in v with its maximum at b + sigma W h and curvature 1/sigma^2
    h = h_all[5:6]
    mean = m.visible_mean(h).detach().requires_grad_(True)
    (g,) = torch.autograd.grad(m.joint_energy(mean, h).sum(), mean, create_graph=True)
    assert g.abs().max() < 1e-10
    hess = torch.stack(
        [torch.autograd.grad(g[0, i], mean, retain_graph=True)[0][0] for i in range(3)]
    )
    torch.testing.assert_close(hess, torch.diag(1 / m.sigma.detach() ** 2))
    samples = m.sample_visible(h.expand(20_000, -1), torch.Generator().manual_seed(0))
    assert (samples.mean(0) - m.visible_mean(h)[0]).abs().max() < 0.03
    assert (samples.std(0) - m.sigma).abs().max() < 0.02


def test_classification_rbm_posterior_is_exact():
    from ebmlab.energies import ClassificationRBM

    torch.manual_seed(0)
    m = ClassificationRBM(4, 3, 3, init_std=1.0).double().requires_grad_(False)
    with torch.no_grad():
        for p in (m.b, m.c, m.d):
            p.normal_()
    x = binary_states(4).double()
    h = binary_states(3).double()

    def joint(xi, y, hi):
        return -(xi @ m.b) - hi @ m.c - m.d[y] - xi @ m.W @ hi - m.U[y] @ hi

    for xi in x:
        e = torch.tensor([[joint(xi, y, hi) for hi in h] for y in range(3)])
        want = torch.softmax(torch.logsumexp(-e, 1), 0)
        torch.testing.assert_close(m.predict_proba(xi[None])[0], want)
        free = torch.stack([m.free_energy(xi[None], torch.tensor([y]))[0] for y in range(3)])
        torch.testing.assert_close(free, -torch.logsumexp(-e, 1))


def test_categorical_rbm_gibbs_matches_the_exact_distribution_over_one_hot_groups():
    from ebmlab.energies import CategoricalRBM

    torch.manual_seed(0)
    m = (
        CategoricalRBM(n_groups=2, n_categories=3, n_hidden=3, init_std=1.0)
        .double()
        .requires_grad_(False)
    )
    m.b.normal_()
    configs = torch.tensor(list(itertools.product(range(3), repeat=2)))
    v = torch.nn.functional.one_hot(configs, 3).double().flatten(1)  # the 9 valid visible vectors
    p = torch.softmax(-m.free_energy(v), 0)
    x = m.gibbs(v[torch.zeros(6000, dtype=torch.long)], 20, torch.Generator().manual_seed(0))
    assert ((x.view(-1, 2, 3).sum(2)) == 1).all()  # every group stays one-hot
    codes = x.view(-1, 2, 3).argmax(2)
    emp = torch.bincount(codes[:, 0] * 3 + codes[:, 1], minlength=9).double() / len(x)
    assert 0.5 * (emp - p).abs().sum() < 0.03


def test_subspace_log_partition_enumerates_either_side():
    from ebmlab.partition import exact_log_partition

    m = subspace_model()  # D = 3 < M K = 4: enumerates x
    x = binary_states(3).double()
    h, s = all_hidden(m)
    joint = torch.stack([m.joint_energy(xi.expand(len(h), -1), h, s) for xi in x])
    brute = float(torch.logsumexp(-joint.flatten(), 0).detach())
    assert abs(exact_log_partition(m).log_z - brute) < 1e-9
    torch.manual_seed(1)
    wide = SubspaceRBM(5, 2, 1, init_std=1.0).double()  # D = 5 > M K = 2: enumerates h s
    with torch.no_grad():
        wide.c.normal_()
        wide.D.normal_()
    brute = float(torch.logsumexp(-wide.free_energy(binary_states(5).double()), 0).detach())
    assert abs(exact_log_partition(wide).log_z - brute) < 1e-9


def test_classification_rbm_log_partition_sums_inputs_labels_and_hidden_units():
    from ebmlab.energies import ClassificationRBM
    from ebmlab.partition import exact_log_partition

    torch.manual_seed(2)
    m = ClassificationRBM(4, 3, 3, init_std=1.0).double()
    with torch.no_grad():
        for p in (m.b, m.c, m.d):
            p.normal_()
    x = binary_states(4).double().repeat_interleave(3, 0)
    y = torch.arange(3).repeat(16)
    brute = float(torch.logsumexp(-m.free_energy(x, y), 0).detach())
    assert abs(exact_log_partition(m).log_z - brute) < 1e-9


def test_subspace_reconstruction_is_the_mean_field_visible_probability():
    m = subspace_model()
    x = binary_states(3).double()
    h, s = all_hidden(m)
    for row in x:
        p = torch.softmax(-m.joint_energy(row.expand(len(h), -1), h, s), 0)
        on = (p[:, None, None] * h[:, :, None] * s).sum(0)
        want = torch.sigmoid(torch.einsum("ijk,jk->i", m.W, on) + m.b)
        torch.testing.assert_close(m.reconstruction(row[None])[0], want)


def test_bernoulli_draws_match_their_probabilities_in_every_dtype():
    """Frequencies are within 4 standard errors of p, for float32 uniforms and for the
    16-bit uniforms used with bfloat16 probabilities (p = 0 and 1 stay exact)."""
    from ebmlab.energies.boltzmann import bernoulli_draw

    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([0.0, 1e-3, 0.1, 0.3, 0.5, 0.77, 0.999, 1.0])
    n = 200_000
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        probs = p.to(dtype).expand(n, -1).contiguous()
        draws = bernoulli_draw(probs, gen)
        assert draws.dtype == dtype and set(draws.unique().tolist()) <= {0.0, 1.0}
        exact = probs[0].double()
        freq = draws.double().mean(0)
        stderr = (exact * (1 - exact) / n).sqrt()
        assert ((freq - exact).abs() <= 4 * stderr + 2**-17).all(), (dtype, freq, exact)
        assert freq[0] == 0 and freq[-1] == 1


def test_boltzmann_machine_closed_form_gradient_gives_exact_flip_energies():
    """One product x W gives E and its gradient as autograd does, and on binary x
    (1 - 2 x_i) grad_i is the exact energy change of flipping unit i."""
    torch.manual_seed(0)
    bm = BoltzmannMachine(7).double()
    with torch.no_grad():
        bm.weight.normal_()
        bm.b.normal_()
    x = (torch.rand(5, 7, dtype=torch.float64) < 0.5).double()
    e, g = bm.energy_and_grad(x)
    e_ref, g_ref = _autograd_energy_and_grad(bm.energy, x)
    torch.testing.assert_close(e, e_ref)
    torch.testing.assert_close(g, g_ref)
    flipped = x[:, None, :] + torch.eye(7, dtype=torch.float64) * (1 - 2 * x[:, None, :])
    delta = bm.energy(flipped.reshape(-1, 7)).view(5, 7) - e[:, None]
    torch.testing.assert_close(delta.detach(), (1 - 2 * x) * g)
