"""Mean-field and TAP approximations of log Z, against exact log Z on enumerable
models: mean field is a lower bound, TAP is closer, and the errors shrink with the
couplings at the rates of their orders."""

import math

import pytest
import torch

from ebmlab.energies import BernoulliRBM, BoltzmannMachine, DeepBoltzmannMachine
from ebmlab.partition import (
    bethe_log_partition,
    exact_log_partition,
    log_partition,
    plefka_log_partition,
)


def _rbm(scale: float, seed: int = 2) -> BernoulliRBM:
    torch.manual_seed(seed)
    rbm = BernoulliRBM(10, 8).double()
    with torch.no_grad():
        rbm.W.normal_().mul_(scale)
        rbm.b.normal_(0, 2)
        rbm.c.normal_(0, 2)
    return rbm


def _bm(scale: float, seed: int) -> BoltzmannMachine:
    torch.manual_seed(seed)
    bm = BoltzmannMachine(12).double()
    with torch.no_grad():
        bm.weight.normal_().mul_(scale)
        bm.b.normal_(0, 1)
    return bm


@pytest.mark.parametrize("make", [_rbm, _bm], ids=["rbm", "bm"])
def test_tap_beats_mean_field_which_is_a_lower_bound(make):
    for seed in range(3):
        model = make(0.3, seed)
        exact = exact_log_partition(model).log_z
        mean_field = plefka_log_partition(model, 1)
        tap = plefka_log_partition(model, 2)
        assert mean_field.cost["converged"] and tap.cost["converged"]
        assert mean_field.log_z <= exact + 1e-9 and mean_field.lower == mean_field.log_z
        assert abs(tap.log_z - exact) < 0.2 * abs(mean_field.log_z - exact)


def test_errors_shrink_at_the_rates_of_their_orders():
    errors = {order: [] for order in (1, 2, 3)}
    for scale in (0.1, 0.05):
        rbm = _rbm(scale)
        exact = exact_log_partition(rbm).log_z
        for order in errors:
            errors[order].append(abs(plefka_log_partition(rbm, order).log_z - exact))
    ratios = {order: first / second for order, (first, second) in errors.items()}
    assert 3 < ratios[1] < 5  # J^2
    assert ratios[2] > 7  # J^3 or faster
    assert ratios[3] > 12  # J^4
    assert errors[3][1] < errors[2][1]


def test_third_order_needs_a_graph_without_triangles_and_dbms_use_their_bipartite_view():
    with pytest.raises(ValueError, match="order 3 needs a graph without triangles"):
        plefka_log_partition(_bm(0.1, 0), 3)
    with pytest.raises(ValueError, match="order must be one of"):
        plefka_log_partition(_rbm(0.1), 4)
    torch.manual_seed(0)
    dbm = DeepBoltzmannMachine(6, 5, 4).double()
    exact = exact_log_partition(dbm).log_z
    assert abs(log_partition(dbm, "tap").log_z - exact) < 1e-3
    bethe = bethe_log_partition(dbm.as_rbm()).log_z
    assert abs(bethe - exact) < 1e-3


def test_magnetisations_converge_in_float32_and_an_early_stop_warns():
    from ebmlab.convergence import ConvergenceWarning
    from ebmlab.partition import plefka_magnetisations
    from ebmlab.partition.variational import pairwise_potentials

    torch.manual_seed(0)
    theta_i, theta_ij, edges = pairwise_potentials(BernoulliRBM(10, 6, init_std=0.5))
    fields, couplings = (theta_i[:, 1] - theta_i[:, 0]).float(), theta_ij[:, 1, 1].float()
    m, report = plefka_magnetisations(fields, couplings, edges, 2)
    assert report["converged"] and m.dtype == torch.float32
    with pytest.warns(ConvergenceWarning, match="Plefka"):
        _, report = plefka_magnetisations(fields, couplings, edges, 2, max_iter=1)
    assert not report["converged"]


def test_saturated_magnetisations_have_a_finite_entropy_in_float32():
    """m = 0 or 1 contributes no entropy; the clamp that keeps the logarithms finite must
    be one float32 resolves (1 - 1e-12 rounds to 1 there, and 0 log 0 became NaN)."""
    from ebmlab.partition import plefka_free_energy

    none = torch.zeros(0, 2, dtype=torch.long)
    for dtype in (torch.float32, torch.float64):
        m = torch.tensor([[0.0, 1.0, 0.5]], dtype=dtype)
        value = plefka_free_energy(m, torch.zeros(3, dtype=dtype), torch.zeros(0, dtype=dtype),
                                   none, 1)  # fmt: skip
        assert torch.isfinite(value).all() and abs(float(value) - math.log(2)) < 1e-5
