"""scikit-learn's 8x8 handwritten digits, the embedded default data set.

The split follows the seed book's code so results are comparable: the first
1000 images train, the next 350 validate, the last 447 test. Pixels are
integers 0..16.
"""

from __future__ import annotations

import functools

import numpy as np

SPLITS = {"train": slice(0, 1000), "val": slice(1000, 1350), "test": slice(1350, 1797)}
IMAGE_SHAPE = (8, 8)


@functools.cache
def _all_digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.images.astype(np.uint8), bunch.target.astype(np.int64)


def load_digits_arrays(split: str) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(images (N, 8, 8) uint8 in 0..16, labels (N,) int64)`` for a split
    (copies: the file is read and parsed once per process)."""
    images, labels = _all_digits()
    part = SPLITS[split]
    return images[part].copy(), labels[part].copy()
