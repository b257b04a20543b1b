"""Simulated walking: joint angles of a two-legged gait, a test bed for sequence models.

Each sequence walks at its own cadence: the gait phase advances by a per-sequence speed
in [0.25, 0.4] radians per frame with a small random jitter. The six joints are
non-sinusoidal functions of the phase, as in human walking: hips swing sinusoidally,
knees only flex (a rectified sinusoid, ahead of the hip), ankles follow a clipped
second harmonic, and the second leg runs half a cycle behind the first. The kinks make
the next frame a nonlinear function of the last ones, which a linear autoregression
can only approximate; the observation noise sets the floor of any predictor.
"""

from __future__ import annotations

import math

import torch

from ebmlab import _checks

JOINTS = ("hip left", "knee left", "ankle left", "hip right", "knee right", "ankle right")


def walking_gaits(
    n_sequences: int = 40,
    n_frames: int = 200,
    *,
    noise: float = 0.005,
    seed: int = 0,
) -> torch.Tensor:
    """Joint angles (n_sequences, n_frames, 6) of simulated walkers, in :data:`JOINTS`
    order, with Gaussian observation noise of standard deviation ``noise``.

    Args:
        seed: seed of the randomness (int).
    """
    _checks.positive_int("n_sequences", n_sequences)
    _checks.positive_int("n_frames", n_frames)
    _checks.positive("noise", noise, allow_zero=True)
    gen = torch.Generator().manual_seed(seed)
    speed = 0.25 + 0.15 * torch.rand(n_sequences, 1, generator=gen)
    steps = speed + 0.005 * torch.randn(n_sequences, n_frames, generator=gen)
    start = 2 * math.pi * torch.rand(n_sequences, 1, generator=gen)
    phase = torch.cumsum(steps, 1) + start
    legs = []
    for lag in (0.0, math.pi):
        leg = phase + lag
        hip = torch.sin(leg)
        knee = 1.5 * torch.relu(torch.sin(leg + 0.6))
        ankle = 0.5 * torch.sin(2 * leg).clamp(-0.5, 1.0)
        legs += [hip, knee, ankle]
    angles = torch.stack(legs, 2)
    return angles + noise * torch.randn(angles.shape, generator=gen)
