"""Sample-quality metrics."""

from __future__ import annotations

import torch

from ebmlab import _checks


def median_bandwidth(x: torch.Tensor, y: torch.Tensor, max_points: int = 2000) -> float:
    """The median pairwise distance of the pooled sample (the usual kernel bandwidth)."""
    pooled = torch.cat([x, y])[:max_points].flatten(1).double()
    d = torch.cdist(pooled, pooled)
    return float(d[d > 0].median())


def mmd2(x: torch.Tensor, y: torch.Tensor, bandwidth: float | None = None) -> float:
    """Unbiased squared maximum mean discrepancy with a Gaussian kernel.

    MMD^2 = E k(x, x') + E k(y, y') - 2 E k(x, y) (Gretton et al. 2012), with
    k(a, b) = exp(-|a - b|^2 / (2 bandwidth^2)) and the median heuristic for the
    bandwidth by default. Near zero (and possibly slightly negative) when x and y
    come from the same distribution.
    """
    _checks.tensor("x", x, min_ndim=2)
    _checks.tensor("y", y, min_ndim=2)
    if x.shape[0] < 2 or y.shape[0] < 2:
        raise ValueError("mmd2 needs at least two points in each sample")
    xf, yf = x.flatten(1).double(), y.flatten(1).double()
    if xf.shape[1] != yf.shape[1]:
        raise ValueError(
            f"x and y must have the same event size, got {xf.shape[1]} and {yf.shape[1]}"
        )
    h = bandwidth if bandwidth is not None else median_bandwidth(xf, yf)
    _checks.positive("bandwidth", h)

    def k(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.exp(-torch.cdist(a, b).pow(2) / (2 * h * h))

    n, m = xf.shape[0], yf.shape[0]
    kxx, kyy, kxy = k(xf, xf), k(yf, yf), k(xf, yf)
    term_x = (kxx.sum() - kxx.diagonal().sum()) / (n * (n - 1))
    term_y = (kyy.sum() - kyy.diagonal().sum()) / (m * (m - 1))
    return float(term_x + term_y - 2 * kxy.mean())


def mmd_permutation_test(
    x: torch.Tensor,
    y: torch.Tensor,
    n_permutations: int = 200,
    generator: torch.Generator | None = None,
) -> tuple[float, float]:
    """Two-sample test of x ~ y by permutation of the pooled sample (Gretton et al. 2012).

    Returns ``(mmd2, p_value)``; the bandwidth is fixed from the pooled sample so every
    permutation uses the same kernel.
    """
    _checks.positive_int("n_permutations", n_permutations)
    h = median_bandwidth(x, y)
    observed = mmd2(x, y, bandwidth=h)
    pooled = torch.cat([x, y])
    n = x.shape[0]
    exceed = 0
    for _ in range(n_permutations):
        perm = torch.randperm(pooled.shape[0], generator=generator)
        exceed += mmd2(pooled[perm[:n]], pooled[perm[n:]], bandwidth=h) >= observed
    return observed, (exceed + 1) / (n_permutations + 1)
