"""Data sets: digits (ships with scikit-learn), MNIST IDX files, 2-D toy densities.

One entry point, :func:`load_dataset`, returns a :class:`Dataset` record holding
float tensors ready for training. Image data come in three transforms:

- ``"raw"``: the integer pixel values as floats (0..16 for digits, 0..255 for MNIST);
- ``"scaled"``: [-1, 1]; digits as in the seed book's code, 2 x / 17 - 1; MNIST 2 x / 255 - 1;
- ``"binary"``: {0, 1}, digits x >= 8, MNIST x / 255 >= 0.5.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import numpy as np
import torch

from ebmlab import _checks
from ebmlab.data import digits, mnist
from ebmlab.data.mnist import DataNotFoundError
from ebmlab.data.toys import TOYS, ToyDistribution, make_toy

IMAGE_SETS = ("digits", "mnist", "mnist10k")
DATASETS = (*IMAGE_SETS, *TOYS)
TRANSFORMS = ("raw", "scaled", "binary")
TOY_SIZES = {"train": 10_000, "val": 2_000, "test": 10_000}
TOY_SEEDS = {"train": 0, "val": 1, "test": 2}


@dataclass(frozen=True)
class Dataset:
    """A loaded split: inputs ``x`` (N, *shape), labels ``y`` (N,) or None, and metadata."""

    name: str
    split: str
    x: torch.Tensor
    y: torch.Tensor | None
    transform: str
    value_range: tuple[float, float]
    image_shape: tuple[int, ...] | None = None
    num_classes: int | None = None
    raw: np.ndarray | None = None

    def __len__(self) -> int:
        return self.x.shape[0]

    def to(self, device: torch.device | str) -> Dataset:
        """This split with ``x`` and ``y`` on ``device`` (``raw`` stays a NumPy array)."""
        y = None if self.y is None else self.y.to(device)
        return dataclasses.replace(self, x=self.x.to(device), y=y)


@dataclass(frozen=True)
class PixelSpec:
    """How a set's integer pixels map to the transforms."""

    max_value: int
    scale_denominator: float  # scaled = 2 x / scale_denominator - 1
    binary_threshold: float  # binary = x >= binary_threshold


PIXELS = {
    "digits": PixelSpec(max_value=16, scale_denominator=17.0, binary_threshold=8.0),
    "mnist": PixelSpec(max_value=255, scale_denominator=255.0, binary_threshold=127.5),
}


def apply_transform(
    raw: np.ndarray, spec: PixelSpec, transform: str
) -> tuple[torch.Tensor, tuple[float, float]]:
    """Map integer pixels to the float representation named ``transform``."""
    _checks.one_of("transform", transform, TRANSFORMS)
    x = torch.from_numpy(raw.astype(np.float32))
    if transform == "raw":
        return x, (0.0, float(spec.max_value))
    if transform == "binary":
        return (x >= spec.binary_threshold).float(), (0.0, 1.0)
    return 2 * x / spec.scale_denominator - 1, (-1.0, 1.0)


def _image_arrays(name: str, split: str, root: str | os.PathLike | None):
    if name == "digits":
        _checks.one_of("split", split, list(digits.SPLITS))
        return (*digits.load_digits_arrays(split), PIXELS["digits"])
    _checks.one_of("split", split, ["train", "test"])
    load = mnist.load_mnist_arrays if name == "mnist" else mnist.load_mnist10k_arrays
    return (*load(split, root), PIXELS["mnist"])


def load_dataset(
    name: str,
    split: str = "train",
    *,
    root: str | os.PathLike | None = None,
    transform: str = "scaled",
    flatten: bool = True,
    n: int | None = None,
) -> Dataset:
    """Load split ``split`` of data set ``name``.

    Image sets: ``digits`` (splits train/val/test), ``mnist`` and ``mnist10k`` (train/test),
    looked up under ``root`` or ``$EBMLAB_DATA``. ``flatten`` gives x of shape (N, H*W),
    otherwise (N, 1, H, W). Toy sets (``8gaussians``, ``25gaussians``, ``checkerboard``,
    ``rings``, ``pinwheel``): ``n`` exact samples drawn with a fixed seed per split.
    """
    _checks.one_of("name", name, DATASETS)
    if name in TOYS:
        _checks.one_of("split", split, list(TOY_SEEDS))
        size = _checks.positive_int("n", n) if n is not None else TOY_SIZES[split]
        toy = make_toy(name)
        gen = torch.Generator().manual_seed(TOY_SEEDS[split])
        return Dataset(name, split, toy.sample(size, gen), None, "raw", toy.bounds[0])
    images, labels, spec = _image_arrays(name, split, root)
    if n is not None:
        _checks.positive_int("n", n)
        images, labels = images[:n], labels[:n]
    x, value_range = apply_transform(images, spec, transform)
    h, w = images.shape[1:]
    x = x.reshape(len(x), h * w) if flatten else x.reshape(len(x), 1, h, w)
    return Dataset(
        name=name,
        split=split,
        x=x,
        y=torch.from_numpy(labels),
        transform=transform,
        value_range=value_range,
        image_shape=(1, h, w),
        num_classes=10,
        raw=images,
    )


def available_datasets(root: str | os.PathLike | None = None) -> dict[str, str]:
    """Which data sets can be loaded here, each with where it comes from."""
    found = {"digits": "scikit-learn (built in)"}
    test = mnist.find_split("test", root)
    if test is not None:
        found["mnist10k"] = str(test[0].parent)
        if mnist.find_split("train", root) is not None:
            found["mnist"] = str(test[0].parent)
    for name in TOYS:
        found[name] = "exact 2-D density (built in)"
    return found


__all__ = [
    "DATASETS",
    "DataNotFoundError",
    "Dataset",
    "PixelSpec",
    "ToyDistribution",
    "apply_transform",
    "available_datasets",
    "load_dataset",
    "make_toy",
]
