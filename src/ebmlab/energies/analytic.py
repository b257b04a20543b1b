"""Energies whose partition function and samplers are known exactly.

They are the ground truth against which samplers, partition-function estimators
and training principles are tested. Each has ``log_partition()`` (a float64
scalar tensor), ``log_prob(x) = -E(x) - log Z`` and ``sample(n, generator)``.
The Gaussian is Tomczak's (2024) eqs. 6.2-6.4 in D dimensions.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.devices import wide_dtype, widen
from ebmlab.energies.base import EnergyModel

LOG_2PI = math.log(2 * math.pi)


class AnalyticEnergy(EnergyModel):
    """An energy with exact ``log_partition`` and exact ``sample``."""

    dim: int

    def log_partition(self) -> torch.Tensor:  # pragma: no cover - abstract
        """log Z in closed form, a scalar tensor."""
        raise NotImplementedError

    def sample(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``n`` exact samples (n, dim), drawn with ``generator`` on its device."""
        raise NotImplementedError  # pragma: no cover - abstract

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised log-density -E(x) - log Z of a batch ``x`` (B, ...) -> (B,)."""
        return -self.energy(x) - self.log_partition().to(x.dtype)

    def _check_x(self, x: torch.Tensor) -> torch.Tensor:
        return _checks.tensor("x", x, ndim=2, last_dims=(self.dim,), floating=True)


class Gaussian(AnalyticEnergy):
    """E(x) = 1/2 (x - mu)^T Sigma^{-1} (x - mu); log Z = D/2 log 2pi + 1/2 log det Sigma.

    Args:
        mean: mu (D,).
        covariance: Sigma (D, D), symmetric positive definite.
    """

    def __init__(self, mean: torch.Tensor, covariance: torch.Tensor) -> None:
        super().__init__()
        mean = _checks.tensor("mean", mean, ndim=1, floating=True, finite=True)
        d = mean.shape[0]
        covariance = _checks.tensor(
            "covariance", covariance, ndim=2, last_dims=(d, d), floating=True
        )
        if not torch.allclose(covariance, covariance.T, atol=1e-6):
            raise ArgumentError("covariance must be symmetric")
        chol, info = torch.linalg.cholesky_ex(covariance)
        if info.item() != 0:
            raise ArgumentError("covariance must be positive definite")
        self.dim = d
        self.register_buffer("mean", mean)
        self.register_buffer("covariance", covariance)
        self.register_buffer("chol", chol)

    def energy(self, x: torch.Tensor) -> torch.Tensor:
        self._check_x(x)
        z = torch.linalg.solve_triangular(self.chol, (x - self.mean).T, upper=False)
        return 0.5 * (z * z).sum(0)

    def energy_and_grad(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Closed form: grad E = Sigma^{-1} (x - mu) = L^{-T} z with z = L^{-1} (x - mu)."""
        self._check_x(x)
        with torch.no_grad():
            z = torch.linalg.solve_triangular(self.chol, (x - self.mean).T, upper=False)
            g = torch.linalg.solve_triangular(self.chol.T, z, upper=True).T
            return 0.5 * (z * z).sum(0), g

    def log_partition(self) -> torch.Tensor:
        logdet = 2 * torch.log(torch.diagonal(widen(self.chol))).sum()
        return 0.5 * self.dim * LOG_2PI + 0.5 * logdet

    def sample(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        _checks.positive_int("n", n)
        eps = torch.randn(
            n, self.dim, generator=generator, dtype=self.mean.dtype, device=self.mean.device
        )
        return self.mean + eps @ self.chol.T


class DiagonalGaussian(AnalyticEnergy):
    """E(x) = sum_i (x_i - mu_i)^2 / (2 sigma_i^2), the product of D copies of eq. 6.2.

    Args:
        mean: mu (D,).
        std: sigma (D,), positive.
    """

    def __init__(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        super().__init__()
        mean = _checks.tensor("mean", mean, ndim=1, floating=True, finite=True)
        std = _checks.tensor("std", std, ndim=1, last_dims=mean.shape, floating=True, finite=True)
        if (std <= 0).any():
            raise ArgumentError("std must be > 0 everywhere")
        self.dim = mean.shape[0]
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)

    def energy(self, x: torch.Tensor) -> torch.Tensor:
        self._check_x(x)
        return 0.5 * (((x - self.mean) / self.std) ** 2).sum(1)

    def energy_and_grad(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Closed form: grad E = (x - mu) / sigma^2."""
        self._check_x(x)
        with torch.no_grad():
            z = (x - self.mean) / self.std
            return 0.5 * (z * z).sum(1), z / self.std

    def log_partition(self) -> torch.Tensor:
        return 0.5 * self.dim * LOG_2PI + torch.log(widen(self.std)).sum()

    def sample(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        _checks.positive_int("n", n)
        eps = torch.randn(
            n, self.dim, generator=generator, dtype=self.mean.dtype, device=self.mean.device
        )
        return self.mean + eps * self.std


class IndependentBernoulli(AnalyticEnergy):
    """E(x) = -a^T x on {0, 1}^D: independent units with logits a; log Z = sum_i
    softplus(a_i). The tractable base for annealing binary models (AIS, tempered SMC)."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        logits = _checks.tensor("logits", logits, ndim=1, floating=True, finite=True)
        self.dim = logits.shape[0]
        self.register_buffer("logits", logits)

    def energy(self, x: torch.Tensor) -> torch.Tensor:
        self._check_x(x)
        return -x @ self.logits.to(x.dtype)

    def log_partition(self) -> torch.Tensor:
        return torch.nn.functional.softplus(widen(self.logits)).sum()

    def sample(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        _checks.positive_int("n", n)
        u = torch.rand(
            n, self.dim, generator=generator, dtype=self.logits.dtype, device=self.logits.device
        )
        return (u < torch.sigmoid(self.logits)).to(self.logits.dtype)


class GaussianMixture(AnalyticEnergy):
    """E(x) = -log sum_k w_k exp(-1/2 (x - mu_k)^T Sigma_k^{-1} (x - mu_k)).

    The components are left unnormalised, so log Z = log sum_k w_k (2pi)^{D/2} |Sigma_k|^{1/2}
    is a non-trivial number that partition-function estimators can be checked against.

    Args:
        weights: w (K,), positive (not necessarily normalised).
        means: mu (K, D).
        covariances: Sigma (K, D, D).
    """

    def __init__(
        self, weights: torch.Tensor, means: torch.Tensor, covariances: torch.Tensor
    ) -> None:
        super().__init__()
        weights = _checks.tensor("weights", weights, ndim=1, floating=True, finite=True)
        k = weights.shape[0]
        if (weights <= 0).any():
            raise ArgumentError("weights must be > 0")
        means = _checks.tensor("means", means, ndim=2, floating=True, finite=True)
        if means.shape[0] != k:
            raise ArgumentError(f"means must have {k} rows (one per weight), got {means.shape[0]}")
        d = means.shape[1]
        covariances = _checks.tensor("covariances", covariances, ndim=3, last_dims=(d, d))
        if covariances.shape[0] != k:
            raise ArgumentError(f"covariances must have shape ({k}, {d}, {d})")
        chol, info = torch.linalg.cholesky_ex(covariances)
        if (info != 0).any():
            raise ArgumentError("every covariance must be symmetric positive definite")
        self.dim = d
        self.register_buffer("weights", weights / weights.sum())
        self.register_buffer("means", means)
        self.register_buffer("chol", chol)
        # z_k = L_k^{-1} x - L_k^{-1} mu_k for all k in one product: the stacked L_k^{-1}
        # (K*D, D) and the whitened means (K*D,)
        eye = torch.eye(d, dtype=chol.dtype, device=chol.device).expand_as(chol)
        chol_inv = torch.linalg.solve_triangular(chol, eye, upper=False)
        self.register_buffer("whiten", chol_inv.reshape(k * d, d))
        self.register_buffer("whitened_means", (chol_inv @ means.unsqueeze(-1)).reshape(k * d))

    @classmethod
    def isotropic(cls, means: torch.Tensor, std: float, weights: torch.Tensor | None = None):
        """Mixture of isotropic components with a shared standard deviation.

        Args:
            means: the components' means (K, D).
            std: their shared standard deviation.
            weights: mixture weights (K,) summing to 1 (default: equal).
        """
        _checks.positive("std", std)
        k, d = means.shape
        w = torch.full((k,), 1.0 / k, dtype=means.dtype) if weights is None else weights
        cov = torch.eye(d, dtype=means.dtype).expand(k, d, d) * std**2
        return cls(w, means, cov.contiguous())

    @classmethod
    def normalized(
        cls, mixture_weights: torch.Tensor, means: torch.Tensor, covariances: torch.Tensor
    ):
        """The mixture sum_k pi_k N(mu_k, Sigma_k) with the given mixture weights pi_k
        (the constructor's ``weights`` multiply unnormalised components instead).

        Args:
            mixture_weights: pi (K,), summing to 1.
            means: mu (K, D).
            covariances: Sigma (K, D, D).
        """
        covariances = _checks.tensor("covariances", covariances, ndim=3, floating=True)
        half_logdet = 0.5 * torch.linalg.slogdet(covariances).logabsdet
        weights = mixture_weights * torch.exp(half_logdet.max() - half_logdet)
        return cls(weights, means, covariances)

    def _log_components(self, x: torch.Tensor) -> torch.Tensor:
        z = (x @ self.whiten.T - self.whitened_means).reshape(x.shape[0], *self.means.shape)
        return torch.log(self.weights) - 0.5 * (z**2).sum(-1)

    def energy(self, x: torch.Tensor) -> torch.Tensor:
        self._check_x(x)
        return -torch.logsumexp(self._log_components(x), dim=1)

    def component_posterior(self, x: torch.Tensor) -> torch.Tensor:
        """p(k | x) under p(x) = exp(-E(x)) / Z, shape (B, K): the responsibilities
        w_k exp(-1/2 z_k^2) / sum_j w_j exp(-1/2 z_j^2). Written as sum_k pi_k N(mu_k,
        Sigma_k), the same density has pi_k proportional to w_k |Sigma_k|^{1/2}, and pi_k
        N(x; mu_k, Sigma_k) is proportional to the same terms (Bishop 2006, eq. 9.13)."""
        self._check_x(x)
        return torch.softmax(self._log_components(x), dim=1)

    def log_partition(self) -> torch.Tensor:
        logdet = torch.log(torch.diagonal(widen(self.chol), dim1=-2, dim2=-1)).sum(-1)
        return (
            torch.logsumexp(torch.log(widen(self.weights)) + logdet, 0) + 0.5 * self.dim * LOG_2PI
        )

    def mixture_weights(self) -> torch.Tensor:
        """Weights of the normalised mixture, proportional to w_k |Sigma_k|^{1/2}."""
        logdet = torch.log(torch.diagonal(self.chol, dim1=-2, dim2=-1)).sum(-1)
        return torch.softmax(torch.log(self.weights) + logdet, 0)

    def sample(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        _checks.positive_int("n", n)
        k = torch.multinomial(self.mixture_weights(), n, replacement=True, generator=generator)
        eps = torch.randn(
            n, self.dim, generator=generator, dtype=self.means.dtype, device=self.means.device
        )
        return self.means[k] + (self.chol[k] @ eps.unsqueeze(-1)).squeeze(-1)


class Funnel(AnalyticEnergy):
    """Neal's funnel: x_0 ~ N(0, scale^2), x_i | x_0 ~ N(0, exp(x_0)) for i = 1..D-1.

    E(x) = x_0^2 / (2 scale^2) + sum_i x_i^2 exp(-x_0) / 2 + (D-1) x_0 / 2, so that
    log Z = D/2 log 2pi + log scale exactly.

    Args:
        dim: D >= 2.
    """

    def __init__(self, dim: int = 10, scale: float = 3.0) -> None:
        super().__init__()
        self.dim = _checks.positive_int("dim", dim)
        if dim < 2:
            raise ArgumentError(f"dim must be >= 2 for a funnel, got {dim}")
        self.scale = _checks.positive("scale", scale)

    def energy(self, x: torch.Tensor) -> torch.Tensor:
        self._check_x(x)
        v, rest = x[:, 0], x[:, 1:]
        return (
            v**2 / (2 * self.scale**2)
            + 0.5 * (rest**2).sum(1) * torch.exp(-v)
            + 0.5 * (self.dim - 1) * v
        )

    def log_partition(self) -> torch.Tensor:
        return torch.tensor(0.5 * self.dim * LOG_2PI + math.log(self.scale), dtype=torch.float64)

    def sample(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        _checks.positive_int("n", n)
        eps = torch.randn(n, self.dim, generator=generator, device=_device_of(generator))
        v = self.scale * eps[:, :1]
        return torch.cat([v, eps[:, 1:] * torch.exp(v / 2)], dim=1)


def _device_of(generator: torch.Generator | None) -> torch.device | None:
    """Where a parameter-free density draws: on its generator's device."""
    return generator.device if generator is not None else None


class Banana(AnalyticEnergy):
    """A banana-shaped 2-D density: x_0 ~ N(0, s^2), x_1 | x_0 ~ N(b (x_0^2 - s^2), 1).

    E(x) = x_0^2 / (2 s^2) + (x_1 - b (x_0^2 - s^2))^2 / 2; the shear has unit Jacobian,
    so log Z = log(2 pi s).

    Args:
        curvature: b, how far x_1's mean bends with x_0.
        scale: s, x_0's standard deviation.
    """

    dim = 2

    def __init__(self, curvature: float = 1.0, scale: float = 1.0) -> None:
        super().__init__()
        self.curvature = _checks.positive("curvature", curvature, allow_zero=True)
        self.scale = _checks.positive("scale", scale)

    def energy(self, x: torch.Tensor) -> torch.Tensor:
        self._check_x(x)
        x0, x1 = x[:, 0], x[:, 1]
        return (
            x0**2 / (2 * self.scale**2) + 0.5 * (x1 - self.curvature * (x0**2 - self.scale**2)) ** 2
        )

    def log_partition(self) -> torch.Tensor:
        return torch.tensor(math.log(2 * math.pi * self.scale), dtype=torch.float64)

    def sample(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        _checks.positive_int("n", n)
        eps = torch.randn(n, 2, generator=generator, device=_device_of(generator))
        x0 = self.scale * eps[:, 0]
        return torch.stack([x0, eps[:, 1] + self.curvature * (x0**2 - self.scale**2)], 1)


class DoubleWell(AnalyticEnergy):
    """A bimodal energy: E(x) = depth (x_0^2 - 1)^2 + sum_{i>0} x_i^2 / 2.

    The one-dimensional factor of Z is integrated by adaptive quadrature (error
    ~1e-12), the Gaussian factor is closed form. Samples of x_0 come from
    numerical inversion of its CDF (u-error below 1e-10), driven by uniforms from
    the given generator, so they are exact to that precision and reproducible.

    Args:
        dim: D >= 1.
    """

    def __init__(self, dim: int = 2, depth: float = 2.0) -> None:
        from scipy import integrate
        from scipy.stats import sampling

        super().__init__()
        self.dim = _checks.positive_int("dim", dim)
        self.depth = _checks.positive("depth", depth)

        def density(t: float) -> float:
            return math.exp(-depth * (t * t - 1.0) ** 2)

        z1, _ = integrate.quad(density, -np.inf, np.inf, epsabs=1e-13, epsrel=1e-12)
        self._log_z1 = math.log(z1)

        class _Dist:
            def pdf(self, t: float) -> float:
                return density(t)

        self._inverse_cdf = sampling.NumericalInversePolynomial(
            _Dist(), center=1.0, domain=(-np.inf, np.inf), u_resolution=1e-10
        )

    def energy(self, x: torch.Tensor) -> torch.Tensor:
        self._check_x(x)
        return self.depth * (x[:, 0] ** 2 - 1) ** 2 + 0.5 * (x[:, 1:] ** 2).sum(1)

    def log_partition(self) -> torch.Tensor:
        return torch.tensor(self._log_z1 + 0.5 * (self.dim - 1) * LOG_2PI, dtype=torch.float64)

    def sample(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        _checks.positive_int("n", n)
        device = _device_of(generator)
        u = torch.rand(n, generator=generator, dtype=wide_dtype(device), device=device)
        u = u.cpu().double().clamp(1e-12, 1 - 1e-12).numpy()  # SciPy's inversion runs on the host
        x0 = torch.from_numpy(np.asarray(self._inverse_cdf.ppf(u))).float().to(device)
        rest = torch.randn(n, self.dim - 1, generator=generator, device=device)
        return torch.cat([x0[:, None], rest], dim=1)
