"""MNIST from IDX files (gzip or raw), with optional verified download.

Files are looked for in the directory given by argument, else in ``$EBMLAB_DATA``
(the files directly there or in an ``mnist/`` sub-folder). ``mnist10k`` uses the
official 10k test split alone, partitioned with a fixed permutation (seed
``MNIST10K_SEED``) into 8000 training and 2000 test images, for machines that
only have that split.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import struct
import tempfile
import urllib.request
from pathlib import Path

import numpy as np

DEFAULT_URL = "https://ossci-datasets.s3.amazonaws.com/mnist/"
FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
MD5 = {
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}
MNIST10K_SEED = 0
MNIST10K_TRAIN = 8000
IMAGE_SHAPE = (28, 28)
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


class DataNotFoundError(FileNotFoundError):
    """A data set's files are missing; the message lists where they were looked for."""


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (optionally gzip-compressed) into a numpy array."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        data = fh.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
        raise ValueError(f"{path} is not an IDX file (bad magic number)")
    ndim = data[3]
    dims = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    dtype = np.dtype(_IDX_DTYPES[data[2]])
    expected = int(np.prod(dims)) * dtype.itemsize
    body = data[4 + 4 * ndim :]
    if len(body) != expected:
        raise ValueError(
            f"{path} is truncated or corrupt: {len(body)} bytes of data, expected {expected}"
        )
    return np.frombuffer(body, dtype=dtype).reshape(dims).astype(dtype.newbyteorder("="))


def md5sum(path: str | os.PathLike) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def candidate_dirs(root: str | os.PathLike | None) -> list[Path]:
    """The directories searched for MNIST files, in order."""
    bases = [Path(root)] if root is not None else []
    env = os.environ.get("EBMLAB_DATA")
    if root is None and env:
        bases.append(Path(env))
    return [d for base in bases for d in (base, base / "mnist")]


def _find(stem: str, dirs: list[Path]) -> Path | None:
    for d in dirs:
        for name in (stem + ".gz", stem):
            if (d / name).is_file():
                return d / name
    return None


def _verified(path: Path) -> Path:
    want = MD5.get(path.name)
    if want is not None and md5sum(path) != want:
        raise ValueError(
            f"{path} has the wrong md5 checksum (expected {want}); the file is corrupt"
        )
    return path


def find_split(split: str, root: str | os.PathLike | None = None) -> tuple[Path, Path] | None:
    """Paths of the image and label files of ``split`` ('train' or 'test'), or None."""
    dirs = candidate_dirs(root)
    found = [_find(stem, dirs) for stem in FILES[split]]
    if None in found:
        return None
    return found[0], found[1]  # type: ignore[return-value]


def load_mnist_arrays(
    split: str, root: str | os.PathLike | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(images (N, 28, 28) uint8, labels (N,) int64)`` of the official split."""
    paths = find_split(split, root)
    if paths is None:
        where = (
            ", ".join(str(d) for d in candidate_dirs(root))
            or "nowhere (no root given, EBMLAB_DATA unset)"
        )
        raise DataNotFoundError(
            f"MNIST {split} files {list(FILES[split])} (.gz or raw) not found; looked in: {where}. "
            "Pass root=DIR, set EBMLAB_DATA, or call ebmlab.data.mnist.download(DIR)."
        )
    images, labels = (read_idx(_verified(p)) for p in paths)
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"{paths[0]} and {paths[1]} disagree on the number of examples")
    return images.astype(np.uint8), labels.astype(np.int64)


def load_mnist10k_arrays(
    split: str, root: str | os.PathLike | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The official test split partitioned into 8000 'train' and 2000 'test' images."""
    images, labels = load_mnist_arrays("test", root)
    perm = np.random.default_rng(MNIST10K_SEED).permutation(images.shape[0])
    part = perm[:MNIST10K_TRAIN] if split == "train" else perm[MNIST10K_TRAIN:]
    return images[part], labels[part]


def download(
    root: str | os.PathLike,
    splits: tuple[str, ...] = ("train", "test"),
    base_url: str = DEFAULT_URL,
    timeout: float = 60.0,
) -> list[Path]:
    """Download the gzip IDX files of ``splits`` into ``root``, verifying md5 checksums.

    Each file is written to a temporary file in ``root`` and renamed only after its
    checksum matches, so an interrupted download never leaves a partial file behind.
    Files already present with the right checksum are kept.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    written = []
    for split in splits:
        if split not in FILES:
            raise ValueError(f"splits must be among {list(FILES)}, got {split!r}")
        for stem in FILES[split]:
            name = stem + ".gz"
            target = root / name
            if target.is_file() and md5sum(target) == MD5[name]:
                written.append(target)
                continue
            fd, tmp = tempfile.mkstemp(dir=root, prefix=f".{name}.", suffix=".part")
            try:
                with (
                    os.fdopen(fd, "wb") as out,
                    urllib.request.urlopen(
                        base_url.rstrip("/") + "/" + name, timeout=timeout
                    ) as response,
                ):
                    for block in iter(lambda: response.read(1 << 20), b""):
                        out.write(block)
                    out.flush()
                    os.fsync(out.fileno())
                got = md5sum(tmp)
                if got != MD5[name]:
                    raise ValueError(f"downloaded {name} has md5 {got}, expected {MD5[name]}")
                os.replace(tmp, target)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            written.append(target)
    return written
