"""Exact MAP of attractive binary pairwise models by a minimum cut (Greig, Porteous &
Seheult 1989; Kolmogorov & Zabih 2004).

Maximising f^T x + sum_(i,j) J_ij x_i x_j over x in {0, 1}^n with every J_ij >= 0 (an
attractive, or submodular, model) is minimising -f^T x - sum J_ij x_i x_j, and since
-J x_i x_j = -J x_i + J x_i (1 - x_j), that energy is the capacity of a cut in a graph
with a source s and a sink t, x_i = 1 meaning i lies on the sink's side: a unary cost
a_i x_i is an arc s -> i of capacity a_i when a_i > 0 (else i -> t of capacity -a_i),
and J x_i (1 - x_j) an arc j -> i of capacity J. A maximum flow finds the cheapest cut
in polynomial time, whatever the treewidth, where enumeration and elimination cannot
go (large grids). The flow runs in SciPy's Dinic solver on integer capacities, the
real ones scaled so that they sum to 2^30: the cut found is optimal for the rounded
capacities, within sum(capacities) x n_arcs / 2^31 of the true optimum.
"""

from __future__ import annotations

import numpy as np
import torch

from ebmlab._checks import ArgumentError

SCALE_TOTAL = 2**30  # the integer capacities sum to about this


def max_attractive(
    fields: torch.Tensor, couplings: torch.Tensor, edges: torch.Tensor
) -> torch.Tensor:
    """The maximiser x in {0, 1}^n of f^T x + sum_e J_e x_i x_j for fields (n,),
    non-negative couplings (E,) and edges (E, 2) of (i, j) pairs, as float64 on the
    fields' device. The cut is computed on the CPU."""
    f = fields.detach().cpu().double().numpy()
    J = couplings.detach().cpu().double().numpy()
    pairs = edges.cpu().numpy()
    if (J < 0).any():
        raise ArgumentError(
            "graph cuts need non-negative couplings (an attractive model); "
            f"the smallest coupling is {J.min():.4g}"
        )
    from scipy.sparse import coo_array
    from scipy.sparse.csgraph import breadth_first_order, maximum_flow

    n = len(f)
    source, sink = n, n + 1
    unary = -f.copy()
    np.add.at(unary, pairs[:, 0], -J)
    nodes = np.arange(n)
    heads = np.concatenate([np.full(n, source), nodes, pairs[:, 1]])
    tails = np.concatenate([nodes, np.full(n, sink), pairs[:, 0]])
    capacity = np.concatenate([np.maximum(unary, 0), np.maximum(-unary, 0), J])
    total = capacity.sum()
    scaled = np.rint(capacity * (SCALE_TOTAL / total)) if total > 0 else capacity
    keep = scaled > 0
    graph = coo_array(
        (scaled[keep].astype(np.int32), (heads[keep], tails[keep])), shape=(n + 2, n + 2)
    ).tocsr()
    flow = maximum_flow(graph, source, sink, method="dinic").flow
    residual = (graph - flow).tocsr()
    residual.data = (residual.data > 0).astype(np.int32)
    residual.eliminate_zeros()
    source_side = breadth_first_order(residual, source, directed=True, return_predecessors=False)
    x = np.ones(n)
    x[source_side[source_side < n]] = 0.0
    return torch.from_numpy(x).to(fields.device)
