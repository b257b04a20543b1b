"""Image pairs related by a known transformation, for models of transformations.

Each pair is a random-dot image x and the same dots moved by one of
:data:`TRANSFORMATIONS` (one-pixel shifts and rotations about the centre), the task
on which Memisevic & Hinton (2010) trained gated RBMs: nothing about the dots is
predictable, so only the transformation can be learned. Dots are drawn on a canvas
wider than the image and both images are cut from its centre, so no pixel of y comes
from outside the dots.
"""

from __future__ import annotations

import math

import torch

from ebmlab import _checks

# (name, column shift, row shift, rotation in degrees, anticlockwise)
TRANSFORMATIONS: tuple[tuple[str, int, int, float], ...] = (
    ("right", 1, 0, 0.0),
    ("left", -1, 0, 0.0),
    ("down", 0, 1, 0.0),
    ("up", 0, -1, 0.0),
    ("rotate +15", 0, 0, 15.0),
    ("rotate -15", 0, 0, -15.0),
    ("rotate +30", 0, 0, 30.0),
    ("rotate -30", 0, 0, -30.0),
)


def transform_images(images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Move each image (B, H, W) by its transformation ``labels`` (B,) (indices into
    :data:`TRANSFORMATIONS`), by nearest-neighbour resampling about the centre; pixels
    coming from outside the image are 0."""
    if images.dim() != 3:
        raise _checks.ArgumentError(f"images must be (B, H, W), got shape {tuple(images.shape)}")
    labels = labels.long()
    if len(labels) != len(images) or labels.min() < 0 or labels.max() >= len(TRANSFORMATIONS):
        raise _checks.ArgumentError(
            f"labels must be {len(images)} indices in [0, {len(TRANSFORMATIONS)}), got "
            f"{labels.tolist()[:8]}"
        )
    _, height, width = images.shape
    table = torch.tensor([t[1:] for t in TRANSFORMATIONS], dtype=torch.float64)[labels.cpu()]
    angle = torch.deg2rad(table[:, 2])[:, None, None]
    rows = torch.arange(height, dtype=torch.float64)[:, None] - (height - 1) / 2
    cols = torch.arange(width, dtype=torch.float64)[None, :] - (width - 1) / 2
    # Invert the move: an output pixel takes the input pixel that lands on it.
    rows, cols = rows - table[:, 1, None, None], cols - table[:, 0, None, None]
    cos, sin = torch.cos(angle), torch.sin(angle)
    src_cols = cos * cols - sin * rows + (width - 1) / 2
    src_rows = sin * cols + cos * rows + (height - 1) / 2
    src_rows, src_cols = src_rows.round().long(), src_cols.round().long()
    inside = (src_rows >= 0) & (src_rows < height) & (src_cols >= 0) & (src_cols < width)
    flat = (src_rows.clamp(0, height - 1) * width + src_cols.clamp(0, width - 1)).to(images.device)
    moved = images.flatten(1).gather(1, flat.flatten(1)).view_as(images)
    return moved * inside.to(images.device, images.dtype)


def transformed_pairs(
    n: int, size: int = 13, density: float = 0.1, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``n`` random-dot pairs: inputs x (n, size^2), outputs y (n, size^2), both 0/1
    float32, and the transformation index of each pair (n,), uniform over
    :data:`TRANSFORMATIONS`. Each pixel is a dot with probability ``density``.

    Args:
        seed: seed of the randomness (int).
    """
    _checks.positive_int("n", n)
    _checks.positive_int("size", size)
    _checks.probability("density", density)
    generator = torch.Generator().manual_seed(seed)
    margin = math.ceil(size * (math.sqrt(2) - 1) / 2) + 2  # room for the corners' moves
    canvas = size + 2 * margin
    dots = (torch.rand(n, canvas, canvas, generator=generator) < density).float()
    labels = torch.randint(len(TRANSFORMATIONS), (n,), generator=generator)
    moved = transform_images(dots, labels)
    crop = slice(margin, margin + size)
    return dots[:, crop, crop].flatten(1), moved[:, crop, crop].flatten(1), labels


def digits_on_canvas(n: int, size: int = 13) -> torch.Tensor:
    """The first ``n`` scikit-learn digits (8 x 8), thresholded at half intensity and
    centred on a ``size`` x ``size`` canvas, as 0/1 rows (n, size^2): new inputs x* for
    analogies with the dot pairs."""
    from ebmlab.data.digits import load_digits_arrays

    _checks.positive_int("n", n)
    if size < 8:
        raise _checks.ArgumentError(f"size must be at least 8 (the digits' side), got {size}")
    images = torch.as_tensor(load_digits_arrays("train")[0][:n] > 8, dtype=torch.float32)
    canvas = torch.zeros(len(images), size, size)
    offset = (size - 8) // 2
    canvas[:, offset : offset + 8, offset : offset + 8] = images.view(-1, 8, 8)
    return canvas.flatten(1)
