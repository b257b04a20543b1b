"""Langevin dynamics.

Unadjusted Langevin (ULA) discretises the Langevin diffusion with step h:

    x' = x - h grad E(x) + sqrt(2 h) eps,   eps ~ N(0, I).

Tomczak (2024, eqs. 6.24 and 6.28, after Welling & Teh 2011 and JEM) decouples the
step size alpha from the noise scale sigma, written there for f = -E:

    x' = x + alpha grad f(x) + sigma eps  =  x - alpha grad E(x) + sigma eps.

Give ``noise_scale`` to use that form; leave it ``None`` for ULA
(sigma = sqrt(2 alpha)). Optional per-chain gradient-norm clipping and box
clamping keep short-run chains of a young model in the data range. A step needs the
gradient at its start only, so states leave energy and gradient for the next step
to evaluate: n steps cost n gradient evaluations.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.energies.base import EnergyFn
from ebmlab.samplers.base import Sampler, SamplerState
from ebmlab.samplers.integrators import euler_maruyama, gaussian_noise


def _clip_rows(g: torch.Tensor, max_norm: float) -> torch.Tensor:
    norms = g.flatten(1).norm(dim=1).clamp_min(1e-12)
    factor = (max_norm / norms).clamp(max=1.0)
    return g * factor.view(-1, *([1] * (g.ndim - 1)))


class Langevin(Sampler[SamplerState]):
    """Unadjusted Langevin dynamics (ULA), or SGLD with independent noise scale.

    Args:
        step_size: h (ULA) or alpha (Tomczak 2024, eq. 6.24).
        noise_scale: sigma; ``None`` means sqrt(2 * step_size), the ULA choice.
        grad_clip: clip each chain's gradient to this L2 norm (``None``: off).
        clamp: box (low, high) every state is clamped into (``None``: off).
        schedule: multiplier of ``step_size`` (and of sigma^2 under ULA) at step t.
    """

    def __init__(
        self,
        step_size: float,
        noise_scale: float | None = None,
        *,
        grad_clip: float | None = None,
        clamp: tuple[float, float] | None = None,
        schedule: Callable[[int], float] | None = None,
    ) -> None:
        self.step_size = _checks.positive("step_size", step_size)
        self.noise_scale = (
            None
            if noise_scale is None
            else _checks.positive("noise_scale", noise_scale, allow_zero=True)
        )
        self.grad_clip = None if grad_clip is None else _checks.positive("grad_clip", grad_clip)
        if clamp is not None and not (len(clamp) == 2 and clamp[0] < clamp[1]):
            raise ArgumentError(f"clamp must be a pair (low, high) with low < high, got {clamp!r}")
        self.clamp = clamp
        self.schedule = None if schedule is None else _checks.callable_("schedule", schedule)

    def tempered(self, beta: torch.Tensor) -> Langevin:
        """Step size / beta: the ULA step matched to the tempered scale (SGLD noise kept)."""
        return self._rescaled("step_size", beta, 1.0)

    def replayable(self, state: SamplerState) -> bool:
        """Steps from any ``state`` alike, unless a ``schedule`` changes the step size
        by step index."""
        return self.schedule is None

    def init(self, x0: torch.Tensor, energy: EnergyFn) -> SamplerState:
        x = x0.detach().clone()
        if self.clamp is not None:
            x = x.clamp(*self.clamp)
        return SamplerState.start(x, None, None, n_grad_evals=0)

    def step(
        self, state: SamplerState, energy: EnergyFn, generator: torch.Generator | None = None
    ) -> SamplerState:
        state = state.evaluated(energy)
        factor = 1.0 if self.schedule is None else float(self.schedule(state.t))
        h = self.step_size * factor
        sigma = (2 * h) ** 0.5 if self.noise_scale is None else self.noise_scale
        g = state.grad if self.grad_clip is None else _clip_rows(state.grad, self.grad_clip)
        x = euler_maruyama(state.x, g, h, sigma, gaussian_noise(state.x, generator))
        if self.clamp is not None:
            x = x.clamp(*self.clamp)
        return state.taken(x=x, energy=None, grad=None)
