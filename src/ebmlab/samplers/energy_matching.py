"""Energy Matching's generation: a flow down a potential that becomes Langevin dynamics.

A potential V trained by Energy Matching (Balcerak et al. 2025) both transports noise to
the data and is, near the data, the Boltzmann density exp(-V / eps_max). Each chain
carries a time t, advanced by 1 / ``flow_steps`` per step, and moves by
x <- x - h grad V(x) + sqrt(2 eps(t) h) xi, where the temperature eps(t) is 0 before
tau_star (the noise-free flow), rises linearly to eps_max at t = 1, and stays there, so
that after ``flow_steps`` steps from noise at t = 0 the chains sample exp(-V / eps_max)
by unadjusted Langevin dynamics. Chains may start at their own times (data-started
negatives at t = 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ebmlab import _checks
from ebmlab.energies.base import EnergyFn, energy_and_grad
from ebmlab.samplers.base import Sampler, SamplerState
from ebmlab.samplers.integrators import euler_maruyama, gaussian_noise


def energy_matching_temperature(t: torch.Tensor, tau_star: float, eps_max: float) -> torch.Tensor:
    """eps(t): 0 for t < tau_star, eps_max (t - tau_star) / (1 - tau_star) up to t = 1,
    eps_max from t = 1 on (Balcerak et al. 2025, the generation schedule)."""
    return eps_max * ((t - tau_star) / (1 - tau_star)).clamp(0.0, 1.0)


@dataclass(frozen=True)
class TimedState(SamplerState):
    """Chains with their own times (B,)."""

    time: torch.Tensor | None = None


class EnergyMatchingSampler(Sampler[TimedState]):
    """Energy Matching's generation schedule on a potential V (the energy).

    Args:
        step_size: h, the step along -grad V.
        tau_star: where the temperature starts to rise, in [0, 1).
        eps_max: the temperature from t = 1 on.
        flow_steps: steps from t = 0 to t = 1.
        start_time: the chains' time at ``init``: one for all, or one per chain (B,).
    """

    def __init__(
        self,
        step_size: float,
        *,
        tau_star: float,
        eps_max: float,
        flow_steps: int,
        start_time: float | torch.Tensor = 0.0,
    ) -> None:
        self.step_size = _checks.positive("step_size", step_size)
        _checks.below_one("tau_star", tau_star)
        self.tau_star = tau_star
        self.eps_max = _checks.positive("eps_max", eps_max)
        self.flow_steps = _checks.positive_int("flow_steps", flow_steps)
        self.start_time = start_time

    def replayable(self, state: TimedState) -> bool:
        """Steps from any ``state`` alike: the chains' times live on the device."""
        return True

    def init(self, x0: torch.Tensor, energy: EnergyFn) -> TimedState:
        time = torch.as_tensor(self.start_time, dtype=x0.dtype, device=x0.device)
        start = SamplerState.start(x0.detach().clone(), None, None, 0)
        return start.as_kind(TimedState, time=time.expand(len(x0)).clone())

    def step(
        self, state: TimedState, energy: EnergyFn, generator: torch.Generator | None = None
    ) -> TimedState:
        e, grad = energy_and_grad(energy, state.x)
        time = state.time + 1 / self.flow_steps
        eps = energy_matching_temperature(time, self.tau_star, self.eps_max)
        h = self.step_size
        noise = gaussian_noise(state.x, generator)
        x = euler_maruyama(state.x, grad, h, (2 * eps * h).sqrt(), noise)
        # the energy at the step's start goes into the step's info, then is dropped
        return state.replace(energy=e).taken(
            x=x, energy=None, grad=None, time=time, n_grad_evals=state.n_grad_evals + 1
        )
