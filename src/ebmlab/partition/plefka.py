"""Mean-field and TAP (Thouless-Anderson-Palmer) approximations of log Z for binary
pairwise models, by the Plefka expansion (Plefka 1982; Georges & Yedidia 1991).

For p(x) proportional to exp(sum_i b_i x_i + sum_(i,j) J_ij x_i x_j) on x in {0, 1}^n,
expanding the Gibbs free energy at fixed magnetisations m_i = <x_i> in powers of the
couplings gives, with v_i = m_i (1 - m_i) (Gabrié, Tramel & Krzakala 2015, eq. 5),

    log Z ~= max_m  S(m) + sum_i b_i m_i + sum_ij J_ij m_i m_j          (order 1)
                  + 1/2 sum_ij J_ij^2 v_i v_j                            (order 2)
                  + 2/3 sum_ij J_ij^3 v_i (1/2 - m_i) v_j (1/2 - m_j)    (order 3),

where S(m) = -sum_i [m_i log m_i + (1 - m_i) log(1 - m_i)]. Order 1 is naive mean
field, a lower bound on log Z; order 2 adds the Onsager reaction term (TAP), order 3
the next correction (the EMF of Gabrié et al.), which is complete at that order only
on graphs without triangles (RBMs, DBMs, sparse Boltzmann machines such as grids): a
triangle adds a J_ij J_jk J_ki term, so order 3 refuses a machine with one. The
truncations are neither bounds nor exact, but their error falls with the couplings'
size: as J^2, J^3 and J^4 for orders 1, 2 and 3. The magnetisations solve the stationarity condition
m_i = sigmoid(dU/dm_i), U the non-entropic terms, by damped parallel iteration from the
mean-field solution of the fields alone.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.convergence import warn_unconverged, working_tol
from ebmlab.energies.boltzmann import bernoulli_entropy
from ebmlab.partition.estimate import LogZEstimate
from ebmlab.partition.variational import pairwise_potentials

if TYPE_CHECKING:
    from ebmlab.energies.boltzmann import BernoulliRBM, BoltzmannMachine, DeepBoltzmannMachine

ORDERS = (1, 2, 3)


def plefka_free_energy(
    m: torch.Tensor, fields: torch.Tensor, couplings: torch.Tensor, edges: torch.Tensor, order: int
) -> torch.Tensor:
    """S(m) + U(m), the negative Gibbs free energy of the expansion to ``order`` at
    magnetisations m (..., n): (...). Its maximum over m is the estimate of log Z, and
    at that maximum its gradient in the fields and couplings is the estimate's
    (Gabrié, Tramel & Krzakala 2015, eq. 7), so autograd through it with m held fixed
    gives the gradient of the approximate log Z.

    Args:
        edges: the couplings' index pairs (E, 2).
    """
    return bernoulli_entropy(m) + _interaction(m, fields, couplings, edges, order)


def _interaction(
    m: torch.Tensor, fields: torch.Tensor, couplings: torch.Tensor, edges: torch.Tensor, order: int
) -> torch.Tensor:
    """U(m): the terms of the expansion besides the entropy, up to ``order``, for
    magnetisations (..., n) -> (...)."""
    i, j = edges[:, 0], edges[:, 1]
    value = m @ fields + (couplings * m[..., i] * m[..., j]).sum(-1)
    if order >= 2:
        v = m * (1 - m)
        value = value + 0.5 * (couplings**2 * v[..., i] * v[..., j]).sum(-1)
    if order >= 3:
        w = m * (1 - m) * (0.5 - m)
        value = value + (2.0 / 3.0) * (couplings**3 * w[..., i] * w[..., j]).sum(-1)
    return value


def _has_triangle(edges: torch.Tensor) -> bool:
    """Whether some three sites of the graph ``edges`` (E, 2) are coupled in a cycle."""
    neighbours: dict[int, set[int]] = {}
    pairs = edges.tolist()
    for i, j in pairs:
        neighbours.setdefault(i, set()).add(j)
        neighbours.setdefault(j, set()).add(i)
    return any(neighbours[i] & neighbours[j] for i, j in pairs)


def check_order(model, edges: torch.Tensor, order: int) -> int:
    """Return ``order`` if the expansion to it is complete on ``model``'s graph: order 3
    is refused on a Boltzmann machine with a triangle (an RBM, bipartite, has none)."""
    from ebmlab.energies.boltzmann import BoltzmannMachine

    _checks.one_of("order", order, ORDERS)
    if order == 3 and isinstance(model, BoltzmannMachine) and _has_triangle(edges):
        raise ArgumentError(
            "order 3 needs a graph without triangles (its triangle terms are not part of "
            "this expansion); this Boltzmann machine has couplings around a triangle: use "
            "order 2, or bethe_log_partition"
        )
    return order


def plefka_magnetisations(
    fields: torch.Tensor,
    couplings: torch.Tensor,
    edges: torch.Tensor,
    order: int = 2,
    *,
    init: torch.Tensor | None = None,
    damping: float = 0.5,
    max_iter: int = 2000,
    tol: float = 1e-10,
) -> tuple[torch.Tensor, dict]:
    """Stationary magnetisations of the order-``order`` free energy, by damped iteration
    of m = sigmoid(dU/dm) from ``init`` (n,) or a batch of starts (P, n) (default: the
    mean field of the fields alone), and a report (iterations, last change, converged).
    ``tol=0`` runs exactly ``max_iter`` iterations without reading the change back;
    otherwise ``tol`` is raised to the dtype's resolution
    (:func:`ebmlab.convergence.working_tol`) and a
    :class:`~ebmlab.convergence.ConvergenceWarning` says when it was not met.

    Args:
        couplings: coupling per edge (E,).
        edges: the couplings' index pairs (E, 2).
        damping: weight of the previous iterate in each update, in [0, 1).
    """
    m = torch.sigmoid(fields) if init is None else init
    # magnetisations lie in [0, 1]: the dtype resolves changes down to its epsilon
    limit = working_tol(tol, m.dtype) if tol > 0 else 0.0
    change, iterations = float("inf"), 0
    while iterations < max_iter and change >= limit:
        iterations += 1
        with torch.enable_grad():
            mg = m.detach().requires_grad_(True)
            energy = _interaction(mg, fields, couplings, edges, order).sum()
            (grad,) = torch.autograd.grad(energy, mg)
        new = damping * m + (1 - damping) * torch.sigmoid(grad)
        if tol > 0:
            change = float((new - m).abs().max())
        m = new
    converged = change < limit
    if tol > 0 and not converged:
        warn_unconverged(f"order-{order} Plefka iteration", iterations, change, limit)
    return m, {"iterations": iterations, "max_change": change, "tol": limit,
               "converged": converged}  # fmt: skip


def plefka_log_partition(
    model: BoltzmannMachine | BernoulliRBM | DeepBoltzmannMachine,
    order: int = 2,
    *,
    damping: float = 0.5,
    max_iter: int = 2000,
    tol: float = 1e-10,
) -> LogZEstimate:
    """log Z of a Boltzmann machine or Bernoulli RBM by the Plefka expansion to ``order``:
    1 naive mean field (a lower bound, carried in ``lower``), 2 TAP, 3 the third-order
    (EMF) free energy of Gabrié, Tramel & Krzakala (2015).

    Args:
        model: a :class:`~ebmlab.energies.BoltzmannMachine`,
            :class:`~ebmlab.energies.BernoulliRBM` or
            :class:`~ebmlab.energies.DeepBoltzmannMachine` (through its bipartite view).
        order: 1, 2 or 3.
        damping: weight of the previous magnetisations in each update, in [0, 1).
        max_iter: iteration limit.
        tol: the largest change of a magnetisation at convergence.

    Returns:
        The estimate; ``cost`` reports the iterations and whether they converged.
    """
    _checks.finite_parameters("model", model)
    from ebmlab.energies.boltzmann import DeepBoltzmannMachine

    _checks.one_of("order", order, ORDERS)
    _checks.probability("damping", damping)
    if damping >= 1:
        raise ArgumentError(f"damping must be below 1, got {damping}")
    _checks.positive_int("max_iter", max_iter)
    start = time.perf_counter()
    graph = model.as_rbm() if isinstance(model, DeepBoltzmannMachine) else model
    theta_i, theta_ij, edges = pairwise_potentials(graph, drop_zero=True)
    check_order(model, edges, order)
    fields, couplings = theta_i[:, 1] - theta_i[:, 0], theta_ij[:, 1, 1]
    with torch.no_grad():
        m, report = plefka_magnetisations(
            fields, couplings, edges, order, damping=damping, max_iter=max_iter, tol=tol
        )
        value = float(plefka_free_energy(m, fields, couplings, edges, order))
    cost = {**report, "seconds": time.perf_counter() - start}
    method = {1: "mean_field", 2: "tap", 3: "tap3"}[order]
    lower = value if order == 1 else -float("inf")
    return LogZEstimate(log_z=value, lower=lower, method=method, cost=cost)
