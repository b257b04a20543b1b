import functools
import gzip
import http.server
import shutil
import struct
import threading

import numpy as np
import pytest

from ebmlab.data import DataNotFoundError, available_datasets, load_dataset, mnist


def test_read_idx_raw_and_gzip(tmp_path):
    arr = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    header = bytes([0, 0, 0x08, 3]) + struct.pack(">3I", 2, 3, 4)
    (tmp_path / "a").write_bytes(header + arr.tobytes())
    with gzip.open(tmp_path / "a.gz", "wb") as fh:
        fh.write(header + arr.tobytes())
    np.testing.assert_array_equal(mnist.read_idx(tmp_path / "a"), arr)
    np.testing.assert_array_equal(mnist.read_idx(tmp_path / "a.gz"), arr)
    (tmp_path / "bad").write_bytes(header + arr.tobytes()[:-1])
    with pytest.raises(ValueError, match="truncated"):
        mnist.read_idx(tmp_path / "bad")


def test_mnist10k_split(mnist_dir):
    train = load_dataset("mnist10k", "train", root=mnist_dir, transform="raw")
    test = load_dataset("mnist10k", "test", root=mnist_dir, transform="binary")
    assert train.x.shape == (8000, 784) and test.x.shape == (2000, 784)
    assert set(test.x.unique().tolist()) == {0.0, 1.0}
    assert train.x.max() == 255
    # a deterministic partition of the 10k images: together they are the whole split
    images, _ = mnist.load_mnist_arrays("test", mnist_dir)
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
    with pytest.raises(ValueError, match="md5"):
        load_dataset("mnist10k", root=tmp_path)


@pytest.fixture
def local_server(mnist_dir):
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(mnist_dir))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


def test_download_from_local_server(tmp_path, local_server):
    paths = mnist.download(tmp_path, splits=("test",), base_url=local_server)
    assert sorted(p.name for p in paths) == [
        "t10k-images-idx3-ubyte.gz",
        "t10k-labels-idx1-ubyte.gz",
    ]
    assert not list(tmp_path.glob(".*part"))
    assert len(load_dataset("mnist10k", root=tmp_path)) == 8000


def test_download_rejects_bad_checksum(tmp_path, local_server, monkeypatch):
    monkeypatch.setitem(mnist.MD5, "t10k-images-idx3-ubyte.gz", "0" * 32)
    with pytest.raises(ValueError, match="md5"):
        mnist.download(tmp_path, splits=("test",), base_url=local_server)
    assert not (tmp_path / "t10k-images-idx3-ubyte.gz").exists()
    assert not list(tmp_path.glob(".*part"))
