"""Variable elimination: exact log Z and marginals of pairwise models, checked against
enumeration of every configuration."""

import pytest
import torch

from ebmlab.energies import BoltzmannMachine
from ebmlab.partition import (
    elimination_order,
    enumerate_log_partition,
    exact_log_partition,
    log_partition,
    pairwise_log_partition,
    pairwise_marginals,
)


def _random_graph(n: int, p: float, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    keep = torch.rand(len(pairs), generator=gen) < p
    return torch.tensor([pair for pair, k in zip(pairs, keep.tolist(), strict=True) if k])


def _brute_force(unary, pairwise, edges):
    """log Z, site and edge marginals by listing all K^n configurations."""
    n, k = unary.shape
    powers = k ** torch.arange(n - 1, -1, -1)  # the first site varies slowest
    states = torch.arange(k**n)[:, None] // powers % k
    score = unary[torch.arange(n), states].sum(1)
    score = score + pairwise[
        torch.arange(len(edges)), states[:, edges[:, 0]], states[:, edges[:, 1]]
    ].sum(1)
    log_z = torch.logsumexp(score, 0)
    p = torch.softmax(score, 0)
    site = torch.stack(
        [torch.stack([p[states[:, i] == a].sum() for a in range(k)]) for i in range(n)]
    )
    return log_z, site


def _grid(rows: int, cols: int) -> torch.Tensor:
    index = torch.arange(rows * cols).view(rows, cols)
    right = torch.stack([index[:, :-1].reshape(-1), index[:, 1:].reshape(-1)], 1)
    down = torch.stack([index[:-1].reshape(-1), index[1:].reshape(-1)], 1)
    return torch.cat([right, down])


@pytest.mark.parametrize(("n", "k", "p"), [(8, 3, 0.4), (10, 2, 0.3), (6, 4, 0.6)])
def test_log_z_and_marginals_match_enumeration(n, k, p):
    edges = _random_graph(n, p, seed=n)
    gen = torch.Generator().manual_seed(k)
    unary = torch.randn(3, n, k, generator=gen, dtype=torch.float64)
    pairwise = torch.randn(3, len(edges), k, k, generator=gen, dtype=torch.float64)
    log_z, site, edge = pairwise_marginals(unary, pairwise, edges)
    for b in range(3):  # a batch of models on one graph
        exact, exact_site = _brute_force(unary[b], pairwise[b], edges)
        assert log_z[b].item() == pytest.approx(exact.item(), rel=1e-10)
        assert torch.allclose(site[b], exact_site, atol=1e-10)
    assert torch.allclose(edge.sum((2, 3)), torch.ones(3, len(edges), dtype=torch.float64))
    i, j = edges[0].tolist()  # an edge marginal sums to its sites' marginals
    assert torch.allclose(edge[:, 0].sum(2), site[:, i]) and torch.allclose(
        edge[:, 0].sum(1), site[:, j]
    )


@pytest.mark.slow
def test_a_sparse_boltzmann_machine_of_21_units_agrees_with_enumeration():
    torch.manual_seed(0)
    bm = BoltzmannMachine(21).double()
    edges = _random_graph(21, 0.15, seed=3)
    with torch.no_grad():
        bm.weight.zero_()  # its strict upper triangle is the coupling matrix
        bm.weight[edges[:, 0], edges[:, 1]] = torch.randn(len(edges), dtype=torch.float64)
        bm.b.normal_()
    estimate = exact_log_partition(bm)
    assert estimate.method == "elimination" and estimate.cost["width"] < 20
    brute = enumerate_log_partition(bm, 21, dtype=torch.float64, chunk=1 << 18)
    assert estimate.log_z == pytest.approx(brute.log_z, rel=1e-6)
    assert log_partition(bm).method == "elimination"  # the automatic policy takes it too


def test_widths_of_chains_trees_and_grids():
    chain = torch.stack([torch.arange(9), torch.arange(1, 10)], 1)
    assert elimination_order(10, chain)[1] == 1
    tree = torch.tensor([[0, 1], [0, 2], [1, 3], [1, 4], [2, 5], [2, 6]])
    assert elimination_order(7, tree)[1] == 1
    order, width = elimination_order(20, _grid(4, 5))
    assert width == 4 and sorted(order) == list(range(20))


def test_grid_ising_model_against_enumeration():
    edges = _grid(4, 5)
    coupling = 0.4
    pairwise = torch.tensor([[coupling, -coupling], [-coupling, coupling]], dtype=torch.float64)
    pairwise = pairwise.expand(len(edges), 2, 2)
    unary = torch.zeros(20, 2, dtype=torch.float64)
    exact, _ = _brute_force(unary, pairwise, edges)
    assert pairwise_log_partition(unary, pairwise, edges).item() == pytest.approx(
        exact.item(), rel=1e-12
    )


def test_too_wide_a_graph_is_refused_with_its_width():
    dense = _random_graph(12, 1.0, seed=0)
    unary, pairwise = torch.zeros(12, 2), torch.zeros(len(dense), 2, 2)
    with pytest.raises(ValueError, match=r"width 11 .* max_width=5; estimate log Z with ais"):
        pairwise_log_partition(unary, pairwise, dense, max_width=5)
    with pytest.raises(ValueError, match="pairwise must have shape"):
        pairwise_log_partition(unary, torch.zeros(3, 2, 2), dense)
    with pytest.raises(ValueError, match="edges must index sites"):
        pairwise_log_partition(unary, torch.zeros(1, 2, 2), torch.tensor([[0, 12]]))


def test_a_dense_boltzmann_machine_is_enumerated():
    bm = BoltzmannMachine(10)
    assert exact_log_partition(bm).method == "enumeration"
