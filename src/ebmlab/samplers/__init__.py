"""Samplers: how to draw x ~ exp(-E(x)) / Z."""

from ebmlab.samplers.base import SampleRun, Sampler, SamplerState, frozen_parameters
from ebmlab.samplers.hmc import HMC, AdaptiveHMC
from ebmlab.samplers.langevin import Langevin
from ebmlab.samplers.mala import MALA
from ebmlab.samplers.metropolis import MetropolisHastings
from ebmlab.samplers.replay_buffer import ReplayBuffer, uniform_init

__all__ = [
    "HMC",
    "MALA",
    "AdaptiveHMC",
    "Langevin",
    "MetropolisHastings",
    "ReplayBuffer",
    "SampleRun",
    "Sampler",
    "SamplerState",
    "frozen_parameters",
    "uniform_init",
]
