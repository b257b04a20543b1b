"""The posterior benchmark's exact references (benchmarks/posterior_models.py)."""

import numpy as np
from benchmarks.posterior_models import POSTERIORS
from benchmarks.posteriors import reference, run_ebmlab, scores

from ebmlab.samplers import AdaptiveHMC


def test_eight_schools_quadrature_agrees_with_sampling_in_both_parametrisations():
    """AdaptiveHMC on the non-centred model (no funnel) lands within 4 Monte Carlo errors
    of every quadrature mean and sd; its draws mapped to the centred parametrisation
    (theta_j = mu + tau eta_j) agree with the centred quadrature, which the eta
    moments would not (the negative control)."""
    by_name = {p.name: p for p in POSTERIORS}
    posterior = by_name["eight schools, non-centred"]
    out = run_ebmlab(AdaptiveHMC(), posterior, 32, 300, 300, seed=0)
    result = scores(out["draws"], reference(posterior))
    assert result["worst_z_mean"] < 4 and result["worst_z_sd"] < 4
    draws = out["draws"]
    thetas = np.concatenate(
        [draws[..., :2], draws[..., :1] + np.exp(draws[..., 1:2]) * draws[..., 2:]], -1
    )
    centred = scores(thetas, reference(by_name["eight schools, centred"]))
    assert centred["worst_z_mean"] < 4 and centred["worst_z_sd"] < 4
    wrong = scores(thetas, reference(posterior))
    assert wrong["worst_z_mean"] > 10
