"""Image folders: one sub-folder per class, images decoded with Pillow.

Classes are the sub-folders' names in sorted order, labelled 0..K-1. Every image is
read as grayscale when all of them are grayscale and as RGB otherwise; images of mixed
sizes need ``resize`` (height, width), which resamples each one bilinearly.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ebmlab.data.formats import DataFormatError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")


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


def read_image_folder(
    root: str | Path, resize: tuple[int, int] | None = None
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Images (N, C, H, W) uint8, labels (N,) int64 and the class names of ``root``."""
    from PIL import Image, UnidentifiedImageError

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
    images = []
    for _, f in files:
        try:
            with Image.open(f) as im:
                im.load()
                images.append(im.copy())
        except (UnidentifiedImageError, OSError) as err:
            raise DataFormatError(f"{f} cannot be decoded as an image: {err}") from err
    gray = all(im.mode in ("1", "L", "I;16", "I", "F") for im in images)
    mode = "L" if gray else "RGB"
    first = images[0].size
    arrays = []
    for (_, f), im in zip(files, images, strict=True):
        if resize is not None:
            im = im.convert(mode).resize((resize[1], resize[0]), Image.Resampling.BILINEAR)
        elif im.size != first:
            raise DataFormatError(
                f"{f} is {im.size[0]}x{im.size[1]} but {files[0][1]} is {first[0]}x{first[1]}; "
                "images of mixed sizes need resize (--resize H W)"
            )
        pixels = np.asarray(im.convert(mode), dtype=np.uint8)
        arrays.append(pixels[None] if gray else pixels.transpose(2, 0, 1))
    labels = np.array([label for label, _ in files], dtype=np.int64)
    return np.stack(arrays), labels, [c.name for c in classes]
