import math

import pytest
import torch

from ebmlab.energies import BernoulliRBM, BoltzmannMachine
from ebmlab.partition import (
    bethe_log_partition,
    exact_log_partition,
    perturb_and_map_log_partition,
    trw_log_partition,
)


def models(scale, seed):
    torch.manual_seed(seed)
    bm = BoltzmannMachine(8, init_std=scale)
    rbm = BernoulliRBM(8, 5, init_std=scale)
    with torch.no_grad():
        bm.b.normal_(0, 0.5)
        rbm.b.normal_(0, 0.5)
        rbm.c.normal_(0, 0.5)
    return bm, rbm


@pytest.mark.parametrize("scale", [0.1, 0.5, 1.0, 2.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_trw_and_perturb_and_map_never_fall_below_exact(scale, seed):
    for model in models(scale, seed):
        exact = exact_log_partition(model).log_z
        trw = trw_log_partition(model)
        assert trw.cost["converged"] and trw.upper >= exact - 1e-9
        pam = perturb_and_map_log_partition(model, n_samples=500, generator=seed)
        assert pam.log_z + 3 * pam.stderr >= exact


def test_bethe_is_exact_on_a_tree_and_close_on_weak_couplings():
    torch.manual_seed(0)
    chain = BoltzmannMachine(6, init_std=0.0)
    with torch.no_grad():
        for i in range(5):
            chain.weight[i, i + 1] = torch.randn(())
        chain.b.normal_()
    assert bethe_log_partition(chain).log_z == pytest.approx(
        exact_log_partition(chain).log_z, abs=1e-6
    )
    for model in models(0.1, 0):
        assert abs(bethe_log_partition(model).log_z - exact_log_partition(model).log_z) < 0.01


def test_bad_models_are_refused():
    with pytest.raises(TypeError, match="BoltzmannMachine or BernoulliRBM"):
        bethe_log_partition(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="smaller layer"):
        perturb_and_map_log_partition(BernoulliRBM(30, 25))


def test_perturb_and_map_enumerates_the_smaller_rbm_layer():
    torch.manual_seed(0)
    for shape in ((30, 6), (6, 30)):
        rbm = BernoulliRBM(*shape, init_std=0.5)
        exact = exact_log_partition(rbm).log_z
        pam = perturb_and_map_log_partition(rbm, n_samples=500, generator=0)
        assert exact - 3 * pam.stderr <= pam.log_z < exact + 10


@pytest.mark.parametrize("scale", [0.5, 2.0])
def test_trw_converges_and_bounds_in_float32(scale):
    """The default tolerance is finer than float32 resolves: it is raised to the dtype's
    resolution, so the bound holds in float32 (a device without float64) too."""
    from ebmlab.partition.variational import pairwise_potentials, reweighted_bp

    for model in models(scale, 0):
        exact = exact_log_partition(model).log_z
        theta_i, theta_ij, edges = (t.float() if t.is_floating_point() else t
                                    for t in pairwise_potentials(model))  # fmt: skip
        rho = (theta_i.shape[0] - 1) / edges.shape[0]
        value, report = reweighted_bp(theta_i, theta_ij, edges, min(1.0, rho))
        assert report["converged"] and report["tol"] > 1e-8
        assert value >= exact - 1e-4 * abs(exact)


def test_an_unconverged_trw_says_so_and_drops_the_bound():
    from ebmlab.convergence import ConvergenceWarning

    _, rbm = models(2.0, 0)
    with pytest.warns(ConvergenceWarning, match="did not converge in 2 iterations"):
        estimate = trw_log_partition(rbm, max_iter=2)
    assert not estimate.cost["converged"] and estimate.upper == float("inf")


def test_beliefs_that_underflow_in_float32_leave_the_estimate_finite():
    """Fields of +-120 make one state's belief exp(-120), zero in float32: its entropy
    term is 0 log 0 = 0, not NaN."""
    from ebmlab.partition.variational import pairwise_potentials, reweighted_bp

    bm = BoltzmannMachine(4, init_std=0.1)
    with torch.no_grad():
        bm.b.copy_(torch.tensor([120.0, -120.0, 0.3, -0.2]))
    exact = exact_log_partition(bm).log_z
    theta_i, theta_ij, edges = (t.float() if t.is_floating_point() else t
                                for t in pairwise_potentials(bm))  # fmt: skip
    value, _ = reweighted_bp(theta_i, theta_ij, edges, 1.0)
    assert math.isfinite(value) and abs(value - exact) < 1e-3 * abs(exact)


def test_message_sums_add_every_incoming_edge_once_in_a_fixed_order():
    """The node sums of reweighted BP are index_add_'s sums (node 3 has no incoming
    edge, node 0 three), read from a padded table rather than added by atomics."""
    from ebmlab.partition.variational import _incoming, _node_sums

    dst = torch.tensor([0, 2, 0, 1, 0, 2])
    messages = torch.randn(len(dst), 2, generator=torch.Generator().manual_seed(0))
    incoming = _incoming(dst, 4)
    assert incoming.shape == (4, 3)
    expected = messages.new_zeros(4, 2).index_add_(0, dst, messages)
    torch.testing.assert_close(_node_sums(messages, incoming), expected)
    assert _node_sums(messages, incoming)[3].eq(0).all()
