"""Integration of dx/dt = v(x, t) for a batch of points, each row on its own.

Fixed steps by Euler (first order), Heun (second order, the trapezoid predictor-corrector)
and the classical fourth-order Runge-Kutta method; adaptive steps by the Dormand-Prince
5(4) pair (Dormand & Prince 1980; Hairer, Norsett & Wanner 1993, II.5) with a step size
per row, controlled on the row's own error, so that one hard row does not slow the
others, and with the accepted steps and the end read back only every ``CHECK_EVERY``
steps. The field takes the points (B, ...) and one time per row (B,). Flow matching and
energy matching sample by integrating their learned fields from noise at t = 0 to data
at t = 1 (-grad V for a potential).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.samplers.base import per_chain, where_rows

Field = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

CHECK_EVERY = 16  # adaptive steps between reads of whether every row has arrived

# Dormand-Prince 5(4): nodes, stage weights, the fifth-order solution and its error
_C = (0.0, 1 / 5, 3 / 10, 4 / 5, 8 / 9, 1.0, 1.0)
_A = (
    (),
    (1 / 5,),
    (3 / 40, 9 / 40),
    (44 / 45, -56 / 15, 32 / 9),
    (19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729),
    (9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656),
    (35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84),
)
_ERROR = (71 / 57600, 0.0, -71 / 16695, 71 / 1920, -17253 / 339200, 22 / 525, -1 / 40)

METHODS = ("euler", "heun", "rk4", "dopri5")


def _fixed_step(field: Field, x: torch.Tensor, t: torch.Tensor, h: float, method: str):
    if method == "euler":
        return x + h * field(x, t)
    if method == "heun":
        k1 = field(x, t)
        k2 = field(x + h * k1, t + h)
        return x + h / 2 * (k1 + k2)
    k1 = field(x, t)
    k2 = field(x + h / 2 * k1, t + h / 2)
    k3 = field(x + h / 2 * k2, t + h / 2)
    k4 = field(x + h * k3, t + h)
    return x + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)


def odeint(
    field: Field,
    x: torch.Tensor,
    t0: float = 0.0,
    t1: float = 1.0,
    *,
    method: str = "rk4",
    n_steps: int = 100,
    rtol: float = 1e-5,
    atol: float = 1e-5,
    max_steps: int = 10_000,
) -> torch.Tensor:
    """The points ``x`` (B, ...) carried by dx/dt = field(x, t) from ``t0`` to ``t1``
    (numbers; ``t1 < t0`` integrates backwards).

    Args:
        field: v(x, t) for points (B, ...) and times (B,), returning x's shape.
        method: ``"euler"``, ``"heun"`` or ``"rk4"`` with ``n_steps`` equal steps, or
            ``"dopri5"`` with adaptive steps per row.
        rtol: relative tolerance of ``dopri5``'s local error.
        atol: absolute tolerance of ``dopri5``'s local error.
        max_steps: the most ``dopri5`` steps (accepted or not) before it gives up.
    """
    _checks.tensor("x", x, min_ndim=2, floating=True, finite=True)
    t0, t1 = _checks.finite("t0", t0), _checks.finite("t1", t1)
    if method not in METHODS:
        raise ArgumentError(f"method must be one of {METHODS}, got {method!r}")
    _checks.positive_int("n_steps", n_steps)
    with torch.no_grad():
        if method == "dopri5":
            return _dopri5(field, x, t0, t1, rtol, atol, max_steps)
        h = (t1 - t0) / n_steps
        for i in range(n_steps):
            t = torch.full((len(x),), t0 + i * h, dtype=x.dtype, device=x.device)
            x = _fixed_step(field, x, t, h, method)
        return x


def _dopri5(
    field: Field, x: torch.Tensor, t0: float, t1: float, rtol: float, atol: float, max_steps: int
) -> torch.Tensor:
    """Adaptive Dormand-Prince steps, a step size per row (the standard controller:
    h' = h min(5, max(0.2, 0.9 err^(-1/5))), err the row's RMS error over the tolerance)."""
    sign = 1.0 if t1 >= t0 else -1.0
    t = torch.full((len(x),), t0, dtype=x.dtype, device=x.device)
    h = torch.full_like(t, abs(t1 - t0) / 100)
    k1 = field(x, t)
    for step in range(max_steps):
        active = (t1 - t).abs() > 1e-12 * max(1.0, abs(t1))
        h = torch.where(active, torch.minimum(h.abs(), (t1 - t).abs()), 0) * sign
        hx = per_chain(h, x)
        stages, point = [k1], x
        for c, a in zip(_C[1:], _A[1:], strict=True):
            point = x + hx * sum(w * k for w, k in zip(a, stages, strict=False) if w)
            stages.append(field(point, t + c * h))
        # the last stage's point is the fifth-order solution (first same as last)
        error = hx * sum(w * k for w, k in zip(_ERROR, stages, strict=True) if w)
        scale = atol + rtol * torch.maximum(x.abs(), point.abs())
        err = (error / scale).flatten(1).square().mean(1).sqrt()
        ok = active & (err <= 1)
        x = where_rows(ok, point, x)
        k1 = where_rows(ok, stages[-1], k1)
        t = torch.where(ok, t + h, t)
        h = h * (0.9 * err.clamp(min=1e-10) ** -0.2).clamp(0.2, 5.0)
        if (step + 1) % CHECK_EVERY == 0 and not bool(active.any()):
            return x
    if bool(((t1 - t).abs() > 1e-12 * max(1.0, abs(t1))).any()):
        raise ArgumentError(
            f"dopri5 did not reach t1 = {t1} in {max_steps} steps; raise max_steps or the "
            "tolerances, or check that the field is finite"
        )
    return x
