"""Metropolis-adjusted Langevin algorithm (Roberts & Tweedie 1996).

The Langevin proposal x' = x - h grad E(x) + sqrt(2h) eps is accepted with
probability min(1, exp(E(x) - E(x') + log q(x | x') - log q(x' | x))), where
log q(x' | x) = -|x' - x + h grad E(x)|^2 / (4h). The correction removes the
step-size bias of unadjusted Langevin: the chain targets exp(-E)/Z exactly.
One gradient evaluation per step (at the proposal; reused when accepted).

With ``target_accept`` the step size is tuned during burn-in by dual averaging
(:class:`~ebmlab.samplers.adaptation.WarmupTuning`) towards that mean acceptance
probability, pooled over chains; the optimal rate for MALA in high dimension is about
0.574 (Roberts & Rosenthal 1998). After burn-in the averaged step size is kept. With
``adapt_mass`` as well, a diagonal inverse mass M^{-1} preconditions the proposal,
x' = x - h M^{-1} grad E(x) + sqrt(2h M^{-1}) eps (Girolami & Calderhead 2011, eq. 10,
with a constant metric), estimated from the chains' variance during burn-in.
"""

from __future__ import annotations

import torch

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.energies.base import EnergyFn, energy_and_grad
from ebmlab.samplers.adaptation import TunedState, WarmupTuning
from ebmlab.samplers.base import Sampler, SamplerState, add_scaled, metropolis_update, per_chain
from ebmlab.samplers.integrators import euler_maruyama, gaussian_noise


def _log_q(
    x_to: torch.Tensor,
    x_from: torch.Tensor,
    grad_from: torch.Tensor,
    h: torch.Tensor | float,
    inv_mass: torch.Tensor | None,
) -> torch.Tensor:
    """log q(x_to | x_from) up to a constant: -|x_to - x_from + h M^{-1} g|^2_M / (4h)
    (M = I for ``inv_mass`` None)."""
    drift = grad_from if inv_mass is None else inv_mass * grad_from
    diff = add_scaled(x_to - x_from, per_chain(h, x_to), drift).flatten(1)
    weighted = diff if inv_mass is None else diff / inv_mass.expand_as(x_to).flatten(1)
    return torch.linalg.vecdot(diff, weighted) / (-4 * h)


class MALA(Sampler[TunedState]):
    """Metropolis-adjusted Langevin with step size ``step_size`` (h).

    Args:
        step_size: h, or the starting point of its tuning.
        target_accept: tune h during burn-in towards this mean acceptance probability
            (None: keep h).
        adapt_mass: also tune a diagonal inverse mass during burn-in (needs
            ``target_accept``; estimated from all chains' draws together, so best with
            16 or more).
    """

    def __init__(
        self, step_size: float, *, target_accept: float | None = None, adapt_mass: bool = False
    ) -> None:
        self.step_size = _checks.positive("step_size", step_size)
        if adapt_mass and target_accept is None:
            raise ArgumentError("adapt_mass=True needs target_accept: the mass is tuned with h")
        self.tuning = (
            None
            if target_accept is None
            else WarmupTuning(target_accept, adapt_mass, pool_step_size=True)
        )

    def tempered(self, beta: torch.Tensor) -> MALA:
        """Step size / beta, matched to the tempered distributions' scale."""
        if self.tuning is not None:
            raise ArgumentError("a MALA kernel that tunes its step size cannot be tempered")
        return self._rescaled("step_size", beta, 1.0)

    def replayable(self, state: TunedState) -> bool:
        """Steps from ``state`` alike once the step size is no longer tuned."""
        return self.tuning is None or not self.tuning.warming(state)

    def init(self, x0: torch.Tensor, energy: EnergyFn) -> TunedState:
        start = SamplerState.start(x0.detach().clone(), None, None, 0).evaluated(energy)
        if self.tuning is not None and self.tuning.adapt_mass:
            return self.tuning.initial(start, self.step_size, TunedState)
        # without a mass to tune, M = I and the step skips its products
        return start.as_kind(TunedState, step_size=self.step_size, inv_mass=None)

    def begin_warmup(self, state: TunedState, n_steps: int) -> TunedState:
        return state if self.tuning is None else self.tuning.begin(state, n_steps)

    def end_warmup(self, state: TunedState) -> TunedState:
        return state if self.tuning is None else self.tuning.finish(state)

    def step(
        self, state: TunedState, energy: EnergyFn, generator: torch.Generator | None = None
    ) -> TunedState:
        h, m = state.step_size, state.inv_mass
        noise = gaussian_noise(state.x, generator)
        drift, kick = (state.grad, noise) if m is None else (m * state.grad, noise * m.sqrt())
        proposal = euler_maruyama(state.x, drift, h, (2 * h) ** 0.5, kick)
        e_new, g_new = energy_and_grad(energy, proposal)
        # log q(x' | x) = -|sqrt(2h) M^{-1/2} noise|^2_M / (4h) = -|noise|^2 / 2
        flat_noise = noise.flatten(1)
        log_q_forward = -0.5 * torch.linalg.vecdot(flat_noise, flat_noise)
        log_q_back = _log_q(state.x, proposal, g_new, h, m)
        log_ratio = state.energy - e_new + log_q_back - log_q_forward
        new = metropolis_update(state, proposal, e_new, g_new, log_ratio, generator)
        if self.tuning is None:
            return new
        return self.tuning.update(state, new)
