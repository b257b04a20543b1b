"""Image folders: ebmlab's reading of a class-per-folder tree (decoded once into a mapped
cache entry) against the loop users write with Pillow (open, convert, resize, stack),
which decodes every image on every load.

Two folders, written by the benchmark: 10,000 CIFAR-sized PNGs (32 x 32 RGB, ten
classes), and 500 JPEG photos' worth of pixels (512 x 512 RGB) resized to 64 x 64 on
reading, as IGEBM-style runs do. Rows: the first load (decoding into the cache) and later
loads (a run's val and test splits, ``evaluate``, a resumed run).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from benchmarks.harness import Case
from ebmlab.data.folders import read_image_folder

SMALL, LARGE = (10_000, 32, "png", None), (500, 512, "jpg", (64, 64))


def pillow_loop(root: Path, resize: tuple[int, int] | None) -> np.ndarray:
    """The loop users write: every image opened, converted, resized, then stacked."""
    from PIL import Image

    files = sorted(f for d in sorted(root.iterdir()) for f in d.iterdir())
    images = []
    for f in files:
        with Image.open(f) as im:
            im = im.convert("RGB")
            if resize is not None:
                im = im.resize((resize[1], resize[0]), Image.Resampling.BILINEAR)
            images.append(np.asarray(im).transpose(2, 0, 1))
    return np.stack(images)


def write_folder(root: Path, n: int, side: int, suffix: str) -> Path:
    """``n`` random-textured RGB images of ``side`` x ``side``, ten class folders."""
    from PIL import Image

    rng = np.random.default_rng(0)
    texture = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
    for k in range(10):
        (root / f"class{k}").mkdir(parents=True)
    for i in range(n):
        pixels = np.roll(texture, (i, 3 * i), axis=(0, 1))
        Image.fromarray(pixels).save(root / f"class{i % 10}" / f"{i:05d}.{suffix}")
    return root


@contextlib.contextmanager
def cache_in(folder: Path) -> Iterator[None]:
    before = os.environ.get("EBMLAB_CACHE")
    os.environ["EBMLAB_CACHE"] = str(folder)
    try:
        yield
    finally:
        if before is None:
            del os.environ["EBMLAB_CACHE"]
        else:
            os.environ["EBMLAB_CACHE"] = before


def _cold(root: Path, cache: Path, resize: tuple[int, int] | None) -> None:
    shutil.rmtree(cache, ignore_errors=True)
    with cache_in(cache):
        read_image_folder(root, resize)


def _warm(root: Path, cache: Path, resize: tuple[int, int] | None) -> None:
    with cache_in(cache):
        np.asarray(read_image_folder(root, resize)[0])  # every pixel read from the map


def cases() -> list:
    work = Path(tempfile.mkdtemp(prefix="ebmlab-bench-folders-"))
    atexit.register(shutil.rmtree, work, ignore_errors=True)  # the cases run after return
    cache = work / "cache"
    rows: list = []
    for n, side, suffix, resize in (SMALL, LARGE):
        root = write_folder(work / f"{side}{suffix}", n, side, suffix)
        with cache_in(cache):  # both ways give the same pixels, in the same order
            assert np.array_equal(read_image_folder(root, resize)[0], pillow_loop(root, resize))
        size = f"{n:,} {suffix.upper()}s of {side}x{side}" + (
            f" resized to {resize[0]}x{resize[1]}" if resize else ""
        )
        rows += [
            Case(f"image folder, first load, {size}", lambda r=root, z=resize: _cold(r, cache, z),
                 lambda r=root, z=resize: pillow_loop(r, z), "Pillow loop", repeats=3),
            Case(f"image folder, later loads, {size}", lambda r=root, z=resize: _warm(r, cache, z),
                 lambda r=root, z=resize: pillow_loop(r, z), "Pillow loop", repeats=3),
        ]  # fmt: skip
    return rows
