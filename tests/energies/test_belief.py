"""Deep belief network: the variational bound against enumeration."""

import torch

from ebmlab.energies import DeepBeliefNetwork
from ebmlab.partition import binary_states, exact_log_partition


def small_dbn():
    torch.manual_seed(0)
    dbn = DeepBeliefNetwork(4, (3, 2)).double()
    with torch.no_grad():
        for p in dbn.parameters():
            p.normal_()
    return dbn


def log_bernoulli(x, logits):
    return (x * logits - torch.nn.functional.softplus(logits)).sum(-1)


def test_the_bound_matches_its_enumerated_value_and_lies_below_log_p():
    dbn = small_dbn()
    bottom, top = dbn.layers
    log_z = exact_log_partition(top).log_z
    v = binary_states(4).double()
    h = binary_states(3).double()
    with torch.no_grad():
        log_prior = -top.free_energy(h) - log_z  # (8,)
        log_lik = log_bernoulli(v[:, None], bottom.visible_logits(h)[None])  # (16, 8)
        log_q = log_bernoulli(h[None], bottom.hidden_logits(v)[:, None])  # (16, 8)
        exact = torch.logsumexp(log_lik + log_prior, 1)
        bound = (log_q.exp() * (log_lik + log_prior - log_q)).sum(1)
    assert torch.all(bound <= exact + 1e-12) and torch.exp(exact).sum().sub(1).abs() < 1e-9
    gen = torch.Generator().manual_seed(0)
    estimate, se = dbn.log_likelihood_bound(v, log_z, n_samples=4000, generator=gen)
    assert 0 < se < 0.05
    assert abs(estimate - float(bound.mean())) < 4 * se


def test_one_layer_bound_is_the_exact_log_likelihood_and_samples_have_the_input_width():
    dbn = DeepBeliefNetwork(5, (3,)).double()
    v = binary_states(5).double()
    log_z = exact_log_partition(dbn.top).log_z
    estimate, se = dbn.log_likelihood_bound(v, log_z, n_samples=2)
    assert se == 0.0  # one layer: no draws enter the bound
    with torch.no_grad():
        exact = float((-dbn.top.free_energy(v) - log_z).mean())
    assert abs(estimate - exact) < 1e-9
    assert small_dbn().sample(7, k=3).shape == (7, 4)
    assert small_dbn().up(v[:3, :4]).shape == (3, 2)
