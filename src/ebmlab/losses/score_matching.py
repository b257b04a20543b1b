"""Score matching: fit the score -grad_x E to the data's, with no partition function.

Hyvarinen (2005) showed that the Fisher divergence between data and model equals,
up to a constant,

    J(theta) = E_data[ 1/2 |grad_x E(x)|^2 - tr(grad_x^2 E(x)) ],

(the score of p = exp(-E)/Z is -grad_x E). :func:`score_matching_loss` computes the
Hessian trace exactly (one extra backward pass per dimension: for low dimensions);
:func:`sliced_score_matching_loss` (Song et al. 2019) replaces it by random
projections, E_v[-v^T grad^2 E v + 1/2 (v^T grad E)^2], at the cost of one
Hessian-vector product; :func:`denoising_score_matching_loss` (Vincent 2011) matches
the score of the data convolved with N(0, sigma^2 I), whose target at
x~ = x + sigma eps is -eps / sigma, for one or several noise levels (weighted by
sigma^2, Song & Ermon 2019). Each returns (loss, metrics).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.energies.base import EnergyLike, as_energy_fn
from ebmlab.samplers.integrators import gaussian_noise


def _input_and_grad(energy: EnergyLike, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x as a leaf requiring grad, grad_x E(x) with its graph kept for second derivatives)."""
    fn = as_energy_fn(energy)
    xg = x.detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(fn(xg).sum(), xg, create_graph=True)
    return xg, grad


def score_matching_loss(
    energy: EnergyLike, x: torch.Tensor
) -> tuple[torch.Tensor, dict[str, float]]:
    """Exact score matching, J = mean(1/2 |grad E|^2 - tr grad^2 E), for flat x (B, D).

    Args:
        energy: E, a callable (B, D) -> (B,), twice differentiable.
    """
    _checks.tensor("x", x, ndim=2, floating=True, finite=True)
    xg, grad = _input_and_grad(energy, x)
    trace = x.new_zeros(x.shape[0])
    for i in range(x.shape[1]):
        (row,) = torch.autograd.grad(grad[:, i].sum(), xg, create_graph=True)
        trace = trace + row[:, i]
    loss = (0.5 * (grad**2).sum(1) - trace).mean()
    return loss, {"score_norm": float(grad.detach().norm(dim=1).mean())}


def sliced_score_matching_loss(
    energy: EnergyLike,
    x: torch.Tensor,
    *,
    n_projections: int = 1,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Sliced score matching with Rademacher projections v: mean(-v^T H v + 1/2 (v^T grad E)^2).

    Args:
        energy: E, a callable (B, ...) -> (B,), twice differentiable.
        x: training examples (B, ...).
        n_projections: random projections per example.
        generator: source of randomness, a ``torch.Generator`` on the data's device
            (``None``: the global one).
    """
    _checks.tensor("x", x, min_ndim=2, floating=True, finite=True)
    _checks.positive_int("n_projections", n_projections)
    xs = x.repeat(n_projections, *([1] * (x.ndim - 1)))
    xg, grad = _input_and_grad(energy, xs)
    v = torch.randint(0, 2, xs.shape, generator=generator, device=x.device).to(x.dtype) * 2 - 1
    gv = (grad * v).flatten(1).sum(1)
    (hv,) = torch.autograd.grad(gv.sum(), xg, create_graph=True)
    loss = (-(hv * v).flatten(1).sum(1) + 0.5 * gv**2).mean()
    return loss, {"score_norm": float(grad.detach().flatten(1).norm(dim=1).mean())}


def denoising_score_matching_loss(
    energy: EnergyLike,
    x: torch.Tensor,
    sigmas: float | Sequence[float] = 0.1,
    *,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Denoising score matching: mean of sigma^2 / 2 |-grad E(x~) + eps / sigma|^2 over levels.

    One noise level gives Vincent's estimator for the sigma-smoothed density; several
    (e.g. a geometric ladder) give the noise-conditional objective of Song & Ermon 2019,
    each level drawn uniformly per example. The energy must then accept the noisy input
    only; a noise-conditional energy would take sigma too.

    Args:
        sigmas: one noise standard deviation, or several levels.
        generator: source of randomness, a ``torch.Generator`` on the data's device
            (``None``: the global one).
    """
    _checks.tensor("x", x, min_ndim=2, floating=True, finite=True)
    levels = torch.as_tensor(
        [sigmas] if isinstance(sigmas, int | float) else list(sigmas), dtype=x.dtype
    )
    if levels.ndim != 1 or len(levels) == 0 or (levels <= 0).any():
        raise ArgumentError(
            f"sigmas must be a positive number or a non-empty sequence of them, got {sigmas!r}"
        )
    pick = torch.randint(len(levels), (x.shape[0],), generator=generator, device=x.device)
    sigma = levels.to(x.device)[pick].view(-1, *([1] * (x.ndim - 1)))
    eps = gaussian_noise(x, generator)
    _, grad = _input_and_grad(energy, x + sigma * eps)
    residual = (-grad + eps / sigma) * sigma  # sigma * (model score - target score)
    loss = 0.5 * (residual**2).flatten(1).sum(1).mean()
    return loss, {"score_norm": float(grad.detach().flatten(1).norm(dim=1).mean())}
