"""Sampling by descent: the optimisation-based sampler of Equilibrium Matching.

Equilibrium Matching (Wang & Du 2025) learns a time-independent field f = -grad E whose
equilibria are the data, so a sample is found by descending E from noise rather than by
integrating a time-dependent flow. Plain gradient descent takes x_{k+1} = x_k + eta f(x_k).
The Nesterov variant (NAG-GD, their section 3.3 and reference code) evaluates the field
at a point looked ahead along the last step's field, y_k = x_k + eta mu m_k, and steps
with it: m_{k+1} = f(y_k), x_{k+1} = x_k + eta m_{k+1}, with m_0 = 0. The paper samples
ImageNet with eta = 0.0017 and mu = 0.3. No noise is added: the chains converge to
equilibria of f, which is what the objective makes of the data. A step's
``info.energy`` is E at its start, one forward pass more when the look-ahead moves the
field's point away from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ebmlab import _checks
from ebmlab.energies.base import EnergyFn, energy_and_grad
from ebmlab.samplers.base import Sampler, SamplerState


@dataclass(frozen=True)
class DescentState(SamplerState):
    """Chains and the field at the last look-ahead point (``momentum``, x's shape)."""

    momentum: torch.Tensor | None = None


class EquilibriumDescent(Sampler[DescentState]):
    """Gradient descent on the energy, with Nesterov's look-ahead for ``momentum`` > 0
    (Wang & Du 2025, NAG-GD).

    Args:
        step_size: eta, the step along the field -grad E.
        momentum: mu, how far ahead (in units of eta times the last field) the field is
            evaluated; 0 gives plain gradient descent.
    """

    def __init__(self, step_size: float, momentum: float = 0.0) -> None:
        self.step_size = _checks.positive("step_size", step_size)
        self.momentum = _checks.positive("momentum", momentum, allow_zero=True)

    def replayable(self, state: DescentState) -> bool:
        """Steps from any ``state`` alike."""
        return True

    def init(self, x0: torch.Tensor, energy: EnergyFn) -> DescentState:
        start = SamplerState.start(x0.detach().clone(), None, None, 0)
        return start.as_kind(DescentState, momentum=torch.zeros_like(x0))

    def step(
        self, state: DescentState, energy: EnergyFn, generator: torch.Generator | None = None
    ) -> DescentState:
        eta, mu = self.step_size, self.momentum
        if mu:  # the field at the look-ahead point; E at the start for the step's info
            _, grad = energy_and_grad(energy, state.x + (eta * mu) * state.momentum)
            with torch.no_grad():
                e = energy(state.x)
        else:
            e, grad = energy_and_grad(energy, state.x)
        field = -grad
        # the energy at the step's start goes into the step's info, then is dropped
        return state.replace(energy=e).taken(
            x=state.x + eta * field,
            energy=None,
            grad=None,
            momentum=field,
            n_grad_evals=state.n_grad_evals + 1,
        )
