"""Samplers: how to draw x ~ exp(-E(x)) / Z."""

from ebmlab.samplers.base import (
    NonFiniteChainError,
    Sampler,
    SamplerState,
    SampleRun,
    StepInfo,
    frozen_parameters,
)
from ebmlab.samplers.descent import EquilibriumDescent
from ebmlab.samplers.discrete import DiscreteLangevin, GibbsWithGradients
from ebmlab.samplers.energy_matching import EnergyMatchingSampler
from ebmlab.samplers.gibbs import BlockGibbs, Gibbs
from ebmlab.samplers.hmc import HMC, AdaptiveHMC
from ebmlab.samplers.langevin import Langevin
from ebmlab.samplers.mala import MALA
from ebmlab.samplers.metropolis import MetropolisHastings
from ebmlab.samplers.neutra import FlowFitError, NeuTra
from ebmlab.samplers.nuts import NUTS
from ebmlab.samplers.replay_buffer import (
    ReplayBuffer,
    gaussian_init,
    mixture_init,
    uniform_init,
)
from ebmlab.samplers.riemannian import SoftAbsHMC
from ebmlab.samplers.tempering import ParallelTempering, anneal, geometric_path, tuned_ladder
from ebmlab.samplers.underdamped import SGHMC, UnderdampedLangevin
from ebmlab.samplers.walnuts import WALNUTS

__all__ = [
    "HMC",
    "MALA",
    "NUTS",
    "SGHMC",
    "WALNUTS",
    "AdaptiveHMC",
    "BlockGibbs",
    "DiscreteLangevin",
    "EnergyMatchingSampler",
    "EquilibriumDescent",
    "FlowFitError",
    "Gibbs",
    "GibbsWithGradients",
    "Langevin",
    "MetropolisHastings",
    "NeuTra",
    "NonFiniteChainError",
    "ParallelTempering",
    "ReplayBuffer",
    "SampleRun",
    "Sampler",
    "SamplerState",
    "SoftAbsHMC",
    "StepInfo",
    "UnderdampedLangevin",
    "anneal",
    "frozen_parameters",
    "gaussian_init",
    "geometric_path",
    "mixture_init",
    "tuned_ladder",
    "uniform_init",
]
