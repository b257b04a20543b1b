"""Exact log Z and marginals of pairwise discrete models by variable elimination.

A pairwise model over n sites with K states each has log-potentials

    log p~(x) = sum_i theta_i(x_i) + sum_{(i, j) in E} theta_ij(x_i, x_j),

and Z sums exp of that over all K^n configurations. Variable elimination (Koller &
Friedman 2009, §9.3) sums the sites out one at a time: eliminating site v combines
every factor that mentions v into one table over v and its neighbours and takes the
log-sum-exp over v, leaving a factor over the neighbours, which become connected. The
cost is K^(w + 1) per step, where the width w is the largest neighbourhood met along
the order; the greedy min-fill order (eliminate the site whose elimination adds the
fewest new edges) keeps w near the treewidth: 1 on chains and trees, the shorter side
on grids. Enumeration costs K^n instead.

Everything runs in log space with ``torch.logsumexp``, on the device of the
potentials, for a batch of models sharing one graph. Because log Z is computed by
differentiable operations, its gradient with respect to the potentials is the
vector of marginals: d log Z / d theta_i(k) = p(x_i = k) and
d log Z / d theta_ij(a, b) = p(x_i = a, x_j = b) (the moment-matching identity of
exponential families), which :func:`pairwise_marginals` returns.
"""

from __future__ import annotations

import torch

from ebmlab import _checks
from ebmlab._checks import ArgumentError

# The widest elimination accepted: a factor over MAX_ELIMINATION_WIDTH + 1 binary sites
# holds 2^23 entries (64 MB in float64 per model); wider orders are refused with a
# pointer to AIS.
MAX_ELIMINATION_WIDTH = 22


def elimination_order(n_sites: int, edges: torch.Tensor) -> tuple[list[int], int]:
    """An elimination order of the graph on ``n_sites`` sites with ``edges`` (E, 2), and its
    width (the most neighbours a site has when it is eliminated).

    Greedy heuristics each miss the best order on some graphs (min-fill turns a grid's
    frontier diagonal, which is longer than a row), so three are run and the narrowest
    kept: min-fill (fewest added edges; Koller & Friedman 2009, §9.4.3.2), min-degree,
    and the sites' own order, which is a grid's row-by-row sweep.
    """
    pairs = [(i, j) for i, j in edges.tolist() if i != j]
    rules = {
        "min-fill": lambda nb, u: (_fill(nb, u), len(nb[u]), u),
        "min-degree": lambda nb, u: (len(nb[u]), u),
        "given": lambda nb, u: (u,),
    }
    return min((_greedy(n_sites, pairs, rule) for rule in rules.values()), key=lambda r: r[1])


def _fill(neighbours: list[set[int]], v: int) -> int:
    """Edges eliminating v would add between its neighbours."""
    near = sorted(neighbours[v])
    return sum(1 for a, u in enumerate(near) for w in near[a + 1 :] if w not in neighbours[u])


def _greedy(n_sites: int, pairs: list[tuple[int, int]], rule) -> tuple[list[int], int]:
    """Eliminate the site with the smallest ``rule(neighbours, site)`` until none is left;
    returns the order and its width."""
    neighbours: list[set[int]] = [set() for _ in range(n_sites)]
    for i, j in pairs:
        neighbours[i].add(j)
        neighbours[j].add(i)
    score = {v: rule(neighbours, v) for v in range(n_sites)}
    order, width = [], 0
    while score:
        v = min(score, key=score.__getitem__)
        near = neighbours[v]
        width = max(width, len(near))
        for a in near:
            neighbours[a] |= near - {a}
            neighbours[a].discard(v)
        del score[v]
        order.append(v)
        # only the neighbours and their neighbours see their scores change
        for u in near.union(*(neighbours[a] for a in near)) - {v}:
            score[u] = rule(neighbours, u)
    return order, width


def _check(
    unary: torch.Tensor, pairwise: torch.Tensor, edges: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validated (unary, pairwise) with a leading batch dimension."""
    if unary.ndim == 2:
        unary, pairwise = unary[None], pairwise[None]
    _checks.tensor("unary", unary, ndim=3, floating=True)
    b, n, k = unary.shape
    _checks.tensor("pairwise", pairwise, ndim=4, floating=True)
    _checks.tensor("edges", edges, ndim=2, last_dims=(2,))
    if pairwise.shape != (b, len(edges), k, k):
        raise ArgumentError(
            f"pairwise must have shape {(b, len(edges), k, k)} for {len(edges)} edges, "
            f"got {tuple(pairwise.shape)}"
        )
    if len(edges) and (int(edges.min()) < 0 or int(edges.max()) >= n):
        raise ArgumentError(f"edges must index sites 0..{n - 1}")
    return unary, pairwise


def pairwise_log_partition(
    unary: torch.Tensor,
    pairwise: torch.Tensor,
    edges: torch.Tensor,
    *,
    max_width: int = MAX_ELIMINATION_WIDTH,
) -> torch.Tensor:
    """Exact log Z of pairwise models by variable elimination in a min-fill order.

    Args:
        unary: log-potentials theta_i, (n, K) or a batch (B, n, K).
        pairwise: log-potentials theta_ij of each edge, (E, K, K) or (B, E, K, K); entry
            [e, a, b] belongs to x_i = a, x_j = b for edge e = (i, j).
        edges: the graph, (E, 2) site indices, shared by the batch.
        max_width: the widest elimination allowed; a wider graph is refused before any
            work, naming its width.

    Returns:
        log Z, a scalar or (B,), differentiable in the potentials.
    """
    batched = unary.ndim == 3
    unary, pairwise = _check(unary, pairwise, edges)
    b, n, k = unary.shape
    order, width = elimination_order(n, edges)
    _checks.positive_int("max_width", max_width, allow_zero=True)
    if width > max_width:
        raise ArgumentError(
            f"variable elimination needs width {width} here (tables of {k}^{width + 1} "
            f"entries), above max_width={max_width}; estimate log Z with ais or smc instead"
        )
    # a factor: (sites in increasing order, table (B, K, ..., K) with one axis per site)
    factors: list[tuple[tuple[int, ...], torch.Tensor]] = [((i,), unary[:, i]) for i in range(n)]
    for e, (i, j) in enumerate(edges.tolist()):
        table = pairwise[:, e]
        factors.append(((i, j), table) if i < j else ((j, i), table.transpose(1, 2)))
    total = unary.new_zeros(b)
    for v in order:
        touching = [f for f in factors if v in f[0]]
        factors = [f for f in factors if v not in f[0]]
        scope = tuple(sorted(set().union(*(f[0] for f in touching))))
        combined = sum(_broadcast(sites, table, scope, k) for sites, table in touching)
        reduced = _log_sum_axis(combined, 1 + scope.index(v))
        rest = tuple(s for s in scope if s != v)
        if rest:
            factors.append((rest, reduced))
        else:
            total = total + reduced
    return total if batched else total[0]


def _log_sum_axis(table: torch.Tensor, dim: int) -> torch.Tensor:
    """log sum exp over axis ``dim``, folded with ``torch.logaddexp`` over the K slices:
    for the few states of discrete sites one elementwise pass per state, where a general
    reduction over an inner axis is several times slower."""
    slices = table.unbind(dim)
    out = slices[0]
    for part in slices[1:]:
        out = torch.logaddexp(out, part)
    return out


def _broadcast(
    sites: tuple[int, ...], table: torch.Tensor, scope: tuple[int, ...], k: int
) -> torch.Tensor:
    """``table`` over ``sites`` (a subsequence of ``scope``) viewed with one axis per site
    of ``scope``, size 1 where it does not depend on the site."""
    shape = [table.shape[0]] + [k if s in sites else 1 for s in scope]
    return table.reshape(shape)


def pairwise_marginals(
    unary: torch.Tensor,
    pairwise: torch.Tensor,
    edges: torch.Tensor,
    *,
    max_width: int = MAX_ELIMINATION_WIDTH,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exact log Z with the site and edge marginals, as the gradient of log Z.

    Args:
        edges: the edges (E, 2) as index pairs.
        max_width: the largest elimination clique allowed (the cost grows as S^width).

    Returns:
        (log Z, p(x_i = a) shaped like ``unary``, p(x_i = a, x_j = b) shaped like
        ``pairwise``).
    """
    with torch.enable_grad():
        theta_i = unary.detach().requires_grad_(True)
        theta_ij = pairwise.detach().requires_grad_(True)
        log_z = pairwise_log_partition(theta_i, theta_ij, edges, max_width=max_width)
        site, edge = torch.autograd.grad(log_z.sum(), (theta_i, theta_ij))
    return log_z.detach(), site, edge
