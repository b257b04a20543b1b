"""Two-dimensional toy densities with exact ``log_prob`` and exact ``sample``.

They are the ground truth of density-estimation tests: a learned model's test NLL
is compared with the true distribution's (its entropy), and samplers are checked
against known mode weights. All live in a box ``bounds`` holding essentially all
of their mass (used for plots and quadrature). Two spirals are left out: their
usual construction (points on a curve plus noise) has no closed-form density.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ebmlab import _checks
from ebmlab.devices import widen

LOG_2PI = math.log(2 * math.pi)


class ToyDistribution:
    """A normalised density on R^2 with exact log-density and exact sampling."""

    name: str = ""
    bounds: tuple[tuple[float, float], tuple[float, float]] = ((-4.0, 4.0), (-4.0, 4.0))

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        """The exact log-density of points ``x`` (N, 2) -> (N,)."""
        raise NotImplementedError

    def sample(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``n`` exact samples (n, 2), drawn with ``generator``."""
        raise NotImplementedError  # pragma: no cover - abstract

    def _check(self, x: torch.Tensor) -> torch.Tensor:
        return _checks.tensor("x", x, ndim=2, last_dims=(2,), floating=True)


class _GaussianMixture2D(ToyDistribution):
    """Equal-weight mixture of 2-D Gaussians with a shared covariance ``cov`` (2x2)."""

    def __init__(self, means: torch.Tensor, cov: torch.Tensor) -> None:
        self.means = means.float()
        self.chol = torch.linalg.cholesky(cov.float())
        self.log_norm = LOG_2PI + torch.log(torch.diagonal(self.chol)).sum() + math.log(len(means))

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        self._check(x)
        diff = (x[:, None, :] - self.means[None]).reshape(-1, 2)
        z = torch.linalg.solve_triangular(self.chol, diff.T, upper=False).T.reshape(
            x.shape[0], -1, 2
        )
        return torch.logsumexp(-0.5 * (z**2).sum(-1), 1) - self.log_norm

    def component(self, x: torch.Tensor) -> torch.Tensor:
        """Index of the nearest mixture component (mode) of each point."""
        return torch.cdist(x, self.means).argmin(1)

    def sample(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        _checks.positive_int("n", n)
        k = torch.randint(len(self.means), (n,), generator=generator)
        eps = torch.randn(n, 2, generator=generator)
        return self.means[k] + eps @ self.chol.T


class EightGaussians(_GaussianMixture2D):
    """Eight isotropic Gaussians with equal weights on a circle of radius ``radius``."""

    name = "8gaussians"

    def __init__(self, radius: float = 2.0, std: float = 0.2) -> None:
        _checks.positive("radius", radius)
        _checks.positive("std", std)
        angles = torch.arange(8) * (2 * math.pi / 8)
        means = radius * torch.stack([torch.cos(angles), torch.sin(angles)], 1)
        super().__init__(means, torch.eye(2) * std**2)
        r = radius + 5 * std
        self.bounds = ((-r, r), (-r, r))


class Grid25(_GaussianMixture2D):
    """Twenty-five isotropic Gaussians on a 5x5 grid with spacing ``spacing``."""

    name = "25gaussians"

    def __init__(self, spacing: float = 1.0, std: float = 0.1) -> None:
        _checks.positive("spacing", spacing)
        _checks.positive("std", std)
        ticks = (torch.arange(5) - 2.0) * spacing
        means = torch.cartesian_prod(ticks, ticks)
        super().__init__(means, torch.eye(2) * std**2)
        r = 2 * spacing + 5 * std
        self.bounds = ((-r, r), (-r, r))


class Checkerboard(ToyDistribution):
    """Uniform density on the 8 'black' squares of a 4x4 board covering [-4, 4]^2.

    Cell (i, j) of side 2 is black when i + j is even; density 1/32 there, 0 elsewhere.
    """

    name = "checkerboard"

    def __init__(self) -> None:
        self.bounds = ((-4.0, 4.0), (-4.0, 4.0))
        self.black = torch.tensor([(i, j) for i in range(4) for j in range(4) if (i + j) % 2 == 0])

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        self._check(x)
        inside = (x.abs() < 4).all(1)
        cell = torch.floor((x + 4) / 2).long()
        black = (cell.sum(1) % 2 == 0) & inside
        out = torch.full((x.shape[0],), -math.inf, dtype=x.dtype)
        out[black] = -math.log(32.0)
        return out

    def sample(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        _checks.positive_int("n", n)
        k = torch.randint(len(self.black), (n,), generator=generator)
        u = torch.rand(n, 2, generator=generator)
        return (self.black[k] + u) * 2 - 4


class Rings(ToyDistribution):
    """Concentric rings: radius r ~ sum_k w_k N(r_k, std^2) truncated to r > 0, angle uniform.

    In the plane the density is p(x) = p_r(|x|) / (2 pi |x|).
    """

    name = "rings"

    def __init__(self, radii: tuple[float, ...] = (1.0, 2.0, 3.0), std: float = 0.1) -> None:
        _checks.positive("std", std)
        for r in radii:
            _checks.positive("radii", r)
        self.radii = torch.tensor(radii, dtype=torch.float64)
        self.std = std
        # P(r > 0) of each untruncated component, for the truncation constant.
        self.log_mass = torch.special.log_ndtr(self.radii / std)
        top = max(radii) + 5 * std
        self.bounds = ((-top, top), (-top, top))

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        self._check(x)
        r = widen(x).norm(dim=1)[:, None]
        z = (r - self.radii) / self.std
        log_comp = -0.5 * z**2 - 0.5 * LOG_2PI - math.log(self.std) - self.log_mass
        log_pr = torch.logsumexp(log_comp, 1) - math.log(len(self.radii))
        return (log_pr - torch.log(2 * math.pi * r.squeeze(1))).to(x.dtype)

    def sample(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        _checks.positive_int("n", n)
        k = torch.randint(len(self.radii), (n,), generator=generator)
        r = torch.empty(n, dtype=torch.float64)
        todo = torch.ones(n, dtype=torch.bool)
        while todo.any():  # exact truncation by rejection (almost never loops)
            m = int(todo.sum())
            draw = self.radii[k[todo]] + self.std * torch.randn(
                m, generator=generator, dtype=torch.float64
            )
            r[todo] = draw
            todo = r <= 0
        theta = 2 * math.pi * torch.rand(n, generator=generator, dtype=torch.float64)
        return torch.stack([r * torch.cos(theta), r * torch.sin(theta)], 1).float()


def _rotate(x: torch.Tensor, angle: torch.Tensor) -> torch.Tensor:
    c, s = torch.cos(angle), torch.sin(angle)
    return torch.stack([c * x[:, 0] - s * x[:, 1], s * x[:, 0] + c * x[:, 1]], 1)


class Pinwheel(ToyDistribution):
    """Anisotropic Gaussian arms, each point rotated by an angle ``rate * |x|``.

    A rotation whose angle depends only on the radius maps (r, phi) to
    (r, phi + rate r) and preserves area, so the density stays closed form:
    p(x) = p_arms(R(-rate |x|) x).
    """

    name = "pinwheel"

    def __init__(
        self,
        n_arms: int = 5,
        radial_std: float = 0.3,
        tangential_std: float = 0.1,
        rate: float = 0.6,
        offset: float = 1.5,
    ) -> None:
        _checks.positive_int("n_arms", n_arms)
        _checks.positive("radial_std", radial_std)
        _checks.positive("tangential_std", tangential_std)
        _checks.positive("offset", offset)
        self.rate = rate
        angles = torch.arange(n_arms) * (2 * math.pi / n_arms)
        self.means = offset * torch.stack([torch.cos(angles), torch.sin(angles)], 1)
        c, s = torch.cos(angles), torch.sin(angles)
        self.rot = torch.stack([torch.stack([c, -s], -1), torch.stack([s, c], -1)], -2)  # (K, 2, 2)
        self.stds = torch.tensor([radial_std, tangential_std])
        self.log_norm = LOG_2PI + math.log(radial_std * tangential_std) + math.log(n_arms)
        top = offset + 5 * radial_std
        self.bounds = ((-top, top), (-top, top))

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        self._check(x)
        z = _rotate(x, -self.rate * x.norm(dim=1))
        diff = z[:, None, :] - self.means[None]  # (B, K, 2)
        w = torch.einsum("kji,bkj->bki", self.rot, diff) / self.stds  # arm frame, standardised
        return torch.logsumexp(-0.5 * (w**2).sum(-1), 1) - self.log_norm

    def sample(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        _checks.positive_int("n", n)
        k = torch.randint(len(self.means), (n,), generator=generator)
        eps = torch.randn(n, 2, generator=generator)
        z = self.means[k] + (self.rot[k] @ (eps * self.stds).unsqueeze(-1)).squeeze(-1)
        return _rotate(z, self.rate * z.norm(dim=1))


class TwoMoons(ToyDistribution):
    """Two interleaved half circles blurred by isotropic Gaussian noise (the shape of
    scikit-learn's ``make_moons``, centred and scaled by ``scale``).

    A point is c(theta) + noise with theta ~ U(0, pi), c on one arc or the mirrored
    other, and noise ~ N(0, std^2 I); its density
    p(x) = 1/2 sum_arcs 1/pi int_0^pi N(x; c(theta), std^2 I) dtheta
    is a smooth integral over theta, taken by Gauss-Legendre quadrature with enough
    nodes that its error is below float32's resolution. The two arcs are
    c(theta) = +-scale (cos theta - 1/2, sin theta - 1/4).
    """

    name = "moons"
    NODES = 128
    CHUNK = 16_384  # points per block of the (points x nodes) distances

    def __init__(self, scale: float = 2.0, std: float = 0.2) -> None:
        _checks.positive("scale", scale)
        _checks.positive("std", std)
        self.scale, self.std = scale, std
        nodes, weights = np.polynomial.legendre.leggauss(self.NODES)
        theta = torch.as_tensor(math.pi * (nodes + 1) / 2)  # [-1, 1] -> [0, pi]
        # int_0^pi f dtheta / pi = sum_k (w_k / 2) f(theta_k); each arc has weight 1/2
        log_weights = torch.as_tensor(weights).log() - 2 * math.log(2)
        arc = self._arc(theta)
        self.centres = torch.cat([arc, -arc])  # (2K, 2)
        self.log_weights = torch.cat([log_weights, log_weights])
        top = 1.5 * scale + 5 * std
        self.bounds = ((-top, top), (-top, top))

    def _arc(self, theta: torch.Tensor) -> torch.Tensor:
        return self.scale * torch.stack([torch.cos(theta) - 0.5, torch.sin(theta) - 0.25], -1)

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        self._check(x)
        out = []
        for block in widen(x).split(self.CHUNK):
            sq = torch.cdist(block, self.centres).square()
            log_comp = -0.5 * sq / self.std**2 - LOG_2PI - 2 * math.log(self.std)
            out.append(torch.logsumexp(log_comp + self.log_weights, 1))
        return torch.cat(out).to(x.dtype)

    def sample(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        _checks.positive_int("n", n)
        theta = math.pi * torch.rand(n, generator=generator, dtype=torch.float64)
        sign = 1 - 2 * torch.randint(2, (n, 1), generator=generator, dtype=torch.float64)
        noise = torch.randn(n, 2, generator=generator, dtype=torch.float64)
        return (sign * self._arc(theta) + self.std * noise).float()


TOYS: dict[str, type[ToyDistribution]] = {
    cls.name: cls for cls in (EightGaussians, Grid25, Checkerboard, Rings, Pinwheel, TwoMoons)
}


def make_toy(name: str) -> ToyDistribution:
    """The toy density called ``name`` with its default parameters."""
    _checks.one_of("name", name, list(TOYS))
    return TOYS[name]()
