"""Published formats, each written here byte for byte as its publisher lays it out:
IDX (MNIST family, EMNIST's transposed images), CIFAR-10/100 binary records, SVHN .mat."""

import dataclasses
import functools
import gzip
import hashlib
import http.server
import io
import shutil
import struct
import tarfile
import threading
from pathlib import Path

import numpy as np
import pytest
import scipy.io

from ebmlab.data import (
    DataFormatError,
    DataNotFoundError,
    available_datasets,
    catalog,
    load_dataset,
)
from ebmlab.data.formats import read_idx

RNG = np.random.default_rng(0)
ROOT = Path(__file__).resolve().parents[2]


def set_md5(monkeypatch, name, md5, content=None):
    """Published checksums, of the files and of their content, replaced (the files
    written here are not the published ones)."""
    source = dataclasses.replace(catalog.SOURCES[name], md5=md5, content_md5=content or {})
    monkeypatch.setitem(catalog.SOURCES, name, source)


def idx_bytes(arr: np.ndarray) -> bytes:
    """An IDX file: two zero bytes, the type code (0x08 unsigned byte), the number of
    dimensions, each dimension as a big-endian uint32, then the data."""
    return bytes([0, 0, 0x08, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.tobytes()


def write_idx_set(folder, images, labels, split="t10k", prefix="", gz=True):
    folder.mkdir(parents=True, exist_ok=True)
    for kind, arr in (("images-idx3", images), ("labels-idx1", labels)):
        name = f"{prefix}{split}-{kind}-ubyte"
        data = idx_bytes(arr.astype(np.uint8))
        if gz:
            with gzip.open(folder / (name + ".gz"), "wb") as fh:
                fh.write(data)
        else:
            (folder / name).write_bytes(data)


def cifar_bytes(images: np.ndarray, labels: list[np.ndarray]) -> bytes:
    """CIFAR binary records: the label byte(s), then the red, green and blue planes."""
    out = io.BytesIO()
    for i, image in enumerate(images):
        out.write(bytes(int(lab[i]) for lab in labels))
        out.write(image.astype(np.uint8).tobytes())  # (3, 32, 32) C order: plane by plane
    return out.getvalue()


def test_read_idx_raw_and_gzip(tmp_path):
    arr = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    (tmp_path / "a").write_bytes(idx_bytes(arr))
    with gzip.open(tmp_path / "a.gz", "wb") as fh:
        fh.write(idx_bytes(arr))
    np.testing.assert_array_equal(read_idx(tmp_path / "a"), arr)
    np.testing.assert_array_equal(read_idx(tmp_path / "a.gz"), arr)
    (tmp_path / "bad").write_bytes(idx_bytes(arr)[:-1])
    with pytest.raises(DataFormatError, match="truncated"):
        read_idx(tmp_path / "bad")
    (tmp_path / "magic").write_bytes(b"\x01\x02" + idx_bytes(arr)[2:])
    with pytest.raises(DataFormatError, match="magic"):
        read_idx(tmp_path / "magic")
    (tmp_path / "cut.gz").write_bytes((tmp_path / "a.gz").read_bytes()[:20])
    with pytest.raises(DataFormatError, match=r"cut\.gz"):
        read_idx(tmp_path / "cut.gz")


@pytest.mark.parametrize("name", ["fashion-mnist", "kmnist"])
def test_mnist_family_from_idx_files(tmp_path, name, monkeypatch):
    images = RNG.integers(0, 256, (12, 28, 28))
    labels = np.arange(12) % 10
    for split in ("train", "t10k"):
        write_idx_set(tmp_path / name, images, labels, split=split, gz=split == "t10k")
    set_md5(monkeypatch, name, {})
    data = load_dataset(name, "test", root=tmp_path, transform="raw", flatten=False)
    assert data.x.shape == (12, 1, 28, 28) and data.image_shape == (1, 28, 28)
    np.testing.assert_array_equal(data.raw[:, 0], images)
    np.testing.assert_array_equal(data.y.numpy(), labels)
    assert data.num_classes == 10
    assert len(load_dataset(name, "train", root=tmp_path)) == 12  # raw (not gzip) files


def test_published_checksum_is_verified(tmp_path):
    write_idx_set(tmp_path / "fashion-mnist", RNG.integers(0, 256, (3, 28, 28)), np.arange(3))
    with pytest.raises(DataFormatError, match="md5"):
        load_dataset("fashion-mnist", "test", root=tmp_path)


def test_emnist_images_are_transposed_and_letters_start_at_zero(tmp_path):
    images = RNG.integers(0, 256, (4, 28, 28))
    write_idx_set(tmp_path, images, np.array([1, 2, 26, 3]), split="test", prefix="emnist-letters-")
    data = load_dataset("emnist-letters", "test", root=tmp_path, transform="raw")
    np.testing.assert_array_equal(data.raw[:, 0], images.transpose(0, 2, 1))
    assert data.y.tolist() == [0, 1, 25, 2] and data.num_classes == 26


def test_idx_count_mismatch_names_both_files(tmp_path):
    write_idx_set(tmp_path, RNG.integers(0, 256, (4, 28, 28)), np.arange(3), split="test",
                  prefix="emnist-digits-")  # fmt: skip
    with pytest.raises(DataFormatError, match="4 images but 3 labels"):
        load_dataset("emnist-digits", "test", root=tmp_path)


def write_cifar10(root, n=6):
    folder = root / "cifar-10-batches-bin"
    folder.mkdir(parents=True)
    images = RNG.integers(0, 256, (n, 3, 32, 32))
    labels = np.arange(n) % 10
    (folder / "test_batch.bin").write_bytes(cifar_bytes(images, [labels]))
    for i in range(1, 6):
        (folder / f"data_batch_{i}.bin").write_bytes(cifar_bytes(images, [labels]))
    return images, labels


def test_cifar10_binary_records(tmp_path):
    images, labels = write_cifar10(tmp_path)
    test = load_dataset("cifar10", "test", root=tmp_path, transform="raw", flatten=False)
    assert test.x.shape == (6, 3, 32, 32) and test.image_shape == (3, 32, 32)
    np.testing.assert_array_equal(test.raw, images)
    # red plane first: pixel (0, 0) of channel 0 is the record's first pixel byte
    record = (tmp_path / "cifar-10-batches-bin" / "test_batch.bin").read_bytes()
    assert test.raw[0, 0, 0, 0] == record[1] and test.raw[0, 1, 0, 0] == record[1 + 1024]
    assert test.y.tolist() == labels.tolist() and test.num_classes == 10
    assert len(load_dataset("cifar10", "train", root=tmp_path)) == 30  # five batch files
    scaled = load_dataset("cifar10", "test", root=tmp_path)
    assert scaled.value_range == (-1.0, 1.0) and scaled.x.shape == (6, 3072)
    torch_close = np.allclose(scaled.x.numpy(), 2 * images.reshape(6, -1) / 255 - 1, atol=1e-6)
    assert torch_close


def test_cifar100_keeps_the_fine_label(tmp_path):
    folder = tmp_path / "cifar-100-binary"
    folder.mkdir()
    images = RNG.integers(0, 256, (5, 3, 32, 32))
    coarse, fine = np.array([0, 1, 2, 3, 19]), np.array([99, 5, 6, 7, 0])
    (folder / "test.bin").write_bytes(cifar_bytes(images, [coarse, fine]))
    data = load_dataset("cifar100", "test", root=tmp_path)
    assert data.y.tolist() == fine.tolist() and data.num_classes == 100


def test_cifar_truncated_record(tmp_path):
    write_cifar10(tmp_path)
    path = tmp_path / "cifar-10-batches-bin" / "test_batch.bin"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(DataFormatError, match=r"test_batch\.bin.*3073-byte records"):
        load_dataset("cifar10", "test", root=tmp_path)


def write_svhn(path, n=7, labels=None):
    x = RNG.integers(0, 256, (32, 32, 3, n)).astype(np.uint8)  # (H, W, C, N) as published
    y = (np.arange(n) % 10 + 1 if labels is None else labels).astype(np.uint8).reshape(n, 1)
    scipy.io.savemat(path, {"X": x, "y": y})
    return x, y


def test_svhn_mat_layout(tmp_path, monkeypatch):
    (tmp_path / "svhn").mkdir()
    x, _ = write_svhn(tmp_path / "svhn" / "test_32x32.mat")
    set_md5(monkeypatch, "svhn", {})
    data = load_dataset("svhn", "test", root=tmp_path, transform="raw", flatten=False)
    assert data.x.shape == (7, 3, 32, 32)
    np.testing.assert_array_equal(data.raw, x.transpose(3, 2, 0, 1))
    assert data.y.tolist() == [1, 2, 3, 4, 5, 6, 7]
    write_svhn(tmp_path / "svhn" / "test_32x32.mat", n=10)  # label 10 is the digit 0
    assert load_dataset("svhn", "test", root=tmp_path).y.tolist()[-1] == 0


def test_svhn_bad_files(tmp_path, monkeypatch):
    set_md5(monkeypatch, "svhn", {})
    (tmp_path / "test_32x32.mat").write_bytes(b"not a matlab file at all" * 10)
    with pytest.raises(DataFormatError, match=r"test_32x32\.mat"):
        load_dataset("svhn", "test", root=tmp_path)
    write_svhn(tmp_path / "test_32x32.mat", n=3, labels=np.array([1, 11, 2]))
    with pytest.raises(DataFormatError, match=r"1\.\.10"):
        load_dataset("svhn", "test", root=tmp_path)
    scipy.io.savemat(tmp_path / "test_32x32.mat", {"X": np.zeros((32, 32, 3, 2), np.uint8),
                                                   "y": np.ones((3, 1), np.uint8)})  # fmt: skip
    with pytest.raises(DataFormatError, match="2 X but 3 y"):
        load_dataset("svhn", "test", root=tmp_path)


def test_mnist10k_split(mnist_dir):
    train = load_dataset("mnist10k", "train", root=mnist_dir, transform="raw")
    test = load_dataset("mnist10k", "test", root=mnist_dir, transform="binary")
    assert train.x.shape == (8000, 784) and test.x.shape == (2000, 784)
    assert set(test.x.unique().tolist()) == {0.0, 1.0}
    assert train.x.max() == 255
    # a deterministic partition of the 10k images: together they are the whole split
    images, _ = catalog.read_split(catalog.SOURCES["mnist"], "test", mnist_dir)
    both = np.concatenate([train.raw, load_dataset("mnist10k", "test", root=mnist_dir).raw])
    assert sorted(map(bytes, both)) == sorted(map(bytes, images))


def test_env_variable_and_info(mnist_dir, monkeypatch):
    monkeypatch.setenv("EBMLAB_DATA", str(mnist_dir))
    assert "mnist10k" in available_datasets()
    assert len(load_dataset("mnist10k", "test")) == 2000


def test_missing_data_error_lists_places(tmp_path, monkeypatch):
    monkeypatch.delenv("EBMLAB_DATA", raising=False)
    with pytest.raises(DataNotFoundError, match=str(tmp_path)):
        load_dataset("mnist", "train", root=tmp_path)


def test_corrupt_file_fails_checksum(tmp_path, mnist_dir):
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        shutil.copy(mnist_dir / name, tmp_path / name)
    with open(tmp_path / "t10k-labels-idx1-ubyte.gz", "r+b") as fh:
        fh.seek(100)
        fh.write(b"\xff\xff")
    with pytest.raises(DataFormatError, match="md5"):
        load_dataset("mnist10k", root=tmp_path)


def serve(directory):
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(directory))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


@pytest.fixture
def local_server(mnist_dir):
    server, url = serve(mnist_dir)
    yield url
    server.shutdown()


def test_download_from_local_server(tmp_path, local_server):
    paths = catalog.download("mnist", tmp_path, splits=("test",), base_url=local_server)
    assert sorted(p.name for p in paths) == [
        "t10k-images-idx3-ubyte.gz",
        "t10k-labels-idx1-ubyte.gz",
    ]
    assert not list(tmp_path.rglob(".*part"))
    assert len(load_dataset("mnist10k", root=tmp_path)) == 8000


def test_download_rejects_bad_checksum(tmp_path, local_server, monkeypatch):
    bad = {**catalog.SOURCES["mnist"].md5, "t10k-images-idx3-ubyte.gz": "0" * 32}
    set_md5(monkeypatch, "mnist", bad)
    with pytest.raises(DataFormatError, match="md5"):
        catalog.download("mnist", tmp_path, splits=("test",), base_url=local_server)
    assert not (tmp_path / "mnist" / "t10k-images-idx3-ubyte.gz").exists()
    assert not list(tmp_path.rglob(".*part"))


def test_download_unpacks_a_verified_archive(tmp_path, monkeypatch):
    """The CIFAR-10 archive: fetched, checked against its md5, unpacked into its folder."""
    src = tmp_path / "publisher"
    images, _ = write_cifar10(src)
    archive = tmp_path / "serve" / "cifar-10-binary.tar.gz"
    archive.parent.mkdir()
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src / "cifar-10-batches-bin", arcname="cifar-10-batches-bin")
    md5 = hashlib.md5(archive.read_bytes()).hexdigest()
    set_md5(monkeypatch, "cifar10", {"cifar-10-binary.tar.gz": md5})
    server, url = serve(archive.parent)
    try:
        catalog.download("cifar10", tmp_path / "data", base_url=url)
    finally:
        server.shutdown()
    data = load_dataset("cifar10", "test", root=tmp_path / "data", transform="raw")
    np.testing.assert_array_equal(data.raw, images)
    with pytest.raises(ValueError, match="no public per-file download"):
        catalog.download("emnist-letters", tmp_path)


def test_download_from_an_unreachable_address_is_a_clear_error(tmp_path, capsys):
    from ebmlab.cli import main

    server, url = serve(tmp_path)
    server.shutdown()
    server.server_close()  # nothing listens there any more
    with pytest.raises(catalog.DownloadError, match="could not download"):
        catalog.download("svhn", tmp_path / "data", splits=("test",), base_url=url)
    assert not list((tmp_path / "data").rglob("*.mat*"))
    assert main(["data", "download", "svhn", str(tmp_path / "data"), "--mirror", url]) == 2
    assert "could not download" in capsys.readouterr().err


def test_a_recompressed_copy_is_recognised_by_its_content(tmp_path, monkeypatch):
    """A distribution or mirror recompresses the published .gz files (another header,
    another level): the file's md5 changes, its decompressed content's does not. Both
    sums are published; either one admits the file, and the error names the content's."""
    images, labels = RNG.integers(0, 256, (5, 28, 28)), np.arange(5)
    write_idx_set(tmp_path / "published", images, labels)
    content = {}
    for path in (tmp_path / "published").iterdir():
        raw = gzip.decompress(path.read_bytes())
        content[path.stem] = hashlib.md5(raw).hexdigest()
        # the same bytes recompressed at another level, without the original header
        (tmp_path / path.name).write_bytes(gzip.compress(raw, compresslevel=1, mtime=0))
    published = {p.name: hashlib.md5(p.read_bytes()).hexdigest()
                 for p in (tmp_path / "published").iterdir()}  # fmt: skip
    set_md5(monkeypatch, "fashion-mnist", published, content)
    data = load_dataset("fashion-mnist", "test", root=tmp_path, transform="raw")
    np.testing.assert_array_equal(data.y.numpy(), labels)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(b"\0\0\x08\x01" + bytes(4)))
    with pytest.raises(DataFormatError, match=content["t10k-labels-idx1-ubyte"]):
        load_dataset("fashion-mnist", "test", root=tmp_path)
    # decompressed by the user: the content's sum applies to the plain file too
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(idx_bytes(labels.astype(np.uint8)))
    assert len(load_dataset("fashion-mnist", "test", root=tmp_path)) == 5


def test_fashion_mnist_as_debian_ships_it():
    """The full Fashion-MNIST from Debian's dataset-fashion-mnist, whose recompressed .gz
    files differ from the published sums: accepted by their content's sums."""
    folder = ROOT.parent / "shared" / "datasets" / "fashion-mnist"
    if not (folder / "t10k-labels-idx1-ubyte.gz").is_file():
        pytest.skip(f"Fashion-MNIST not found at {folder}")
    test = load_dataset("fashion-mnist", "test", root=folder, transform="raw")
    assert len(test) == 10_000 and test.num_classes == 10
    assert np.bincount(test.y.numpy()).tolist() == [1000] * 10
    found = available_datasets(folder)  # MNIST's file names, Fashion-MNIST's labels
    assert found["fashion-mnist"] == str(folder) and "mnist" not in found


def test_the_system_data_folder_is_searched_after_ebmlab_data(tmp_path, monkeypatch):
    images, labels = RNG.integers(0, 256, (4, 28, 28)), np.arange(4)
    for split in ("train", "t10k"):
        write_idx_set(tmp_path / "system" / "kmnist", images, labels, split=split)
    monkeypatch.setattr(catalog, "SYSTEM_DATA_DIRS", (tmp_path / "system",))
    monkeypatch.setenv("EBMLAB_DATA", str(tmp_path / "mine"))
    assert len(load_dataset("kmnist", "test")) == 4
    assert available_datasets()["kmnist"] == str(tmp_path / "system" / "kmnist")
    dirs = catalog.search_dirs(catalog.SOURCES["kmnist"], None)
    assert dirs.index(tmp_path / "mine") < dirs.index(tmp_path / "system")
    assert catalog.search_dirs(catalog.SOURCES["kmnist"], tmp_path / "given") == [
        tmp_path / "given", tmp_path / "given" / "kmnist"]  # fmt: skip


def test_a_set_with_one_file_missing_names_the_missing_file(tmp_path):
    write_idx_set(tmp_path / "fashion-mnist", RNG.integers(0, 256, (3, 28, 28)), np.arange(3))
    (tmp_path / "fashion-mnist" / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataNotFoundError, match=r"holds .*\['t10k-images-idx3-ubyte'\] "
                       r"but not \['t10k-labels-idx1-ubyte'\]"):  # fmt: skip
        load_dataset("fashion-mnist", "test", root=tmp_path)
