"""A user's own data: array files (memory-mapped), image folders, split folders, and the
errors for each kind of bad file."""

import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from ebmlab.data import DataFormatError, EncodedRows, load_dataset, splits_of

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


def test_larger_than_memory_file_trains_in_bounded_memory(tmp_path):
    """A 1.5 GB uint8 file (sparse on disk; 6 GB once encoded as floats) trains 20 steps
    while the process grows by less than 400 MB: only the batches' rows are ever read."""
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
        data = load_dataset({str(path)!r}, "train", in_memory=False)
        class Fit(Task):
            def __init__(self):
                self.model = nn.Linear({d}, 1)
            def training_step(self, batch, generator):
                return StepResult(self.model(batch[0]).pow(2).mean())
        config = TrainerConfig(epochs=1, max_steps=20, batch_size=256, progress=False,
                               device="cpu")
        Trainer(Fit(), (data.x,), config).fit()
        print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
    """)
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    grown_mb = int(out.stdout.split()[-1])
    assert grown_mb < 400, f"the process grew by {grown_mb} MB for a {n * d >> 20} MB file"


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
    loader = torch.utils.data.DataLoader(
        _Batches((rows,), shares), batch_size=None, num_workers=1,
        multiprocessing_context="spawn",
    )  # fmt: skip
    for (got,), share in zip(loader, shares, strict=True):
        assert torch.equal(got, rows[share])
