"""Samplers against a hand-written PyTorch autograd loop doing the same updates."""

from __future__ import annotations

import math

import torch
from torch import nn

from benchmarks.harness import Case
from ebmlab.energies import MLPEnergy
from ebmlab.samplers import Langevin

STEPS = 20


def hand_written_langevin(
    net: nn.Module, x: torch.Tensor, steps: int, h: float, gen
) -> torch.Tensor:
    """The loop users write: autograd gradient of the energy, then the ULA update."""
    noise_scale = math.sqrt(2 * h)
    for _ in range(steps):
        x = x.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(net(x).sum(), x)
        x = x - h * g + noise_scale * torch.randn(x.shape, generator=gen)
    return x.detach()


def cases() -> list[Case]:
    torch.manual_seed(0)
    energy = MLPEnergy(64, hidden=(256, 256))
    x0 = torch.randn(1024, 64)
    sampler = Langevin(0.01)
    gen = torch.Generator().manual_seed(0)
    return [
        Case(
            what=f"Langevin, MLP 64-256-256-1 SiLU, 1024 chains, {STEPS} steps",
            ebmlab=lambda: sampler.sample(energy, x0, STEPS, generator=gen),
            anchor=lambda: hand_written_langevin(energy, x0, STEPS, 0.01, gen),
            anchor_name="hand-written autograd loop",
        )
    ]
