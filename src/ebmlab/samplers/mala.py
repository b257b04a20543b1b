"""Metropolis-adjusted Langevin algorithm (Roberts & Tweedie 1996).

The Langevin proposal x' = x - h grad E(x) + sqrt(2h) eps is accepted with
probability min(1, exp(E(x) - E(x') + log q(x | x') - log q(x' | x))), where
log q(x' | x) = -|x' - x + h grad E(x)|^2 / (4h). The correction removes the
step-size bias of unadjusted Langevin: the chain targets exp(-E)/Z exactly.
One gradient evaluation per step (at the proposal; reused when accepted).

With ``target_accept`` the step size is tuned during burn-in by dual averaging
(:class:`~ebmlab.samplers.adaptation.DualAveraging`) towards that mean acceptance
probability, pooled over chains; the optimal rate for MALA in high dimension is about
0.574 (Roberts & Rosenthal 1998). After burn-in the averaged step size is kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.energies.base import EnergyFn, energy_and_grad
from ebmlab.samplers.adaptation import DualAveraging
from ebmlab.samplers.base import (
    Sampler,
    SamplerState,
    accept,
    add_scaled,
    metropolis_update,
    per_chain,
)


def _log_q(
    x_to: torch.Tensor, x_from: torch.Tensor, grad_from: torch.Tensor, h: torch.Tensor | float
) -> torch.Tensor:
    diff = add_scaled(x_to - x_from, per_chain(h, x_to), grad_from).flatten(1)
    return torch.linalg.vecdot(diff, diff) / (-4 * h)


@dataclass(frozen=True)
class MALAState(SamplerState):
    """MALA's chain state with its step size and, while it is tuned, its adapter."""

    step_size: float | torch.Tensor = 0.1
    warmup_steps: int = 0
    dual: DualAveraging | None = None


class MALA(Sampler[MALAState]):
    """Metropolis-adjusted Langevin with step size ``step_size`` (h).

    Args:
        step_size: h, or the starting point of its tuning.
        target_accept: tune h during burn-in towards this mean acceptance probability
            (None: keep h).
    """

    def __init__(self, step_size: float, *, target_accept: float | None = None) -> None:
        self.step_size = _checks.positive("step_size", step_size)
        if target_accept is not None:
            _checks.probability("target_accept", target_accept)
        self.target_accept = target_accept

    def tempered(self, beta: torch.Tensor) -> MALA:
        """Step size / beta, matched to the tempered distributions' scale."""
        if self.target_accept is not None:
            raise ArgumentError("a MALA kernel that tunes its step size cannot be tempered")
        return self._rescaled("step_size", beta, 1.0)

    def init(self, x0: torch.Tensor, energy: EnergyFn) -> MALAState:
        e, g = energy_and_grad(energy, x0)
        base = SamplerState.start(x0.detach().clone(), e, g, n_grad_evals=1)
        fields = {f: getattr(base, f) for f in SamplerState.__dataclass_fields__}
        return MALAState(**fields, step_size=self.step_size)

    def begin_warmup(self, state: MALAState, n_steps: int) -> MALAState:
        if self.target_accept is None:
            return state
        dual = DualAveraging.start(float(state.step_size), self.target_accept)
        return state.replace(warmup_steps=n_steps, dual=dual)

    def end_warmup(self, state: MALAState) -> MALAState:
        if state.dual is None:
            return state
        return state.replace(step_size=state.dual.final_step_size, warmup_steps=0, dual=None)

    def step(
        self, state: MALAState, energy: EnergyFn, generator: torch.Generator | None = None
    ) -> MALAState:
        h = state.step_size
        hx = per_chain(h, state.x)
        noise = torch.randn(
            state.x.shape, generator=generator, dtype=state.x.dtype, device=state.x.device
        )
        proposal = add_scaled(add_scaled(state.x, -hx, state.grad), (2 * hx) ** 0.5, noise)
        e_new, g_new = energy_and_grad(energy, proposal)
        # log q(x' | x) = -|sqrt(2h) noise|^2 / (4h) = -|noise|^2 / 2
        flat_noise = noise.flatten(1)
        log_q_forward = -0.5 * torch.linalg.vecdot(flat_noise, flat_noise)
        log_ratio = state.energy - e_new + _log_q(state.x, proposal, g_new, h) - log_q_forward
        ok = accept(log_ratio, generator)
        new = metropolis_update(state, ok, proposal, e_new, g_new)
        if state.dual is not None and state.t < state.warmup_steps:
            rate = float(log_ratio.clamp(max=0).exp().mean())  # warm-up reads it back
            dual, step_size = state.dual.update(rate)
            new = new.replace(step_size=step_size, dual=dual)
        return new
