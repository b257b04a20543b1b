import math

import pytest
import torch

from ebmlab.energies import Banana, DiagonalGaussian
from ebmlab.partition import quadrature_log_partition, quadrature_sample
from ebmlab.testing import assert_mean_close


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


def test_grid_samples_have_the_moments_of_a_banana():
    """Banana: E[x0] = 0, E[x0^2] = 1, E[x1] = 0, E[x1^2] = 1 + 2 b^2 (b = 0.5)."""
    banana = Banana(curvature=0.5)
    gen = torch.Generator().manual_seed(0)
    x = quadrature_sample(banana, [(-7.0, 7.0), (-8.0, 25.0)], 40_000, generator=gen)
    assert x.shape == (40_000, 2)
    assert_mean_close(x, torch.zeros(2))
    assert_mean_close(x**2, torch.tensor([1.0, 1.5]), what="second moment")


def test_grid_samples_fill_the_cells_uniformly():
    """A flat energy on [0, 1]: the samples are uniform, not stuck at cell midpoints."""
    x = quadrature_sample(lambda z: z.sum(1) * 0, [(0.0, 1.0)], 20_000, n_points=8)
    counts = torch.histc(x[:, 0], bins=32, min=0, max=1)
    assert counts.min() > 0.8 * 20_000 / 32 and counts.max() < 1.2 * 20_000 / 32
