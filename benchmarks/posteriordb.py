"""Samplers against Stan's reference posteriors, on the data as posteriordb publishes them.

``python -m benchmarks.posteriordb --posteriordb DIR`` reads eleven posteriors from a
checkout of posteriordb (Magnusson et al. 2025; ``git clone
https://github.com/stan-dev/posteriordb DIR``), each with its published data and its
reference draws (10 chains of 1,000 draws thinned from long Stan runs):

- ``kidiq-kidscore_interaction``: the children's test scores of Gelman & Hill (2007,
  ch. 3) on their mothers' high school, IQ and both (434 rows, flat priors on the
  coefficients, sigma half-Cauchy(0, 2.5)), the real data behind the synthetic
  regression of :mod:`benchmarks.posterior_models`;
- ``arK-arK``: an AR(5) model of 200 points, coefficients N(0, 10), sigma half-Cauchy;
- ``kilpisjarvi_mod-kilpisjarvi``: a temperature trend against uncentred years, whose
  intercept and slope correlate at -0.99999 (Bales et al. 2019);
- ``diamonds-diamonds``: a regression of 5,000 log prices on 24 strongly correlated
  terms, a ridge in 26 dimensions (Stan's reference took 10,000 warm-up iterations);
- ``garch-garch11`` and ``low_dim_gauss_mix-low_dim_gauss_mix``: a GARCH(1, 1) model
  and a two-component mixture, whose constrained parameters run on Stan's
  unconstrained scale with its Jacobians;
- ``arma-arma11``: an ARMA(1, 1) model whose errors grow like |theta|^t from half of
  Stan's starts;
- ``hmm_example-hmm_example``: a two-state hidden Markov model, its states summed out
  by the forward algorithm;
- ``hudson_lynx_hare-lotka_volterra``: the Lotka-Volterra equations fitted to 21 years
  of hare and lynx pelts, integrated by RK4 inside the log density; from Stan's starts
  some chains land in minor modes 40 and 72 nats up;
- ``gp_pois_regr-gp_pois_regr`` and ``eight_schools-eight_schools_noncentered``: the
  models of :mod:`benchmarks.posterior_models`, whose data are the published ones.

Our own transcriptions of the Stan programs are checked twice against what Stan
computed: the exact moments of the four conditionally Gaussian models
(:func:`gaussian_scale_moments`) and of eight schools (quadrature) against the
reference draws, and ebmlab's ``NUTS`` and ``AdaptiveHMC`` from Stan's starts
(uniform(-2, 2) on the unconstrained scale; 32 chains, 300 warm-up and 300 kept steps,
float64) against them too, on Stan's own parameters (sigma, not log sigma; the GP's f
and the schools' theta, not the standard normals behind them). Each row gives the worst
|z| of the means and sds with the Monte Carlo errors of both sides counted
(:func:`benchmarks.posteriors.scores`). ``--diagonal`` adds both samplers with
``dense_mass=False``, Stan's default mass. Writes ``results/posteriordb.json`` (the
rows it runs replace those of the same posterior and sampler) and prints a Markdown
table.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.posterior_models import (
    GP_COUNTS,
    GP_X,
    SCHOOLS_SIGMA,
    SCHOOLS_Y,
    Posterior,
    _cholesky,
    _const,
    _normal,
    eight_schools_noncentred,
    gp_poisson,
    schools_moments,
)
from benchmarks.posteriors import RESULTS, merged, run_ebmlab, scores
from ebmlab.samplers import NUTS, AdaptiveHMC
from ebmlab.samplers.diagnostics import effective_sample_size


@dataclass(frozen=True)
class Published:
    """A posteriordb posterior as ebmlab samples it: ``posterior`` on the unconstrained
    scale, ``quantities`` mapping its draws (..., D) to Stan's named parameters (...,
    Q) in the order of ``names``, and ``exact`` the exact means and sds of some of them
    (name -> (mean, sd)) where a closed form or quadrature gives them."""

    posterior: Posterior
    names: tuple[str, ...]
    quantities: Callable[[np.ndarray], np.ndarray]
    exact: Callable[[], dict[str, tuple[float, float]]] | None = None


def _database(root: Path) -> Path:
    """The ``posterior_database`` folder of a posteriordb checkout (or that folder)."""
    inner = root / "posterior_database"
    return inner if inner.is_dir() else root


def _zipped_json(path: Path) -> Any:
    """The one JSON file inside ``path``, a ``.json.zip`` as posteriordb ships them."""
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: --posteriordb must name a checkout of "
            "https://github.com/stan-dev/posteriordb (or its posterior_database folder)"
        )
    with zipfile.ZipFile(path) as archive:
        inside = [n for n in archive.namelist() if n.endswith(".json")]
        if len(inside) != 1:
            raise ValueError(f"{path} should hold one .json file, holds {inside}")
        return json.load(io.TextIOWrapper(archive.open(inside[0]), encoding="utf-8"))


def read(root: Path, name: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The data and the reference draws of posterior ``name``, as posteriordb lays them
    out: ``posteriors/<name>.json`` names its data and its reference posterior, whose
    files are ``data/data/<data>.json.zip`` and
    ``reference_posteriors/draws/draws/<reference>.json.zip`` (a list of chains, each
    a mapping from parameter to draws). Draws come back as (draws, chains) arrays."""
    base = _database(Path(root))
    info_path = base / "posteriors" / f"{name}.json"
    if not info_path.is_file():
        raise FileNotFoundError(f"{info_path} is missing: no posterior {name!r} there")
    info = json.loads(info_path.read_text())
    data = _zipped_json(base / "data" / "data" / f"{info['data_name']}.json.zip")
    reference = info.get("reference_posterior_name")
    if not reference:
        raise ValueError(f"posterior {name!r} has no reference posterior in posteriordb")
    drawn = base / "reference_posteriors" / "draws" / "draws"
    chains = _zipped_json(drawn / f"{reference}.json.zip")
    draws = {key: np.array([chain[key] for chain in chains], dtype=float).T for key in chains[0]}
    return data, draws


Prior = tuple[np.ndarray, np.ndarray]  # the coefficients' prior means and sds


def gaussian_scale_moments(
    X: np.ndarray,
    y: np.ndarray,
    prior: Prior | None,
    log_scale_prior: Callable[[np.ndarray], np.ndarray],
    points: int = 8001,
) -> tuple[np.ndarray, np.ndarray, float, float]:
    """Exact posterior means and sds of beta and sigma for y ~ N(X beta, sigma^2 I),
    beta_j ~ N(mu_j, s_j^2) independently (``prior`` = (mu, s); ``None``: flat) and
    sigma with log prior density ``log_scale_prior`` (up to a constant).

    Given sigma, beta is Gaussian with precision A = X'X / sigma^2 + diag(1 / s^2) and
    mean m = A^{-1} (X'y / sigma^2 + mu / s^2), and sigma's marginal is p(sigma)
    sigma^{-n} |A|^{-1/2} exp(-(y'y / sigma^2 - m'A m) / 2) up to a constant (Bishop
    2006, eq. 3.86 with the scale left free), integrated on a grid over log sigma of
    +-2 about the maximum-likelihood scale (over 12 posterior sds from 20 rows on).
    Means and variances of beta follow by the laws of total expectation and variance.
    Returns (mean beta, sd beta, mean sigma, sd sigma)."""
    n, d = X.shape
    prior_precision, shift = np.zeros((d, d)), np.zeros(d)
    if prior is not None:
        prior_mean, prior_sd = np.broadcast_arrays(*prior, np.zeros(d))[:2]
        prior_precision, shift = np.diag(1 / prior_sd**2), prior_mean / prior_sd**2
    fit = np.linalg.lstsq(X, y, rcond=None)[0]
    log_s = np.log(np.sqrt(((y - X @ fit) ** 2).mean())) + np.linspace(-2.0, 2.0, points)
    s2 = np.exp(2 * log_s)[:, None, None]
    precision = X.T @ X / s2 + prior_precision
    cov = np.linalg.inv(precision)
    mean = (cov @ (X.T @ y / s2[..., 0] + shift)[..., None])[..., 0]
    quad = np.einsum("gi,gi->g", mean, (precision @ mean[..., None])[..., 0])
    log_p = log_scale_prior(np.exp(log_s)) + log_s - n * log_s  # the grid is in log sigma
    log_p = log_p - 0.5 * np.linalg.slogdet(precision)[1] - 0.5 * (y @ y / s2[:, 0, 0] - quad)
    w = np.exp(log_p - log_p.max())
    w /= w.sum()
    beta = w @ mean
    second = np.einsum("g,gij->ij", w, cov + mean[:, :, None] * mean[:, None, :])
    sigma, sigma2 = w @ np.exp(log_s), w @ np.exp(2 * log_s)
    return beta, np.sqrt(np.diag(second) - beta**2), float(sigma), math.sqrt(sigma2 - sigma**2)


def _scale_last(draws: np.ndarray) -> np.ndarray:
    """Draws whose last coordinate is a log scale, with the scale itself (Stan's sigma)."""
    return np.concatenate([draws[..., :-1], np.exp(draws[..., -1:])], -1)


def _regression(
    name: str,
    X: np.ndarray,
    y: np.ndarray,
    coefficients: tuple[str, ...],
    prior: Prior | None,
    sigma_scale: float | None,
) -> Published:
    """y ~ N(X beta, sigma); beta flat or N(prior); sigma half-Cauchy(0, sigma_scale)
    (``None``: flat), sampled as log sigma with its Jacobian."""
    prior_mean, prior_sd = (None, None) if prior is None else prior

    def log_density(theta: Any, xp: Any) -> Any:
        beta, log_sigma = theta[..., :-1], theta[..., -1]
        design, target = _const(X, theta, xp), _const(y, theta, xp)
        mean = xp.sum(design * beta[..., None, :], axis=-1)
        sigma = xp.exp(log_sigma)
        lp = xp.sum(_normal(target, mean, sigma[..., None], xp), axis=-1) + log_sigma
        if prior is not None:
            m, s = _const(prior_mean, theta, xp), _const(prior_sd, theta, xp)
            lp = lp + xp.sum(_normal(beta, m, s, xp), axis=-1)
        return lp if sigma_scale is None else lp - xp.log1p((sigma / sigma_scale) ** 2)

    def exact() -> dict[str, tuple[float, float]]:
        def log_scale_prior(s: np.ndarray) -> np.ndarray:
            return 0 * s if sigma_scale is None else -np.log1p((s / sigma_scale) ** 2)

        beta, beta_sd, sigma, sigma_sd = gaussian_scale_moments(X, y, prior, log_scale_prior)
        moments = dict(zip(coefficients, zip(beta, beta_sd, strict=True), strict=True))
        return {**moments, "sigma": (sigma, sigma_sd)}

    names = (*coefficients, "sigma")
    posterior = Posterior(name, (*coefficients, "log sigma"), log_density)
    return Published(posterior, names, _scale_last, exact)


def kidiq_interaction(data: dict[str, Any]) -> Published:
    """posteriordb's ``kidscore_interaction``: kid_score ~ N(b1 + b2 mom_hs + b3 mom_iq
    + b4 mom_hs mom_iq, sigma), flat priors on b, sigma half-Cauchy(0, 2.5)."""
    hs, iq = np.asarray(data["mom_hs"], float), np.asarray(data["mom_iq"], float)
    X = np.column_stack([np.ones_like(hs), hs, iq, hs * iq])
    names = tuple(f"beta[{k}]" for k in range(1, 5))
    return _regression("kidiq-kidscore_interaction", X, np.asarray(data["kid_score"], float),
                       names, prior=None, sigma_scale=2.5)  # fmt: skip


def autoregression(data: dict[str, Any]) -> Published:
    """posteriordb's ``arK``: y_t ~ N(alpha + sum_k beta_k y_{t-k}, sigma) for t > K;
    alpha, beta ~ N(0, 10), sigma half-Cauchy(0, 2.5)."""
    y, k = np.asarray(data["y"], float), int(data["K"])
    lags = [y[k - j : len(y) - j] for j in range(1, k + 1)]
    X = np.column_stack([np.ones(len(y) - k), *lags])
    names = ("alpha", *(f"beta[{j}]" for j in range(1, k + 1)))
    prior = (np.zeros(k + 1), np.full(k + 1, 10.0))
    return _regression("arK-arK", X, y[k:], names, prior=prior, sigma_scale=2.5)


def kilpisjarvi(data: dict[str, Any]) -> Published:
    """posteriordb's ``kilpisjarvi``: summer temperatures at Kilpisjarvi against the
    year, uncentred (x from 3952 to 4013), y ~ N(alpha + beta x, sigma) with the data's
    own normal priors on alpha and beta and a flat sigma: alpha and beta correlate
    almost perfectly (Bales et al. 2019), which a diagonal mass cannot undo."""
    x = np.asarray(data["x"], float)
    X = np.column_stack([np.ones_like(x), x])
    prior = (np.array([data["pmualpha"], data["pmubeta"]], float),
             np.array([data["psalpha"], data["psbeta"]], float))  # fmt: skip
    return _regression("kilpisjarvi_mod-kilpisjarvi", X, np.asarray(data["y"], float),
                       ("alpha", "beta"), prior=prior, sigma_scale=None)  # fmt: skip


def diamonds(data: dict[str, Any]) -> Published:
    """posteriordb's ``diamonds`` (a brms model): the log price of 5,000 diamonds on 24
    centred terms (polynomials of carat, cut, colour and clarity), b ~ N(0, 1), the
    Intercept ~ Student-t(3, 8, 10), sigma ~ half-Student-t(3, 0, 10). The terms are so
    correlated that the posterior is a narrow ridge: Stan's reference took 10,000
    warm-up iterations with trees up to depth 20. The likelihood is evaluated from the
    design's sufficient statistics, the same sum of squares as the Stan program's
    ``normal_id_glm`` (tested). The exact moments treat the Intercept's prior as flat:
    over ten posterior sds (about 0.02) its log density moves by less than 1e-4, which
    shifts the Intercept's mean by about 1e-5 of its sd."""
    design, y = np.asarray(data["X"], float), np.asarray(data["Y"], float)
    centred = design[:, 1:] - design[:, 1:].mean(0)
    n, k = centred.shape
    gram, cross = centred.T @ centred, centred.T @ (y - y.mean())
    y_mean, spread = float(y.mean()), float(((y - y.mean()) ** 2).sum())

    def log_density(theta: Any, xp: Any) -> Any:
        b, intercept, log_sigma = theta[..., :k], theta[..., k], theta[..., k + 1]
        g, h = _const(gram, theta, xp), _const(cross, theta, xp)
        squares = (spread + n * (y_mean - intercept) ** 2 - 2 * xp.sum(b * h, axis=-1)
                   + xp.sum(b * (b @ g), axis=-1))  # fmt: skip
        sigma = xp.exp(log_sigma)
        lp = -n * log_sigma - 0.5 * squares / sigma**2 - 0.5 * xp.sum(b * b, axis=-1)
        lp = lp - 2 * xp.log1p(((intercept - 8) / 10) ** 2 / 3)  # Student-t, 3 dof
        return lp - 2 * xp.log1p((sigma / 10) ** 2 / 3) + log_sigma

    names = (*(f"b[{j}]" for j in range(1, k + 1)), "Intercept")

    def exact() -> dict[str, tuple[float, float]]:
        X = np.column_stack([centred, np.ones(n)])
        prior = (np.zeros(k + 1), np.append(np.ones(k), np.inf))
        half_t = lambda s: -2 * np.log1p((s / 10) ** 2 / 3)  # noqa: E731
        beta, beta_sd, sigma, sigma_sd = gaussian_scale_moments(X, y, prior, half_t)
        return {**dict(zip(names, zip(beta, beta_sd, strict=True), strict=True)),
                "sigma": (sigma, sigma_sd)}  # fmt: skip

    posterior = Posterior("diamonds-diamonds", (*names, "log sigma"), log_density)
    return Published(posterior, (*names, "sigma"), _scale_last, exact)


def _log_inv_logit(u: Any, xp: Any) -> Any:
    """log(1 / (1 + e^-u)) without overflow: -softplus(-u)."""
    return -xp.logaddexp(xp.zeros_like(u), -u)


def _inv_logit(u: np.ndarray) -> np.ndarray:
    return np.exp(_log_inv_logit(u, np))


def garch(data: dict[str, Any]) -> Published:
    """posteriordb's ``garch11``: y_t ~ N(mu, sigma_t) with sigma_t^2 = alpha0 + alpha1
    (y_{t-1} - mu)^2 + beta1 sigma_{t-1}^2 from sigma_1 given (Bollerslev 1986), flat
    priors, alpha0 > 0, 0 < alpha1 < 1 and 0 < beta1 < 1 - alpha1: sampled on Stan's
    unconstrained scale (log alpha0, logit alpha1, logit of beta1 / (1 - alpha1)) with
    its Jacobians. The recursion unrolls to sigma_t^2 = sum_{j<t} beta1^{t-1-j} (alpha0
    + alpha1 (y_j - mu)^2) + beta1^{t-1} sigma_1^2, one (T - 1) x (T - 1) product of
    powers of beta1 per chain instead of T - 1 sequential steps (tested against the
    recursion)."""
    y, sigma1 = np.asarray(data["y"], float), float(data["sigma1"])
    lags = np.arange(len(y) - 1)
    gaps = lags[:, None] - lags[None, :]  # t - 1 - j for t = 2..T, j = 1..T-1
    below = (gaps >= 0).astype(float)
    gaps = np.maximum(gaps, 0).astype(float)
    names = ("mu", "log alpha0", "logit alpha1", "logit beta1 share")

    def log_density(theta: Any, xp: Any) -> Any:
        mu, u0, u1, u2 = (theta[..., i] for i in range(4))
        log_a1, log_1m_a1 = _log_inv_logit(u1, xp), _log_inv_logit(-u1, xp)
        log_share, log_1m_share = _log_inv_logit(u2, xp), _log_inv_logit(-u2, xp)
        alpha0, alpha1 = xp.exp(u0), xp.exp(log_a1)
        log_beta1 = log_1m_a1 + log_share
        data_y = _const(y, theta, xp)
        log_b = log_beta1[..., None]
        powers = _const(below, theta, xp) * xp.exp(_const(gaps, theta, xp) * log_b[..., None])
        drive = alpha0[..., None] + alpha1[..., None] * (data_y[:-1] - mu[..., None]) ** 2
        start = xp.exp((_const(lags, theta, xp) + 1.0) * log_b) * sigma1**2
        var = xp.sum(powers * drive[..., None, :], axis=-1) + start
        lp = _normal(data_y[0], mu, sigma1, xp) + xp.sum(
            _normal(data_y[1:], mu[..., None], xp.sqrt(var), xp), axis=-1
        )
        # Jacobians: alpha0 = e^u0; alpha1 = logistic(u1); beta1 = (1 - alpha1) logistic(u2)
        return lp + u0 + log_a1 + log_1m_a1 + log_1m_a1 + log_share + log_1m_share

    def quantities(draws: np.ndarray) -> np.ndarray:
        alpha1 = _inv_logit(draws[..., 2])
        beta1 = (1 - alpha1) * _inv_logit(draws[..., 3])
        return np.stack([draws[..., 0], np.exp(draws[..., 1]), alpha1, beta1], -1)

    posterior = Posterior("garch-garch11", names, log_density)
    return Published(posterior, ("mu", "alpha0", "alpha1", "beta1"), quantities)


def arma(data: dict[str, Any]) -> Published:
    """posteriordb's ``arma11``: y_t = mu + phi y_{t-1} + theta err_{t-1} + err_t, err_t ~
    N(0, sigma) (err_0 = 0, y_0 = mu), mu ~ N(0, 10), phi, theta ~ N(0, 2), sigma ~
    half-Cauchy(0, 2.5). Nothing keeps |theta| < 1: from Stan's starts half the chains
    begin where the errors grow like |theta|^t over 200 steps, energies near 1e100. The
    errors' recursion runs step by step, as in the Stan program."""
    y = np.asarray(data["y"], float)
    names = ("mu", "phi", "theta", "log sigma")

    def log_density(params: Any, xp: Any) -> Any:
        mu, phi, theta, log_sigma = (params[..., i] for i in range(4))
        data_y = _const(y, params, xp)
        err = data_y[0] - mu - phi * mu
        squares = err * err
        for t in range(1, len(y)):
            err = data_y[t] - mu - phi * data_y[t - 1] - theta * err
            squares = squares + err * err
        sigma = xp.exp(log_sigma)
        lp = -len(y) * log_sigma - 0.5 * squares / sigma**2
        lp = lp + _normal(mu, 0.0, 10.0, xp) + _normal(phi, 0.0, 2.0, xp)
        lp = lp + _normal(theta, 0.0, 2.0, xp) - xp.log1p((sigma / 2.5) ** 2)
        return lp + log_sigma  # log sigma's Jacobian

    posterior = Posterior("arma-arma11", names, log_density)
    return Published(posterior, ("mu", "phi", "theta", "sigma"), _scale_last)


def hidden_markov(data: dict[str, Any]) -> Published:
    """posteriordb's ``hmm_example``: 100 observations y_t ~ N(mu_{z_t}, 1) of a two-state
    Markov chain z whose rows of transition probabilities theta1 and theta2 are
    simplexes (uniform priors), mu positive and ordered with mu_1 ~ N(3, 1) and mu_2 ~
    N(10, 1), z summed out by the forward algorithm (Rabiner 1989) as in the Stan
    program. Sampled on Stan's unconstrained scale: each simplex's first entry as a
    logit (the stick-breaking transform of two entries), mu_1 = e^u, mu_2 = mu_1 +
    e^v, with their Jacobians."""
    y = np.asarray(data["y"], float)
    names = ("logit theta1[1]", "logit theta2[1]", "log mu[1]", "log gap")

    def log_density(params: Any, xp: Any) -> Any:
        u1, u2, log_mu1, log_gap = (params[..., i] for i in range(4))
        stay1, leave1 = _log_inv_logit(u1, xp), _log_inv_logit(-u1, xp)  # log theta1
        leave2, stay2 = _log_inv_logit(u2, xp), _log_inv_logit(-u2, xp)  # log theta2
        mu1 = xp.exp(log_mu1)
        mu2 = mu1 + xp.exp(log_gap)
        data_y = _const(y, params, xp)
        alpha1, alpha2 = _normal(data_y[0], mu1, 1.0, xp), _normal(data_y[0], mu2, 1.0, xp)
        for t in range(1, len(y)):
            into1 = xp.logaddexp(alpha1 + stay1, alpha2 + leave2)
            into2 = xp.logaddexp(alpha1 + leave1, alpha2 + stay2)
            alpha1 = into1 + _normal(data_y[t], mu1, 1.0, xp)
            alpha2 = into2 + _normal(data_y[t], mu2, 1.0, xp)
        lp = xp.logaddexp(alpha1, alpha2)
        lp = lp + _normal(mu1, 3.0, 1.0, xp) + _normal(mu2, 10.0, 1.0, xp)
        return lp + stay1 + leave1 + leave2 + stay2 + log_mu1 + log_gap  # the Jacobians

    def quantities(draws: np.ndarray) -> np.ndarray:
        first, second = _inv_logit(draws[..., 0]), _inv_logit(draws[..., 1])
        mu1 = np.exp(draws[..., 2])
        mu2 = mu1 + np.exp(draws[..., 3])
        return np.stack([first, 1 - first, second, 1 - second, mu1, mu2], -1)

    posterior = Posterior("hmm_example-hmm_example", names, log_density)
    out = ("theta1[1]", "theta1[2]", "theta2[1]", "theta2[2]", "mu[1]", "mu[2]")
    return Published(posterior, out, quantities)


def gaussian_mixture(data: dict[str, Any]) -> Published:
    """posteriordb's ``low_dim_gauss_mix``: 1,000 points from theta N(mu_1, sigma_1) +
    (1 - theta) N(mu_2, sigma_2), mu ordered, mu ~ N(0, 2), sigma ~ half-N(0, 2), theta ~
    Beta(5, 5); sampled as (mu_1, log(mu_2 - mu_1), log sigma, logit theta) with Stan's
    Jacobians."""
    y = np.asarray(data["y"], float)
    names = ("mu1", "log gap", "log sigma1", "log sigma2", "logit theta")

    def log_density(theta: Any, xp: Any) -> Any:
        mu1, gap, s1, s2, u = (theta[..., i] for i in range(5))
        mu2 = mu1 + xp.exp(gap)
        log_t, log_1m_t = _log_inv_logit(u, xp), _log_inv_logit(-u, xp)
        data_y = _const(y, theta, xp)
        first = log_t[..., None] + _normal(data_y, mu1[..., None], xp.exp(s1)[..., None], xp)
        second = log_1m_t[..., None] + _normal(data_y, mu2[..., None], xp.exp(s2)[..., None], xp)
        lp = xp.sum(xp.logaddexp(first, second), axis=-1)
        lp = lp + _normal(mu1, 0.0, 2.0, xp) + _normal(mu2, 0.0, 2.0, xp)
        lp = lp + _normal(xp.exp(s1), 0.0, 2.0, xp) + _normal(xp.exp(s2), 0.0, 2.0, xp)
        lp = lp + 4 * log_t + 4 * log_1m_t  # Beta(5, 5)
        return lp + gap + s1 + s2 + log_t + log_1m_t  # the Jacobians

    def quantities(draws: np.ndarray) -> np.ndarray:
        mu1, mu2 = draws[..., 0], draws[..., 0] + np.exp(draws[..., 1])
        return np.stack([mu1, mu2, np.exp(draws[..., 2]), np.exp(draws[..., 3]),
                         _inv_logit(draws[..., 4])], -1)  # fmt: skip

    posterior = Posterior("low_dim_gauss_mix-low_dim_gauss_mix", names, log_density)
    out = ("mu[1]", "mu[2]", "sigma[1]", "sigma[2]", "theta")
    return Published(posterior, out, quantities)


def _lotka_volterra_rk4(
    theta: Any, start: tuple[Any, Any], times: int, substeps: int
) -> tuple[list[Any], list[Any]]:
    """Prey and predator populations (u, v) at t = 1 ... ``times`` under du/dt = (alpha -
    beta v) u, dv/dt = (-gamma + delta u) v from ``start`` at t = 0, for each row of
    ``theta`` (..., 4): the classical Runge-Kutta method (RK4) with ``substeps`` steps per
    unit of time. Returns the lists of u and of v at those times, each entry (...)."""
    alpha, beta, gamma, delta = (theta[..., i] for i in range(4))
    h = 1.0 / substeps

    def rates(u: Any, v: Any) -> tuple[Any, Any]:
        return (alpha - beta * v) * u, (delta * u - gamma) * v

    u, v = start
    us, vs = [], []
    for _ in range(times):
        for _ in range(substeps):
            k1 = rates(u, v)
            k2 = rates(u + 0.5 * h * k1[0], v + 0.5 * h * k1[1])
            k3 = rates(u + 0.5 * h * k2[0], v + 0.5 * h * k2[1])
            k4 = rates(u + h * k3[0], v + h * k3[1])
            u = u + h / 6 * (k1[0] + 2 * k2[0] + 2 * k3[0] + k4[0])
            v = v + h / 6 * (k1[1] + 2 * k2[1] + 2 * k3[1] + k4[1])
        us.append(u)
        vs.append(v)
    return us, vs


def lotka_volterra(data: dict[str, Any], substeps: int = 4) -> Published:
    """posteriordb's ``lotka_volterra`` (Carpenter 2018's case study): the Hudson's Bay
    Company's hare and lynx pelts of 1900-1920, y ~ LogNormal(log z, sigma) where z
    solves the Lotka-Volterra equations from z_init with theta = (alpha, beta, gamma,
    delta), theta_{1,3} ~ N(1, 0.5), theta_{2,4} ~ N(0.05, 0.05), z_init ~ LogNormal(log
    10, 1), sigma ~ LogNormal(-1, 1), all positive: sampled as logs with their
    Jacobians. Stan integrates by RK45 to a relative tolerance of 1e-5; here RK4 with
    ``substeps`` steps per year, whose log populations over the posterior lie within
    1e-4 of the exact solution (tested), under a hundredth of their posterior sds. From
    a fifth of Stan's starts (rates up to e^2) the populations overflow and the energy
    is not finite; those chains begin at the others' starts, where Stan would draw new
    ones."""
    ts = np.asarray(data["ts"], float)
    if not np.array_equal(ts, np.arange(1, len(ts) + 1)):
        raise ValueError(f"lotka_volterra expects yearly times 1, 2, ..., got {ts.tolist()}")
    first, y = np.log(np.asarray(data["y_init"], float)), np.log(np.asarray(data["y"], float))
    names = (*(f"log theta[{i}]" for i in range(1, 5)), "log z_init[1]", "log z_init[2]",
             "log sigma[1]", "log sigma[2]")  # fmt: skip

    def log_density(params: Any, xp: Any) -> Any:
        theta, z_init = xp.exp(params[..., :4]), xp.exp(params[..., 4:6])
        u, v = _lotka_volterra_rk4(theta, (z_init[..., 0], z_init[..., 1]), len(ts), substeps)
        log_y = _const(y, params, xp)
        lp = _normal(theta[..., 0], 1.0, 0.5, xp) + _normal(theta[..., 2], 1.0, 0.5, xp)
        lp = lp + _normal(theta[..., 1], 0.05, 0.05, xp) + _normal(theta[..., 3], 0.05, 0.05, xp)
        for k, z in enumerate((u, v)):
            log_z, log_sigma = xp.log(xp.stack(z, -1)), params[..., 6 + k]
            scale = xp.exp(log_sigma)
            # log y ~ N(log z, sigma), up to the data's own -log y
            lp = lp + xp.sum(_normal(log_y[:, k], log_z, scale[..., None], xp), axis=-1)
            lp = lp + _normal(first[k], params[..., 4 + k], scale, xp)
            # the priors: a LogNormal density carries -log of its variate
            lp = lp + _normal(log_sigma, -1.0, 1.0, xp) - log_sigma
            lp = lp + _normal(params[..., 4 + k], math.log(10.0), 1.0, xp) - params[..., 4 + k]
        return lp + xp.sum(params, axis=-1)  # the Jacobians of the eight logs

    posterior = Posterior("hudson_lynx_hare-lotka_volterra", names, log_density)
    out = (*(f"theta[{i}]" for i in range(1, 5)), "z_init[1]", "z_init[2]", "sigma[1]",
           "sigma[2]")  # fmt: skip
    return Published(posterior, out, np.exp)


def _check_same(name: str, published: Any, ours: np.ndarray) -> None:
    if not np.array_equal(np.asarray(published, float), ours):
        raise ValueError(f"{name}: the published data differ from benchmarks.posterior_models'")


def gp_poisson_regression(data: dict[str, Any]) -> Published:
    """posteriordb's ``gp_pois_regr``, the GP of :mod:`benchmarks.posterior_models`; its
    reference reports rho, alpha and f = L f_tilde."""
    _check_same("gp_pois_regr x", data["x"], GP_X)
    _check_same("gp_pois_regr k", data["k"], GP_COUNTS)
    names = ("log rho", "log alpha", *(f"eta{i}" for i in range(len(GP_X))))
    posterior = Posterior("gp_pois_regr-gp_pois_regr", names, gp_poisson)

    def quantities(draws: np.ndarray) -> np.ndarray:
        rho, alpha = np.exp(draws[..., :1]), np.exp(draws[..., 1:2])
        sq = (GP_X[:, None] - GP_X[None, :]) ** 2
        cov = alpha[..., None] ** 2 * np.exp(-sq / (2 * rho[..., None] ** 2))
        factor = _cholesky(cov + 1e-10 * np.eye(len(GP_X)), np)
        f = (factor @ draws[..., 2:, None])[..., 0]
        return np.concatenate([rho, alpha, f], -1)

    f_names = tuple(f"f[{i}]" for i in range(1, len(GP_X) + 1))
    return Published(posterior, ("rho", "alpha", *f_names), quantities)


def eight_schools(data: dict[str, Any]) -> Published:
    """posteriordb's ``eight_schools_noncentered``, the model of
    :mod:`benchmarks.posterior_models`; its reference reports theta = mu + tau eta, mu
    and tau, and the quadrature there gives the exact moments of mu and theta."""
    _check_same("eight_schools y", data["y"], SCHOOLS_Y)
    _check_same("eight_schools sigma", data["sigma"], SCHOOLS_SIGMA)
    names = ("mu", "log tau", *(f"eta{j}" for j in range(8)))
    posterior = Posterior(
        "eight_schools-eight_schools_noncentered", names, eight_schools_noncentred
    )

    def quantities(draws: np.ndarray) -> np.ndarray:
        mu, tau = draws[..., :1], np.exp(draws[..., 1:2])
        return np.concatenate([mu + tau * draws[..., 2:], mu, tau], -1)

    def exact() -> dict[str, tuple[float, float]]:
        m = schools_moments(noncentred=False)  # mu, log tau, theta_1..8
        thetas = {f"theta[{j + 1}]": (m["mean"][2 + j], m["sd"][2 + j]) for j in range(8)}
        return {"mu": (m["mean"][0], m["sd"][0]), **thetas}

    theta_names = tuple(f"theta[{j}]" for j in range(1, 9))
    return Published(posterior, (*theta_names, "mu", "tau"), quantities, exact)


# posteriordb's name of each posterior -> how to build it from its published data
MODELS: dict[str, Callable[[dict[str, Any]], Published]] = {
    "kidiq-kidscore_interaction": kidiq_interaction,
    "arK-arK": autoregression,
    "kilpisjarvi_mod-kilpisjarvi": kilpisjarvi,
    "diamonds-diamonds": diamonds,
    "garch-garch11": garch,
    "arma-arma11": arma,
    "hmm_example-hmm_example": hidden_markov,
    "low_dim_gauss_mix-low_dim_gauss_mix": gaussian_mixture,
    "hudson_lynx_hare-lotka_volterra": lotka_volterra,
    "gp_pois_regr-gp_pois_regr": gp_poisson_regression,
    "eight_schools-eight_schools_noncentered": eight_schools,
}


def reference_moments(draws: dict[str, np.ndarray], names: tuple[str, ...]) -> dict[str, Any]:
    """Means, sds and the min bulk ESS of the reference draws of ``names``."""
    stacked = reference_draws(draws, names)
    flat = stacked.reshape(-1, len(names))
    ess = effective_sample_size(torch.as_tensor(stacked)).min()
    return {"mean": flat.mean(0).tolist(), "sd": flat.std(0, ddof=1).tolist(),
            "min_bulk_ess": float(ess)}  # fmt: skip


def reference_draws(draws: dict[str, np.ndarray], names: tuple[str, ...]) -> np.ndarray:
    """The reference draws of ``names`` as (draws, chains, Q)."""
    missing = [n for n in names if n not in draws]
    if missing:
        raise KeyError(f"the reference draws hold no {missing}; they hold {sorted(draws)}")
    return np.stack([draws[n] for n in names], -1)


def named(result: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """``scores``' result with the columns of its worst z given by name."""
    at_mean, at_sd = result.pop("worst_mean_at"), result.pop("worst_sd_at")
    return {**result, "worst_mean_of": names[at_mean], "worst_sd_of": names[at_sd]}


def exact_row(published: Published, draws: dict[str, np.ndarray]) -> dict[str, Any] | None:
    """How far Stan's reference draws lie from the exact moments: worst |z| of the
    means and sds, in the reference's own Monte Carlo errors."""
    if published.exact is None:
        return None
    exact = published.exact()
    names = tuple(exact)
    truth = {"mean": [exact[n][0] for n in names], "sd": [exact[n][1] for n in names],
             "min_bulk_ess": math.inf}  # fmt: skip
    result = named(scores(reference_draws(draws, names), truth), names)
    return {"posterior": published.posterior.name, "sampler": "Stan reference draws",
            "against": "exact", **result}  # fmt: skip


def sampler_row(
    name: str, published: Published, draws: dict[str, np.ndarray], out: dict[str, Any], args: Any
) -> dict[str, Any]:
    """A sampler's run against Stan's reference draws, on Stan's parameters."""
    ours = published.quantities(out["draws"])
    result = named(scores(ours, reference_moments(draws, published.names)), published.names)
    ess = result["min_bulk_ess"]
    return {
        "posterior": published.posterior.name,
        "sampler": name,
        "against": "Stan reference draws",
        **result,
        "divergent_share": out["n_divergent"] / (args.chains * args.draws),
        "ess_per_1000_grads": 1000 * ess / out["n_grad_evals"],
        "seconds": out["seconds"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--posteriordb", type=Path, required=True,
                        help="a checkout of https://github.com/stan-dev/posteriordb")  # fmt: skip
    parser.add_argument("--chains", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--draws", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", help="only the posteriors whose name contains this")
    parser.add_argument("--sampler", help="only the samplers whose name contains this")
    parser.add_argument("--diagonal", action="store_true", help="also with dense_mass=False")
    parser.add_argument("--out", default="posteriordb.json", help="file under benchmarks/results")
    args = parser.parse_args()
    torch.set_default_dtype(torch.float64)
    rows = []
    for name, build in MODELS.items():
        if args.only and args.only not in name:
            continue
        data, draws = read(args.posteriordb, name)
        published = build(data)
        checked = exact_row(published, draws)
        if checked is not None:
            rows.append(checked)
            print(json.dumps(rows[-1]), flush=True)
        samplers = {"ebmlab NUTS": NUTS(), "ebmlab AdaptiveHMC": AdaptiveHMC()}
        if args.diagonal:
            for kind in (NUTS, AdaptiveHMC):
                samplers[f"ebmlab {kind.__name__}, diagonal mass"] = kind(dense_mass=False)
        for label, sampler in samplers.items():
            if args.sampler and args.sampler not in label:
                continue
            out = run_ebmlab(sampler, published.posterior, args.chains, args.warmup,
                             args.draws, seed=args.seed)  # fmt: skip
            rows.append(sampler_row(label, published, draws, out, args))
            print(json.dumps(rows[-1]), flush=True)
    path = RESULTS / args.out
    path.write_text(json.dumps(merged(path, rows), indent=1) + "\n")
    print(markdown(rows))


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| posterior | what | against | R-hat | divergent | ESS/1k grads | worst z mean | "
        "worst z sd |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        sampled = "divergent_share" in r
        lines.append(
            f"| {r['posterior']} | {r['sampler']} | {r['against']} | "
            + (f"{r['max_rhat']:.3f} | {r['divergent_share']:.1%} | "
               f"{r['ess_per_1000_grads']:.2f} | " if sampled else "| | | ")
            + f"{r['worst_z_mean']:.1f} | {r['worst_z_sd']:.1f} |"
        )  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    main()
