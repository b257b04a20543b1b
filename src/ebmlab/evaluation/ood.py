"""Out-of-distribution detection: shifted data sets and AUROC of a score.

A score is higher for inputs the model considers in-distribution; AUROC is the
probability that a random in-distribution input outscores a random OOD input
(0.5: chance, 1: perfect separation).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, overload

import numpy as np
import torch

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.data import IMAGE_SETS, DataNotFoundError, load_dataset
from ebmlab.devices import widen


@overload
def auroc(
    in_scores: torch.Tensor, out_scores: torch.Tensor, *, return_stderr: Literal[False] = False
) -> float: ...
@overload
def auroc(
    in_scores: torch.Tensor, out_scores: torch.Tensor, *, return_stderr: Literal[True]
) -> tuple[float, float]: ...
def auroc(
    in_scores: torch.Tensor, out_scores: torch.Tensor, *, return_stderr: bool = False
) -> float | tuple[float, float]:
    """AUROC of a score, the Mann-Whitney statistic P(in > out) + P(in = out) / 2, and
    with ``return_stderr`` its standard error (DeLong et al. 1988): each input's share
    of the pairs it wins, V_in (over the OOD inputs) and V_out (over the in-distribution
    ones), gives var = var(V_in) / m + var(V_out) / n for m and n inputs.

    Args:
        in_scores: scores of in-distribution inputs (n,); higher means more in.
        out_scores: scores of out-of-distribution inputs (m,).
    """
    _checks.tensor("in_scores", in_scores, min_ndim=1)
    _checks.tensor("out_scores", out_scores, min_ndim=1)
    a, b = widen(in_scores.detach().flatten()), widen(out_scores.detach().flatten())
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        raise ArgumentError("OOD scores contain NaN or infinite values")
    wins_in = _pair_wins(a, b)  # per in-distribution input, share of OOD inputs below it
    value = float(wins_in.mean())
    if not return_stderr:
        return value
    if len(a) < 2 or len(b) < 2:
        raise ArgumentError("auroc's standard error needs at least two scores on each side")
    wins_out = 1.0 - _pair_wins(b, a)  # per OOD input, share of in-distribution inputs above it
    variance = wins_in.var() / len(a) + wins_out.var() / len(b)
    return value, float(variance.sqrt())


def _pair_wins(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """For each a_i, (#{b < a_i} + #{b = a_i} / 2) / len(b), by binary search."""
    a, b = a.contiguous(), b.sort().values
    below = torch.searchsorted(b, a, side="left")
    ties = torch.searchsorted(b, a, side="right") - below
    return (widen(below) + 0.5 * widen(ties)) / len(b)


def shifted_images(raw: np.ndarray, seed: int = 0) -> dict[str, np.ndarray]:
    """OOD variants of raw images (N, [C,] H, W): permuted pixels, left-right and up-down
    flips.

    Args:
        seed: seed of the randomness (int).
    """
    rng = np.random.default_rng(seed)
    flat = raw.reshape(len(raw), -1)
    permuted = np.stack([row[rng.permutation(flat.shape[1])] for row in flat]).reshape(raw.shape)
    return {
        "permuted": permuted,
        "flip_lr": raw[..., ::-1].copy(),
        "flip_ud": raw[..., ::-1, :].copy(),
    }


def load_ood_images(
    source: str, image_shape: tuple[int, ...], root: str | Path | None = None
) -> tuple[str, np.ndarray]:
    """A user OOD set as stored images (N, *image_shape), and its key in the results:
    ``user_file`` for a .npy file (:func:`load_ood_file`); ``user_set`` for a published
    image set named as the catalog names it, or a folder of data files as
    :func:`~ebmlab.data.load_dataset` reads it, whose test split is used (``SET:SPLIT``
    for another split). The set users try first has the training images' shape and
    other content: MNIST against a Fashion-MNIST model (Nalisnick et al. 2019), SVHN
    against a CIFAR-10 one.

    Args:
        source: a .npy file, a data set name such as ``"mnist"``, or a folder.
        root: the folder of a named set's files (default: ``$EBMLAB_DATA``, then the
            system's data folders).
    """
    if source.endswith(".npy"):
        return "user_file", load_ood_file(source, image_shape)
    name, _, split = source.partition(":")
    if name not in IMAGE_SETS and not Path(name).is_dir():
        raise ArgumentError(
            f"--ood-data must be a .npy file of uint8 images, a folder of data files or one "
            f"of the image sets {', '.join(IMAGE_SETS)} (SET:SPLIT for a split other than "
            f"test), got {source!r}"
        )
    try:
        data = load_dataset(name, split or "test", root=root, flatten=False, in_memory=True)
    except DataNotFoundError as err:  # the folder is given by --ood-root here
        finding = f"--ood-data {source!r}: {err.finding}"
        raise DataNotFoundError(finding, "Pass --ood-root DIR") from err
    raw, shape = data.raw, tuple(image_shape)
    if raw is None or raw.dtype != np.uint8 or tuple(raw.shape[1:]) != shape:
        stored = "no images" if raw is None else f"{raw.dtype} images {tuple(raw.shape[1:])}"
        raise ArgumentError(
            f"--ood-data {source!r} holds {stored}; the model's are uint8 "
            f"({', '.join(map(str, shape))})"
        )
    return "user_set", raw


def load_ood_file(path: str | Path, image_shape: tuple[int, ...]) -> np.ndarray:
    """Load a user OOD set: a .npy of uint8 images in the training set's stored format,
    (N, *image_shape); grayscale images (image_shape (1, H, W)) may also come as (N, H, W).

    Args:
        path: the .npy file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--ood-data file {path} does not exist")
    try:
        arr = np.load(path, allow_pickle=False)
    except ValueError as err:
        raise ArgumentError(f"--ood-data file {path} is not a plain .npy array: {err}") from err
    shape = tuple(image_shape)
    if arr.dtype == np.uint8 and len(shape) == 3 and shape[0] == 1 and arr.shape[1:] == shape[1:]:
        arr = arr[:, None]
    if arr.dtype != np.uint8 or tuple(arr.shape[1:]) != shape:
        raise ArgumentError(
            f"--ood-data must hold uint8 images of shape (N, {', '.join(map(str, shape))}), "
            f"got {arr.dtype} {arr.shape}"
        )
    if len(arr) == 0:
        raise ArgumentError("--ood-data holds no images")
    return arr


def uniform_noise(
    n: int,
    dim: int,
    value_range: tuple[float, float],
    seed: int = 0,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """``n`` points uniform in the box ``value_range``^dim, on ``device``.

    Args:
        seed: seed of the randomness (int).
    """
    _checks.positive_int("n", n)
    gen = torch.Generator(device or "cpu").manual_seed(seed)
    lo, hi = value_range
    return lo + (hi - lo) * torch.rand(n, dim, generator=gen, device=device)
