"""Where the auto mass fails: a GP Poisson regression of 41 points.

``python -m benchmarks.gp_mass`` samples the GP Poisson model of
:mod:`benchmarks.posterior_models` on 41 points (x from -10 to 10 in steps of 0.5,
counts drawn once from Poisson(exp(3 + 1.2 sin(x / 3) + 0.8 cos(x / 1.7))), a jitter
of 1e-6; 43 coordinates) by AdaptiveHMC with the mass chosen at each window's end
(``dense_mass="auto"``) and with the diagonal mass, 32 chains from uniform(-2, 2),
300 + 300 steps, float64. The diagonal mass leaves the mean Hessian a condition number
past 10^4, so the rule picks a dense mass, which mixes worse here
(docs/results/posteriors.md, "Choosing the mass"). Prints R-hat, divergent transitions
and the min bulk ESS per 1000 gradients of each.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from benchmarks.posterior_models import Posterior, _cholesky, _const, _normal
from benchmarks.posteriors import run_ebmlab
from ebmlab.samplers import AdaptiveHMC
from ebmlab.samplers.diagnostics import effective_sample_size, split_rhat

X = np.linspace(-10.0, 10.0, 41)
COUNTS = np.random.default_rng(0).poisson(np.exp(3 + 1.2 * np.sin(X / 3) + 0.8 * np.cos(X / 1.7)))
COUNTS = COUNTS.astype(float)
JITTER = 1e-6 * np.eye(len(X))


def gp_poisson_41(theta: Any, xp: Any) -> Any:
    """The log density of :func:`benchmarks.posterior_models.gp_poisson`'s model on
    these 41 points (rho ~ Gamma(25, 4), alpha ~ half-N(0, 2), both as logs)."""
    log_rho, log_alpha, eta = theta[..., 0], theta[..., 1], theta[..., 2:]
    rho, alpha = xp.exp(log_rho), xp.exp(log_alpha)
    x = _const(X, theta, xp)
    sq = (x[:, None] - x[None, :]) ** 2
    cov = alpha[..., None, None] ** 2 * xp.exp(-sq / (2 * rho[..., None, None] ** 2))
    f = xp.sum(_cholesky(cov + _const(JITTER, theta, xp), xp) * eta[..., None, :], axis=-1)
    lp = xp.sum(_const(COUNTS, theta, xp) * f - xp.exp(f) - 0.5 * eta * eta, axis=-1)
    lp = lp + 24.0 * log_rho - 4.0 * rho + log_rho
    return lp + _normal(alpha, 0.0, 2.0, xp) + log_alpha


def main() -> None:
    torch.set_default_dtype(torch.float64)
    names = ("log rho", "log alpha", *(f"eta{i}" for i in range(len(X))))
    posterior = Posterior("GP Poisson regression (41 counts)", names, gp_poisson_41)
    for mass in ("auto", False):
        out = run_ebmlab(AdaptiveHMC(dense_mass=mass), posterior, 32, 300, 300, seed=0)
        draws = torch.as_tensor(out["draws"])
        ess = float(effective_sample_size(draws).min())
        print(f"dense_mass={mass!r}: R-hat {float(split_rhat(draws).max()):.3f}, "
              f"{out['n_divergent']} divergent, "
              f"{1000 * ess / out['n_grad_evals']:.2f} ESS per 1000 gradients")  # fmt: skip


if __name__ == "__main__":
    main()
