"""Random-walk Metropolis-Hastings with Gaussian proposals (Metropolis et al. 1953).

x' = x + scale * eps is accepted with probability min(1, exp(E(x) - E(x'))); the
proposal is symmetric so no correction term is needed. Uses energies only, no
gradients: the sampler of choice for non-differentiable energies.
"""

from __future__ import annotations

import torch

from ebmlab import _checks
from ebmlab.energies.base import EnergyFn
from ebmlab.samplers.base import Sampler, SamplerState, add_scaled, metropolis_update, per_chain
from ebmlab.samplers.integrators import gaussian_noise


class MetropolisHastings(Sampler[SamplerState]):
    """Gaussian random-walk Metropolis with proposal standard deviation ``scale``."""

    def __init__(self, scale: float) -> None:
        self.scale = _checks.positive("scale", scale)

    def tempered(self, beta: torch.Tensor) -> MetropolisHastings:
        """Proposal scale / sqrt(beta), matched to the tempered distributions' width."""
        return self._rescaled("scale", beta, 0.5)

    def replayable(self, state: SamplerState) -> bool:
        """Steps from any ``state`` alike."""
        return True

    def init(self, x0: torch.Tensor, energy: EnergyFn) -> SamplerState:
        x = x0.detach().clone()
        with torch.no_grad():
            e = energy(x)
        return SamplerState.start(x, e, None, n_grad_evals=0)

    def step(
        self, state: SamplerState, energy: EnergyFn, generator: torch.Generator | None = None
    ) -> SamplerState:
        noise = gaussian_noise(state.x, generator)
        proposal = add_scaled(state.x, per_chain(self.scale, state.x), noise)
        with torch.no_grad():
            e_new = energy(proposal)
        return metropolis_update(
            state, proposal, e_new, None, state.energy - e_new, generator, n_grad_evals=0
        )
