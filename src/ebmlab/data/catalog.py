"""The published image data sets ebmlab reads from the files their publishers distribute.

Each :class:`Source` names its files per split, how to read them, their published md5
checksums (verified on every load where the publisher gives one) and where to download
them. A file is accepted when its md5 is the published one or, where the catalog knows
it, when the md5 of its decompressed content is the published content's: a copy that a
mirror or a distribution recompressed (Debian's ``dataset-fashion-mnist``) holds the
published data under another compressed sum. Files are looked for in the directory
given by argument (``--data-root``), else in ``$EBMLAB_DATA`` and then in the system's
data folders (``/usr/share/datasets/<set>``, where Debian's dataset packages install):
directly there or in the set's own sub-folder (``mnist/``, ``cifar-10-batches-bin/`` as
the CIFAR-10 archive unpacks, ...). Nothing is
downloaded unless asked for: :func:`download` (``ebmlab data download NAME DIR``)
fetches the files into a folder, writing each under a temporary name and renaming it
only once its checksum matches.
"""

from __future__ import annotations

import os
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.data.formats import (
    DataFormatError,
    md5sum,
    read_cifar,
    read_idx_pair,
    read_svhn,
    verify_md5,
)

Reader = Callable[[list[Path]], tuple[np.ndarray, np.ndarray]]


class DataNotFoundError(FileNotFoundError):
    """A data set's files are missing; the message lists where they were looked for.

    ``finding`` is that statement without the advice that follows it, so that a caller
    whose users name the folder another way (``evaluate --ood-root``) gives its own.
    """

    def __init__(self, finding: str, advice: str = "") -> None:
        super().__init__(f"{finding}. {advice}" if advice else finding)
        self.finding = finding


class DownloadError(OSError):
    """A download failed (no network, unknown address, server error); nothing was kept."""


@dataclass(frozen=True)
class Source:
    """A published data set: its files per split and how to read them."""

    name: str
    folder: str  # the sub-folder its files live in
    files: dict[str, tuple[str, ...]]  # split -> file names (IDX files may also end in .gz)
    read: Reader
    num_classes: int
    md5: dict[str, str] = field(default_factory=dict)  # published checksums, by file name
    # md5 of each file's decompressed content, by the uncompressed name
    content_md5: dict[str, str] = field(default_factory=dict)
    url: str | None = None  # base URL of the files (or of the archive)
    archive: str | None = None  # a .tar.gz that unpacks into ``folder``
    gzipped: bool = False  # files are published gzip-compressed (name + ".gz")


def _idx(transpose: bool = False, label_offset: int = 0) -> Reader:
    def read(paths: list[Path]) -> tuple[np.ndarray, np.ndarray]:
        images, labels = read_idx_pair(paths[0], paths[1], transpose=transpose)
        return images, labels - label_offset

    return read


def _cifar(label_bytes: int) -> Reader:
    return lambda paths: read_cifar(paths, label_bytes)


def _svhn(paths: list[Path]) -> tuple[np.ndarray, np.ndarray]:
    return read_svhn(paths[0])


_IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def _idx_source(name: str, url: str, md5: str = "", content_md5: str = "") -> Source:
    """An MNIST-like set: the four IDX files under MNIST's names, gzip-compressed, with
    their published md5 checksums and those of their decompressed content (train images,
    train labels, test images, test labels) when given."""
    stems = [stem for split in ("train", "test") for stem in _IDX_FILES[split]]
    md5s = dict(zip([s + ".gz" for s in stems], md5.split(), strict=True)) if md5 else {}
    content = dict(zip(stems, content_md5.split(), strict=True)) if content_md5 else {}
    return Source(name, name, _IDX_FILES, _idx(), 10, md5=md5s, content_md5=content, url=url,
                  gzipped=True)  # fmt: skip


def _emnist(variant: str, classes: int) -> Source:
    files = {
        split: (
            f"emnist-{variant}-{split}-images-idx3-ubyte",
            f"emnist-{variant}-{split}-labels-idx1-ubyte",
        )
        for split in ("train", "test")
    }
    # EMNIST stores images transposed; its letters are labelled 1..26
    reader = _idx(transpose=True, label_offset=1 if variant == "letters" else 0)
    return Source(f"emnist-{variant}", "emnist", files, reader, classes, gzipped=True)


SOURCES: dict[str, Source] = {
    s.name: s
    for s in [
        _idx_source(
            "mnist",
            "https://ossci-datasets.s3.amazonaws.com/mnist/",
            "f68b3c2dcbeaaa9fbdd348bbdeb94873 d53e105ee54ea40749a09fcbcd1e9432 "
            "9fb629c4189551a2d022fa330f9573f3 ec29112dd5afa0611ce80d1b7f02629c",
            "6bbc9ace898e44ae57da46a324031adb a25bea736e30d166cdddb491f175f624 "
            "2646ac647ad5339dbf082846283269ea 27ae3e4e09519cfbb04c329615203637",
        ),
        _idx_source(
            "fashion-mnist",
            "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
            "8d4fb7e6c68d591d4c3dfef9ec88bf0d 25c81989df183df01b3e8a0aad5dffbe "
            "bef4ecab320f06d8554ea6380940ec79 bb300cfdad3c16e7a12a480ee83cd310",
            "f4a8712d7a061bf5bd6d2ca38dc4d50a 9018921c3c673c538a1fc5bad174d6f9 "
            "8181f5470baa50b63fa0f6fddb340f0a 15d484375f8d13e6eb1aabb0c3f46965",
        ),
        _idx_source("kmnist", "http://codh.rois.ac.jp/kmnist/dataset/kmnist/"),
        _emnist("balanced", 47),
        _emnist("byclass", 62),
        _emnist("bymerge", 47),
        _emnist("digits", 10),
        _emnist("letters", 26),
        _emnist("mnist", 10),
        Source(
            "cifar10",
            "cifar-10-batches-bin",
            {
                "train": tuple(f"data_batch_{i}.bin" for i in range(1, 6)),
                "test": ("test_batch.bin",),
            },
            _cifar(1),
            10,
            md5={"cifar-10-binary.tar.gz": "c32a1d4ab5d03f1284b67883e8d87530"},
            url="https://www.cs.toronto.edu/~kriz/",
            archive="cifar-10-binary.tar.gz",
        ),
        Source(
            "cifar100",
            "cifar-100-binary",
            {"train": ("train.bin",), "test": ("test.bin",)},
            _cifar(2),
            100,
            md5={"cifar-100-binary.tar.gz": "03b5dce01913d631647c71ecec9e9cb8"},
            url="https://www.cs.toronto.edu/~kriz/",
            archive="cifar-100-binary.tar.gz",
        ),
        Source(
            "svhn",
            "svhn",
            {
                "train": ("train_32x32.mat",),
                "test": ("test_32x32.mat",),
                "extra": ("extra_32x32.mat",),
            },
            _svhn,
            10,
            md5={
                "train_32x32.mat": "e26dedcc434d2e4c54c9b2d4a06d8373",
                "test_32x32.mat": "eb5a983be6a315427106f1b164d9cef3",
                "extra_32x32.mat": "a93ce644f1a588dc4d68dda5feec44a7",
            },
            url="http://ufldl.stanford.edu/housenumbers/",
        ),
    ]
}


# where operating systems install data sets (Debian's dataset-* packages)
SYSTEM_DATA_DIRS = (Path("/usr/share/datasets"),)


def search_dirs(source: Source, root: str | os.PathLike | None) -> list[Path]:
    """The directories searched for ``source``'s files, in order: ``root`` given, else
    ``$EBMLAB_DATA`` and then the system's data folders, each directly and in the set's
    sub-folder.

    Args:
        root: directory of local data files (default: ``$EBMLAB_DATA``, then
            ``SYSTEM_DATA_DIRS``).
    """
    if root is not None:
        bases = [Path(root)]
    else:
        env = os.environ.get("EBMLAB_DATA")
        bases = [*([Path(env)] if env else []), *SYSTEM_DATA_DIRS]
    return [d for base in bases for d in (base, base / source.folder)]


def find_files(
    source: Source, split: str, root: str | os.PathLike | None = None
) -> list[Path] | None:
    """The paths of ``split``'s files (the first directory holding all of them), or None.

    Args:
        root: directory of local data files (default: ``$EBMLAB_DATA``).
    """
    names = source.files[split]
    for d in search_dirs(source, root):
        found = []
        for name in names:
            candidates = [d / (name + ".gz"), d / name] if source.gzipped else [d / name]
            found.append(next((p for p in candidates if p.is_file()), None))
        if None not in found:
            return found  # type: ignore[return-value]
    return None


def _partial_set(source: Source, split: str, dirs: list[Path]) -> str | None:
    """Where a folder holds some of ``split``'s files but not all: which it lacks."""
    for d in dirs:
        names = source.files[split]
        have = [n for n in names if (d / n).is_file() or (d / (n + ".gz")).is_file()]
        if have:
            missing = [n for n in names if n not in have]
            return f"{d} holds {source.name}'s {split} files {have} but not {missing}"
    return None


def verified(source: Source, path: Path) -> Path:
    """``path``, one of ``source``'s files, after its checksum check (the published
    file's md5 or its content's, where the catalog has them)."""
    content = source.content_md5.get(path.name.removesuffix(".gz"))
    return verify_md5(path, source.md5.get(path.name), content)


def read_split(
    source: Source, split: str, root: str | os.PathLike | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Images (N, C, H, W) uint8 and labels (N,) of ``split``, checksums verified.

    Args:
        root: directory of local data files (default: ``$EBMLAB_DATA``).
    """
    _checks.one_of("split", split, list(source.files))
    paths = find_files(source, split, root)
    if paths is None:
        dirs = search_dirs(source, root)
        where = ", ".join(str(d) for d in dirs)
        partial = _partial_set(source, split, dirs)
        raise DataNotFoundError(
            (partial or f"{source.name} {split} files {list(source.files[split])} not found")
            + f"; looked in: {where}",
            "Pass --data-root DIR (root=DIR), set EBMLAB_DATA"
            + (f", or run: ebmlab data download {source.name} DIR" if source.url else ""),
        )
    images, labels = source.read([verified(source, p) for p in paths])
    if len(labels) and (labels.min() < 0 or labels.max() >= source.num_classes):
        raise DataFormatError(
            f"{paths[-1]}: labels must lie in 0..{source.num_classes - 1}, "
            f"found {labels.min()}..{labels.max()}"
        )
    return images, labels


def _fetch(url: str, target: Path, md5: str | None, timeout: float) -> Path:
    """``url`` saved as ``target`` through a temporary file renamed once verified."""
    if target.is_file() and (md5 is None or md5sum(target) == md5):
        return target
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                with urllib.request.urlopen(url, timeout=timeout) as response:
                    for block in iter(lambda: response.read(1 << 20), b""):
                        out.write(block)
            except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
                raise DownloadError(f"could not download {url}: {err}") from err
            out.flush()
            os.fsync(out.fileno())
        if md5 is not None and (got := md5sum(tmp)) != md5:
            raise DataFormatError(f"downloaded {target.name} has md5 {got}, expected {md5}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def download(
    name: str,
    root: str | os.PathLike,
    splits: tuple[str, ...] | None = None,
    base_url: str | None = None,
    timeout: float = 60.0,
) -> list[Path]:
    """Download data set ``name`` into ``root`` (all splits, or ``splits``), verifying
    published checksums; archives are unpacked into the set's folder. Files already
    present and verified are kept. ``base_url`` replaces the publisher's address (a
    mirror).

    Args:
        timeout: seconds to wait for the server before giving up.
    """
    source = SOURCES[_checks.one_of("name", name, list(SOURCES))]
    url = base_url or source.url
    if url is None:
        raise ArgumentError(
            f"{name} has no public per-file download; fetch it from its publisher and "
            f"unpack its files into {Path(root) / source.folder}"
        )
    url = url.rstrip("/") + "/"
    for split in splits or ():
        _checks.one_of("splits", split, list(source.files))
    root = Path(root)
    if source.archive is not None:
        root.mkdir(parents=True, exist_ok=True)
        archive = _fetch(
            url + source.archive, root / source.archive, source.md5.get(source.archive), timeout
        )
        with tarfile.open(archive) as tar:
            tar.extractall(root, filter="data")
        return [p for s in source.files for p in find_files(source, s, root) or []]
    folder = root / source.folder
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for split in splits or tuple(source.files):
        for stem in source.files[split]:
            name_on_disk = stem + ".gz" if source.gzipped else stem
            written.append(
                _fetch(
                    url + name_on_disk, folder / name_on_disk, source.md5.get(name_on_disk), timeout
                )
            )
    return written
