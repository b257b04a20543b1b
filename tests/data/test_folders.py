"""Image folders decoded once into a memory-mapped cache entry: in file order across the
decoding threads, refreshed when an image changes, and bad images refused with their
file's name, leaving nothing half-written in the cache."""

import os
import shutil

import numpy as np
import pytest
from PIL import Image

from ebmlab.data import DataFormatError, EncodedRows, load_dataset
from ebmlab.data import folders as folders_module
from ebmlab.data.folders import read_image_folder


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EBMLAB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "image-folders"


def entries(cache):
    """The cache's entries (folders; each has a lock file beside it)."""
    return sorted(d for d in cache.iterdir() if d.is_dir())


def write_folder(root, n=150, classes=("a", "b", "c"), size=(5, 3)):
    """``n`` RGB images, image i of class i % 3 filled with (i, 255 - i, i % 7)."""
    for name in classes:
        (root / name).mkdir(parents=True, exist_ok=True)
    for i in range(n):
        pixels = np.empty((*size, 3), np.uint8)
        pixels[...] = (i, 255 - i, i % 7)
        Image.fromarray(pixels).save(root / classes[i % 3] / f"{i:04d}.png")
    return root


def test_a_folder_is_decoded_once_in_file_order_and_mapped(tmp_path, cache):
    root = write_folder(tmp_path / "images")
    x, y, classes = read_image_folder(root)
    assert classes == ["a", "b", "c"] and x.shape == (150, 3, 5, 3) and x.dtype == np.uint8
    assert isinstance(x, np.memmap)
    # files in class order, then name order; several threads' chunks of 64 kept in order
    order = [i for k in range(3) for i in range(k, 150, 3)]
    assert x[:, 0, 0, 0].tolist() == order and x[:, 1, 4, 2].tolist() == [255 - i for i in order]
    assert y.tolist() == [i % 3 for i in order]
    (entry,) = entries(cache)
    # the splits of a run read the same entry; nothing is decoded again
    parts = [load_dataset(str(root), s, in_memory=False) for s in ("train", "val", "test")]
    assert [len(p) for p in parts] == [120, 15, 15]
    assert entries(cache) == [entry]
    assert isinstance(parts[0].x, EncodedRows)
    assert parts[0].x.array.filename == entry / "x.npy"
    assert parts[0].classes == ("a", "b", "c") and parts[0].image_shape == (3, 5, 3)


def test_a_changed_image_or_resize_makes_a_new_entry(tmp_path, cache):
    root = write_folder(tmp_path / "images", n=6)
    before = read_image_folder(root)[0]
    Image.fromarray(np.full((5, 3, 3), 200, np.uint8)).save(root / "a" / "0000.png")
    after = read_image_folder(root)[0]
    assert len(entries(cache)) == 2
    assert before[0].max() == 255 and (after[0] == 200).all()
    assert np.array_equal(before[1:], after[1:])
    resized = load_dataset(str(root), "train", resize=(4, 4), flatten=False, transform="raw")
    assert resized.x.shape[1:] == (3, 4, 4) and len(entries(cache)) == 3


def test_a_finished_entry_is_kept_a_damaged_one_replaced_and_a_stale_one_removed(tmp_path, cache):
    root = write_folder(tmp_path / "images", n=6)
    x, _, _ = read_image_folder(root)
    (entry,) = entries(cache)
    files = [(i % 3, root / "abc"[i % 3] / f"{i:04d}.png") for i in (0, 3, 1, 4, 2, 5)]
    folders_module._decode_into(entry, root, files, ["a", "b", "c"], None)
    assert entries(cache) == [entry]
    assert np.array_equal(read_image_folder(root)[0], x)
    (entry / "meta.json").unlink()  # a damaged entry is decoded again
    stale = entry.with_name(f"{entry.name}.partial-999999999")  # of a process that died
    stale.mkdir()
    assert np.array_equal(read_image_folder(root)[0], x) and entries(cache) == [entry]


@pytest.mark.parametrize(
    "spoil, match",
    [
        (lambda f: f.write_bytes(f.read_bytes()[:60]), "cannot be decoded as an image"),
        (lambda f: f.write_bytes(b"not a picture at all"), "cannot be read as an image"),
    ],
    ids=["truncated", "not-an-image"],
)
def test_a_bad_image_is_named_and_leaves_no_entry(tmp_path, cache, spoil, match):
    root = write_folder(tmp_path / "images", n=100, size=(40, 40))
    bad = root / "b" / "0040.png"
    spoil(bad)
    with pytest.raises(DataFormatError, match=match) as err:
        load_dataset(str(root), "train")
    assert str(bad) in str(err.value)
    assert not entries(cache)  # no entry, not even a partial one


def test_mixed_sizes_are_refused_before_any_image_is_decoded(tmp_path, cache, monkeypatch):
    root = write_folder(tmp_path / "images", n=9)
    Image.fromarray(np.zeros((7, 7, 3), np.uint8)).save(root / "c" / "big.png")
    monkeypatch.setattr(Image.Image, "convert", lambda *a: pytest.fail("decoded an image"))
    with pytest.raises(DataFormatError, match=r"big\.png is 7x7 but .*0000\.png is 3x5"):
        read_image_folder(root)
    assert not entries(cache)


def test_an_unwritable_cache_is_a_clear_error(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("EBMLAB_CACHE", str(blocker))
    root = write_folder(tmp_path / "images", n=3)
    with pytest.raises(DataFormatError, match="set EBMLAB_CACHE to a writable folder"):
        read_image_folder(root)


def test_the_cache_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("EBMLAB_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert folders_module.cache_root() == tmp_path / "xdg" / "ebmlab"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert folders_module.cache_root() == tmp_path / "home" / ".cache" / "ebmlab"


def test_resize_is_for_folders_and_every_image_recipe_takes_it(tmp_path, cache):
    with pytest.raises(ValueError, match=r"resize applies to image folders, not to .*'digits'"):
        load_dataset("digits", "train", resize=(4, 4))
    with pytest.raises(ValueError, match=r"resize must be \(height, width\), got \(4,\)"):
        load_dataset("digits", "train", resize=(4,))
    root = write_folder(tmp_path / "images", n=30)
    Image.fromarray(np.zeros((7, 7, 3), np.uint8)).save(root / "c" / "big.png")
    from ebmlab.training.recipes import get_recipe

    for name in ("jem", "rbm", "structured"):
        recipe = get_recipe(name)
        with pytest.raises(ValueError, match="resize must be"):
            recipe.configs({"data": str(root), "resize": [4, 4, 4]})
        with pytest.raises(DataFormatError, match="mixed sizes need resize"):
            recipe.build(*recipe.configs({"data": str(root)}))
        setup = recipe.build(*recipe.configs({"data": str(root), "resize": [4, 4]}))
        assert setup.task.train.x.shape[1:] == (48,), name


def test_a_process_waits_for_the_one_decoding_the_folder_and_maps_its_entry(tmp_path, cache):
    """While this test holds an entry's lock, as a decoding process would, another process
    loading the folder waits and says so; it then maps the entry written meanwhile and
    decodes nothing (one image is garbled by then, keeping its size and time)."""
    import fcntl
    import subprocess
    import sys

    root = write_folder(tmp_path / "images", n=6)
    total = int(read_image_folder(root)[0].sum())
    (entry,) = entries(cache)
    shutil.move(entry, tmp_path / "done")
    script = "from ebmlab.data.folders import read_image_folder as r; import sys; "
    script += "print(int(r(sys.argv[1])[0].sum()))"
    with open(entry.with_name(f"{entry.name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        loader = subprocess.Popen([sys.executable, "-c", script, str(root)], text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        assert "waiting for another process decoding" in loader.stderr.readline()
        shutil.move(tmp_path / "done", entry)
        image = root / "a" / "0000.png"
        stat = image.stat()
        image.write_bytes(b"x" * stat.st_size)
        os.utime(image, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        fcntl.flock(lock, fcntl.LOCK_UN)
    out, err = loader.communicate(timeout=120)
    assert loader.returncode == 0, err
    assert int(out) == total


def test_a_cache_without_room_for_the_folder_is_refused_before_decoding(
    tmp_path, cache, monkeypatch
):
    root = write_folder(tmp_path / "images", n=6)  # 6 x 3 x 5 x 3 = 270 bytes
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=269))
    monkeypatch.setattr(Image.Image, "convert", lambda *a: pytest.fail("decoded an image"))
    with pytest.raises(DataFormatError, match=r"0\.00 GiB free; set EBMLAB_CACHE to a folder"):
        read_image_folder(root)
    assert not entries(cache)


def test_the_cache_is_listed_and_cleared_from_the_command_line(tmp_path, cache, capsys):
    from ebmlab.cli import main

    root = write_folder(tmp_path / "images", n=6)
    load_dataset(str(root), "train", resize=(4, 4))
    load_dataset(str(root), "train")
    assert main(["data", "cache"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(str(root) in line for line in lines)
    assert sum("(6, 3, 4, 4)" in line and "resized to 4x4" in line for line in lines) == 1
    assert main(["data", "cache", "--clear"]) == 0
    assert capsys.readouterr().out.startswith("freed 0.0 MiB in ")
    assert not list(cache.iterdir())
    assert main(["data", "cache"]) == 0 and capsys.readouterr().out == ""


def test_a_split_folder_takes_the_training_splits_labels_by_class_name(tmp_path, cache):
    """A test folder without one of the training classes keeps the training labels (fox
    stays 2, not 1); a class the training split lacks is refused by name."""
    for split, classes in (("train", ("cat", "dog", "fox")), ("test", ("cat", "fox"))):
        for k, name in enumerate(classes):
            (tmp_path / "data" / split / name).mkdir(parents=True)
            pixels = np.full((5, 3, 3), 10 * k, np.uint8)
            Image.fromarray(pixels).save(tmp_path / "data" / split / name / "0.png")
    test = load_dataset(str(tmp_path / "data"), "test")
    assert test.classes == ("cat", "dog", "fox") and test.num_classes == 3
    assert test.y.tolist() == [0, 2]
    (tmp_path / "data" / "test" / "eel").mkdir()
    Image.fromarray(np.zeros((5, 3, 3), np.uint8)).save(
        tmp_path / "data" / "test" / "eel" / "0.png"
    )
    with pytest.raises(DataFormatError, match=r"class folders \['eel'\] are not among"):
        load_dataset(str(tmp_path / "data"), "test")


def test_grey_images_with_alpha_stay_one_channel(tmp_path, cache):
    for name, mode, shape in (("plain", "L", (4, 4)), ("alpha", "LA", (4, 4, 2))):
        (tmp_path / "grey" / name).mkdir(parents=True)
        Image.fromarray(np.full(shape, 70, np.uint8), mode).save(tmp_path / "grey" / name / "0.png")
    x, y, _ = read_image_folder(tmp_path / "grey")
    assert x.shape == (2, 1, 4, 4) and (np.asarray(x) == 70).all() and y.tolist() == [0, 1]
