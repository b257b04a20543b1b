"""A user's own data: array files (memory-mapped), image folders, split folders, and the
errors for each kind of bad file."""

import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from ebmlab.data import (
    DataFormatError,
    EncodedRows,
    Encoding,
    holdout_rows,
    load_dataset,
    run_splits,
    splits_of,
)

RNG = np.random.default_rng(1)


def test_npy_with_labels_file_is_memory_mapped_and_split(tmp_path):
    x = RNG.normal(size=(50, 6)).astype(np.float32)
    y = np.arange(50) % 3
    np.save(tmp_path / "feats.npy", x)
    np.save(tmp_path / "feats_labels.npy", y)
    parts = {
        s: load_dataset(str(tmp_path / "feats.npy"), s, transform="raw")
        for s in ("train", "val", "test")
    }
    assert [len(p) for p in parts.values()] == [40, 5, 5]
    rows = np.concatenate([p.x.numpy() for p in parts.values()])
    assert sorted(map(bytes, rows)) == sorted(map(bytes, x))  # a partition of the file
    assert parts["train"].num_classes == 3 and parts["train"].image_shape is None
    assert parts["train"].value_range == (float(x.min()), float(x.max()))
    lazy = load_dataset(str(tmp_path / "feats.npy"), "train", transform="raw", in_memory=False)
    assert isinstance(lazy.x, EncodedRows) and isinstance(lazy.x.array, np.memmap)
    idx = torch.tensor([5, 0, 39, 5])
    torch.testing.assert_close(lazy.x[idx], parts["train"].x[idx], rtol=0, atol=0)
    torch.testing.assert_close(torch.cat(lazy.x.split(7)), parts["train"].x, rtol=0, atol=0)
    scaled = load_dataset(str(tmp_path / "feats.npy"), "train")
    assert float(scaled.x.min()) >= -1 and float(scaled.x.max()) <= 1


def test_npz_split_folder_uncompressed_is_mapped(tmp_path):
    images = RNG.integers(0, 256, (20, 3, 8, 8), dtype=np.uint8)
    np.savez(tmp_path / "train.npz", x=images, y=np.arange(20) % 4)
    np.savez_compressed(tmp_path / "test.npz", x=images[:6], y=np.arange(6) % 4)
    assert splits_of(str(tmp_path)) == ["train", "test"]
    train = load_dataset(str(tmp_path), "train", flatten=False, in_memory=False)
    assert isinstance(train.x.array, np.memmap)  # uncompressed members are mapped
    assert train.image_shape == (3, 8, 8) and train.num_classes == 4
    torch.testing.assert_close(
        train.x[torch.arange(3)], torch.from_numpy(images[:3]) * (2 / 255) - 1
    )
    test = load_dataset(str(tmp_path), "test", transform="raw")
    assert test.x.shape == (6, 192) and test.raw.shape == (6, 3, 8, 8)
    with pytest.raises(ValueError, match=r"split must be one of \['train', 'test'\]"):
        load_dataset(str(tmp_path), "val")


@pytest.mark.parametrize("in_memory", [True, False])
def test_validation_is_held_out_of_training_where_a_set_has_none(tmp_path, in_memory):
    images = RNG.integers(0, 256, (200, 1, 4, 4), dtype=np.uint8)
    labels = np.repeat(np.arange(4), [20, 40, 60, 80])  # unbalanced classes
    np.savez(tmp_path / "train.npz", x=images, y=labels)
    np.savez(tmp_path / "test.npz", x=images[:7], y=labels[:7])
    train, val, test = run_splits(str(tmp_path), transform="raw", in_memory=in_memory)
    assert (train.split, val.split, test.split) == ("train", "val", "test")
    assert (len(train), len(val), len(test)) == (180, 20, 7)
    # every class gives up its share, and train and val partition the training file
    assert np.bincount(val.y.numpy()).tolist() == [2, 4, 6, 8]
    rows = lambda part: part.x[torch.arange(len(part))].numpy()  # noqa: E731
    seen = sorted(map(bytes, np.concatenate([rows(train), rows(val)])))
    assert seen == sorted(map(bytes, images.reshape(200, -1).astype(np.float32)))
    for part in (train, val):  # labels still belong to their rows
        pixels = rows(part).reshape(-1, 16).astype(np.uint8)
        by_row = {bytes(r): int(c) for r, c in zip(images.reshape(200, -1), labels, strict=True)}
        assert [by_row[bytes(r)] for r in pixels] == part.y.tolist()
    if in_memory:
        assert train.raw.shape == (180, 1, 4, 4) and val.raw.shape == (20, 1, 4, 4)
    again = run_splits(str(tmp_path), transform="raw", in_memory=in_memory)[1]
    assert torch.equal(again.x[torch.arange(20)], val.x[torch.arange(20)])  # a fixed choice
    whole, on_test, _ = run_splits(str(tmp_path), validation_fraction=0)
    assert len(whole) == 200 and on_test.split == "test" and len(on_test) == 7


def test_a_set_with_its_own_validation_split_keeps_it(tmp_path):
    for split, n in (("train", 30), ("val", 5), ("test", 6)):
        np.savez(tmp_path / f"{split}.npz", x=RNG.normal(size=(n, 3)), y=np.arange(n) % 2)
    train, val, test = run_splits(str(tmp_path), validation_fraction=0.5)
    assert (len(train), len(val), len(test)) == (30, 5, 6)


def test_holdout_rows_shares_and_bad_shares():
    kept, held = holdout_rows(None, 10, 0.3)
    assert len(held) == 3 and sorted([*kept, *held]) == list(range(10))
    labels = torch.tensor([0] * 7 + [1] * 2 + [2])  # shares 0.7, 0.2, 0.1 of 3 rows
    _, held = holdout_rows(labels, 10, 0.25)  # ceil(2.5) = 3 rows: 2.1, 0.6, 0.3
    assert labels[held].tolist() == [0, 0, 1]
    assert len(holdout_rows(labels, 10, 0.01)[1]) == 1  # at least one row
    single = torch.tensor([0] * 6 + [1])  # ceil(4.2) = 5 rows: 4.29 and 0.71
    kept, held = holdout_rows(single, 7, 0.6)
    assert single[held].tolist() == [0] * 4 and 6 in kept  # class 1 keeps its one row
    with pytest.raises(ValueError, match="leaves no validation rows: each class has a single"):
        holdout_rows(torch.arange(5), 5, 0.3)
    with pytest.raises(
        ValueError, match=r"validation_fraction 0\.95 of 10 training rows leaves no"
    ):
        holdout_rows(None, 10, 0.95)
    with pytest.raises(ValueError, match=r"validation_fraction must lie in \[0, 1\), got 1"):
        run_splits("digits", validation_fraction=1)
    with pytest.raises(ValueError, match="validation_fraction must be a finite number >= 0"):
        run_splits("digits", validation_fraction=-0.1)


def test_image_folders_grayscale_rgb_and_resize(tmp_path):
    from PIL import Image

    for k, name in enumerate(["cat", "dog"]):
        (tmp_path / "rgb" / name).mkdir(parents=True)
        (tmp_path / "gray" / name).mkdir(parents=True)
        for i in range(5):
            pixels = np.full((6, 4, 3), 40 * k + i, np.uint8)
            Image.fromarray(pixels).save(tmp_path / "rgb" / name / f"{i}.png")
            Image.fromarray(pixels[..., 0]).save(tmp_path / "gray" / name / f"{i}.png")
    rgb = load_dataset(str(tmp_path / "rgb"), "train", transform="raw", flatten=False)
    assert rgb.image_shape == (3, 6, 4) and rgb.classes == ("cat", "dog") and rgb.num_classes == 2
    gray = load_dataset(str(tmp_path / "gray"), "train", transform="raw")
    assert gray.image_shape == (1, 6, 4) and gray.x.shape == (8, 24)
    # every image is one grey level: its label says which
    assert all((v < 40) == (lab == 0) for v, lab in zip(gray.x[:, 0], gray.y, strict=True))
    Image.fromarray(np.zeros((9, 9, 3), np.uint8)).save(tmp_path / "rgb" / "dog" / "big.png")
    with pytest.raises(DataFormatError, match=r"big\.png is 9x9.*resize"):
        load_dataset(str(tmp_path / "rgb"), "train")
    resized = load_dataset(str(tmp_path / "rgb"), "train", resize=(5, 5), flatten=False)
    assert resized.x.shape[1:] == (3, 5, 5)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda d: np.save(d / "a.npy", np.array([[1.0, np.nan], [0.0, 1.0]])), "NaN or inf"),
        (lambda d: np.save(d / "a.npy", np.array([[1.0, np.inf]] * 3)), "NaN or inf"),
        (
            lambda d: np.savez(d / "a.npz", x=np.ones((3, 2)), y=np.array([0, 1])),
            "3 inputs but 2 labels",
        ),
        (lambda d: np.savez(d / "a.npz", z=np.ones((3, 2))), "named 'x'"),
        (lambda d: np.save(d / "a.npy", np.array([{"a": 1}] * 2, dtype=object)), "readable NumPy"),
        (lambda d: (d / "a.npy").write_bytes(b"\x93NUMPY garbage"), "readable NumPy"),
        (lambda d: (d / "a.npz").write_bytes(b"PK not really"), r"readable \.npz"),
        (lambda d: np.save(d / "a.npy", np.ones(5)), r"shape \(N, \.\.\.\)"),
        (lambda d: np.savez(d / "a.npz", x=np.ones((4, 2)), y=np.array([0, 1, -1, 1])), r"0\.\.1"),
    ],
)
def test_bad_array_files(tmp_path, make, match):
    make(tmp_path)
    path = next(tmp_path.iterdir())
    with pytest.raises(DataFormatError, match=match) as err:
        load_dataset(str(path), "train")
    assert str(path) in str(err.value)


def test_test_labels_outside_the_training_classes(tmp_path):
    np.savez(tmp_path / "train.npz", x=np.ones((4, 2)), y=np.array([0, 1, 0, 1]))
    np.savez(tmp_path / "test.npz", x=np.ones((2, 2)), y=np.array([0, 2]))
    with pytest.raises(DataFormatError, match=r"test\.npz.*0\.\.1"):
        load_dataset(str(tmp_path), "test")


def test_empty_and_missing(tmp_path):
    (tmp_path / "empty" / "a").mkdir(parents=True)
    with pytest.raises(DataFormatError, match="holds no images"):
        load_dataset(str(tmp_path / "empty"), "train")
    (tmp_path / "none").mkdir()
    with pytest.raises(DataFormatError, match="no class sub-folders"):
        load_dataset(str(tmp_path / "none"), "train")
    with pytest.raises(FileNotFoundError, match="neither a known data set"):
        load_dataset(str(tmp_path / "nothing.npy"), "train")


@pytest.mark.parametrize(("read_rows", "bound_mb"), [(False, 1000), (True, 300)])
def test_larger_than_memory_file_trains_in_bounded_memory(tmp_path, read_rows, bound_mb):
    """A 1.5 GB uint8 file (sparse on disk; 6 GB once encoded as floats) trains 20 steps
    while the process grows by a bounded amount: only the batches' rows are ever read.
    Mapped, the growth counts the file's pages mapped around each row (up to 64 kB: about
    330 MB for these 5120 rows), still well below the file; read row by row (as a file
    larger than half the memory is), it stays below 300 MB."""
    path = tmp_path / "big.npy"
    n, d = 1_500_000, 1024
    array = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=(n, d))
    array[::1000] = 7  # a few written rows; the rest stays a hole in the file
    del array
    script = textwrap.dedent(f"""
        import resource
        from torch import nn
        from ebmlab.data import load_dataset
        from ebmlab.training import StepResult, Task, Trainer, TrainerConfig
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        from ebmlab.data import EncodedRows
        x = load_dataset({str(path)!r}, "train", in_memory=False).x
        x = EncodedRows(x.array, x.encoding, x.row_shape, x.index, read_rows={read_rows})
        class Fit(Task):
            def __init__(self):
                self.model = nn.Linear({d}, 1)
            def training_step(self, batch, generator):
                return StepResult(self.model(batch[0]).pow(2).mean())
        config = TrainerConfig(epochs=1, max_steps=20, batch_size=256, progress=False,
                               device="cpu")
        Trainer(Fit(), (x,), config).fit()
        print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
    """)
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    grown_mb = int(out.stdout.split()[-1])
    assert grown_mb < bound_mb, f"the process grew by {grown_mb} MB for a {n * d >> 20} MB file"


def test_rows_of_a_mapped_file_are_read_from_it_as_the_view_gives_them(tmp_path):
    """A batch reads each row's bytes from the file (offset, record stride and a skipped
    label byte included) and gets exactly what indexing the mapped view gives; a view
    whose rows are not one run of bytes is indexed as before, and a file cut short is
    named."""
    from ebmlab.data.arrays import MappedView

    encoding = load_dataset("digits", "train").encoding
    records = RNG.integers(0, 256, (60, 1 + 48), dtype=np.uint8)
    (tmp_path / "records.bin").write_bytes(b"head" + records.tobytes())
    mapped = np.memmap(tmp_path / "records.bin", np.uint8, "r", 4, (60, 49))
    idx = torch.tensor([59, 3, 3, 0, 31])
    views = {
        "records": mapped[:, 1:].reshape(60, 3, 4, 4),  # stride 49, label byte skipped
        "reversed": mapped[::-1, 1:],  # a negative row stride
        "columns": mapped[:, 1:].reshape(60, 3, 4, 4).transpose(0, 1, 3, 2),  # not a run
    }
    for name, view in views.items():
        shape = (int(np.prod(view.shape[1:])),)
        rows = EncodedRows(view, encoding, shape, read_rows=name != "columns")
        assert (rows._file is not None) == (name != "columns"), name
        expected = encoding(np.ascontiguousarray(view[idx.numpy()])).reshape(len(idx), -1)
        assert torch.equal(rows[idx], expected), name
        picked = rows.subset(np.array([5, 2]))[torch.tensor([1, 0])]
        assert torch.equal(picked, rows[torch.tensor([2, 5])]), name
    with pytest.raises(ValueError, match="read_rows needs an array that views a memory-mapped"):
        EncodedRows(views["columns"], encoding, (48,), read_rows=True)
    floats = np.lib.format.open_memmap(tmp_path / "f.npy", "w+", np.float32, (30, 2, 3))
    floats[:] = RNG.normal(size=(30, 2, 3))
    floats.flush()
    rows = EncodedRows(floats, Encoding.for_values(-5, 5, "raw"), (6,), read_rows=True)
    assert rows.subset(np.arange(4))._file is not None  # a subset reads as its split does
    assert torch.equal(rows[idx[idx < 30]], torch.from_numpy(floats[[3, 3, 0]].reshape(3, 6)))
    cut = MappedView(str(tmp_path / "records.bin"), 4, 60 * 49, 1, (70, 48), (49, 1), "|u1")
    with pytest.raises(DataFormatError, match=r"records\.bin: the file ends before row 65"):
        cut.read_rows(np.array([2, 65]), np.empty((2, 48), np.uint8))


def test_only_a_file_larger_than_half_the_memory_is_read_row_by_row(tmp_path, monkeypatch):
    """By default a file the page cache can hold is mapped (its pages read ahead in large
    blocks and kept); one larger than half the machine's memory is read row by row."""
    import ebmlab.data.encoding as encoding_module

    np.save(tmp_path / "x.npy", RNG.integers(0, 256, (100, 64), dtype=np.uint8))
    assert load_dataset(str(tmp_path / "x.npy"), in_memory=False).x._file is None
    monkeypatch.setattr(encoding_module, "physical_memory", lambda: 2 * 100 * 64 - 2)
    assert load_dataset(str(tmp_path / "x.npy"), in_memory=False).x._file is not None


def test_a_mapped_split_travels_to_loader_workers_as_its_file(tmp_path):
    """DataLoader workers started by spawn or forkserver (macOS, Windows, Python 3.14)
    receive the split pickled: the file's name travels, not its rows, and each worker
    maps the file again, including a view that skips a record's label byte."""
    from ebmlab.data.arrays import MappedView
    from ebmlab.training.trainer import _Batches

    x = np.random.default_rng(0).integers(0, 256, (4000, 1, 16, 16), dtype=np.uint8)
    np.save(tmp_path / "x.npy", x)
    rows = load_dataset(str(tmp_path / "x.npy"), "train", in_memory=False).x
    blob = pickle.dumps(rows)
    assert len(blob) < x.nbytes / 10  # the split's row index, not its pixels
    idx = torch.tensor([3, 0, 2000])
    assert torch.equal(pickle.loads(blob)[idx], rows[idx])
    in_memory = EncodedRows(np.asarray(x), rows.encoding, rows.row_shape)
    assert MappedView.of(in_memory.array) is None  # negative control: the rows travel
    assert len(pickle.dumps(in_memory)) > x.nbytes

    records = np.random.default_rng(1).integers(0, 256, (50, 257), dtype=np.uint8)
    records.tofile(tmp_path / "records.bin")
    mapped = np.memmap(tmp_path / "records.bin", np.uint8, "r", 0, (50, 257))
    view = EncodedRows(mapped[:, 1:].reshape(50, 1, 16, 16), rows.encoding, (256,))
    assert len(pickle.dumps(view)) < 2000
    assert torch.equal(pickle.loads(pickle.dumps(view))[idx[:2]], view[idx[:2]])

    shares = [torch.tensor([5, 1]), torch.tensor([2000, 7, 3])]
    read = EncodedRows(rows.array, rows.encoding, rows.row_shape, rows.index, read_rows=True)
    loader = torch.utils.data.DataLoader(
        _Batches((rows, read), shares), batch_size=None, num_workers=1,
        multiprocessing_context="spawn",
    )  # fmt: skip
    for (got, got_read), share in zip(loader, shares, strict=True):
        assert torch.equal(got, rows[share]) and torch.equal(got_read, rows[share])


def test_a_single_labelled_file_is_split_by_class(tmp_path):
    """100 images of each of three classes: every split holds the classes in equal
    shares (a plain permutation gave a validation split of 11/6/13)."""
    from ebmlab.data import load_dataset

    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (300, 4, 4), dtype=np.uint8)
    y = np.repeat(np.arange(3), 100)
    np.savez(tmp_path / "pool.npz", x=x, y=y)
    splits = {s: load_dataset(str(tmp_path / "pool.npz"), s) for s in ("train", "val", "test")}
    counts = {s: np.bincount(d.y.numpy(), minlength=3).tolist() for s, d in splits.items()}
    assert counts == {"train": [80, 80, 80], "val": [10, 10, 10], "test": [10, 10, 10]}
    rows = [d.x for d in splits.values()]
    assert len(torch.unique(torch.cat(rows), dim=0)) == 300  # disjoint, and all of them
