"""Random augmentation of flattened images: affine moves (shifts, rotations, scaling),
crops of padded images and horizontal flips.

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

    Args:
        image_shape: (channels, height, width) of the input images.
        generator: source of randomness, a ``torch.Generator`` on the data's device
            (``None``: the global one).
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


def random_crop_flip(
    x: torch.Tensor,
    image_shape: tuple[int, ...],
    generator: torch.Generator,
    *,
    pad: int = 0,
    flip: bool = False,
    fill: float = 0.0,
) -> torch.Tensor:
    """Random crops and horizontal flips of flat images ``x`` (B, C*H*W), the standard
    augmentation of CIFAR and SVHN classifiers (JEM uses both, with ``pad`` 4).

    Each image is padded by ``pad`` pixels of value ``fill`` on every side and an H x W
    window is cut at a uniformly random offset; with ``flip`` it is mirrored left-right
    with probability 1/2. One gather for the whole batch, on ``x``'s device.

    Args:
        image_shape: (channels, height, width) of the input images.
        generator: source of randomness, a ``torch.Generator`` on the data's device
            (``None``: the global one).
    """
    _checks.positive_int("pad", pad, allow_zero=True)
    c, h, w = image_shape
    n = x.shape[0]
    images = x.reshape(n, c, h, w)
    if pad:
        images = F.pad(images, (pad, pad, pad, pad), value=fill)
    offsets = torch.randint(0, 2 * pad + 1, (n, 2), generator=generator, device=x.device)
    rows = offsets[:, :1] + torch.arange(h, device=x.device)  # (n, h)
    cols = offsets[:, 1:] + torch.arange(w, device=x.device)  # (n, w)
    if flip:
        mirror = torch.rand(n, 1, generator=generator, device=x.device) < 0.5
        cols = torch.where(mirror, cols.flip(1), cols)
    index = rows[:, None, :, None] * images.shape[-1] + cols[:, None, None, :]
    flat = images.flatten(2).gather(2, index.expand(n, c, h, w).flatten(2))
    return flat.reshape(n, c * h * w)
