"""Random affine augmentation of flattened images: shifts, rotations and scaling.

Small classifiers on small image sets (1000 digits) generalise much better when each
batch sees the images slightly moved, turned and resized; the background outside the
image is filled with the data set's background value.
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from ebmlab import _checks


def random_affine(
    x: torch.Tensor,
    image_shape: tuple[int, ...],
    generator: torch.Generator,
    *,
    shift: float = 0.0,
    rotate: float = 0.0,
    scale: float = 0.0,
    fill: float = 0.0,
) -> torch.Tensor:
    """Move each flat image in ``x`` (B, C*H*W) by a random affine map about its centre.

    Per image: a translation uniform in [-shift, shift] pixels on each axis, a rotation
    uniform in [-rotate, rotate] degrees and a zoom factor uniform in [1 - scale, 1 + scale];
    pixels are resampled bilinearly, and those coming from outside the image get ``fill``.
    """
    _checks.positive("shift", shift, allow_zero=True)
    _checks.positive("rotate", rotate, allow_zero=True)
    _checks.probability("scale", scale)
    c, h, w = image_shape
    n = x.shape[0]
    u = torch.rand(n, 4, generator=generator, dtype=x.dtype, device=x.device) * 2 - 1
    angle = u[:, 0] * rotate * math.pi / 180
    zoom = 1 + u[:, 1] * scale
    # affine_grid maps output to input coordinates in [-1, 1]: zooming in by s samples 1/s.
    cos, sin = torch.cos(angle) / zoom, torch.sin(angle) / zoom
    tx, ty = u[:, 2] * shift * 2 / w, u[:, 3] * shift * 2 / h
    theta = torch.stack([torch.stack([cos, -sin, tx], 1), torch.stack([sin, cos, ty], 1)], 1)
    images = x.reshape(n, c, h, w) - fill
    grid = F.affine_grid(theta, [n, c, h, w], align_corners=False)
    moved = F.grid_sample(images, grid, align_corners=False, padding_mode="zeros")
    return (moved + fill).reshape(n, c * h * w)
