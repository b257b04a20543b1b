"""LogZEstimate: its interval's coverage and how estimates combine."""

import math

import pytest
import torch

from ebmlab.partition.estimate import LogZEstimate, log_sum


def coverage_of_replicate_means(dof: float, k: float, trials: int = 4000, n: int = 8) -> float:
    """Fraction of ``trials`` means of n normal replicates (truth 0) whose interval
    holds the truth, the stderr being the replicates' spread / sqrt(n)."""
    draws = torch.randn(trials, n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    means, stderrs = draws.mean(1), draws.std(1) / math.sqrt(n)
    covered = 0
    for mean, stderr in zip(means.tolist(), stderrs.tolist(), strict=True):
        low, high = LogZEstimate(mean, stderr, dof=dof).interval(k)
        covered += low <= 0 <= high
    return covered / trials


@pytest.mark.parametrize("k, nominal", [(2.0, 0.9545), (3.0, 0.9973)])
def test_interval_from_eight_replicates_has_its_nominal_coverage(k, nominal):
    """Student's t half-width: 4000 sets of 8 replicates cover at the normal interval's
    rate, within 4 binomial standard errors."""
    tolerance = 4 * math.sqrt(nominal * (1 - nominal) / 4000)
    assert abs(coverage_of_replicate_means(7, k) - nominal) < tolerance


def test_k_standard_errors_from_eight_replicates_undercover():
    """Negative control: the same check rejects the plain +/- 2 stderr (P(|t_7| < 2) =
    0.914) that the interval would be without the degrees of freedom."""
    plain = coverage_of_replicate_means(math.inf, 2.0)
    assert abs(plain - 0.914) < 0.02 and plain < 0.9545 - 4 * math.sqrt(0.0434 / 4000)


def test_interval_with_known_error_and_bounds():
    estimate = LogZEstimate(1.0, 0.1, lower=0.9)
    assert estimate.interval(3.0) == (0.9, pytest.approx(1.3))
    wide = LogZEstimate(1.0, 0.1, dof=3).interval(3.0)
    assert wide[1] - 1.0 == pytest.approx(0.1 * 9.2189, rel=1e-3)  # t_3 at 99.865 %


def test_log_sum_keeps_the_fewest_degrees_of_freedom():
    parts = [LogZEstimate(0.0, 0.1, dof=7), LogZEstimate(1.0, 0.2)]
    combined = log_sum(parts, [0.0, 0.0], "sum")
    assert combined.dof == 7
    assert combined.log_z == pytest.approx(math.log(1 + math.e))
