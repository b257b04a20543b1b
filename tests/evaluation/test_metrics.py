import pytest
import torch

from ebmlab.evaluation import mmd2
from ebmlab.testing import assert_mean_close


def test_mmd_near_zero_for_same_distribution_and_positive_otherwise():
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(800, 2, generator=gen), torch.randn(800, 2, generator=gen)
    c = torch.randn(800, 2, generator=gen) + 0.5
    same, diff = mmd2(a, b), mmd2(a, c)
    assert abs(same) < 0.005
    assert diff > 10 * abs(same) and diff > 0.02


def test_bandwidth_pools_both_samples_whatever_their_order_and_size():
    """The median heuristic over more points than it uses: both samples still count in
    proportion to their sizes, so the bandwidth and MMD^2 do not depend on which sample
    comes first (taking the first 2000 pooled rows left y out whenever x had as many)."""
    from ebmlab.evaluation import median_bandwidth

    gen = torch.Generator().manual_seed(2)
    x = torch.randn(3000, 2, generator=gen, dtype=torch.float64)
    y = 4 * torch.randn(1000, 2, generator=gen, dtype=torch.float64)
    h = median_bandwidth(x, y)
    assert h == median_bandwidth(y, x)
    assert mmd2(x, y) == pytest.approx(mmd2(y, x), rel=1e-12)  # the sums' order differs
    # against the median over all 4000 points (a quarter of them wide)
    pooled = torch.cat([x, y])
    d = torch.cdist(pooled, pooled)
    assert abs(h / float(d[d > 0].median()) - 1) < 0.05
    assert h > 1.2 * median_bandwidth(x, x[:10])  # y widens it


def test_permutation_test_rejects_different_distributions_only():
    from ebmlab.evaluation import mmd_permutation_test

    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(300, 2, generator=gen), torch.randn(300, 2, generator=gen)
    _, p_same = mmd_permutation_test(a, b, generator=gen)
    _, p_diff = mmd_permutation_test(a, b * 1.5, generator=gen)
    assert p_same > 0.05 and p_diff < 0.01


def _gaussian_kernel_mean(mean: torch.Tensor, cov: torch.Tensor, h: float) -> float:
    """E exp(-|x - x'|^2 / (2 h^2)) for x - x' ~ N(mean, cov), in closed form."""
    eye = torch.eye(len(mean), dtype=torch.float64)
    scale = torch.linalg.det(eye + cov / h**2) ** -0.5
    return float(scale * torch.exp(-0.5 * mean @ torch.linalg.solve(cov + h**2 * eye, mean)))


def test_mmd_and_its_standard_error_match_the_closed_form_for_gaussians():
    """x ~ N(0, I), y ~ N(0.3, 1.3^2 I) in 2-D: the population MMD^2 in closed form;
    over 200 replications the estimates centre there and spread as the first-order
    standard error says."""
    h, d = 1.0, 2
    eye, shift = torch.eye(d, dtype=torch.float64), torch.full((d,), 0.3, dtype=torch.float64)
    zero = torch.zeros(d, dtype=torch.float64)
    exact = (
        _gaussian_kernel_mean(zero, 2 * eye, h)
        + _gaussian_kernel_mean(zero, 2 * 1.69 * eye, h)
        - 2 * _gaussian_kernel_mean(shift, 2.69 * eye, h)
    )
    gen = torch.Generator().manual_seed(2)
    runs = torch.tensor(
        [
            mmd2(
                torch.randn(300, d, generator=gen),
                1.3 * torch.randn(200, d, generator=gen) + 0.3,
                bandwidth=h,
                return_stderr=True,
            )
            for _ in range(200)
        ]
    )
    values, stderrs = runs[:, 0], runs[:, 1]
    assert_mean_close(values, exact, what="MMD²")
    assert float(stderrs.mean()) == pytest.approx(float(values.std()), rel=0.15)
