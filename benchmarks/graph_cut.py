"""Exact MAP of attractive Ising grids by a minimum cut, beside dwave-samplers.

The grids of :mod:`benchmarks.elimination` (couplings J = 0.35, fields N(0, 0.1^2),
seed 0) at 20 x 20, 50 x 50 and 100 x 100: the most probable spin configuration, i.e.
the maximum of sum_i h_i s_i + J sum_<ij> s_i s_j. ebmlab's ``max_attractive`` solves it
exactly by one minimum cut (on the model rewritten in 0/1 units). The anchors are
dwave-samplers (``pip install dwave-samplers``; rows left out when absent):
``TreeDecompositionSolver``, exact but limited to treewidth 25 (given ebmlab's
elimination order, as in the elimination benchmark), and ``SimulatedAnnealingSampler``
(100 reads of 1000 sweeps), the heuristic most users would reach for. ``python -m
benchmarks.graph_cut`` prints each solver's best value and seconds.
"""

from __future__ import annotations

import time

import torch

from benchmarks.elimination import ising_grid
from benchmarks.harness import Case
from ebmlab.partition import elimination_order
from ebmlab.partition.graph_cut import max_attractive

SIZES = (20, 50, 100)


def spin_value(spins: torch.Tensor, size: int) -> float:
    """sum h s + J sum s s of a configuration in {-1, 1}."""
    fields, edges, couplings = ising_grid(size)
    return float(fields @ spins + (couplings * spins[edges[:, 0]] * spins[edges[:, 1]]).sum())


def ebmlab_map(size: int) -> float:
    """With s = 2x - 1 the objective is f^T x + sum 4J x_i x_j + constant, f_i = 2 h_i -
    2 J deg(i)."""
    fields, edges, couplings = ising_grid(size)
    degree = torch.bincount(edges.reshape(-1), minlength=len(fields)).double()
    unary = 2 * fields - 2 * couplings[0] * degree
    x = max_attractive(unary, 4 * couplings, edges)
    return spin_value(2 * x - 1, size)


def _bqm(size: int):
    import dimod

    fields, edges, couplings = ising_grid(size)
    linear = {i: -float(h) for i, h in enumerate(fields)}  # dimod minimises: negate
    quadratic = {(int(i), int(j)): -float(c) for (i, j), c in zip(edges, couplings, strict=True)}
    return dimod.BinaryQuadraticModel(linear, quadratic, 0.0, dimod.SPIN)


def dwave_tree_map(size: int) -> float:
    from dwave.samplers import TreeDecompositionSolver

    fields, edges, _ = ising_grid(size)
    order, _ = elimination_order(len(fields), edges)
    result = TreeDecompositionSolver().sample(_bqm(size), elimination_order=order)
    return -float(result.first.energy)


def dwave_annealing_map(size: int) -> float:
    from dwave.samplers import SimulatedAnnealingSampler

    result = SimulatedAnnealingSampler().sample(_bqm(size), num_reads=100, num_sweeps=1000, seed=0)
    return -float(result.first.energy)


def cases() -> list[Case]:
    try:
        import dwave.samplers  # noqa: F401
    except ImportError:
        return []
    return [
        Case(
            what="exact MAP, 20 x 20 attractive Ising grid: minimum cut",
            ebmlab=lambda: ebmlab_map(20),
            anchor=lambda: dwave_tree_map(20),
            anchor_name="dwave-samplers TreeDecompositionSolver (C++)",
            repeats=3,
        )
    ]


def main() -> None:
    torch.set_num_threads(1)
    solvers = {
        "ebmlab max_attractive (minimum cut)": ebmlab_map,
        "dwave-samplers TreeDecompositionSolver": dwave_tree_map,
        "dwave-samplers SimulatedAnnealingSampler": dwave_annealing_map,
    }
    print("| grid | solver | best value | seconds |")
    print("|---|---|---:|---:|")
    for size in SIZES:
        for name, solve in solvers.items():
            if "Tree" in name and size > 20:
                continue  # treewidth above its limit of 25
            start = time.perf_counter()
            try:
                value = solve(size)
            except ImportError:
                continue
            seconds = time.perf_counter() - start
            print(f"| {size} x {size} | {name} | {value:.4f} | {seconds:.3f} |")


if __name__ == "__main__":
    main()
