"""Metropolis-adjusted Langevin algorithm (Roberts & Tweedie 1996).

The Langevin proposal x' = x - h grad E(x) + sqrt(2h) eps is accepted with
probability min(1, exp(E(x) - E(x') + log q(x | x') - log q(x' | x))), where
log q(x' | x) = -|x' - x + h grad E(x)|^2 / (4h). The correction removes the
step-size bias of unadjusted Langevin: the chain targets exp(-E)/Z exactly.
One gradient evaluation per step (at the proposal; reused when accepted).
"""

from __future__ import annotations

import torch

from ebmlab import _checks
from ebmlab.energies.base import EnergyFn, energy_and_grad
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


class MALA(Sampler[SamplerState]):
    """Metropolis-adjusted Langevin with step size ``step_size`` (h)."""

    def __init__(self, step_size: float) -> None:
        self.step_size = _checks.positive("step_size", step_size)

    def tempered(self, beta: torch.Tensor) -> MALA:
        """Step size / beta, matched to the tempered distributions' scale."""
        return self._rescaled("step_size", beta, 1.0)

    def init(self, x0: torch.Tensor, energy: EnergyFn) -> SamplerState:
        e, g = energy_and_grad(energy, x0)
        return SamplerState.start(x0.detach().clone(), e, g, n_grad_evals=1)

    def step(
        self, state: SamplerState, energy: EnergyFn, generator: torch.Generator | None = None
    ) -> SamplerState:
        h = self.step_size
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
        return metropolis_update(state, ok, proposal, e_new, g_new)
