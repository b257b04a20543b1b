"""Array files: ``.npy`` (features, with an optional labels file) and ``.npz`` (``x``,
optional ``y``), memory-mapped.

``.npy`` files and the members of an uncompressed ``.npz`` (``numpy.savez``) are mapped
from disk, not read: a data set larger than memory opens at once and pages in as
batches touch it. A compressed ``.npz`` (``numpy.savez_compressed``) has to be inflated
and is read into memory. Object arrays are refused (loading them would unpickle).
Checking an array for NaN and inf, and finding its value range, is one pass in chunks
of ``SCAN_BYTES`` bytes. :class:`MappedView` names a view of a mapped file, so that a
DataLoader worker started by spawn or forkserver (macOS, Windows, Python 3.14's
default) maps the file again instead of receiving a pickled copy of all of it.
"""

from __future__ import annotations

import mmap
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ebmlab.data.formats import DataFormatError

SCAN_BYTES = 64 << 20  # bytes per chunk of the NaN/inf and range scan


def physical_memory() -> int:
    """The machine's memory in bytes (8 GiB where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX
        return 8 << 30


@dataclass(frozen=True)
class MappedView:
    """Where an array that views a memory-mapped file lives: the file, the mapped span
    (its byte offset and length) and the view's start in it, shape, strides and dtype."""

    filename: str
    offset: int
    length: int
    start: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str

    @classmethod
    def of(cls, array: np.ndarray) -> MappedView | None:
        """The view ``array`` is of a file mapped by ``numpy.memmap``, else None (an
        array in memory)."""
        base: object = array
        while isinstance(base, np.ndarray) and not isinstance(base.base, mmap.mmap):
            base = base.base
        if not isinstance(base, np.memmap) or base.filename is None:
            return None
        start = array.__array_interface__["data"][0] - base.__array_interface__["data"][0]
        return cls(base.filename, base.offset, base.nbytes, start, array.shape, array.strides,
                   array.dtype.str)  # fmt: skip

    def open(self) -> np.ndarray:
        """The same read-only view, on a new mapping of the file."""
        span = np.memmap(self.filename, np.uint8, "r", self.offset, (self.length,))
        return np.ndarray(self.shape, np.dtype(self.dtype), span, self.start, self.strides)

    @property
    def rows_contiguous(self) -> bool:
        """Whether each row (the elements after the first axis) is one run of bytes in
        the file, so that :meth:`read_rows` can read it with one call."""
        itemsize = np.dtype(self.dtype).itemsize
        expected = np.empty((1, *self.shape[1:]), np.dtype(self.dtype)).strides[1:]
        return itemsize > 0 and tuple(self.strides[1:]) == tuple(expected)

    def read_rows(self, rows: np.ndarray, out: np.ndarray) -> None:
        """Read rows ``rows`` of the view (best in ascending order) into ``out`` (len(rows),
        *shape[1:]), one read of exactly a row's bytes each (needs
        :attr:`rows_contiguous`).

        Reading, not mapping, is what rows scattered over a file larger than memory
        want: a page fault in a mapped file reads the 128 kB around it, forty times the
        bytes of a CIFAR-size row, and in a file the page cache cannot hold those
        neighbours are dropped before their turn comes; a read asks the disk for the
        row alone.
        """
        first = self.offset + self.start  # the file position of row 0
        with open(self.filename, "rb", buffering=0) as fh:
            for i, row in enumerate(rows):
                fh.seek(first + int(row) * self.strides[0])
                target = memoryview(out[i]).cast("B")
                if fh.readinto(target) != len(target):
                    raise DataFormatError(f"{self.filename}: the file ends before row {row}")


def _npz_member(path: Path, name: str) -> np.ndarray:
    """Member ``name`` of an ``.npz`` file, memory-mapped when it is stored uncompressed."""
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(name + ".npy")
        if info.compress_type != zipfile.ZIP_STORED:
            with archive.open(info) as member:
                return np.lib.format.read_array(member, allow_pickle=False)
    with open(path, "rb") as fh:
        fh.seek(info.header_offset)
        local = fh.read(30)
        if local[:4] != b"PK\x03\x04":
            raise DataFormatError(f"{path}: member {name!r} has a damaged zip header")
        name_len = int.from_bytes(local[26:28], "little")
        extra_len = int.from_bytes(local[28:30], "little")
        fh.seek(info.header_offset + 30 + name_len + extra_len)
        version = np.lib.format.read_magic(fh)
        readers = {
            (1, 0): np.lib.format.read_array_header_1_0,
            (2, 0): np.lib.format.read_array_header_2_0,
        }
        if version not in readers:  # a newer header: read the member into memory
            with zipfile.ZipFile(path) as archive, archive.open(info) as member:
                return np.lib.format.read_array(member, allow_pickle=False)
        shape, fortran, dtype = readers[version](fh)
        offset = fh.tell()
    if dtype.hasobject:
        raise DataFormatError(f"{path}: {name!r} holds Python objects, which are never unpickled")
    if int(np.prod(shape)) == 0:
        return np.zeros(shape, dtype)
    order = "F" if fortran else "C"
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape, order=order)


def read_arrays(
    path: str | Path, labels: str | Path | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """Inputs and labels (or None) from an ``.npy`` or ``.npz`` file.

    For ``.npy`` the labels come from ``labels`` or, if absent, a ``<stem>_labels.npy``
    beside the file when there is one; ``.npz`` files hold ``x`` and optionally ``y``.
    """
    path = Path(path)
    try:
        if path.suffix == ".npz":
            with zipfile.ZipFile(path) as archive:
                members = {n.removesuffix(".npy") for n in archive.namelist()}
            if "x" not in members:
                raise DataFormatError(
                    f"{path} must hold an array named 'x' (and optionally 'y'); "
                    f"it holds {sorted(members)}"
                )
            x = _npz_member(path, "x")
            y = _npz_member(path, "y") if "y" in members else None
        elif path.suffix == ".npy":
            x = np.load(path, mmap_mode="r", allow_pickle=False)
            sibling = path.with_name(path.stem + "_labels.npy")
            labels = labels if labels is not None else (sibling if sibling.is_file() else None)
            y = None if labels is None else np.load(labels, allow_pickle=False)
        else:
            raise DataFormatError(f"{path}: array files end in .npy or .npz")
    except (zipfile.BadZipFile, EOFError) as err:
        raise DataFormatError(f"{path} is not a readable .npz archive: {err}") from err
    except ValueError as err:  # numpy: bad magic, truncated data, object arrays
        if isinstance(err, DataFormatError):
            raise
        raise DataFormatError(f"{path} is not a readable NumPy array file: {err}") from err
    if x.dtype.kind not in "uif" or x.ndim < 2:
        raise DataFormatError(
            f"{path}: x must be a numeric array of shape (N, ...) with N >= 1, "
            f"got {x.dtype} {x.shape}"
        )
    if y is not None:
        if y.dtype.kind not in "ui" or y.ndim != 1:
            raise DataFormatError(
                f"{path}: labels must be integers of shape (N,), got {y.dtype} {y.shape}"
            )
        if len(y) != len(x):
            raise DataFormatError(f"{path}: {len(x)} inputs but {len(y)} labels")
        y = np.asarray(y, dtype=np.int64)
    return x, y


def value_bounds(array: np.ndarray, name: str) -> tuple[float, float]:
    """The smallest and largest value of ``array``, scanned in chunks; NaN or inf is a
    :class:`DataFormatError` naming ``name`` and the first bad row."""
    if len(array) == 0:
        raise DataFormatError(f"{name} holds no rows")
    row_bytes = max(1, array[:1].nbytes)
    step = max(1, SCAN_BYTES // row_bytes)
    low, high = np.inf, -np.inf
    for start in range(0, len(array), step):
        chunk = np.asarray(array[start : start + step])
        if chunk.dtype.kind == "f" and not np.isfinite(chunk).all():
            bad = start + int(np.flatnonzero(~np.isfinite(chunk.reshape(len(chunk), -1)).all(1))[0])
            raise DataFormatError(f"{name} holds NaN or inf (first in row {bad})")
        low, high = min(low, float(chunk.min())), max(high, float(chunk.max()))
    return low, high
