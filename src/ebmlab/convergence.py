"""Stopping rules for iterative routines that hold in every working dtype and on every CPU.

A fixed-point iteration (belief propagation, mean field, TAP) stops when its largest
change falls below a tolerance. In floating point the change never reaches zero: once
the iterate is as close to the fixed point as the dtype resolves, rounding keeps it
moving by a few units in the last place of its largest entry, and the size and pattern
of that noise change with the summation order, which differs between CPUs (AVX2,
AVX-512, AMX kernels) and devices. A tolerance below that floor (1e-8 in float32, whose
resolution is 1.2e-7) is then never met, and the routine reports failure on one
machine and success on another. :func:`working_tol` raises a requested tolerance to
``RESOLUTION_ULPS`` units of the dtype's resolution at the iterate's scale, and
:func:`warn_unconverged` says, once per call, when a routine stops without meeting it,
so that an estimate that lost its guarantee is never silent.
"""

from __future__ import annotations

import warnings

import torch

# Changes of at most this many units in the last place are rounding noise, not progress.
RESOLUTION_ULPS = 64


class ConvergenceWarning(UserWarning):
    """An iterative routine stopped at its iteration limit before its tolerance was met."""


def working_tol(tol: float, dtype: torch.dtype, scale: float = 1.0) -> float:
    """The tolerance an iteration in ``dtype`` can meet: ``tol``, or ``RESOLUTION_ULPS``
    machine epsilons of ``dtype`` times ``scale`` (at least 1) where that is larger.

    Args:
        tol: the requested tolerance on the largest change of an iteration.
        dtype: the floating dtype the iteration runs in.
        scale: the largest magnitude of the iterate (changes are absolute).
    """
    return max(tol, RESOLUTION_ULPS * torch.finfo(dtype).eps * max(1.0, scale))


def warn_unconverged(what: str, iterations: int, change: float, tol: float) -> None:
    """Warn (:class:`ConvergenceWarning`) that ``what`` stopped after ``iterations``
    with its last change above ``tol``, and what to try."""
    warnings.warn(
        f"{what} did not converge in {iterations} iterations (last change {change:.3g}, "
        f"tolerance {tol:.3g}); raise max_iter or damping, and read the result as an "
        "approximation",
        ConvergenceWarning,
        stacklevel=3,
    )
