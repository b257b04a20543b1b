import math

import pytest
import torch

from ebmlab.energies import DiagonalGaussian
from ebmlab.partition import quadrature_log_partition


def test_one_dimensional_gaussian():
    g = DiagonalGaussian(torch.zeros(1), torch.full((1,), 0.7))
    est = quadrature_log_partition(g, [(-8.0, 8.0)], n_points=256)
    assert est.log_z == pytest.approx(math.log(math.sqrt(2 * math.pi) * 0.7), abs=1e-6)
    assert est.method == "quadrature" and est.cost["energy_evals"] > 0


def test_error_estimate_is_honest_on_a_coarse_grid():
    g = DiagonalGaussian(torch.zeros(2), torch.tensor([0.3, 0.3]))
    est = quadrature_log_partition(g, [(-2.0, 2.0), (-2.0, 2.0)], n_points=8)
    truth = float(g.log_partition())
    assert est.stderr > 1e-4
    assert abs(est.log_z - truth) < 3 * est.stderr


def test_bad_bounds():
    with pytest.raises(ValueError, match="bounds must be 1 or 2 pairs"):
        quadrature_log_partition(lambda x: x.sum(1), [(0, 1)] * 3)
    with pytest.raises(ValueError, match="n_points must be an even number"):
        quadrature_log_partition(lambda x: x.sum(1), [(0, 1)], n_points=9)
