"""Samplers: how to draw x ~ exp(-E(x)) / Z."""

from ebmlab.samplers.base import Sampler, SamplerState, SampleRun, frozen_parameters
from ebmlab.samplers.gibbs import BlockGibbs, Gibbs
from ebmlab.samplers.hmc import HMC, AdaptiveHMC
from ebmlab.samplers.langevin import Langevin
from ebmlab.samplers.mala import MALA
from ebmlab.samplers.metropolis import MetropolisHastings
from ebmlab.samplers.nuts import NUTS
from ebmlab.samplers.replay_buffer import (
    ReplayBuffer,
    gaussian_init,
    mixture_init,
    uniform_init,
)
from ebmlab.samplers.tempering import ParallelTempering, anneal, geometric_path

__all__ = [
    "HMC",
    "MALA",
    "NUTS",
    "AdaptiveHMC",
    "BlockGibbs",
    "Gibbs",
    "Langevin",
    "MetropolisHastings",
    "ParallelTempering",
    "ReplayBuffer",
    "SampleRun",
    "Sampler",
    "SamplerState",
    "anneal",
    "frozen_parameters",
    "gaussian_init",
    "geometric_path",
    "mixture_init",
    "uniform_init",
]
