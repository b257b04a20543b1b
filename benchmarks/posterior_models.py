"""Bayesian posteriors that samplers meet in practice, written once for PyTorch and JAX.

Each :class:`Posterior` gives the log density of its parameters on the unconstrained
scale (positive parameters as logs, with their Jacobians), as Stan samples them, for a
batch of parameter vectors (..., D) and an array namespace ``xp`` (``torch`` or
``jax.numpy``): ebmlab's samplers and BlackJAX run the same function. Data are drawn
once from fixed seeds (or are the published ones: eight schools, the GP Poisson
counts), so every run sees the same posterior.

- eight schools, centred and non-centred (Rubin 1981; Gelman et al., BDA3 ch. 5), whose
  moments quadrature gives exactly;
- a linear regression with an interaction of badly scaled, uncentred predictors (434
  rows, predictors on scales 1 to 100, flat priors and sigma uniform as in Stan);
- an AR(5) model of a simulated series of 200 points;
- a Gaussian-process Poisson regression of 11 counts (exp-quad kernel, latent values
  through the Cholesky factor; posteriordb's ``gp_pois_regr``);
- a hierarchical logistic regression (10 groups, non-centred intercepts);
- Neal's funnel in 10 dimensions (Neal 2003), whose moments are known exactly.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache, partial
from typing import Any

import numpy as np


def run_arguments(doc: str, chains: int, warmup: int, draws: int) -> argparse.Namespace:
    """The command line of a posterior run: chains, warm-up and kept steps (with these
    defaults), ``--only`` (the posteriors whose name contains it), ``--sampler`` (the
    samplers whose name contains it) and ``--seed``."""
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--chains", type=int, default=chains)
    parser.add_argument("--warmup", type=int, default=warmup)
    parser.add_argument("--draws", type=int, default=draws)
    parser.add_argument("--only", help="only the posteriors whose name contains this")
    parser.add_argument("--sampler", help="only the samplers whose name contains this")
    parser.add_argument("--device", default="cpu", help="where ebmlab's chains run")
    parser.add_argument(
        "--seed", type=int, default=0, help="seeds the chains' starts and every sampler"
    )
    parser.add_argument(
        "--lockstep",
        action="store_true",
        help="add ebmlab NUTS with run_ahead=1 (every chain waits for the deepest tree)",
    )
    parser.add_argument(
        "--diagonal",
        action="store_true",
        help="add ebmlab NUTS and AdaptiveHMC with dense_mass=False (Stan's default)",
    )
    parser.add_argument(
        "--dense",
        action="store_true",
        help="add ebmlab NUTS and AdaptiveHMC with dense_mass=True",
    )
    parser.add_argument(
        "--softabs",
        action="store_true",
        help="add ebmlab SoftAbsHMC (Riemannian; D + 1 backward passes per Hessian, slow)",
    )
    parser.add_argument(
        "--neutra",
        action="store_true",
        help="add ebmlab NeuTra (WALNUTS in the latent space of a flow fitted first)",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="add ebmlab NUTS with compile=True (each tree step one torch.compile graph)",
    )
    parser.add_argument("--out", default="posteriors.json", help="file under benchmarks/results")
    return parser.parse_args()


_TORCH_CONSTANTS: dict[tuple, Any] = {}


def _const(values: np.ndarray, like: Any, xp: Any) -> Any:
    """``values`` (an array a model keeps: it is known by its identity) as an array of
    ``xp`` in ``like``'s dtype (and device, for torch). A torch constant is copied to its
    device once and kept, as a user's model holds its data: a copy from the host at
    every evaluation would wait for the device and keep the gradient from being
    replayed as a CUDA graph."""
    if xp.__name__ != "torch":
        return xp.asarray(values, dtype=like.dtype)
    key = (id(values), like.dtype, like.device)
    if key not in _TORCH_CONSTANTS:
        # the entry keeps ``values`` alive, so that no other array takes over its id
        _TORCH_CONSTANTS[key] = (values, xp.as_tensor(values, dtype=like.dtype, device=like.device))
    return _TORCH_CONSTANTS[key][1]


def _normal(x: Any, mu: Any, sigma: Any, xp: Any) -> Any:
    """log N(x | mu, sigma^2) without the constant -log sqrt(2 pi)."""
    z = (x - mu) / sigma
    return -0.5 * z * z - (math.log(sigma) if isinstance(sigma, float) else xp.log(sigma))


@dataclass(frozen=True)
class Posterior:
    """A posterior over D unconstrained parameters: ``log_density(theta, xp)`` for theta
    (..., D) gives (...); ``exact`` gives the exact means and sds where they are known
    (closed forms, or quadrature computed when first asked for); ``target_accept`` the
    acceptance a NUTS user would set for it."""

    name: str
    names: tuple[str, ...]
    log_density: Callable[[Any, Any], Any]
    target_accept: float = 0.8
    exact: Callable[[], dict[str, list[float]]] | None = field(default=None)

    @property
    def dim(self) -> int:
        return len(self.names)


# ---------------------------------------------------------------- eight schools
SCHOOLS_Y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
SCHOOLS_SIGMA = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])


def _schools_prior(theta: Any, xp: Any) -> tuple[Any, Any, Any]:
    """mu ~ N(0, 5), tau ~ half-Cauchy(5) on log tau (with its Jacobian)."""
    mu, log_tau = theta[..., 0], theta[..., 1]
    tau = xp.exp(log_tau)
    prior = _normal(mu, 0.0, 5.0, xp) - xp.log1p((tau / 5.0) ** 2) + log_tau
    return mu, tau, prior


def eight_schools_centred(theta: Any, xp: Any) -> Any:
    mu, tau, lp = _schools_prior(theta, xp)
    effects = theta[..., 2:]
    y, sigma = _const(SCHOOLS_Y, theta, xp), _const(SCHOOLS_SIGMA, theta, xp)
    lp = lp + xp.sum(_normal(effects, mu[..., None], tau[..., None], xp), axis=-1)
    return lp + xp.sum(_normal(y, effects, sigma, xp), axis=-1)


@cache
def schools_moments(noncentred: bool) -> dict[str, list[float]]:
    """The exact means and sds of eight schools' parameters, by quadrature over (mu,
    log tau) on a 401 x 1201 grid (to six digits: a grid twice as fine agrees). Given
    mu and tau the school effects are Gaussian, theta_j ~ N(m_j, v_j) with 1 / v_j =
    1 / sigma_j^2 + 1 / tau^2 and m_j = v_j (y_j / sigma_j^2 + mu / tau^2) (BDA3 eq.
    5.17), and (mu, tau) has the marginal prior x prod_j N(y_j; mu, sigma_j^2 + tau^2)
    (eq. 5.18); eta_j = (theta_j - mu) / tau likewise."""
    mu = np.linspace(-35.0, 45.0, 401)[:, None, None]
    log_tau = np.linspace(-20.0, 6.5, 1201)[None, :, None]
    tau2 = np.exp(2 * log_tau)
    spread = SCHOOLS_SIGMA**2 + tau2
    log_p = -0.5 * (mu[..., 0] / 5) ** 2 - np.log1p(tau2[..., 0] / 25) + log_tau[..., 0]
    log_p = log_p + (-0.5 * (SCHOOLS_Y - mu) ** 2 / spread - 0.5 * np.log(spread)).sum(-1)
    p = np.exp(log_p - log_p.max())
    p /= p.sum()
    var = 1 / (1 / SCHOOLS_SIGMA**2 + 1 / tau2)
    mean = var * (SCHOOLS_Y / SCHOOLS_SIGMA**2 + mu / tau2)
    if noncentred:
        mean, var = (mean - mu) / np.exp(log_tau), var / tau2
    grid = np.broadcast_arrays(mu[..., 0], log_tau[..., 0])
    first = np.array([(p * g).sum() for g in grid] + list((p[..., None] * mean).sum((0, 1))))
    second = np.array(
        [(p * g**2).sum() for g in grid] + list((p[..., None] * (var + mean**2)).sum((0, 1)))
    )
    return {"mean": first.tolist(), "sd": np.sqrt(second - first**2).tolist()}


def eight_schools_noncentred(theta: Any, xp: Any) -> Any:
    mu, tau, lp = _schools_prior(theta, xp)
    eta = theta[..., 2:]
    y, sigma = _const(SCHOOLS_Y, theta, xp), _const(SCHOOLS_SIGMA, theta, xp)
    effects = mu[..., None] + tau[..., None] * eta
    lp = lp + xp.sum(-0.5 * eta * eta, axis=-1)
    return lp + xp.sum(_normal(y, effects, sigma, xp), axis=-1)


# ---------------------------------------------------------------- regression
def _regression_data() -> tuple[np.ndarray, np.ndarray]:
    """434 rows: an indicator, a score around 100, an age around 23, and their
    interaction, uncentred; y from known coefficients plus noise of sd 18."""
    rng = np.random.default_rng(434)
    n = 434
    hs = (rng.random(n) < 0.79).astype(float)
    iq = rng.normal(100.0, 15.0, n)
    age = rng.uniform(17.0, 29.0, n)
    X = np.column_stack([np.ones(n), hs, iq, hs * iq, age])
    y = X @ np.array([-10.0, 50.0, 0.95, -0.48, 0.2]) + rng.normal(0.0, 18.0, n)
    return X, y


REGRESSION_X, REGRESSION_Y = _regression_data()


def regression(theta: Any, xp: Any) -> Any:
    """y ~ N(X beta, sigma); flat priors on beta, sigma uniform on (0, inf) sampled as
    log sigma with its Jacobian (Stan's defaults)."""
    beta, log_sigma = theta[..., :5], theta[..., 5]
    X, y = _const(REGRESSION_X, theta, xp), _const(REGRESSION_Y, theta, xp)
    mean = xp.sum(X * beta[..., None, :], axis=-1)
    lp = xp.sum(_normal(y, mean, xp.exp(log_sigma)[..., None], xp), axis=-1)
    return lp + log_sigma


# ---------------------------------------------------------------- AR(5)
def _ar_data(order: int = 5, n: int = 200) -> np.ndarray:
    rng = np.random.default_rng(5)
    coefficients = np.array([0.5, -0.3, 0.2, 0.1, -0.15])
    y = np.zeros(n + 100)
    for t in range(order, len(y)):
        y[t] = 1.0 + coefficients @ y[t - order : t][::-1] + rng.normal(0.0, 0.8)
    return y[100:]


AR_Y = _ar_data()
AR_ORDER = 5
AR_LAGS = np.column_stack([AR_Y[AR_ORDER - k : len(AR_Y) - k] for k in range(1, AR_ORDER + 1)])
AR_TARGET = AR_Y[AR_ORDER:]


def autoregression(theta: Any, xp: Any) -> Any:
    """y_t ~ N(alpha + sum_k beta_k y_{t-k}, sigma) for t > K; flat priors, sigma
    uniform (sampled as log sigma)."""
    alpha, beta, log_sigma = theta[..., 0], theta[..., 1 : 1 + AR_ORDER], theta[..., -1]
    L, y = _const(AR_LAGS, theta, xp), _const(AR_TARGET, theta, xp)
    mean = alpha[..., None] + xp.sum(L * beta[..., None, :], axis=-1)
    lp = xp.sum(_normal(y, mean, xp.exp(log_sigma)[..., None], xp), axis=-1)
    return lp + log_sigma


# ---------------------------------------------------------------- GP Poisson regression
def _cholesky(cov: Any, xp: Any) -> Any:
    """The Cholesky factor, NaN where a matrix is not positive definite (as JAX gives
    it), so that a sampler sees a non-finite energy there rather than an exception."""
    if xp.__name__ != "torch":
        return xp.linalg.cholesky(cov)
    factor, info = xp.linalg.cholesky_ex(cov)
    return xp.where((info == 0)[..., None, None], factor, float("nan"))


GP_X = np.arange(-10.0, 11.0, 2.0)
GP_COUNTS = np.array([40.0, 37.0, 29.0, 12.0, 4.0, 3.0, 9.0, 19.0, 77.0, 82.0, 33.0])
GP_JITTER = 1e-10 * np.eye(len(GP_X))


def gp_poisson_model(
    x_points: np.ndarray, counts: np.ndarray, jitter: np.ndarray
) -> Callable[[Any, Any], Any]:
    """The log density of k ~ Poisson(exp(f)) at ``x_points``, f = L eta with L the
    Cholesky factor of the exp-quad kernel alpha^2 exp(-(x - x')^2 / (2 rho^2)) +
    ``jitter``, eta ~ N(0, 1); rho ~ Gamma(25, 4), alpha ~ half-N(0, 2), both sampled
    as logs. The arrays are kept by the returned function (:func:`_const`)."""

    def log_density(theta: Any, xp: Any) -> Any:
        log_rho, log_alpha, eta = theta[..., 0], theta[..., 1], theta[..., 2:]
        rho, alpha = xp.exp(log_rho), xp.exp(log_alpha)
        x = _const(x_points, theta, xp)
        sq = (x[:, None] - x[None, :]) ** 2
        cov = alpha[..., None, None] ** 2 * xp.exp(-sq / (2 * rho[..., None, None] ** 2))
        cov = cov + _const(jitter, theta, xp)
        f = xp.sum(_cholesky(cov, xp) * eta[..., None, :], axis=-1)
        k = _const(counts, theta, xp)
        lp = xp.sum(k * f - xp.exp(f), axis=-1) + xp.sum(-0.5 * eta * eta, axis=-1)
        lp = lp + 24.0 * log_rho - 4.0 * rho + log_rho  # Gamma(25, 4) and the Jacobian
        return lp + _normal(alpha, 0.0, 2.0, xp) + log_alpha

    return log_density


# posteriordb's gp_pois_regr: 11 counts, a jitter of 1e-10
gp_poisson = gp_poisson_model(GP_X, GP_COUNTS, GP_JITTER)


# ---------------------------------------------------------------- hierarchical logistic
def _logistic_data(groups: int = 10, per_group: int = 20) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(10)
    group = np.repeat(np.arange(groups), per_group)
    x = rng.normal(0.0, 1.0, groups * per_group)
    intercepts = rng.normal(-0.5, 0.8, groups)
    logit = intercepts[group] + 1.2 * x
    y = (rng.random(len(x)) < 1 / (1 + np.exp(-logit))).astype(float)
    return np.eye(groups)[group], x, y


LOGISTIC_GROUPS, LOGISTIC_X, LOGISTIC_Y = _logistic_data()


def hierarchical_logistic(theta: Any, xp: Any) -> Any:
    """y ~ Bernoulli(logit^-1(a_g + b x)), a_g = mu + tau eta_g; mu ~ N(0, 2),
    tau ~ half-N(0, 1) as log tau, b ~ N(0, 2), eta ~ N(0, 1)."""
    mu, log_tau, b, eta = theta[..., 0], theta[..., 1], theta[..., 2], theta[..., 3:]
    tau = xp.exp(log_tau)
    onehot = _const(LOGISTIC_GROUPS, theta, xp)
    x, y = _const(LOGISTIC_X, theta, xp), _const(LOGISTIC_Y, theta, xp)
    a = mu[..., None] + tau[..., None] * eta
    logit = xp.sum(onehot * a[..., None, :], axis=-1) + b[..., None] * x
    lp = xp.sum(y * logit - xp.logaddexp(logit * 0, logit), axis=-1)
    lp = lp + _normal(mu, 0.0, 2.0, xp) + _normal(b, 0.0, 2.0, xp)
    return lp + _normal(tau, 0.0, 1.0, xp) + log_tau + xp.sum(-0.5 * eta * eta, axis=-1)


# ---------------------------------------------------------------- Neal's funnel
def funnel(theta: Any, xp: Any) -> Any:
    """v ~ N(0, 3), x_i ~ N(0, exp(v / 2)) for i = 1..9 (Neal 2003, section 8)."""
    v, x = theta[..., 0], theta[..., 1:]
    return _normal(v, 0.0, 3.0, xp) + xp.sum(_normal(x, 0.0, xp.exp(v / 2)[..., None], xp), axis=-1)


POSTERIORS = (
    Posterior("eight schools, centred", ("mu", "log tau", *[f"theta{j}" for j in range(8)]),
              eight_schools_centred, target_accept=0.95,
              exact=partial(schools_moments, noncentred=False)),
    Posterior("eight schools, non-centred", ("mu", "log tau", *[f"eta{j}" for j in range(8)]),
              eight_schools_noncentred, exact=partial(schools_moments, noncentred=True)),
    Posterior("regression with interaction (434 rows)",
              ("b0", "b_hs", "b_iq", "b_hs_iq", "b_age", "log sigma"), regression),
    Posterior("AR(5), 200 points", ("alpha", *[f"beta{k}" for k in range(1, 6)], "log sigma"),
              autoregression),
    Posterior("GP Poisson regression (11 counts)",
              ("log rho", "log alpha", *[f"eta{i}" for i in range(11)]), gp_poisson),
    Posterior("hierarchical logistic (10 groups)",
              ("mu", "log tau", "b", *[f"eta{g}" for g in range(10)]), hierarchical_logistic),
    Posterior("Neal's funnel, 10-d", ("v", *[f"x{i}" for i in range(9)]), funnel,
              exact=lambda: {"mean": [0.0] * 10, "sd": [3.0] + [math.exp(9 / 4)] * 9}),
)  # fmt: skip
