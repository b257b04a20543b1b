"""Exact log Z of Ising grids by variable elimination, beside dwave-samplers.

An L x L Ising model with free boundaries, couplings J = 0.35 and fields h_i drawn from
N(0, 0.1^2) (seed 0): p(s) proportional to exp(sum_i h_i s_i + J sum_<ij> s_i s_j) on
s in {-1, 1}^(L^2). Its treewidth is L, so exact log Z costs about L^2 2^(L + 1) instead
of the 2^(L^2) of enumeration. ebmlab's ``pairwise_log_partition`` (min-fill,
min-degree or row order, whichever is narrowest; log-space elimination in float64 with
PyTorch) is timed against dwave-samplers' ``TreeDecompositionSampler`` (elimination
in C++; ``pip install dwave-samplers``, rows left out when absent) given the same order
(its own min-fill order exceeds its width limit of 25 on the 20 x 20 grid), which
returns the same log Z; both values are printed by ``python -m benchmarks.elimination``.
"""

from __future__ import annotations

import torch

from benchmarks.harness import Case
from ebmlab.partition import elimination_order, pairwise_log_partition

COUPLING, FIELD_STD = 0.35, 0.1


def ising_grid(size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(fields (n,), edges (E, 2), couplings (E,)) of an L x L grid, seed 0."""
    index = torch.arange(size * size).view(size, size)
    right = torch.stack([index[:, :-1].reshape(-1), index[:, 1:].reshape(-1)], 1)
    down = torch.stack([index[:-1].reshape(-1), index[1:].reshape(-1)], 1)
    edges = torch.cat([right, down])
    gen = torch.Generator().manual_seed(0)
    fields = FIELD_STD * torch.randn(size * size, generator=gen, dtype=torch.float64)
    return fields, edges, torch.full((len(edges),), COUPLING, dtype=torch.float64)


def ebmlab_log_z(size: int) -> float:
    fields, edges, couplings = ising_grid(size)
    spins = torch.tensor([-1.0, 1.0], dtype=torch.float64)  # state 0 is s = -1
    unary = fields[:, None] * spins
    pairwise = couplings[:, None, None] * spins[:, None] * spins[None, :]
    return float(pairwise_log_partition(unary, pairwise, edges))


def dwave_log_z(size: int) -> float:
    import dimod
    from dwave.samplers import TreeDecompositionSampler

    fields, edges, couplings = ising_grid(size)
    # dimod's energy is sum h s + sum J s s with p proportional to exp(-E): negate
    linear = {i: -float(h) for i, h in enumerate(fields)}
    quadratic = {(int(i), int(j)): -float(c) for (i, j), c in zip(edges, couplings, strict=True)}
    bqm = dimod.BinaryQuadraticModel(linear, quadratic, 0.0, dimod.SPIN)
    # its own min-fill order is wider than 25 on the 20 x 20 grid, which it refuses:
    # it gets ebmlab's order, so that the two compare elimination engines
    order, _ = elimination_order(size * size, edges)
    result = TreeDecompositionSampler().sample(
        bqm, num_reads=1, marginals=False, elimination_order=order
    )
    return float(result.info["log_partition_function"])


def cases() -> list[Case]:
    try:
        import dwave.samplers  # noqa: F401
    except ImportError:
        return []
    return [
        Case(
            what=f"exact log Z, {size} x {size} Ising grid (treewidth {size}), float64",
            ebmlab=lambda size=size: ebmlab_log_z(size),
            anchor=lambda size=size: dwave_log_z(size),
            anchor_name="dwave-samplers TreeDecompositionSampler (C++)",
            repeats=3,
        )
        for size in (10, 16, 20)
    ]


def main() -> None:
    import time

    torch.set_num_threads(1)
    for size in (10, 16, 20):
        for name, fn in (("ebmlab", ebmlab_log_z), ("dwave-samplers", dwave_log_z)):
            start = time.perf_counter()
            try:
                value = fn(size)
            except ImportError:
                continue
            print(
                f"{size} x {size} {name}: log Z {value:.10f} in {time.perf_counter() - start:.2f} s"
            )


if __name__ == "__main__":
    main()
