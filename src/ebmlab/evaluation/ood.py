"""Out-of-distribution detection: shifted data sets and AUROC of a score.

A score is higher for inputs the model considers in-distribution; AUROC is the
probability that a random in-distribution input outscores a random OOD input
(0.5: chance, 1: perfect separation).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import roc_auc_score

from ebmlab import _checks


def auroc(in_scores: torch.Tensor, out_scores: torch.Tensor) -> float:
    labels = np.concatenate([np.ones(len(in_scores)), np.zeros(len(out_scores))])
    scores = torch.cat([in_scores, out_scores]).double().numpy()
    if not np.isfinite(scores).all():
        raise ValueError("OOD scores contain NaN or infinite values")
    return float(roc_auc_score(labels, scores))


def shifted_images(raw: np.ndarray, seed: int = 0) -> dict[str, np.ndarray]:
    """OOD variants of raw images (N, H, W): permuted pixels, left-right and up-down flips."""
    rng = np.random.default_rng(seed)
    flat = raw.reshape(len(raw), -1)
    permuted = np.stack([row[rng.permutation(flat.shape[1])] for row in flat]).reshape(raw.shape)
    return {
        "permuted": permuted,
        "flip_lr": raw[:, :, ::-1].copy(),
        "flip_ud": raw[:, ::-1, :].copy(),
    }


def load_ood_file(path: str | Path, image_shape: tuple[int, int]) -> np.ndarray:
    """Load a user OOD set: a .npy of uint8 images (N, H, W) in the training set's raw format."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--ood-data file {path} does not exist")
    try:
        arr = np.load(path, allow_pickle=False)
    except ValueError as err:
        raise ValueError(f"--ood-data file {path} is not a plain .npy array: {err}") from err
    if arr.dtype != np.uint8 or arr.ndim != 3 or tuple(arr.shape[1:]) != tuple(image_shape):
        raise ValueError(
            f"--ood-data must hold uint8 images of shape (N, {image_shape[0]}, {image_shape[1]}), "
            f"got {arr.dtype} {arr.shape}"
        )
    if len(arr) == 0:
        raise ValueError("--ood-data holds no images")
    return arr


def uniform_noise(
    n: int, dim: int, value_range: tuple[float, float], seed: int = 0
) -> torch.Tensor:
    _checks.positive_int("n", n)
    gen = torch.Generator().manual_seed(seed)
    lo, hi = value_range
    return lo + (hi - lo) * torch.rand(n, dim, generator=gen)
