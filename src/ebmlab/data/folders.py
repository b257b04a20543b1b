"""Image folders: one sub-folder per class, images decoded with Pillow once, then mapped.

Classes are the sub-folders' names in sorted order, labelled 0..K-1. Every image is
read as grayscale when all of them are grayscale and as RGB otherwise; images of mixed
sizes need ``resize`` (height, width), which resamples each one bilinearly.

A folder is decoded once into a cache entry under ``$EBMLAB_CACHE`` (default
``~/.cache/ebmlab``): ``x.npy`` (N, C, H, W) uint8, ``y.npy`` and ``meta.json`` (source,
resize, classes), named by a hash of every image's path, size and modification time
and of ``resize``. Later loads memory-map the entry, so a folder larger than memory
trains like an ``.npy`` file, and a run's train, val and test splits of one folder
decode it once. Processes that load one folder together (the ranks of a distributed
run) take turns on a lock, so one decodes it and the others map its entry. Every
header is read before any image is decoded (so mixed sizes are refused at once); images
are then decoded straight into the mapped file, so memory holds one image per thread
(several threads for images of 256 x 256 pixels or more, whose decoding releases the
GIL long enough to pay). Changing, adding or removing an image makes a new entry;
:func:`cached_folders` lists the entries and :func:`clear_cache` deletes them
(``ebmlab data cache [--clear]``), which only costs decoding again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from ebmlab.data.formats import DataFormatError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")
GRAY_MODES = ("1", "L", "LA", "La", "I", "I;16", "I;16L", "I;16B", "I;16N", "F")  # alpha dropped
CACHE_FORMAT = 1  # bump when an entry's layout or decoding changes
CHUNK = 64  # images a thread decodes per task
THREADED_PIXELS = 256 * 256  # image size from which decoding on several threads pays
PROGRESS_FROM = 2000  # images from which decoding shows a progress bar
META = "meta.json"  # an entry's source, resize and classes; its presence marks it complete


def class_folders(root: Path) -> list[Path]:
    """The class sub-folders of ``root``, sorted by name."""
    if not root.is_dir():
        raise DataFormatError(f"{root} is not a folder")
    classes = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise DataFormatError(
            f"{root} holds no class sub-folders (expected {root}/<class>/<image>)"
        )
    return classes


def cache_root() -> Path:
    """Where decoded folders are kept: ``$EBMLAB_CACHE``, else ``$XDG_CACHE_HOME/ebmlab``,
    else ``~/.cache/ebmlab``."""
    if os.environ.get("EBMLAB_CACHE"):
        return Path(os.environ["EBMLAB_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "ebmlab"


def _entries() -> list[Path]:
    folder = cache_root() / "image-folders"
    return sorted(d for d in folder.glob("*") if (d / META).is_file())


def _bytes(entry: Path) -> int:
    return sum(f.stat().st_size for f in entry.iterdir())


def cached_folders() -> list[dict[str, object]]:
    """The complete cache entries: each one's ``entry`` folder, ``source`` folder,
    ``resize``, ``shape`` of its images and ``bytes`` on disk."""
    listed = []
    for entry in _entries():
        meta = json.loads((entry / META).read_text())
        shape = np.load(entry / "x.npy", mmap_mode="r").shape
        listed.append({"entry": str(entry), "source": meta["source"], "resize": meta["resize"],
                       "shape": list(shape), "bytes": _bytes(entry)})  # fmt: skip
    return listed


def clear_cache() -> int:
    """Delete every complete cache entry (and its lock file); returns the bytes freed.
    Entries being written by a running process are left to it."""
    freed = 0
    for entry in _entries():
        freed += _bytes(entry)
        shutil.rmtree(entry)
        entry.with_name(f"{entry.name}.lock").unlink(missing_ok=True)
    return freed


def read_image_folder(
    root: str | os.PathLike, resize: tuple[int, int] | None = None
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Images (N, C, H, W) uint8 (memory-mapped from the cache), labels (N,) int64 and
    the class names of ``root``, decoding the folder first where it is not cached."""
    root = Path(root)
    classes = class_folders(root)
    files = [
        (label, f)
        for label, folder in enumerate(classes)
        for f in sorted(folder.iterdir())
        if f.suffix.lower() in IMAGE_SUFFIXES
    ]
    if not files:
        raise DataFormatError(
            f"{root} holds no images (looked for {', '.join(IMAGE_SUFFIXES)} in its sub-folders)"
        )
    entry = cache_root() / "image-folders" / f"{root.name}-{_fingerprint(root, files, resize)}"
    if not (entry / META).is_file():
        try:
            entry.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise DataFormatError(
                f"cannot create the image cache {entry.parent} ({err}); set EBMLAB_CACHE to "
                "a writable folder"
            ) from err
        with _exclusive(entry.with_name(f"{entry.name}.lock"), f"decoding {root}") as alone:
            if not (entry / META).is_file():  # or another process has done it
                if alone:  # a partial entry now is one a process left as it died
                    for stale in entry.parent.glob(f"{entry.name}.partial-*"):
                        shutil.rmtree(stale, ignore_errors=True)
                _decode_into(entry, root, files, [c.name for c in classes], resize)
    x = np.load(entry / "x.npy", mmap_mode="r")
    return x, np.load(entry / "y.npy"), json.loads((entry / META).read_text())["classes"]


@contextlib.contextmanager
def _exclusive(lock: Path, what: str) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on the file ``lock``, so that of the processes loading
    one folder at once (the ranks of a distributed run) one decodes it and the others
    wait for its entry; the lock dies with its process. Yields whether the lock is held:
    without ``fcntl`` (not POSIX) processes may decode the same folder side by side, to
    the same entry."""
    try:
        import fcntl
    except ImportError:
        yield False
        return
    with open(lock, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"ebmlab: waiting for another process {what}", file=sys.stderr, flush=True)
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield True
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _fingerprint(root: Path, files: list[tuple[int, Path]], resize: tuple[int, int] | None) -> str:
    """A hash of what the decoded folder depends on: each image's path below ``root``,
    class, size and modification time, and ``resize``."""
    digest = hashlib.sha256(f"{CACHE_FORMAT} {resize}".encode())
    for label, f in files:
        stat = f.stat()
        digest.update(f"\n{label} {f.relative_to(root)} {stat.st_size} {stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:20]


def _in_threads(
    work: Callable[[Sequence[int]], object], n: int, desc: str, threads: int
) -> list[object]:
    """``work`` over chunks of ``range(n)`` on ``threads`` threads, in order, with a
    progress bar for large folders."""
    chunks = [range(i, min(i + CHUNK, n)) for i in range(0, n, CHUNK)]
    bar = tqdm(total=n, desc=desc, unit="image", leave=False, disable=n < PROGRESS_FROM)
    results = []
    pool = ThreadPoolExecutor(threads) if threads > 1 else None
    try:
        done = pool.map(work, chunks) if pool is not None else map(work, chunks)
        for chunk, result in zip(chunks, done, strict=True):
            results.append(result)
            bar.update(len(chunk))
    finally:  # on a bad image, the chunks not yet started are dropped
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        bar.close()
    return results


def _decode_into(
    entry: Path,
    root: Path,
    files: list[tuple[int, Path]],
    classes: list[str],
    resize: tuple[int, int] | None,
) -> None:
    """Decode every image of ``files`` into a new cache entry at ``entry``; a failure
    leaves no entry behind."""
    from PIL import Image, UnidentifiedImageError

    def headers(chunk: Sequence[int]) -> list[tuple[str, tuple[int, int]]]:
        found = []
        for i in chunk:
            try:
                with Image.open(files[i][1]) as im:
                    found.append((im.mode, im.size))
            except (UnidentifiedImageError, OSError) as err:
                raise DataFormatError(f"{files[i][1]} cannot be read as an image: {err}") from err
        return found

    found = _in_threads(headers, len(files), "reading headers", 1)
    modes_sizes = [h for part in found for h in part]
    gray = all(mode in GRAY_MODES for mode, _ in modes_sizes)
    mode = "L" if gray else "RGB"
    first = modes_sizes[0][1]
    width, height = first
    if resize is None:
        for (_, f), (_, size) in zip(files, modes_sizes, strict=True):
            if size != (width, height):
                raise DataFormatError(
                    f"{f} is {size[0]}x{size[1]} but {files[0][1]} is {width}x{height}; "
                    "images of mixed sizes need resize (--resize H W)"
                )
    else:
        height, width = resize
    shape = (len(files), 1 if gray else 3, height, width)
    needed, free = math.prod(shape), shutil.disk_usage(entry.parent).free
    if needed > free:  # a mapped file that outgrows its disk would crash at a page write
        raise DataFormatError(
            f"decoding {root} takes {needed / 2**30:.2f} GiB in {entry.parent}, which has "
            f"{free / 2**30:.2f} GiB free; set EBMLAB_CACHE to a folder on a larger disk"
        )
    partial = entry.with_name(f"{entry.name}.partial-{os.getpid()}")
    partial.mkdir(exist_ok=True)
    try:
        x = np.lib.format.open_memmap(partial / "x.npy", "w+", np.uint8, shape)

        def decode(chunk: Sequence[int]) -> None:
            for i in chunk:
                try:
                    with Image.open(files[i][1]) as im:
                        im = im.convert(mode)
                        if resize is not None:
                            im = im.resize((width, height), Image.Resampling.BILINEAR)
                        pixels = np.asarray(im, dtype=np.uint8)
                except (UnidentifiedImageError, OSError) as err:
                    raise DataFormatError(
                        f"{files[i][1]} cannot be decoded as an image: {err}"
                    ) from err
                x[i] = pixels[None] if gray else pixels.transpose(2, 0, 1)

        # small images decode faster than threads trade the GIL
        big = math.prod(first) >= THREADED_PIXELS
        threads = min(32, os.cpu_count() or 1) if big else 1
        _in_threads(decode, len(files), f"decoding {root.name}", threads)
        x.flush()
        np.save(partial / "y.npy", np.array([label for label, _ in files], dtype=np.int64))
        meta = {"source": str(root.resolve()), "resize": resize, "classes": classes}
        (partial / META).write_text(json.dumps(meta))  # written last: the entry is complete
        if entry.is_dir() and not (entry / META).is_file():  # damaged: not ours to keep
            shutil.rmtree(entry)
        try:
            partial.rename(entry)
        except OSError:  # another process finished the same entry first
            if not (entry / META).is_file():
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
