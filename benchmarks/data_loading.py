"""Data loading: the trainer's batches of one epoch, in memory and memory-mapped from an
``.npz`` on disk, against what users write instead (a ``DataLoader`` over a
``TensorDataset``; a per-row ``Dataset`` over the memory map with default collation),
and the share of a JEM epoch that loading takes.

The data are MNIST-shaped: 8000 images of 1 x 28 x 28 8-bit pixels (the size of
mnist10k's training split), random, so the benchmark needs no files. A last case reads
batches of CIFAR-size rows from a file that is not in the page cache (evicted before
each repeat, as the rows of a data set larger than memory are), against indexing the
memory map with the batch's rows (Linux only: eviction is ``posix_fadvise``).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.harness import Case, MetricCase
from ebmlab.data import EncodedRows, load_dataset, run_splits
from ebmlab.training import Trainer, TrainerConfig
from ebmlab.training.recipes.jem import JEMConfig, JEMTask
from ebmlab.training.trainer import _Batches

N, SHAPE, BATCH = 8000, (1, 28, 28), 64
COLD_SHAPE, LARGE_ROWS, SMALL_ROWS = (3, 32, 32), 600_000, 100_000  # 1.8 GB and 0.3 GB


def write_image_npz(folder: Path, n: int, shape: tuple[int, ...]) -> Path:
    """Random 8-bit images of ``shape`` with ten classes, as ``train.npz`` (``n`` rows)
    and ``test.npz`` (a tenth of them) in ``folder``, the layout ``--data FOLDER`` reads."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (n, *shape), dtype=np.uint8)
    np.savez(folder / "train.npz", x=x, y=np.arange(n) % 10)
    np.savez(folder / "test.npz", x=x[: n // 10], y=np.arange(n // 10) % 10)
    return folder


class _Rows(torch.utils.data.Dataset):
    """The usual hand-written Dataset: one memory-mapped row per item, scaled to [-1, 1]."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return torch.from_numpy(self.x[i].astype(np.float32) * (2 / 255) - 1).flatten(), self.y[i]


def _epoch(trainer: Trainer) -> int:
    rows = 0
    for batch, _ in trainer._epoch_data(trainer._batches(0)):
        rows += len(batch[0])
    return rows


def _trainer(folder: Path, in_memory: bool) -> Trainer:
    data = load_dataset(str(folder), "train", in_memory=in_memory)
    config = TrainerConfig(batch_size=BATCH, progress=False, device="cpu")
    return Trainer(_Loader(), (data.x, data.y), config)


class _Loader:
    """A task that only receives batches (the trainer needs a model with no parameters)."""

    def __init__(self) -> None:
        self.model = torch.nn.Linear(1, 1)

    def to(self, device):
        return self


def _write_cifar_rows(path: Path, n: int) -> None:
    """``n`` random CIFAR-size 8-bit rows as the ``.npy`` file ``path``."""
    array = np.lib.format.open_memmap(path, "w+", np.uint8, (n, *COLD_SHAPE))
    for start in range(0, n, 10_000):
        part = array[start : start + 10_000]
        part[:] = np.random.default_rng(start).integers(0, 256, part.shape, np.uint8)
    array.flush()


def _cold_reads(path: Path, batches: list[np.ndarray], read_rows: bool, workers: int = 0):
    """Reads of ``batches`` of the training split of ``path`` (kept on disk), first
    dropping the file from the page cache as memory pressure does, then row by row or
    through a fresh mapping (the pages of a mapping kept from the last repeat would stay
    cached), in this process or in ``workers`` DataLoader worker processes."""

    def run() -> None:
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        rows = load_dataset(str(path), "train", in_memory=False).x
        rows = EncodedRows(rows.array, rows.encoding, rows.row_shape, rows.index, read_rows)
        shares = [torch.from_numpy(batch) for batch in batches]
        loader = torch.utils.data.DataLoader(
            _Batches((rows,), shares), batch_size=None, num_workers=workers
        )
        for _ in loader:
            pass

    return run


def _cold_cases(folder: Path) -> list[Case]:
    """Rows read from a file that is not in the page cache, row by row and mapped: from a
    file larger than memory (scattered batches, each read cold) and a whole epoch of a
    file the page cache holds."""
    if not hasattr(os, "posix_fadvise"):
        return []
    large, small = folder / "large.npy", folder / "small.npy"
    _write_cifar_rows(large, LARGE_ROWS)
    _write_cifar_rows(small, SMALL_ROWS)
    rng = np.random.default_rng(0)
    train_rows = int(0.8 * LARGE_ROWS), int(0.8 * SMALL_ROWS)  # the file's training split
    scattered = [np.sort(rng.choice(train_rows[0], 256, replace=False)) for _ in range(40)]
    epoch = [np.sort(b) for b in rng.permutation(train_rows[1]).reshape(-1, 250)]
    # (what, file, batches, whether ebmlab reads row by row there, the anchor, workers)
    compared = [
        ("20 batches of 256 CIFAR-size rows scattered over a 1.8 GB file not in the page "
         "cache (each batch of a file larger than memory): read row by row",
         large, scattered[:20], True, "np.memmap indexed by the batch", 0),
        ("the same, 40 batches through 4 DataLoader workers (--num-workers 4)",
         large, scattered, True, "np.memmap indexed by the batch", 4),
        ("an epoch (80 000 CIFAR-size rows) of a 300 MB file not in the page cache: "
         "mapped, as ebmlab reads a file below half the memory",
         small, epoch, False, "rows read one by one", 0),
    ]  # fmt: skip
    return [
        Case(
            what,
            _cold_reads(path, b, read, workers),
            _cold_reads(path, b, not read, workers),
            anchor,
            repeats=3,
        )
        for what, path, b, read, anchor, workers in compared
    ]


def _jem_epoch_seconds(folder: Path, in_memory: bool) -> tuple[float, float]:
    """(seconds of one JEM epoch, seconds of its data loading alone) on the folder's data."""
    config = JEMConfig(data=str(folder), conv_width=16, buffer_size=1000, calibrate=False)
    task = JEMTask(config, seed=0)
    if not in_memory:
        task.train = run_splits(str(folder), in_memory=False)[0]
    settings = TrainerConfig(epochs=1, batch_size=BATCH, progress=False, device="cpu")
    trainer = Trainer(task, (task.train.x, task.train.y), settings)
    start = time.perf_counter()
    _epoch(trainer)
    loading = time.perf_counter() - start
    start = time.perf_counter()
    trainer.fit()
    return time.perf_counter() - start, loading


def cases() -> list:
    folder = Path(tempfile.mkdtemp(prefix="ebmlab-bench-data-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # the cases run after return
    write_image_npz(folder, N, SHAPE)
    memory, disk = (_trainer(folder, flag) for flag in (True, False))
    arrays = np.load(folder / "train.npz")
    y = arrays["y"]
    x = torch.from_numpy(arrays["x"].reshape(N, -1).astype(np.float32) * (2 / 255) - 1)
    tensors = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, torch.from_numpy(y)), batch_size=BATCH, shuffle=True
    )
    mapped = load_dataset(str(folder), "train", in_memory=False).x.array
    per_row = torch.utils.data.DataLoader(_Rows(mapped, y), batch_size=BATCH, shuffle=True)

    def share() -> tuple[float, float]:
        shares = []
        for flag in (True, False):
            epoch, loading = _jem_epoch_seconds(folder, flag)
            shares.append(100 * loading / epoch)
        return shares[0], shares[1]

    return [
        Case(
            "epoch of batches, 8000 MNIST-size images in memory",
            lambda: _epoch(memory),
            lambda: sum(len(b[0]) for b in tensors),
            "DataLoader(TensorDataset)",
        ),
        Case(
            "epoch of batches, memory-mapped .npz",
            lambda: _epoch(disk),
            lambda: sum(len(b[0]) for b in per_row),
            "per-row Dataset over np.memmap",
        ),
        MetricCase(
            "share of a JEM epoch spent loading (%): in memory vs memory-mapped",
            share,
            "memory-mapped",
            "%",
            higher_is_better=False,
        ),
        *_cold_cases(folder),
    ]
