"""Couplings of a noise batch with a data batch, the pairs flow matching interpolates.

Conditional flow matching (Lipman et al. 2023; Tong et al. 2024) regresses a field on
the velocity x1 - x0 of pairs (x0, x1) drawn from a coupling of the noise and the data.
Pairs drawn independently give the plain objective; pairs from a minibatch optimal
transport plan for the squared Euclidean cost (Tong et al. 2024, section 3.2; Pooladian
et al. 2023) give straighter, non-crossing paths, fewer integration steps and the
warm-up of Energy Matching (Balcerak et al. 2025, eq. 5):

- :func:`independent_pairs`: the batches as given;
- :func:`ot_pairs`: the exact assignment (Hungarian algorithm, on the host: batches of a
  few hundred) or the entropic plan by log-domain Sinkhorn iterations (Cuturi 2013) on
  the batches' device, each data point drawing its noise partner from its column of the
  plan. With ``labels``, noise is paired only with data of the same class: the plan of
  each class within the batch, the conditional coupling of class-conditional flow
  matching (Chemseddine et al. 2025, couplings restricted to equal labels), so that
  the flow of class y carries noise to that class's data alone.

Each returns a :class:`Pairs`: the noise reordered to pair with the data, and the mean
squared distance of the pairs (the transport cost the coupling pays).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ebmlab import _checks
from ebmlab._checks import ArgumentError

EXACT_LIMIT = 1024  # the largest batch ot_pairs(method="auto") assigns exactly


@dataclass(frozen=True)
class Pairs:
    """Noise ``x0`` and data ``x1`` (B, ...) paired row by row, and ``cost``: the mean
    squared Euclidean distance between the rows of a pair."""

    x0: torch.Tensor
    x1: torch.Tensor
    cost: torch.Tensor


def _check_batches(x0: torch.Tensor, x1: torch.Tensor) -> None:
    _checks.tensor("x0", x0, min_ndim=2, floating=True)
    _checks.tensor("x1", x1, min_ndim=2, floating=True)
    if x0.shape != x1.shape:
        raise ArgumentError(
            f"x0 and x1 must have one shape (noise and data paired row by row), got "
            f"{tuple(x0.shape)} and {tuple(x1.shape)}"
        )


def _squared_distances(x0: torch.Tensor, x1: torch.Tensor) -> torch.Tensor:
    """|x0_i - x1_j|^2 (B, B), from flattened rows."""
    return torch.cdist(x0.flatten(1), x1.flatten(1)).square()


def _paired(x0: torch.Tensor, x1: torch.Tensor) -> Pairs:
    cost = (x0 - x1).flatten(1).square().sum(1).mean()
    return Pairs(x0, x1, cost)


def independent_pairs(x0: torch.Tensor, x1: torch.Tensor) -> Pairs:
    """The rows of ``x0`` and ``x1`` (B, ...) paired as they come (independent draws
    make an independent coupling)."""
    _check_batches(x0, x1)
    return _paired(x0, x1)


def ot_pairs(
    x0: torch.Tensor,
    x1: torch.Tensor,
    *,
    method: str = "auto",
    reg: float = 0.05,
    n_iter: int = 200,
    labels: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> Pairs:
    """The rows of ``x0`` reordered to pair with those of ``x1`` (B, ...) by a minibatch
    optimal transport plan for the squared Euclidean cost.

    Args:
        x0: noise (B, ...).
        x1: data (B, ...).
        method: ``"exact"`` (the optimal assignment, on the host), ``"sinkhorn"`` (the
            entropic plan, on the device) or ``"auto"`` (exact up to ``EXACT_LIMIT``
            rows).
        reg: the entropic regularisation of Sinkhorn, relative to the mean cost.
        n_iter: Sinkhorn iterations.
        labels: the data's classes (B,), if noise may pair only within a class: the
            noise row i takes the class of data row i (the noise is exchangeable, so
            each class gets as many noise rows as it has data rows), and pairs across
            classes cost infinity.
        generator: source of the draws from the entropic plan, on the data's device.
    """
    _check_batches(x0, x1)
    if method not in ("auto", "exact", "sinkhorn"):
        raise ArgumentError(f"method must be 'auto', 'exact' or 'sinkhorn', got {method!r}")
    _checks.positive("reg", reg)
    _checks.positive_int("n_iter", n_iter)
    cost = _squared_distances(x0, x1)
    if labels is not None:
        if labels.shape != (len(x1),) or labels.is_floating_point():
            raise ArgumentError(
                f"labels must be integer classes, one per row of x1: shape ({len(x1)},), got "
                f"{labels.dtype} of shape {tuple(labels.shape)}"
            )
        labels = labels.to(cost.device)
        cost = cost.masked_fill(labels[:, None] != labels[None, :], math.inf)
    if method == "exact" or (method == "auto" and len(x0) <= EXACT_LIMIT):
        from scipy.optimize import linear_sum_assignment

        rows, cols = linear_sum_assignment(cost.detach().cpu().double().numpy())
        order = torch.empty(len(x0), dtype=torch.long)
        order[torch.as_tensor(cols)] = torch.as_tensor(rows)
        return _paired(x0[order.to(x0.device)], x1)
    scale = float(cost[cost.isfinite()].mean())  # over the pairs the plan may make
    log_plan = sinkhorn_log_plan(cost, reg * scale, n_iter)
    # each data point (a column) draws its noise partner from its column of the plan
    partners = torch.multinomial(log_plan.T.softmax(1), 1, generator=generator).squeeze(1)
    return _paired(x0[partners], x1)


def sinkhorn_log_plan(cost: torch.Tensor, epsilon: float, n_iter: int) -> torch.Tensor:
    """log P of the entropic optimal transport plan between uniform marginals for the
    cost matrix (n, m): P = argmin <P, C> - epsilon H(P), by ``n_iter`` log-domain
    Sinkhorn iterations (Cuturi 2013; Peyre & Cuturi 2019, Alg. 4.1 in log form).

    Args:
        cost: the cost of moving row i to column j (n, m).
        epsilon: the entropic regularisation, in the cost's units.
        n_iter: alternating projections onto the two marginals.
    """
    _checks.positive("epsilon", epsilon)
    n, m = cost.shape
    log_a = torch.full((n,), -math.log(n), dtype=cost.dtype, device=cost.device)
    log_b = torch.full((m,), -math.log(m), dtype=cost.dtype, device=cost.device)
    kernel = -cost / epsilon
    f = torch.zeros_like(log_a)
    g = torch.zeros_like(log_b)
    for _ in range(n_iter):
        f = log_a - torch.logsumexp(kernel + g[None, :], dim=1)
        g = log_b - torch.logsumexp(kernel + f[:, None], dim=0)
    return kernel + f[:, None] + g[None, :]
