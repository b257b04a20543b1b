"""How stored values become model inputs, and rows encoded on demand.

A data set is stored as integers (pixels) or floats (features). An :class:`Encoding`
maps them to what a model sees, in one of three forms:

- ``"raw"``: the stored values as floats;
- ``"scaled"``: [-1, 1], x -> 2 (x - lo) / d - 1 for a divisor d (the value span, or 17
  for scikit-learn's digits as in Tomczak's code);
- ``"binary"``: {0, 1}, x >= a threshold.

A run records its encoding (``config.json``, under ``data``), so that pictures and
saved samples can be mapped back to stored values. :class:`EncodedRows` keeps a
(memory-mapped) array on disk and encodes only the rows a batch asks for, so a data set
larger than memory trains; the rows of a file too large for the page cache are read
from it one by one (:meth:`~ebmlab.data.arrays.MappedView.read_rows`), which asks the
disk for those bytes alone.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from ebmlab import _checks
from ebmlab.data.arrays import MappedView, physical_memory

TRANSFORMS = ("raw", "scaled", "binary")
READ_ROWS_SHARE = 0.5  # of the machine's memory, above which a mapped file's rows are read


@dataclass(frozen=True)
class Encoding:
    """How stored values x become model inputs, by ``transform``: ``raw``: x;
    ``scaled``: 2 (x - low) / divisor - 1; ``binary``: x >= threshold. ``low`` and
    ``high`` are the smallest and largest stored values."""

    transform: str
    low: float  # smallest stored value
    high: float  # largest stored value
    divisor: float  # scaled = 2 (x - low) / divisor - 1
    threshold: float  # binary = x >= threshold

    @classmethod
    def for_values(
        cls,
        low: float,
        high: float,
        transform: str = "scaled",
        divisor: float | None = None,
        threshold: float | None = None,
    ) -> Encoding:
        """The encoding of values in [low, high] (divisor: the span; threshold: the middle).

        Args:
            transform: ``"raw"``, ``"scaled"`` or ``"binary"``.
        """
        _checks.one_of("transform", transform, TRANSFORMS)
        span = float(high - low) or 1.0
        return cls(
            transform,
            float(low),
            float(high),
            float(divisor if divisor is not None else span),
            float(threshold if threshold is not None else low + span / 2),
        )

    @property
    def value_range(self) -> tuple[float, float]:
        """The box the encoded values live in."""
        if self.transform == "raw":
            return self.low, self.high
        if self.transform == "binary":
            return 0.0, 1.0
        return -1.0, 1.0

    def __call__(self, values: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Stored values (any numeric dtype) as encoded float32."""
        if isinstance(values, np.ndarray):  # a writable float32 copy (memory maps are read-only)
            values = np.array(values, dtype=np.float32)
        x = torch.as_tensor(values).float()
        if self.transform == "raw":
            return x
        if self.transform == "binary":
            return (x >= self.threshold).float()
        return (x - self.low) * (2 / self.divisor) - 1

    def to_dict(self) -> dict[str, Any]:
        """The encoding as a JSON-serialisable dict (for config.json)."""
        return asdict(self)


class EncodedRows:
    """Rows of a stored array encoded on demand: ``rows[idx]`` reads only those rows.

    Behaves like the float tensor of all encoded rows (N, *row_shape) for indexing with
    an integer tensor, array or slice, ``shape``, ``len`` and ``split``, without holding
    it: the array may be a ``numpy.memmap`` far larger than memory, turned into floats
    by ``encoding`` one batch at a time. ``index`` selects
    and orders the rows of ``array`` that belong to this split. ``read_rows`` reads a
    batch's rows from the mapped file one by one (True), indexes the mapping (False), or
    decides by the file's size (None: reads a file larger than half the machine's
    memory). Rows stay on the CPU:
    the trainer moves each batch to its device. Pickled (for a DataLoader worker), a
    memory-mapped array travels as its file's name and is mapped again on arrival.
    """

    def __init__(
        self,
        array: np.ndarray,
        encoding: Encoding,
        row_shape: tuple[int, ...],
        index: np.ndarray | None = None,
        read_rows: bool | None = None,
    ) -> None:
        self.array, self.encoding, self.row_shape = array, encoding, tuple(row_shape)
        self.index = np.arange(len(array)) if index is None else np.asarray(index)
        self.device = torch.device("cpu")
        self._file = self._file_to_read(array, read_rows)

    @staticmethod
    def _file_to_read(array: np.ndarray, read_rows: bool | None) -> MappedView | None:
        """The mapped file whose rows a batch reads one by one
        (:meth:`~ebmlab.data.arrays.MappedView.read_rows`), or None to index the mapping.
        ``read_rows`` None reads a file larger than ``READ_ROWS_SHARE`` of the machine's
        memory, which the page cache cannot keep, and maps a smaller one, whose pages
        mapping reads ahead in large blocks and the page cache then holds."""
        view = MappedView.of(array)
        readable = view is not None and view.rows_contiguous
        if read_rows and not readable:
            raise _checks.ArgumentError(
                "read_rows needs an array that views a memory-mapped file with each row "
                "one run of bytes"
            )
        if read_rows is None:
            read_rows = readable and view.length > READ_ROWS_SHARE * physical_memory()
        return view if read_rows else None

    @property
    def shape(self) -> torch.Size:
        return torch.Size((len(self.index), *self.row_shape))

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["array"] = MappedView.of(self.array) or self.array
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if isinstance(state["array"], MappedView):
            state["array"] = state["array"].open()
        self.__dict__.update(state)

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, key: Any) -> torch.Tensor:
        rows = self.index[key.cpu().numpy() if isinstance(key, torch.Tensor) else key]
        rows = np.atleast_1d(rows)
        # read in file order, then restore the batch's order
        order = np.argsort(rows, kind="stable")
        values = np.empty((len(rows), *self.array.shape[1:]), dtype=self.array.dtype)
        if self._file is not None:
            in_order = np.empty_like(values)
            self._file.read_rows(rows[order], in_order)
            values[order] = in_order
        else:
            values[order] = self.array[rows[order]]
        return self.encoding(values).reshape(len(rows), *self.row_shape)

    def subset(self, rows: np.ndarray) -> EncodedRows:
        """These rows' rows ``rows``, still on disk.

        Args:
            rows: indices into these rows.
        """
        return EncodedRows(
            self.array, self.encoding, self.row_shape, self.index[rows], self._file is not None
        )

    def split(self, size: int) -> list[torch.Tensor]:
        """Consecutive chunks of ``size`` encoded rows (like :meth:`torch.Tensor.split`)."""
        return [self[start : start + size] for start in range(0, len(self), size)]

    def to(self, device: torch.device | str) -> EncodedRows:
        """Itself: rows are encoded on the CPU and batches are moved where they are used.

        Args:
            device: the device the rows are decoded onto.
        """
        return self
