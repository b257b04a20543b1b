"""Inference over continuous answers by gradient descent on E(W, Y, X) with restarts.

``energy(y)`` maps answers (B, *shape) to energies (B,) for fixed inputs (bind x
in a closure). Each restart starts from ``y0`` plus Gaussian noise; the best
end point per row is returned. :func:`most_offending_continuous` constrains the
search to ||Y - Y^i|| > eps by projecting onto the sphere of radius eps around
Y^i whenever an iterate falls inside it. Restarts that diverge are discarded.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ebmlab import _checks
from ebmlab.energies.base import energy_and_grad


def _descend(
    energy: Callable[[torch.Tensor], torch.Tensor],
    y0: torch.Tensor,
    steps: int,
    lr: float,
    restarts: int,
    init_scale: float,
    generator: torch.Generator | None,
    project: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    _checks.tensor("y0", y0, min_ndim=2, floating=True)
    _checks.positive_int("steps", steps)
    _checks.positive("lr", lr)
    _checks.positive_int("restarts", restarts)
    generator = _checks.generator("generator", generator, y0.device)
    b = y0.shape[0]
    y = y0.repeat(restarts, *([1] * (y0.ndim - 1)))
    if restarts > 1 or init_scale:
        noise = torch.randn(y.shape, generator=generator, dtype=y.dtype, device=y.device)
        noise[:b] = 0  # the first restart starts exactly at y0
        y = y + init_scale * noise
    if project is not None:
        y = project(y)
    for _ in range(steps):
        _, g = energy_and_grad(energy, y)
        y = y - lr * g
        if project is not None:
            y = project(y)
    with torch.no_grad():
        e = energy(y).view(restarts, b)
    # a restart that diverged (non-finite energy) never wins
    best = torch.where(torch.isfinite(e), e, torch.inf).argmin(0)
    columns = torch.arange(b, device=y.device)
    return y[best * b + columns], e[best, columns]


def gradient_argmin(
    energy: Callable[[torch.Tensor], torch.Tensor],
    y0: torch.Tensor,
    *,
    steps: int = 100,
    lr: float = 0.1,
    restarts: int = 1,
    init_scale: float = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Approximate argmin_Y E(Y): returns (answers (B, ...), their energies (B,)).

    Args:
        energy: E(Y), a callable (B, ...) -> (B,).
        y0: starting answers (B, ...).
        steps: gradient steps per restart.
        lr: step size of the gradient descent.
        restarts: independent starts, the first at y0 and the others at y0 plus
            Gaussian noise of standard deviation ``init_scale``; the lowest energy wins.
        init_scale: see ``restarts``.
        generator: source of the restarts' noise, on y0's device.
    """
    return _descend(energy, y0, steps, lr, restarts, init_scale, generator)


def most_offending_continuous(
    energy: Callable[[torch.Tensor], torch.Tensor],
    y_target: torch.Tensor,
    eps: float,
    *,
    steps: int = 100,
    lr: float = 0.1,
    restarts: int = 4,
    init_scale: float = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Approximate Ybar = argmin over ||Y - Y^i|| > eps of E(Y) by projected gradient descent.

    ``y_target`` holds the correct answers Y^i (B, ...); ``energy``, ``steps``, ``lr``,
    ``restarts``, ``init_scale`` and ``generator`` are as in :func:`gradient_argmin`,
    the restarts starting around Y^i. Returns (answers (B, ...), their energies (B,)).
    """
    _checks.positive("eps", eps)
    margin = eps * (1 + 1e-4)

    def project(y: torch.Tensor) -> torch.Tensor:
        centre = y_target.repeat(y.shape[0] // y_target.shape[0], *([1] * (y.ndim - 1)))
        d = y - centre
        norm = d.flatten(1).norm(dim=1).view(-1, *([1] * (y.ndim - 1)))
        direction = torch.where(
            norm > 0, d / norm.clamp_min(1e-12), torch.ones_like(d) / d[0].numel() ** 0.5
        )
        return torch.where(norm > margin, y, centre + margin * direction)

    start = y_target + eps * 2
    return _descend(energy, start, steps, lr, restarts, init_scale, generator, project)
