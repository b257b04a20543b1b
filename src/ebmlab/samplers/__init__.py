"""Samplers: how to draw x ~ exp(-E(x)) / Z."""

from ebmlab.samplers.base import Sampler, SamplerState, SampleRun, frozen_parameters
from ebmlab.samplers.langevin import Langevin
from ebmlab.samplers.replay_buffer import ReplayBuffer, uniform_init

__all__ = [
    "Langevin",
    "ReplayBuffer",
    "SampleRun",
    "Sampler",
    "SamplerState",
    "frozen_parameters",
    "uniform_init",
]
