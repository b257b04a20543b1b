"""log Z of a continuous energy in one or two dimensions by grid quadrature.

Z = integral of exp(-E(x)) over a bounding box, by the midpoint rule in log
space (log-sum-exp of -E on the grid plus log of the cell volume). The error
estimate compares the grid with one of half the resolution; the midpoint rule
is second order, so the difference divided by 3 estimates the remaining error
(Richardson). Mass outside the box is not counted: choose a box that holds it.
The same grid gives exact samples of the density restricted to the box, up to the
grid's resolution (:func:`quadrature_sample`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import torch

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.devices import wide_dtype
from ebmlab.energies.base import EnergyLike, as_energy_fn, energy_device
from ebmlab.partition.estimate import LogZEstimate

Bounds = Sequence[tuple[float, float]]


def grid_points(
    bounds: Bounds, n_points: int, device: torch.device | str | None = None
) -> tuple[torch.Tensor, float]:
    """Cell midpoints of an ``n_points``-per-axis grid over the box (float64, or float32
    on a device without it, on ``device``), and the cell volume.

    Args:
        bounds: (low, high) per dimension.
    """
    axes, volume = [], 1.0
    dtype = wide_dtype(torch.device(device or "cpu"))
    for lo, hi in bounds:
        width = (hi - lo) / n_points
        steps = torch.arange(n_points, dtype=dtype, device=device)
        axes.append(lo + width * (steps + 0.5))
        volume *= width
    mesh = torch.meshgrid(*axes, indexing="ij")
    return torch.stack([m.reshape(-1) for m in mesh], 1), volume


def _check_bounds(bounds: Bounds, n_points: int) -> None:
    if len(bounds) not in (1, 2) or any(not (lo < hi) for lo, hi in bounds):
        raise ArgumentError(
            f"bounds must be 1 or 2 pairs (low, high) with low < high, got {bounds!r}"
        )
    _checks.positive_int("n_points", n_points)
    if n_points < 8 or n_points % 2:
        raise ArgumentError(f"n_points must be an even number >= 8, got {n_points}")


def _neg_energies(fn, pts: torch.Tensor, chunk: int) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([-fn(p.float()).to(pts.dtype) for p in pts.split(chunk)])


def _log_integral(fn, bounds: Bounds, n_points: int, chunk: int) -> float:
    pts, volume = grid_points(bounds, n_points, energy_device(fn))
    return float(torch.logsumexp(_neg_energies(fn, pts, chunk), 0)) + math.log(volume)


def quadrature_log_partition(
    energy: EnergyLike, bounds: Bounds, n_points: int = 512, *, chunk: int = 65536
) -> LogZEstimate:
    """log Z over the box ``bounds`` ((low, high) per dimension, 1 or 2 dimensions).

    Args:
        energy: E over 1 or 2 dimensions, (B, D) -> (B,).
        n_points: grid points per axis.
        chunk: rows evaluated at once, which bounds the memory used.
    """
    _checks.finite_parameters("energy", energy)
    _check_bounds(bounds, n_points)
    fn = as_energy_fn(energy)
    start = time.perf_counter()
    fine = _log_integral(fn, bounds, n_points, chunk)
    coarse = _log_integral(fn, bounds, n_points // 2, chunk)
    err = abs(fine - coarse) / 3
    cost = {
        "energy_evals": n_points ** len(bounds) * 5 // 4,
        "seconds": time.perf_counter() - start,
    }
    return LogZEstimate(log_z=fine, stderr=err, method="quadrature", cost=cost)


def quadrature_sample(
    energy: EnergyLike,
    bounds: Bounds,
    n: int,
    n_points: int = 512,
    *,
    generator: torch.Generator | None = None,
    chunk: int = 65536,
) -> torch.Tensor:
    """``n`` independent samples of exp(-E(x)) / Z restricted to the box, shape (n, D).

    A cell of the ``n_points``-per-axis grid is drawn with probability proportional to
    exp(-E) at its midpoint, then a point uniformly inside it: exact up to the variation
    of E within one cell. No Markov chain, so no burn-in and no mode-hopping problem.

    Args:
        energy: E over 1 or 2 dimensions, (B, D) -> (B,).
        generator: source of randomness, a ``torch.Generator`` on the data's device
            (``None``: the global one).
        chunk: rows evaluated at once, which bounds the memory used.
    """
    _check_bounds(bounds, n_points)
    _checks.positive_int("n", n)
    fn = as_energy_fn(energy)
    pts, _ = grid_points(bounds, n_points, energy_device(fn))
    neg = _neg_energies(fn, pts, chunk)
    if not torch.isfinite(neg).any():
        raise ArgumentError("the energy is not finite anywhere on the grid")
    cells = torch.multinomial(torch.softmax(neg, 0), n, replacement=True, generator=generator)
    width = [(hi - lo) / n_points for lo, hi in bounds]
    width = torch.tensor(width, dtype=pts.dtype, device=pts.device)
    jitter = torch.rand(n, len(bounds), generator=generator, dtype=pts.dtype, device=pts.device)
    jitter -= 0.5
    return (pts[cells] + jitter * width).float()
