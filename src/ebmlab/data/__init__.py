"""Data sets: built-in, published image sets read from their files, and your own.

One entry point, :func:`load_dataset`, returns a :class:`Dataset` record with the split's
inputs ``x`` ready for a model, its labels, the :class:`Encoding` that maps stored
values to inputs (kept with a run so pictures can undo it), the image shape and the
number of classes read from the data. ``name`` is either

- a built-in set: ``digits`` (scikit-learn's 8x8 digits; train/val/test), ``digits-rgb``
  (the same digits painted in random colours, RGB), ``mnist10k``
  (the MNIST test split cut into 8000 training and 2000 test images) and the 2-D toy
  densities (``8gaussians``, ...);
- a published set read from its distributed files under ``root`` or ``$EBMLAB_DATA``
  (:mod:`ebmlab.data.catalog`): ``mnist``, ``fashion-mnist``, ``kmnist``,
  ``emnist-<variant>``, ``cifar10``, ``cifar100``, ``svhn``;
- a path: an ``.npy``/``.npz`` array file, an image folder (one sub-folder per class),
  or a folder holding one of those per split (``train.npz``, ``test.npz``; ``train/``,
  ``test/``). A single file or folder is split into train, val and test (80/10/10 %)
  by a fixed permutation, stratified by class where it has labels.

A recipe reads its three splits through :func:`run_splits`, which holds out part of the
training split for validation where a data set has no validation split of its own, so
that neither checkpoint choice nor calibration ever sees the test split.

Image data come in three transforms (:mod:`ebmlab.data.encoding`): ``raw`` stored
values, ``scaled`` to [-1, 1] (2 x / 255 - 1 for 8-bit pixels; 2 x / 17 - 1 for the
digits, as in Tomczak's code) and ``binary``. Splits whose encoded floats would take
more than a quarter of the machine's memory stay on disk (``in_memory=False`` forces
this): ``x`` is then an :class:`EncodedRows` that reads and encodes only the rows a
batch asks for.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.data import digits
from ebmlab.data.arrays import physical_memory, read_arrays, value_bounds
from ebmlab.data.catalog import (
    SOURCES,
    DataNotFoundError,
    download,
    find_files,
    read_split,
    verified,
)
from ebmlab.data.encoding import TRANSFORMS, EncodedRows, Encoding
from ebmlab.data.folders import class_folders, read_image_folder
from ebmlab.data.formats import DataFormatError
from ebmlab.data.toys import TOYS, ToyDistribution, make_toy

IMAGE_SETS = ("digits", "digits-rgb", "mnist10k", *SOURCES)
DATASETS = (*IMAGE_SETS, *TOYS)
TOY_SIZES = {"train": 10_000, "val": 2_000, "test": 10_000}
TOY_SEEDS = {"train": 0, "val": 1, "test": 2}
HOLDOUT = {"train": (0.0, 0.8), "val": (0.8, 0.9), "test": (0.9, 1.0)}  # shares of one pool
HOLDOUT_SEED = 0
VALIDATION_FRACTION = 0.1  # of the training rows, where a set has no validation split
MNIST10K_TRAIN = 8000
IN_MEMORY_SHARE = 0.25  # of physical memory, above which a split stays on disk
DIGITS_ENCODING = {"divisor": 17.0, "threshold": 8.0}  # Tomczak's scaling of 0..16
BYTE_ENCODING = {"divisor": 255.0, "threshold": 127.5}


@dataclass(frozen=True)
class Dataset:
    """A loaded split: inputs ``x`` (N, *shape), labels ``y`` (N,) or None, and metadata.

    ``name`` and ``split`` say what was loaded. ``x`` is a float tensor, or an
    :class:`EncodedRows` for splits kept on disk; ``encoding`` maps stored values to
    ``x``'s. ``image_shape`` is (C, H, W) for images (``x`` may be flat), ``num_classes``
    and ``classes`` (the class names, where the set has them) describe ``y``. ``raw``
    holds the stored values of an in-memory image split (N, C, H, W).
    """

    name: str
    split: str
    x: torch.Tensor | EncodedRows
    y: torch.Tensor | None
    encoding: Encoding
    image_shape: tuple[int, ...] | None = None
    num_classes: int | None = None
    raw: np.ndarray | None = None
    classes: tuple[str, ...] | None = None

    def __len__(self) -> int:
        return self.x.shape[0]

    @property
    def transform(self) -> str:
        return self.encoding.transform

    @property
    def value_range(self) -> tuple[float, float]:
        return self.encoding.value_range

    def subset(self, rows: np.ndarray, split: str) -> Dataset:
        """The rows ``rows`` of this split (indices, in the order given), named ``split``.

        Args:
            rows: indices into this split.
            split: the name the subset goes by (``"val"`` for a held-out part).
        """
        index = torch.as_tensor(rows, dtype=torch.int64)
        x = self.x.subset(rows) if isinstance(self.x, EncodedRows) else self.x[index]
        return dataclasses.replace(
            self,
            split=split,
            x=x,
            y=None if self.y is None else self.y[index],
            raw=None if self.raw is None else self.raw[rows],
        )

    def to(self, device: torch.device | str) -> Dataset:
        """This split with ``x`` and ``y`` on ``device`` (``raw`` stays a NumPy array,
        rows kept on disk stay there)."""
        y = None if self.y is None else self.y.to(device)
        return dataclasses.replace(self, x=self.x.to(device), y=y)

    def describe(self) -> dict[str, Any]:
        """What a run records about its data: enough to rebuild pictures and check shapes."""
        return {
            "name": self.name,
            "split": self.split,
            "rows": len(self),
            "image_shape": list(self.image_shape) if self.image_shape else None,
            "num_classes": self.num_classes,
            "classes": list(self.classes) if self.classes else None,
            "encoding": self.encoding.to_dict(),
        }


def resolve_path(name: str, root: str | os.PathLike | None = None) -> Path:
    """The file or folder ``--data`` names: as given, or relative to ``root``."""
    path = Path(name).expanduser()
    if root and not path.is_absolute() and not path.exists():
        return Path(root) / path
    return path


def check_data(name: str, builtin: Sequence[str], root: str | os.PathLike | None = None) -> str:
    """``name`` if it is one of ``builtin``, or the absolute path of the existing file or
    folder it names; a recipe's config calls it so that a wrong ``--data`` fails before
    any work starts, and so that the run records where its data are wherever
    ``evaluate``, ``sample`` or ``--resume`` are later called from.

    Args:
        root: directory of local data files (default: ``$EBMLAB_DATA``).
    """
    if name in builtin:
        return name
    if name not in DATASETS and resolve_path(name, root).exists():
        return str(resolve_path(name, root).resolve())
    raise ArgumentError(
        f"data must be one of {list(builtin)} or an existing .npy/.npz file or image "
        f"folder, got {name!r}"
    )


def check_resize(resize: Sequence[int]) -> tuple[int, int] | None:
    """``resize`` as (height, width), or None when empty (images keep their size)."""
    if not resize:
        return None
    if len(resize) != 2:
        raise ArgumentError(f"resize must be (height, width), got {tuple(resize)}")
    return _checks.positive_int("resize", resize[0]), _checks.positive_int("resize", resize[1])


def _holdout(n: int, split: str, labels: np.ndarray | None = None) -> np.ndarray:
    """The rows of a single pool that form ``split`` (80/10/10 %), by a fixed
    permutation; with ``labels``, stratified by class (:func:`holdout_rows`: the
    training split, then the rest halved into validation and test), so that every
    split holds the classes in their shares."""
    _checks.one_of("split", split, list(HOLDOUT))
    if labels is None:
        lo, hi = HOLDOUT[split]
        perm = np.random.default_rng(HOLDOUT_SEED).permutation(n)
        return np.sort(perm[int(lo * n) : int(hi * n)])
    y = torch.tensor(np.asarray(labels))
    train, rest = holdout_rows(y, n, 1 - HOLDOUT["train"][1])
    if split == "train":
        return train
    val, test = holdout_rows(y[rest], len(rest), 0.5)
    return rest[val if split == "val" else test]


def _own_splits(path: Path) -> dict[str, Path]:
    """The split files (``train.npz``, ``test.npy``, ...) or split folders (``train/``)
    of a folder that has a training split; empty otherwise."""
    if not path.is_dir():
        return {}
    own = {}
    for split in HOLDOUT:
        candidates = [path / f"{split}.npz", path / f"{split}.npy", path / split]
        found = next((c for c in candidates if c.exists()), None)
        if found is not None:
            own[split] = found
    return own if "train" in own else {}


def local_splits(path: str | os.PathLike) -> list[str]:
    """The splits a local file or folder offers: its own split files or folders, or the
    holdout train/val/test of a single pool."""
    return list(_own_splits(Path(path)) or HOLDOUT)


def _read_local(
    path: Path, split: str, resize: tuple[int, int] | None, labels: str | None
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, list[str] | None, Path]:
    """(stored values, labels, rows of this split or None for all, class names, the
    file or folder the split came from), for a split of a local data set."""
    if not path.exists():
        raise DataNotFoundError(
            f"data {str(path)!r} is neither a known data set ({', '.join(DATASETS)}) nor a "
            "file or folder"
        )
    own = _own_splits(path)
    _checks.one_of("split", split, list(own or HOLDOUT))
    if own:
        path = own[split]
    if resize is not None and not path.is_dir():
        raise ArgumentError(f"resize applies to image folders; {path} is an array file")
    if path.is_dir():
        x, y, classes = read_image_folder(path, resize)
    else:
        (x, y), classes = read_arrays(path, labels), None
    return x, y, None if own else _holdout(len(x), split, y), classes, path


def _local_dataset(
    path: Path, split: str, transform: str, resize: tuple[int, int] | None, labels: str | None
) -> tuple[
    np.ndarray, np.ndarray | None, np.ndarray | None, list[str] | None, Encoding, int | None
]:
    """A local split with its encoding and number of classes, both fixed by the training
    split (a single pool: by the whole pool), which every split must agree with."""
    x, y, rows, classes, where = _read_local(path, split, resize, labels)
    if len(x) == 0:
        raise DataFormatError(f"{where} holds no rows")
    tx, ty, twhere = x, y, where
    own = _own_splits(path)
    if classes is not None and split != "train" and own and own["train"].is_dir():
        # another split's folder: its class folders take the training split's labels
        named = [c.name for c in class_folders(own["train"])]
        if unknown := sorted(set(classes) - set(named)):
            raise DataFormatError(
                f"{where}: class folders {unknown} are not among the training split's "
                f"classes {named}"
            )
        y, classes = np.array([named.index(c) for c in classes], dtype=np.int64)[y], named
    # another split's file: the training split fixes float bounds and the label range
    needs_train = x.dtype != np.uint8 or (classes is None and y is not None)
    if rows is None and split != "train" and needs_train:
        tx, ty, _, _, twhere = _read_local(path, "train", resize, labels)
    if x.dtype == np.uint8:
        encoding = Encoding.for_values(0, 255, transform, **BYTE_ENCODING)
    else:
        bounds = value_bounds(tx, str(twhere))  # also refuses NaN and inf
        if tx is not x:
            value_bounds(x, str(where))
        encoding = Encoding.for_values(*bounds, transform)
    num_classes = None
    if classes is not None:
        num_classes = len(classes)
    elif ty is not None and len(ty):
        num_classes = int(ty.max()) + 1
    if y is not None:
        part = y if rows is None else y[rows]
        if len(part) and (part.min() < 0 or part.max() >= (num_classes or 0)):
            raise DataFormatError(
                f"{where}: labels must lie in 0..{(num_classes or 1) - 1} (the training "
                f"split's classes), found {part.min()}..{part.max()}"
            )
    return x, y, rows, classes, encoding, num_classes


def _named_arrays(
    name: str, split: str, root: str | os.PathLike | None, transform: str
) -> tuple[np.ndarray, np.ndarray, Encoding, int]:
    if name == "digits":
        _checks.one_of("split", split, list(digits.SPLITS))
        images, labels = digits.load_digits_arrays(split)
        return images[:, None], labels, Encoding.for_values(0, 16, transform, **DIGITS_ENCODING), 10
    encoding = Encoding.for_values(0, 255, transform, **BYTE_ENCODING)
    if name == "digits-rgb":
        _checks.one_of("split", split, list(digits.SPLITS))
        return (*digits.load_digits_rgb_arrays(split), encoding, 10)
    if name == "mnist10k":
        _checks.one_of("split", split, ["train", "test"])
        images, labels = read_split(SOURCES["mnist"], "test", root)
        perm = np.random.default_rng(HOLDOUT_SEED).permutation(len(images))
        part = perm[:MNIST10K_TRAIN] if split == "train" else perm[MNIST10K_TRAIN:]
        return images[part], labels[part], encoding, 10
    source = SOURCES[name]
    images, labels = read_split(source, split, root)
    return images, labels, encoding, source.num_classes


def load_dataset(
    name: str,
    split: str = "train",
    *,
    root: str | os.PathLike | None = None,
    transform: str = "scaled",
    flatten: bool = True,
    n: int | None = None,
    resize: tuple[int, int] | None = None,
    in_memory: bool | None = None,
    labels: str | os.PathLike | None = None,
) -> Dataset:
    """Load split ``split`` of data set ``name`` (a known name or a path; see the module).

    ``flatten`` gives image inputs of shape (N, C*H*W), otherwise (N, C, H, W). ``n``
    keeps the first ``n`` rows (toys: draws ``n`` exact samples). ``resize`` (height,
    width) resamples an image folder's images. ``in_memory`` keeps the split in memory
    (True), on disk (False) or decides by its size (None). ``labels`` is the labels file
    of an ``.npy`` input file.

    Args:
        root: directory of local data files (default: ``$EBMLAB_DATA``).
        transform: ``"scaled"`` (to [-1, 1]), ``"binary"`` or ``"raw"``.
    """
    _checks.one_of("transform", transform, TRANSFORMS)
    if n is not None:
        _checks.positive_int("n", n)
    resize = check_resize(resize or ())
    if resize is not None and name in DATASETS:
        raise ArgumentError(f"resize applies to image folders, not to the data set {name!r}")
    if name in TOYS:
        _checks.one_of("split", split, list(TOY_SEEDS))
        toy = make_toy(name)
        gen = torch.Generator().manual_seed(TOY_SEEDS[split])
        x = toy.sample(n if n is not None else TOY_SIZES[split], gen)
        encoding = Encoding.for_values(*toy.bounds[0], "raw")
        return Dataset(name, split, x, None, encoding)
    classes = None
    rows = None
    if name in IMAGE_SETS:
        values, y, encoding, num_classes = _named_arrays(name, split, root, transform)
    else:
        path = resolve_path(name, root)
        values, y, rows, classes, encoding, num_classes = _local_dataset(
            path, split, transform, resize, None if labels is None else str(labels)
        )
    if rows is None:
        rows = np.arange(len(values))
    if n is not None:
        rows = rows[:n]
    row_shape = values.shape[1:]
    image_shape = tuple(row_shape) if len(row_shape) == 3 else None
    if len(row_shape) == 2:  # grayscale images (N, H, W)
        image_shape = (1, *row_shape)
    x_shape = (int(np.prod(row_shape)),) if flatten or image_shape is None else image_shape
    labels_t = None if y is None else torch.from_numpy(np.asarray(y[rows], dtype=np.int64))
    encoded_bytes = 4 * len(rows) * int(np.prod(row_shape))
    keep = (
        in_memory if in_memory is not None else encoded_bytes <= IN_MEMORY_SHARE * physical_memory()
    )
    if keep:
        stored = np.asarray(values[rows]) if len(rows) < len(values) else np.asarray(values)
        x: torch.Tensor | EncodedRows = encoding(stored).reshape(len(rows), *x_shape)
        raw = stored.reshape(len(rows), *image_shape) if image_shape else None
    else:
        x, raw = EncodedRows(values, encoding, x_shape, rows), None
    return Dataset(
        name=name,
        split=split,
        x=x,
        y=labels_t,
        encoding=encoding,
        image_shape=image_shape,
        num_classes=num_classes,
        raw=raw,
        classes=None if classes is None else tuple(classes),
    )


def splits_of(name: str, root: str | os.PathLike | None = None) -> list[str]:
    """The splits data set ``name`` (a known name or a path) offers.

    Args:
        root: directory of local data files (default: ``$EBMLAB_DATA``).
    """
    if name in ("digits", "digits-rgb"):
        return list(digits.SPLITS)
    if name in TOYS:
        return list(TOY_SEEDS)
    if name == "mnist10k":
        return ["train", "test"]
    if name in SOURCES:
        return list(SOURCES[name].files)
    return local_splits(resolve_path(name, root))


def holdout_rows(
    labels: torch.Tensor | None, n: int, fraction: float
) -> tuple[np.ndarray, np.ndarray]:
    """(kept rows, held-out rows) of a split of ``n`` rows, both in ascending order.

    ceil(``fraction`` n) rows are held out, shared among the classes of ``labels`` in
    proportion to their sizes (largest remainders take the rows left over; no class
    gives up its last row), each class's rows chosen by a fixed permutation: stratified
    as scikit-learn's ``train_test_split``, so that a validation split holds the classes
    in their shares.

    Args:
        labels: the rows' class labels (N,), or None (one group).
        n: the number of rows.
        fraction: the share to hold out, in (0, 1).
    """
    held_out = math.ceil(round(fraction * n, 6))
    if held_out >= n:
        raise ArgumentError(
            f"validation_fraction {fraction} of {n} training rows leaves no training rows"
        )
    if labels is None:
        groups = [np.arange(n)]
    else:
        y = labels.cpu().numpy()
        groups = [np.flatnonzero(y == c) for c in np.unique(y)]
    sizes = np.array([len(g) for g in groups])
    share = held_out * sizes / n
    counts = np.floor(share).astype(np.int64)
    counts[np.argsort(counts - share, kind="stable")[: held_out - counts.sum()]] += 1
    counts = np.minimum(counts, sizes - 1)  # every class keeps a training row
    if counts.sum() == 0:
        raise ArgumentError(
            f"validation_fraction {fraction} of {n} training rows leaves no validation rows: "
            "each class has a single row"
        )
    rng = np.random.default_rng(HOLDOUT_SEED)
    held = np.sort(
        np.concatenate(
            [g[rng.permutation(len(g))[:k]] for g, k in zip(groups, counts, strict=True)]
        )
    )
    return np.setdiff1d(np.arange(n), held), held


def run_splits(
    name: str,
    *,
    root: str | os.PathLike | None = None,
    validation_fraction: float = VALIDATION_FRACTION,
    **options: Any,
) -> tuple[Dataset, Dataset, Dataset]:
    """The train, validation and test splits a recipe trains, validates and tests on;
    ``options`` go to :func:`load_dataset`.

    A data set with a ``val`` split of its own validates on it. Otherwise
    ``validation_fraction`` of the training rows, stratified by class
    (:func:`holdout_rows`), are held out for validation and the rest train, as the JEM
    reference holds out 5000 of CIFAR-10's 50 000 training images (Grathwohl et al.
    2020); the validation split picks the best checkpoint, stops early and fits the
    classifier's temperature, so the test split stays unseen. ``validation_fraction``
    0 validates on the test split instead and trains on every training row.

    Args:
        name: a data set name or a path, as for :func:`load_dataset`.
        root: directory of local data files (default: ``$EBMLAB_DATA``).
        validation_fraction: share of the training rows held out, in [0, 1), where the
            data set has no validation split.
    """
    check_validation_fraction(validation_fraction)
    if "val" in splits_of(name, root):
        return tuple(load_dataset(name, s, root=root, **options) for s in ("train", "val", "test"))
    train, test = (load_dataset(name, s, root=root, **options) for s in ("train", "test"))
    if not validation_fraction:
        return train, test, test
    kept, held = holdout_rows(train.y, len(train), validation_fraction)
    return train.subset(kept, "train"), train.subset(held, "val"), test


def describe_splits(parts: dict[str, Dataset]) -> dict[str, dict[str, Any]]:
    """For each role (``"train"``, ``"val"``, ...) the split that fills it, its rows and,
    for labelled data, its rows per class: what a run records and ``ebmlab data show``
    prints.

    Args:
        parts: the splits by role, as :func:`run_splits` gives them.
    """
    return {
        role: {
            "split": part.split,
            "rows": len(part),
            **({} if part.y is None else {"class_counts": part.y.bincount().tolist()}),
        }
        for role, part in parts.items()
    }


def check_validation_fraction(fraction: float) -> float:
    """``fraction`` if it is a share of the training rows that can be held out, [0, 1)."""
    _checks.positive("validation_fraction", fraction, allow_zero=True)
    if fraction >= 1:
        raise ArgumentError(f"validation_fraction must lie in [0, 1), got {fraction!r}")
    return fraction


def available_datasets(root: str | os.PathLike | None = None) -> dict[str, str]:
    """Which named data sets can be loaded here, each with where it comes from (a set
    with published checksums only where its test labels pass them).

    Args:
        root: directory of local data files (default: ``$EBMLAB_DATA``, then the system's
            data folders).
    """
    found = {"digits": "scikit-learn (built in)", "digits-rgb": "digits in colour (built in)"}
    for name, source in SOURCES.items():
        test = find_files(source, "test", root)
        if test is None:
            continue
        try:  # the MNIST family shares file names: its small label file's sum tells them apart
            verified(source, test[-1])
        except DataFormatError:
            continue
        if name == "mnist":
            found["mnist10k"] = str(test[0].parent)
        if find_files(source, "train", root) is not None:
            found[name] = str(test[0].parent)
    for name in TOYS:
        found[name] = "exact 2-D density (built in)"
    return found


__all__ = [
    "DATASETS",
    "DataFormatError",
    "DataNotFoundError",
    "Dataset",
    "EncodedRows",
    "Encoding",
    "ToyDistribution",
    "available_datasets",
    "check_data",
    "check_resize",
    "check_validation_fraction",
    "describe_splits",
    "download",
    "holdout_rows",
    "load_dataset",
    "make_toy",
    "run_splits",
    "splits_of",
]
