"""The auto mass's split test: a GP Poisson regression of 41 points.

``python -m benchmarks.gp_mass`` samples the GP Poisson model of
:mod:`benchmarks.posterior_models` (:func:`~benchmarks.posterior_models.gp_poisson_model`)
on 41 points (x from -10 to 10 in steps of 0.5,
counts drawn once from Poisson(exp(3 + 1.2 sin(x / 3) + 0.8 cos(x / 1.7))), a jitter
of 1e-6; 43 coordinates) by AdaptiveHMC with the mass chosen at each window's end
(``dense_mass="auto"``) and with the diagonal mass, 32 chains from uniform(-2, 2),
300 + 300 steps, float64. The diagonal mass leaves the mean Hessian a condition number
past 10^4, as on a ridge, but a dense mass mixes worse here: the latent values' scale
follows the kernel's hyperparameters, and the split test
(:func:`ebmlab.samplers.adaptation.mass_spread`) keeps the mass diagonal
(docs/results/posteriors.md, "A GP of more points, and the split test"). Prints R-hat,
divergent transitions and the min bulk ESS per 1000 gradients of each.
"""

from __future__ import annotations

import numpy as np
import torch

from benchmarks.posterior_models import Posterior, gp_poisson_model
from benchmarks.posteriors import run_ebmlab
from ebmlab.samplers import AdaptiveHMC
from ebmlab.samplers.diagnostics import effective_sample_size, split_rhat

X = np.linspace(-10.0, 10.0, 41)
COUNTS = np.random.default_rng(0).poisson(np.exp(3 + 1.2 * np.sin(X / 3) + 0.8 * np.cos(X / 1.7)))
COUNTS = COUNTS.astype(float)
JITTER = 1e-6 * np.eye(len(X))


gp_poisson_41 = gp_poisson_model(X, COUNTS, JITTER)


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
