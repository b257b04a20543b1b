"""Underdamped (kinetic) Langevin dynamics and stochastic-gradient HMC.

The underdamped Langevin diffusion with unit mass and friction gamma,

    dx = v dt,   dv = -grad E(x) dt - gamma v dt + sqrt(2 gamma) dW,

leaves exp(-E(x) - |v|^2 / 2) invariant. Splitting it into a kick B
(v -= h/2 grad E), a drift A (x += h/2 v) and the exact Ornstein-Uhlenbeck step O
(v = c v + sqrt(1 - c^2) xi, c = exp(-gamma h) over a step h) gives the schemes of
Leimkuhler & Matthews (2013), in :mod:`ebmlab.samplers.integrators`: BAOAB, whose
configurational samples are exact for Gaussian targets and second-order accurate
otherwise, and OBABO (half O steps around a velocity-Verlet step). Momentum persists between
steps, so chains move ballistically for about 1 / gamma time units: the mixing of
HMC with the cost of Langevin (one gradient per step, reused by the next step).

:class:`SGHMC` is the update of Chen, Fox & Guestrin (2014, eq. 15), written for
noisy (minibatch) energies: v = (1 - alpha) v - eta grad E(x) + N(0, 2 (alpha -
beta_hat) eta), x = x + v. With eta = h^2 and alpha = gamma h it is a first-order
discretisation of the same diffusion in the velocity v = h p.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.energies.base import EnergyFn, energy_and_grad
from ebmlab.samplers.base import Sampler, SamplerState, add_scaled, per_chain
from ebmlab.samplers.integrators import gaussian_noise, underdamped_step


@dataclass(frozen=True)
class KineticState(SamplerState):
    """Chains' positions, energies and gradients with their momenta (velocities)."""

    momentum: torch.Tensor | None = None


class _Kinetic(Sampler[KineticState]):
    """Shared state handling: chains start at rest with the energy and gradient cached."""

    def init(self, x0: torch.Tensor, energy: EnergyFn) -> KineticState:
        start = SamplerState.start(x0.detach().clone(), None, None, 0).evaluated(energy)
        return start.as_kind(KineticState, momentum=torch.zeros_like(start.x))

    def replayable(self, state: KineticState) -> bool:
        """Steps from any ``state`` alike."""
        return True

    def _advanced(
        self,
        state: KineticState,
        x: torch.Tensor,
        v: torch.Tensor,
        e: torch.Tensor,
        g: torch.Tensor,
    ) -> KineticState:
        """The next state: position ``x`` with its energy and gradient, momentum ``v``."""
        return state.taken(x=x, energy=e, grad=g, momentum=v, n_grad_evals=state.n_grad_evals + 1)


class UnderdampedLangevin(_Kinetic):
    """Underdamped Langevin dynamics by BAOAB or OBABO splitting (unit mass).

    Args:
        step_size: h.
        friction: gamma; large values approach overdamped Langevin, small values
            Hamiltonian motion.
        scheme: ``"baoab"`` (exact configurational variance on Gaussians) or ``"obabo"``.
    """

    def __init__(self, step_size: float, friction: float = 1.0, scheme: str = "baoab") -> None:
        self.step_size = _checks.positive("step_size", step_size)
        self.friction = _checks.positive("friction", friction)
        self.scheme = _checks.one_of("scheme", scheme, ["baoab", "obabo"])

    def tempered(self, beta: torch.Tensor) -> UnderdampedLangevin:
        """Step size / sqrt(beta): the stiffness of beta E grows with beta."""
        return self._rescaled("step_size", beta, 0.5)

    def step(
        self, state: KineticState, energy: EnergyFn, generator: torch.Generator | None = None
    ) -> KineticState:
        x, v, e, g = underdamped_step(
            energy,
            state.x,
            state.momentum,
            state.grad,
            self.step_size,
            self.friction,
            generator,
            self.scheme,
        )
        return self._advanced(state, x, v, e, g)


class SGHMC(_Kinetic):
    """Stochastic-gradient Hamiltonian Monte Carlo (Chen, Fox & Guestrin 2014, eq. 15).

    Args:
        learning_rate: eta (the squared step size, h^2).
        momentum_decay: alpha = gamma h, in (0, 1].
        noise_estimate: beta_hat, an estimate of the gradient noise's variance term
            (0 for exact gradients); must be below ``momentum_decay``.
    """

    def __init__(
        self, learning_rate: float, momentum_decay: float = 0.1, noise_estimate: float = 0.0
    ) -> None:
        self.learning_rate = _checks.positive("learning_rate", learning_rate)
        self.momentum_decay = _checks.probability("momentum_decay", momentum_decay)
        if self.momentum_decay == 0:
            raise ArgumentError("momentum_decay must be in (0, 1], got 0")
        self.noise_estimate = _checks.positive("noise_estimate", noise_estimate, allow_zero=True)
        if self.noise_estimate >= self.momentum_decay:
            raise ArgumentError(
                f"noise_estimate must be below momentum_decay ({self.momentum_decay}), "
                f"got {noise_estimate}"
            )

    def tempered(self, beta: torch.Tensor) -> SGHMC:
        """Learning rate / beta (the step size / sqrt(beta))."""
        return self._rescaled("learning_rate", beta, 1.0)

    def step(
        self, state: KineticState, energy: EnergyFn, generator: torch.Generator | None = None
    ) -> KineticState:
        eta = per_chain(self.learning_rate, state.x)
        sd = (2 * (self.momentum_decay - self.noise_estimate) * eta) ** 0.5
        v = add_scaled((1 - self.momentum_decay) * state.momentum, -eta, state.grad)
        v = add_scaled(v, sd, gaussian_noise(v, generator), inplace=True)
        x = state.x + v
        return self._advanced(state, x, v, *energy_and_grad(energy, x))
