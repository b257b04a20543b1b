"""Variational and perturbation bounds on log Z for pairwise binary models (BM, RBM).

A Boltzmann machine or RBM is a pairwise Markov random field on binary variables:
p(x) proportional to exp(sum_i theta_i(x_i) + sum_(i,j) theta_ij(x_i, x_j)). Reweighted
belief propagation (Wainwright, Jaakkola & Willsky 2005) with edge appearance
probabilities rho_ij finds beliefs mu_i, mu_ij at which

    log Z ~= sum_i <theta_i, mu_i> + sum_ij <theta_ij, mu_ij>
             + sum_i H(mu_i) - sum_ij rho_ij I(mu_ij),

where H is the entropy and I the mutual information of an edge's belief.
With rho = 1 this is the Bethe approximation from loopy BP (Yedidia, Freeman & Weiss
2001). It is exact on trees, often close on weak couplings, and neither a lower nor
an upper bound in general. With rho from a distribution over spanning trees it is
tree-reweighted BP (TRW), whose optimum is a guaranteed upper bound on log Z.
ebmlab's models are complete or complete-bipartite graphs, which are edge-transitive,
so the uniform spanning-tree distribution gives every edge rho = (n - 1) / |E|.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

import torch

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.convergence import warn_unconverged, working_tol
from ebmlab.devices import wide_dtype, widen
from ebmlab.energies.boltzmann import ENUMERATION_LIMIT
from ebmlab.partition.estimate import LogZEstimate
from ebmlab.partition.graph_cut import max_attractive

if TYPE_CHECKING:
    from ebmlab.energies.boltzmann import BernoulliRBM, BoltzmannMachine

EULER_GAMMA = 0.5772156649015329


def pairwise_potentials(
    model, drop_zero: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(theta_i (n, 2), theta_ij (E, 2, 2), edges (E, 2)) of a BoltzmannMachine or
    BernoulliRBM, in float64 on the model's device (float32 where it has none); with
    ``drop_zero`` only the edges of non-zero couplings (a sparse model's graph)."""
    _checks.finite_parameters("model", model)
    from ebmlab.energies.boltzmann import BernoulliRBM, BoltzmannMachine

    with torch.no_grad():
        if isinstance(model, BoltzmannMachine):
            n = model.n_visible
            bias = widen(model.b.detach())
            edges = torch.triu_indices(n, n, offset=1, device=bias.device).T
            coupling = (
                2 * widen(model.W.detach())[edges[:, 0], edges[:, 1]]
            )  # x^T W x counts a pair twice
        elif isinstance(model, BernoulliRBM):
            d, m = model.n_visible, model.n_hidden
            n = d + m
            bias = widen(torch.cat([model.b.detach(), model.c.detach()]))
            vi, hj = torch.meshgrid(
                torch.arange(d, device=bias.device),
                torch.arange(m, device=bias.device),
                indexing="ij",
            )
            edges = torch.stack([vi.reshape(-1), d + hj.reshape(-1)], 1)
            coupling = widen(model.W.detach()).reshape(-1)
        else:
            raise ArgumentError(
                f"model must be a BoltzmannMachine or BernoulliRBM, got {type(model).__name__}"
            )
        if drop_zero:
            keep = coupling != 0
            edges, coupling = edges[keep], coupling[keep]
    theta_i = bias.new_zeros(n, 2)
    theta_i[:, 1] = bias
    theta_ij = bias.new_zeros(len(edges), 2, 2)
    theta_ij[:, 1, 1] = coupling
    return theta_i, theta_ij, edges


def _incoming(dst: torch.Tensor, n: int) -> torch.Tensor:
    """For each of ``n`` nodes, the indices of the directed edges that end there
    (``dst``: each edge's end), padded with ``len(dst)`` to the largest in-degree: a
    message sum over this table adds in a fixed order on every device, where CUDA's
    ``index_add_`` adds by atomics in an order that changes from run to run."""
    order = torch.argsort(dst, stable=True)
    counts = torch.bincount(dst, minlength=n)
    width = int(counts.max()) if len(dst) else 0
    slot = torch.arange(width, device=dst.device)
    at = (counts.cumsum(0) - counts)[:, None] + slot
    return torch.where(slot < counts[:, None], order[at.clamp(max=max(len(dst) - 1, 0))], len(dst))


def _node_sums(messages: torch.Tensor, incoming: torch.Tensor) -> torch.Tensor:
    """Per node, the sum of ``messages`` (edges, 2) over its :func:`_incoming` edges."""
    return torch.cat([messages, messages.new_zeros(1, 2)])[incoming].sum(1)


def reweighted_bp(
    theta_i: torch.Tensor,
    theta_ij: torch.Tensor,
    edges: torch.Tensor,
    rho: float,
    *,
    damping: float = 0.5,
    max_iter: int = 1000,
    tol: float = 1e-8,
) -> tuple[float, dict]:
    """Reweighted BP with damped parallel updates in log space; returns (log Z, report).
    The report holds the iterations, the last change, the tolerance used (``tol`` raised
    to the dtype's resolution, :func:`ebmlab.convergence.working_tol`) and whether it
    was met; a :class:`~ebmlab.convergence.ConvergenceWarning` says when it was not.

    Args:
        damping: weight of the previous iterate in each update, in [0, 1).
        max_iter: most iterations before giving up on convergence.
        tol: convergence tolerance on the largest change of an iteration.
    """
    _checks.probability("damping", damping)
    _checks.positive_int("max_iter", max_iter)
    n, n_edges = theta_i.shape[0], edges.shape[0]
    src = torch.cat([edges[:, 0], edges[:, 1]])  # directed edge e: src -> dst
    dst = torch.cat([edges[:, 1], edges[:, 0]])
    # pairwise potential as seen from (x_src, x_dst)
    pair = torch.cat([theta_ij, theta_ij.transpose(1, 2)]) / rho
    index = torch.arange(n_edges, device=theta_i.device)
    reverse = torch.cat([index + n_edges, index])
    log_m = theta_i.new_zeros(2 * n_edges, 2)  # log m_{src -> dst}(x_dst)
    incoming = _incoming(dst, n)
    change, iterations, limit = float("inf"), 0, tol
    while iterations < max_iter and change >= limit:
        iterations += 1
        s = _node_sums(rho * log_m, incoming)
        # exponent over (x_src, x_dst): theta_src + S_src - log m_{dst -> src}(x_src) + pair
        pre = (theta_i[src] + s[src] - log_m[reverse])[:, :, None] + pair
        new = torch.logsumexp(pre, 1)
        new = new - new.logsumexp(1, keepdim=True)
        new = (1 - damping) * new + damping * log_m
        change, scale = torch.stack([(new - log_m).abs().max(), new.abs().max()]).tolist()
        limit = working_tol(tol, new.dtype, scale)
        log_m = new
    converged = change < limit
    if not converged:
        warn_unconverged("reweighted belief propagation", iterations, change, limit)
    s = _node_sums(rho * log_m, incoming)
    log_node = theta_i + s
    mu_i = torch.softmax(log_node, 1)
    a, b = edges[:, 0], edges[:, 1]
    log_edge = (
        (log_node[a] - log_m[n_edges + index])[:, :, None]
        + (log_node[b] - log_m[index])[:, None, :]
        + theta_ij / rho
    )
    mu_ij = torch.softmax(log_edge.reshape(n_edges, 4), 1).reshape(n_edges, 2, 2)
    # x log x with 0 log 0 = 0 in any dtype (a belief that underflows to 0 in float32)
    xlogy = torch.special.xlogy
    entropy = -xlogy(mu_i, mu_i).sum()
    outer = mu_i[a][:, :, None] * mu_i[b][:, None, :]
    mutual = (xlogy(mu_ij, mu_ij) - xlogy(mu_ij, outer)).sum()
    energy_term = (mu_i * theta_i).sum() + (mu_ij * theta_ij).sum()
    value = float(energy_term + entropy - rho * mutual)
    report = {"iterations": iterations, "max_message_change": change, "tol": limit,
              "converged": converged}  # fmt: skip
    return value, report


def _estimate(model, rho_fn, method: str, **options) -> LogZEstimate:
    start = time.perf_counter()
    theta_i, theta_ij, edges = pairwise_potentials(model)
    rho = rho_fn(theta_i.shape[0], edges.shape[0])
    value, report = reweighted_bp(theta_i, theta_ij, edges, rho, **options)
    cost = {**report, "edge_appearance": rho, "seconds": time.perf_counter() - start}
    upper = value if method == "trw" and report["converged"] else float("inf")
    return LogZEstimate(log_z=value, upper=upper, method=method, cost=cost)


def bethe_log_partition(
    model: BoltzmannMachine | BernoulliRBM,
    *,
    damping: float = 0.5,
    max_iter: int = 1000,
    tol: float = 1e-8,
) -> LogZEstimate:
    """Bethe approximation of log Z by damped loopy belief propagation; ``cost`` reports
    iterations, the last message change and convergence.

    Args:
        model: a Boltzmann machine or Bernoulli RBM.
        damping: weight of the previous iterate in each update, in [0, 1).
        max_iter: most iterations before giving up on convergence.
        tol: convergence tolerance on the largest change of an iteration.
    """
    return _estimate(model, lambda n, e: 1.0, "bethe", damping=damping, max_iter=max_iter, tol=tol)


def trw_log_partition(
    model: BoltzmannMachine | BernoulliRBM,
    *,
    damping: float = 0.5,
    max_iter: int = 2000,
    tol: float = 1e-8,
) -> LogZEstimate:
    """Tree-reweighted upper bound on log Z (uniform spanning trees, rho = (n - 1) / |E|).

    ``upper`` carries the bound when the messages converged to the working dtype's
    resolution (otherwise infinity, with a
    :class:`~ebmlab.convergence.ConvergenceWarning`: the value is then an
    approximation, not a guarantee).

    Args:
        model: a Boltzmann machine or Bernoulli RBM.
        damping: weight of the previous iterate in each update, in [0, 1).
        max_iter: most iterations before giving up on convergence.
        tol: convergence tolerance on the largest change of an iteration.
    """
    return _estimate(
        model,
        lambda n, e: min(1.0, (n - 1) / e),
        "trw",
        damping=damping,
        max_iter=max_iter,
        tol=tol,
    )


def _gumbel(
    shape: tuple[int, ...], gen: torch.Generator | None, device: torch.device
) -> torch.Tensor:
    """Zero-mean Gumbel noise (standard Gumbel minus Euler's constant) on ``device``, in
    its :func:`~ebmlab.devices.wide_dtype`."""
    dtype = wide_dtype(device)
    u = torch.rand(shape, generator=gen, dtype=dtype, device=device)
    u = u.clamp(torch.finfo(dtype).tiny, 1.0)
    return -torch.log(-torch.log(u)) - EULER_GAMMA


# states of the enumerated layer scored at once in perturbed MAP (memory: samples x chunk
# x the other layer's width)
MAP_CHUNK = 1024


def perturbed_map(
    model: BoltzmannMachine | BernoulliRBM,
    n_samples: int,
    generator: torch.Generator | None,
    perturbation: str = "unit",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact MAP states of ``n_samples`` Gumbel-perturbed copies of a Boltzmann machine or
    Bernoulli RBM.

    With ``perturbation="unit"`` (first order) each unit's two states get independent
    standard Gumbel noise, and max_x (-E(x) + sum_i gamma_i(x_i)) is found by enumeration
    (a Boltzmann machine's 2^D states; an RBM's smaller layer, the other layer's maximum
    being separable in closed form given it), in chunks of ``MAP_CHUNK`` states, or, for a
    model too wide to enumerate whose couplings are all non-negative, by a minimum cut
    (:func:`ebmlab.partition.graph_cut.max_attractive`; the noise only moves the fields,
    so every perturbed copy stays attractive). The mean maximum bounds log Z from above
    (Hazan & Jaakkola 2012), and the states are not exact samples.

    With ``perturbation="joint"`` every configuration of the enumerated units gets its own
    Gumbel noise: the Gumbel-max trick (Papandreou & Yuille 2011), so the states
    are exact draws from the model and the maxima average to log Z itself. An RBM's other
    layer is summed out first (the enumerated layer's marginal -F(h) = c.h +
    sum_i softplus(b_i + W_i. h)) and then drawn given the winner with one Gumbel pair
    per unit, which is exact as its units are conditionally independent. Enumeration
    only: at most ``ENUMERATION_LIMIT`` units (the smaller layer of an RBM).

    Args:
        perturbation: ``"unit"`` (noise on each unit's two states) or ``"joint"`` (noise
            on each configuration of the enumerated units).
        generator: source of randomness, a ``torch.Generator`` on the data's device
            (``None``: the global one).

    Returns:
        (the maxima (n_samples,), the maximising states (n_samples, D) of a Boltzmann
        machine or (n_samples, D + M), visible then hidden, of an RBM), in float64
        (float32 on a device without it).
    """
    from ebmlab.energies.boltzmann import BernoulliRBM, BoltzmannMachine, binary_states

    if not isinstance(model, BernoulliRBM | BoltzmannMachine):
        raise ArgumentError(
            f"model must be a BoltzmannMachine or BernoulliRBM, got {type(model).__name__}"
        )
    joint = check_perturbation(model, perturbation) == "joint"
    device = model.b.device
    if _map_width(model) > ENUMERATION_LIMIT:
        return _perturbed_cuts(model, n_samples, generator)
    with torch.no_grad():
        if isinstance(model, BoltzmannMachine):
            d = model.n_visible
            states = widen(binary_states(d, device=device))
            neg_energy = widen(-model.energy(states.to(model.b.dtype)))
            if joint:
                maxima, best = (
                    neg_energy[None] + _gumbel((n_samples, len(states)), generator, device)
                ).max(1)
                return maxima, states[best]
            g = _gumbel((n_samples, d, 2), generator, device)
            scores = (
                neg_energy[None]
                + g[:, :, 0].sum(1, keepdim=True)
                + (g[:, :, 1] - g[:, :, 0]) @ states.T
            )
            maxima, best = scores.max(1)
            return maxima, states[best]
        W, b, c = (widen(p.detach()) for p in (model.W, model.b, model.c))
        swapped = W.shape[1] > W.shape[0]
        if swapped:  # enumerate the visible layer instead of the hidden one
            W, b, c = W.T, c, b
        g_outer = _gumbel((n_samples, W.shape[0], 2), generator, device)  # the summed layer's
        outer_shift = g_outer[:, :, 1] - g_outer[:, :, 0]
        if not joint:
            g_inner = _gumbel((n_samples, W.shape[1], 2), generator, device)  # enumerated
        maxima = torch.full((n_samples,), -math.inf, dtype=W.dtype, device=device)
        best = torch.zeros(n_samples, W.shape[1], dtype=W.dtype, device=device)
        n_states = 2 ** W.shape[1]
        for lo in range(0, n_states, MAP_CHUNK):
            states = binary_states(W.shape[1], lo, min(lo + MAP_CHUNK, n_states), device)
            states = states.to(W.dtype)
            field = b + states @ W.T
            if joint:  # the marginal of the enumerated layer, plus noise per configuration
                marginal = torch.nn.functional.softplus(field).sum(1) + states @ c
                scores = marginal[None] + _gumbel((n_samples, len(states)), generator, device)
            else:  # -E = b.v + c.h + v W h; given h the best v_i is 1 iff its field is > 0
                scores = (
                    torch.relu(field[None] + outer_shift[:, None, :]).sum(2)
                    + (states @ c)[None]
                    + (g_inner[:, :, 1] - g_inner[:, :, 0]) @ states.T
                )
            chunk_max, chunk_arg = scores.max(1)
            better = chunk_max > maxima
            maxima = torch.where(better, chunk_max, maxima)
            best = torch.where(better[:, None], states[chunk_arg], best)
        if not joint:
            maxima = maxima + g_outer[:, :, 0].sum(1) + g_inner[:, :, 0].sum(1)
        outer_states = ((b + best @ W.T + outer_shift) > 0).to(W.dtype)
        visible, hidden = (best, outer_states) if swapped else (outer_states, best)
        return maxima, torch.cat([visible, hidden], 1)


def check_perturbation(model, perturbation: str) -> str:
    """``perturbation`` if it is ``"unit"``, or ``"joint"`` on a model narrow enough to
    enumerate (see :func:`perturbed_map`)."""
    _checks.one_of("perturbation", perturbation, ("unit", "joint"))
    if perturbation == "joint" and _map_width(model) > ENUMERATION_LIMIT:
        raise ArgumentError(
            f"perturbation='joint' enumerates at most {ENUMERATION_LIMIT} units (the "
            f"smaller layer of an RBM), got {_map_width(model)}; perturbation='unit' "
            "reaches wider attractive models by graph cuts"
        )
    return perturbation


def _map_width(model) -> int:
    """The units exact MAP by enumeration would have to enumerate."""
    from ebmlab.energies.boltzmann import BoltzmannMachine

    return model.n_visible if isinstance(model, BoltzmannMachine) else min(model.W.shape)


def _perturbed_cuts(
    model, n_samples: int, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`perturbed_map` by one minimum cut per perturbed copy, for attractive models
    too wide to enumerate."""
    theta_i, theta_ij, edges = pairwise_potentials(model, drop_zero=True)
    fields, couplings = theta_i[:, 1], theta_ij[:, 1, 1]
    if (couplings < 0).any():
        raise ArgumentError(
            f"exact MAP enumerates at most {ENUMERATION_LIMIT} units (of the smaller layer "
            "of an RBM); beyond that it uses graph cuts, which need non-negative couplings, "
            f"but the smallest is {float(couplings.min()):.4g}"
        )
    g = _gumbel((n_samples, len(fields), 2), generator, fields.device)
    shift = g[:, :, 1] - g[:, :, 0]
    states = torch.stack([max_attractive(fields + row, couplings, edges) for row in shift])
    i, j = edges[:, 0], edges[:, 1]
    pairs = (couplings * states[:, i] * states[:, j]).sum(1)
    maxima = states @ fields + pairs + (shift * states).sum(1) + g[:, :, 0].sum(1)
    return maxima, states


def perturb_and_map_log_partition(
    model: BoltzmannMachine | BernoulliRBM,
    *,
    n_samples: int = 200,
    generator: torch.Generator | int | None = None,
) -> LogZEstimate:
    """Upper bound on log Z by Gumbel perturbations and MAP (Hazan & Jaakkola 2012).

    With independent zero-mean Gumbel noise gamma_i(x_i) on every variable's two states,
    log Z <= E[max_x (-E(x) + sum_i gamma_i(x_i))]; the expectation is estimated from
    ``n_samples`` perturbations (:func:`perturbed_map`) and reported with its standard
    error.

    Args:
        model: a Boltzmann machine or Bernoulli RBM small enough for exact MAP.
        generator: source of randomness, a ``torch.Generator`` on the data's device
            (``None``: the global one).
    """
    _checks.finite_parameters("model", model)
    _checks.positive_int("n_samples", n_samples)
    gen = _checks.generator("generator", generator, model.b.device)
    start = time.perf_counter()
    maxima, _ = perturbed_map(model, n_samples, gen)
    cost = {
        "n_samples": n_samples,
        "map_solver": "enumeration" if _map_width(model) <= ENUMERATION_LIMIT else "graph cut",
        "seconds": time.perf_counter() - start,
    }
    return LogZEstimate(
        log_z=float(maxima.mean()),
        stderr=float(maxima.std() / n_samples**0.5),
        method="perturb_and_map",
        cost=cost,
        dof=n_samples - 1,
    )
