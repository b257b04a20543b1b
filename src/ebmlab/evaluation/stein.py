"""The kernel Stein discrepancy: how well samples fit an unnormalised density.

For a model p = exp(-E)/Z with score s(x) = -grad E(x), the Stein kernel of a base
kernel k is (Liu, Lee & Jordan 2016, eq. 9; Chwialkowski et al. 2016)

    u(x, y) = s(x)^T s(y) k(x, y) + s(x)^T grad_y k + s(y)^T grad_x k + tr(grad_x grad_y k),

and KSD^2 = E_{x, y ~ q} u(x, y) is zero exactly when the sample law q equals p.
It needs the score only, never Z. The base kernel is the inverse multiquadric
k(x, y) = (c^2 + |x - y|^2)^beta, beta = -1/2, for which the KSD detects
non-convergence (Gorham & Mackey 2017, Thm. 8).

The estimate is the U-statistic over pairs i != j. Its standard error is the
Hoeffding projection's, 2 sd(h_1) / sqrt(n), with h_1(x_i) the row means of u.
The test of H0: q = p uses the wild bootstrap with Rademacher weights
(Chwialkowski et al. 2016), which reproduces the U-statistic's degenerate null
distribution.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.devices import widen
from ebmlab.energies.base import EnergyLike, score


@dataclass(frozen=True)
class SteinDiscrepancy:
    """KSD^2 with its standard error and the bootstrap test's p-value.

    ``ksd2`` is the unbiased U-statistic (it can be slightly negative under H0);
    ``stderr`` is its standard error; ``p_value`` tests H0: the samples are drawn from
    the model, by ``n_bootstrap`` wild-bootstrap replicates over ``n_samples`` samples.
    """

    ksd2: float
    stderr: float
    p_value: float
    n_samples: int
    n_bootstrap: int

    def reject(self, level: float = 0.05) -> bool:
        """Whether the test rejects "samples come from the model" at ``level``."""
        return self.p_value <= _checks.probability("level", level)

    def to_dict(self) -> dict[str, Any]:
        """The result as a JSON-serialisable dict."""
        return asdict(self)


def stein_kernel_matrix(
    x: torch.Tensor, score: torch.Tensor, scale: float = 1.0, power: float = -0.5
) -> torch.Tensor:
    """The n x n Stein kernel matrix u(x_i, x_j) for the IMQ kernel (c^2 + r^2)^power.

    ``x`` and ``score`` are (n, D); nothing n x n x D is formed.
    """
    d = x.shape[1]
    r2 = torch.cdist(x, x).square()
    q = scale**2 + r2
    k = q.pow(power)
    dk = 2 * power * q.pow(power - 1)  # d k / d r^2
    m = score @ x.T  # m_ij = s_i . x_j
    a = m.diagonal()
    # (s_j - s_i) . (x_i - x_j) = m_ji - a_j - a_i + m_ij
    cross = m + m.T - a[:, None] - a[None, :]
    trace = -dk * d - 4 * power * (power - 1) * r2 * q.pow(power - 2)
    return (score @ score.T) * k + dk * cross + trace


def kernel_stein_discrepancy(
    samples: torch.Tensor,
    energy: EnergyLike,
    *,
    scale: float = 1.0,
    n_bootstrap: int = 1000,
    generator: torch.Generator | int | None = None,
) -> SteinDiscrepancy:
    """KSD^2 of ``samples`` (n, ...) against the model exp(-E)/Z, with its standard
    error and a wild-bootstrap p-value.

    Args:
        samples: at least two draws; flattened to (n, D) and computed in float64.
        energy: the model's energy (an ``EnergyModel`` or a callable ``x -> (n,)``).
        scale: c of the IMQ kernel (c^2 + |x - y|^2)^(-1/2); of the order of the
            distance between neighbouring modes, 1 for standardised data.
        n_bootstrap: bootstrap replicates for the p-value.
        generator: randomness of the bootstrap weights (on the samples' device).
    """
    _checks.tensor("samples", samples, min_ndim=2, floating=True, finite=True)
    if samples.shape[0] < 2:
        raise ArgumentError(f"samples must hold at least 2 draws, got {samples.shape[0]}")
    _checks.positive("scale", scale)
    _checks.positive_int("n_bootstrap", n_bootstrap)
    gen = _checks.generator("generator", generator, samples.device)
    s = widen(score(energy, samples.detach()).flatten(1))
    x = widen(samples.detach().flatten(1))
    if not torch.isfinite(s).all():
        raise ArgumentError("energy has a NaN or infinite gradient at some of the samples")
    n = x.shape[0]
    u = stein_kernel_matrix(x, s, scale).fill_diagonal_(0.0)
    pairs = n * (n - 1)
    ksd2 = u.sum() / pairs
    row_means = u.sum(1) / (n - 1)
    stderr = 2 * row_means.std() / math.sqrt(n) if n > 2 else torch.tensor(math.inf)
    signs = widen(torch.randint(0, 2, (n_bootstrap, n), generator=gen, device=x.device))
    w = 2 * signs - 1
    replicates = ((w @ u) * w).sum(1) / pairs
    p_value = (1 + (replicates >= ksd2).sum()) / (1 + n_bootstrap)
    return SteinDiscrepancy(
        ksd2=float(ksd2),
        stderr=float(stderr),
        p_value=float(p_value),
        n_samples=n,
        n_bootstrap=n_bootstrap,
    )
