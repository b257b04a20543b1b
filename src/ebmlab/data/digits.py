"""scikit-learn's 8x8 handwritten digits, the embedded default data set, and a colour
version of it.

The split follows the code of Tomczak's book (2024, ch. 6) so results are comparable: the first
1000 images train, the next 350 validate, the last 447 test. Pixels are
integers 0..16. ``digits-rgb`` paints each digit in a random light colour on a random
dark background (fixed per image, seed ``COLOUR_SEED``): an RGB set of 8-bit pixels
(3, 8, 8) that is always available, for colour pipelines on any machine.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import numpy as np

COLOUR_SEED = 0
SPLITS = {"train": slice(0, 1000), "val": slice(1000, 1350), "test": slice(1350, 1797)}
IMAGE_SHAPE = (8, 8)


@functools.cache
def _all_digits() -> tuple[np.ndarray, np.ndarray]:
    """The file ``sklearn.datasets.load_digits`` reads (rows of 64 pixels, then the
    label), read here without importing scikit-learn, whose import takes longer than
    a short training run; ``tests/data`` checks the arrays against ``load_digits``."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the digits data set ships with scikit-learn: install it")
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
    rows = np.loadtxt(path, delimiter=",")
    return rows[:, :-1].reshape(-1, *IMAGE_SHAPE).astype(np.uint8), rows[:, -1].astype(np.int64)


def load_digits_arrays(split: str) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(images (N, 8, 8) uint8 in 0..16, labels (N,) int64)`` for a split
    (copies: the file is read and parsed once per process)."""
    images, labels = _all_digits()
    part = SPLITS[split]
    return images[part].copy(), labels[part].copy()


def load_digits_rgb_arrays(split: str) -> tuple[np.ndarray, np.ndarray]:
    """``(images (N, 3, 8, 8) uint8, labels (N,))``: each digit's ink level a = x / 16
    mixes a background colour (weight 1 - a) with an ink colour (weight a)."""
    images, labels = _all_digits()
    rng = np.random.default_rng(COLOUR_SEED)
    # light ink on dark paper, hues at random: every digit keeps its contrast
    ink = rng.uniform(145, 255, (len(images), 3, 1, 1))
    paper = rng.uniform(0, 110, (len(images), 3, 1, 1))
    a = images[:, None].astype(np.float64) / 16
    rgb = np.rint((1 - a) * paper + a * ink).astype(np.uint8)
    part = SPLITS[split]
    return rgb[part], labels[part].copy()
