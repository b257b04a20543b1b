"""Energy functions: what assigns a scalar to a configuration (nn.Modules)."""

from ebmlab.energies.analytic import (
    AnalyticEnergy,
    Banana,
    DiagonalGaussian,
    DoubleWell,
    Funnel,
    Gaussian,
    GaussianMixture,
)
from ebmlab.energies.base import (
    EnergyFn,
    EnergyLike,
    EnergyModel,
    as_energy_fn,
    energy_and_grad,
    score,
)
from ebmlab.energies.boltzmann import BernoulliRBM, BoltzmannMachine
from ebmlab.energies.mlp import MLPEnergy

__all__ = [
    "AnalyticEnergy",
    "Banana",
    "BernoulliRBM",
    "BoltzmannMachine",
    "DiagonalGaussian",
    "DoubleWell",
    "EnergyFn",
    "EnergyFunction",
    "EnergyLike",
    "EnergyModel",
    "Funnel",
    "Gaussian",
    "GaussianMixture",
    "MLPEnergy",
    "as_energy_fn",
    "energy_and_grad",
    "score",
]
