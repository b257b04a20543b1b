"""Inference over a finite set of answers: Y* = argmin_Y E(W, Y, X) (LeCun et al. 2006, §1).

With K candidate answers the energies of all of them form a (B, K) table; the
answer is its row-wise argmin, and the most offending incorrect answer is the
lowest-energy answer at distance more than ``eps`` from the correct one.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ebmlab import _checks
from ebmlab._checks import ArgumentError


def candidate_energies(
    energy: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    candidates: torch.Tensor,
) -> torch.Tensor:
    """E(x_b, y_k) for every input and candidate, (B, K), in one call of ``energy(x, y)``.

    Args:
        candidates: the K answers to score, (K, ...).
    """
    _checks.tensor("x", x, min_ndim=1)
    _checks.tensor("candidates", candidates, min_ndim=1)
    b, k = x.shape[0], candidates.shape[0]
    xs = x.repeat_interleave(k, 0)
    ys = candidates.repeat(b, *([1] * (candidates.ndim - 1)))
    return energy(xs, ys).view(b, k)


def argmin_answer(energies: torch.Tensor) -> torch.Tensor:
    """Index of the lowest-energy answer per row of a (B, K) table.

    Args:
        energies: E(W, Y, X^i) of every answer, (B, K).
    """
    _checks.tensor("energies", energies, ndim=2)
    return energies.argmin(1)


def most_offending(
    energies: torch.Tensor,
    target: torch.Tensor,
    *,
    distances: torch.Tensor | None = None,
    eps: float = 0.0,
) -> torch.Tensor:
    """Ybar^i = argmin over answers y with d(y, Y^i) > eps of E(y), per row.

    ``distances`` (K, K) gives d between answers (default: 0 on the diagonal, 1 off
    it, so every other answer qualifies). Raises if some row has no answer farther
    than ``eps``.

    Args:
        energies: E(W, Y, X^i) of every answer, (B, K).
        target: the index of each example's correct answer, (B,) integers in [0, K).
    """
    _checks.tensor("energies", energies, ndim=2)
    _checks.positive("eps", eps, allow_zero=True)
    k = energies.shape[1]
    if distances is None:
        distances = 1.0 - torch.eye(k, dtype=energies.dtype, device=energies.device)
    if distances.shape != (k, k):
        raise ArgumentError(f"distances must have shape ({k}, {k}), got {tuple(distances.shape)}")
    allowed = distances[target.long()] > eps  # (B, K)
    if not allowed.any(1).all():
        raise ArgumentError(f"some target has no answer at distance > eps={eps}")
    masked = energies.masked_fill(~allowed, torch.inf)
    return masked.argmin(1)
