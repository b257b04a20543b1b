"""Readers for the files that public image data sets are published in.

Every reader returns images as ``uint8`` arrays of shape (N, C, H, W) and labels as
``int64`` arrays of shape (N,), and checks the file's structure (magic numbers, record
sizes, counts) before returning, so that a truncated or foreign file fails with one
:class:`DataFormatError` naming it. Nothing here unpickles: CIFAR is read from its
binary version and SVHN from MATLAB v5 files through :func:`scipy.io.loadmat`, which
decodes plain arrays only.

- IDX (LeCun et al. 1998): MNIST, Fashion-MNIST, KMNIST, EMNIST; gzip or raw.
- CIFAR binary (Krizhevsky 2009): records of label byte(s) then 3072 pixel bytes, the
  red, green and blue planes of a 32x32 image in turn.
- SVHN cropped digits (Netzer et al. 2011): ``X`` (32, 32, 3, N), ``y`` (N, 1) in 1..10,
  where 10 stands for the digit 0.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ebmlab._checks import ArgumentError

_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
CIFAR_SHAPE = (3, 32, 32)


class DataFormatError(ArgumentError):
    """A data file is corrupt, truncated, or not in the format its name promises."""


def md5sum(path: str | os.PathLike) -> str:
    """The md5 hex digest of a file, read in 1 MiB blocks."""
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def content_md5sum(path: str | os.PathLike) -> str:
    """The md5 hex digest of a file's content: of its decompressed bytes when its name
    ends in ``.gz``, read in 1 MiB blocks."""
    path = Path(path)
    if path.suffix != ".gz":
        return md5sum(path)
    digest = hashlib.md5(usedforsecurity=False)
    try:
        with gzip.open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    except (OSError, EOFError, zlib.error) as err:
        raise DataFormatError(
            f"{path} cannot be decompressed to check its content's md5: {err}"
        ) from err
    return digest.hexdigest()


def verify_md5(path: Path, expected: str | None, content: str | None = None) -> Path:
    """``path`` when its md5 is ``expected``, or the md5 of its content (its decompressed
    bytes, for a ``.gz`` file) is ``content`` (or nothing is expected), else an error
    naming both.

    A mirror, a distribution or the user's own ``gzip`` recompresses a published file
    (another header, another compression level): the compressed file's sum changes
    while the data are the published ones, which the content's sum recognises.

    Args:
        expected: the published md5 of the file as distributed.
        content: the md5 of its decompressed bytes.
    """
    if expected is None and content is None:
        return path
    if expected is not None and md5sum(path) == expected:
        return path
    if content is not None:
        got = content_md5sum(path)
        if got == content:
            return path
        raise DataFormatError(
            f"{path}: its content (decompressed) has md5 {got}, and the published "
            f"{path.name.removesuffix('.gz')} has {content}; the file is corrupt or is "
            "another version than the published one"
        )
    raise DataFormatError(
        f"{path} has the wrong md5 checksum (expected {expected}); the file is corrupt "
        "or is another version than the published one"
    )


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """An IDX file (gzip-compressed when its name ends in ``.gz``) as a NumPy array."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:
            data = fh.read()
    except (OSError, EOFError) as err:  # a gzip stream cut short
        raise DataFormatError(f"{path} cannot be read as an IDX file: {err}") from err
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
        raise DataFormatError(f"{path} is not an IDX file (bad magic number)")
    ndim = data[3]
    if len(data) < 4 + 4 * ndim:
        raise DataFormatError(f"{path} is truncated: its header lists {ndim} dimensions")
    dims = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    dtype = np.dtype(_IDX_DTYPES[data[2]])
    expected = int(np.prod(dims)) * dtype.itemsize
    body = data[4 + 4 * ndim :]
    if len(body) != expected:
        raise DataFormatError(
            f"{path} is truncated or corrupt: {len(body)} bytes of data, expected {expected}"
        )
    return np.frombuffer(body, dtype=dtype).reshape(dims).astype(dtype.newbyteorder("="))


def read_idx_pair(
    images: Path, labels: Path, transpose: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """IDX images (N, H, W) and labels (N,) as (N, 1, H, W) uint8 and int64 arrays.
    ``transpose`` swaps height and width (EMNIST stores images column by column)."""
    x, y = read_idx(images), read_idx(labels)
    if x.ndim != 3 or x.dtype != np.uint8:
        raise DataFormatError(f"{images} must hold uint8 images (N, H, W), got {x.dtype} {x.shape}")
    if y.ndim != 1:
        raise DataFormatError(f"{labels} must hold one label per image, got shape {y.shape}")
    _same_count(images, len(x), labels, len(y))
    if transpose:
        x = x.transpose(0, 2, 1)
    return np.ascontiguousarray(x[:, None]), y.astype(np.int64)


def read_cifar(paths: Sequence[Path], label_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """CIFAR binary files: each record is ``label_bytes`` label bytes (CIFAR-100: coarse
    then fine) and 3072 pixel bytes; the last label byte is kept (CIFAR-100's fine one)."""
    record = np.dtype([("labels", np.uint8, (label_bytes,)), ("pixels", np.uint8, CIFAR_SHAPE)])
    images, labels = [], []
    for path in paths:
        size = path.stat().st_size
        if size == 0 or size % record.itemsize:
            raise DataFormatError(
                f"{path} is not a CIFAR binary file: {size} bytes is not a whole number of "
                f"{record.itemsize}-byte records ({label_bytes} label byte(s) + 3072 pixels)"
            )
        rows = np.fromfile(path, dtype=record)
        images.append(rows["pixels"])
        labels.append(rows["labels"][:, -1].astype(np.int64))
    return np.concatenate(images), np.concatenate(labels)


def read_svhn(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """An SVHN cropped-digits ``.mat`` file: images (N, 3, 32, 32), labels 0..9 (the
    file's label 10 is the digit 0)."""
    from scipy.io import loadmat

    try:
        mat = loadmat(path, variable_names=["X", "y"])
    except Exception as err:  # scipy raises several types for a damaged file
        raise DataFormatError(f"{path} cannot be read as a MATLAB file: {err}") from err
    if "X" not in mat or "y" not in mat:
        raise DataFormatError(f"{path} must hold the variables X and y (SVHN layout)")
    x, y = mat["X"], mat["y"].reshape(-1)
    if x.ndim != 4 or x.shape[2] != 3 or x.dtype != np.uint8:
        raise DataFormatError(
            f"{path}: X must be uint8 of shape (H, W, 3, N), got {x.dtype} {x.shape}"
        )
    _same_count(path, x.shape[3], path, len(y), "X", "y")
    if len(y) and (y.min() < 1 or y.max() > 10):
        raise DataFormatError(f"{path}: labels must be 1..10 (10 is the digit 0)")
    return np.ascontiguousarray(x.transpose(3, 2, 0, 1)), y.astype(np.int64) % 10


def _same_count(a: Path, n_a: int, b: Path, n_b: int, what_a="images", what_b="labels") -> None:
    if n_a != n_b:
        where = f"{a}" if a == b else f"{a} and {b}"
        raise DataFormatError(f"{where}: {n_a} {what_a} but {n_b} {what_b}")
