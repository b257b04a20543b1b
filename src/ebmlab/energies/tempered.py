"""A potential read as a Boltzmann density at a temperature: E(x) = V(x) / T.

Energy Matching (Balcerak et al. 2025) learns a potential V whose Boltzmann density
exp(-V / eps_max) models the data; its likelihood, samplers and log Z need the energy
V / eps_max, with V's own parameters (and V's fused gradients, scaled).
"""

from __future__ import annotations

import torch

from ebmlab import _checks
from ebmlab.energies.base import EnergyModel


class TemperedEnergy(EnergyModel):
    """E(x) = V(x) / ``temperature`` for a potential V: the density exp(-V / T) / Z.

    Args:
        potential: V, an energy model (its parameters are this model's).
        temperature: T > 0 (Energy Matching's eps_max).
    """

    def __init__(self, potential: EnergyModel, temperature: float) -> None:
        super().__init__()
        self.potential = potential
        self.temperature = _checks.positive("temperature", temperature)

    def energy(self, x: torch.Tensor) -> torch.Tensor:
        return self.potential(x) / self.temperature

    def energy_and_grad(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        e, g = self.potential.energy_and_grad(x)  # V's own (fused) gradient
        return e / self.temperature, g / self.temperature
