"""Statistical assertions for tests of samplers and estimators.

A Monte Carlo mean is within k standard errors of the truth with high
probability; the standard error of a chain's mean is sd / sqrt(ESS), where the
effective sample size ESS accounts for autocorrelation (ESS = n for independent
draws).
"""

from __future__ import annotations

import torch


def assert_mean_close(
    samples: torch.Tensor,
    expected: torch.Tensor | float,
    *,
    ess: torch.Tensor | float | None = None,
    k: float = 4.0,
    what: str = "mean",
) -> None:
    """Assert each coordinate's sample mean is within ``k`` Monte Carlo standard errors.

    ``samples`` is (N, *event); ``ess`` is per coordinate (event-shaped) or a scalar,
    defaulting to N (independent draws).

    Args:
        expected: the exact means, a float or (D,).
        what: a few words naming the operation, for the error message.
    """
    x = samples.detach().cpu().double()
    n = x.shape[0]
    mean = x.mean(0)
    sd = x.std(0)
    ess_t = torch.as_tensor(n if ess is None else ess, dtype=torch.float64)
    se = sd / ess_t.clamp_min(1.0).sqrt()
    target = torch.as_tensor(expected, dtype=torch.float64).expand_as(mean)
    z = ((mean - target).abs() / se.clamp_min(1e-300)).max()
    if not bool(z <= k):
        worst = int(((mean - target).abs() / se.clamp_min(1e-300)).argmax())
        raise AssertionError(
            f"{what} off by {float(z):.2f} standard errors (> {k}) at coordinate {worst}: "
            f"estimate {float(mean.flatten()[worst]):.5g}, "
            f"expected {float(target.flatten()[worst]):.5g}, "
            f"standard error {float(se.flatten()[worst]):.3g}"
        )
