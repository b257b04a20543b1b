"""Drawing primitives shared by training (curves, sample grids) and evaluation.

Everything renders off-screen into PNG files through matplotlib's object interface
(:class:`matplotlib.figure.Figure`), never pyplot: no backend is chosen and no global
figure registry is touched, so importing or plotting changes nothing in the user's
matplotlib session, and matplotlib is imported only when a first picture is drawn.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def subplots(nrows: int = 1, ncols: int = 1, **options: Any) -> tuple[Any, Any]:
    """A new off-screen figure and its axes, as ``pyplot.subplots`` returns them.

    Args:
        nrows: rows of axes.
        ncols: columns of axes.
        options: ``figsize``, ``dpi`` for the figure; the rest (``squeeze``,
            ``sharex``, ...) for its axes.
    """
    from matplotlib.figure import Figure

    figure_keys = ("figsize", "dpi")
    fig = Figure(**{k: v for k, v in options.items() if k in figure_keys})
    axes = fig.subplots(nrows, ncols, **{k: v for k, v in options.items() if k not in figure_keys})
    return fig, axes


def save_figure(fig: Figure, path: str | os.PathLike, *, crop: bool = True) -> None:
    """Save a matplotlib figure as a PNG at ``path``.

    Args:
        fig: the matplotlib figure.
        crop: trim the figure's margins to its contents, which draws it twice; a
            figure already laid out by ``tight_layout`` has no margins to trim.
    """
    fig.savefig(path, dpi=100, bbox_inches="tight" if crop else None)


def plot_curves(records: Iterable[Mapping], path: str | os.PathLike) -> None:
    """One panel per metric, training and validation values against the step.

    Args:
        records: metric records, each with ``step``, ``split`` and metric values (as in
            metrics.jsonl).
        path: the PNG written.
    """
    series: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for rec in records:
        split = rec.get("split", "train")
        for key, value in rec.items():
            if key in ("split", "step", "epoch") or not isinstance(value, int | float):
                continue
            if math.isfinite(value):
                series[key][split].append((rec["step"], value))
    if not series:
        return
    n = len(series)
    cols = min(3, n)
    rows = math.ceil(n / cols)
    # fixed margins, set out for the titles, tick labels and axis labels, instead of a
    # tight layout: that measures every text on a draw of its own, and doubled the cost
    width, height = 4.2 * cols, 3.0 * rows  # inches
    fig, axes = subplots(
        rows, cols, figsize=(width, height), squeeze=False,
        gridspec_kw={"left": 0.9 / width, "right": 1 - 0.15 / width, "bottom": 0.5 / height,
                     "top": 1 - 0.35 / height, "wspace": 0.3, "hspace": 0.45},
    )  # fmt: skip
    for ax, (name, splits) in zip(axes.flat, sorted(series.items()), strict=False):
        for split, points in sorted(splits.items()):
            steps, values = zip(*points, strict=True)
            ax.plot(steps, values, label=split, marker="o" if len(points) < 30 else None, ms=3)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    save_figure(fig, path, crop=False)


def image_grid(
    images: torch.Tensor,
    path: str | os.PathLike,
    *,
    image_shape: Sequence[int],
    value_range: tuple[float, float],
    ncol: int | None = None,
    row_labels: Sequence[str] | None = None,
    title: str | None = None,
) -> None:
    """Tile a batch of images (N, *image_shape) or flat (N, D) into one PNG; images with
    three channels (C, H, W) are drawn in colour, others in grey.

    Args:
        path: the PNG written.
        value_range: (low, high) of the pixel values, mapped to black and white.
        ncol: images per row (default: about the square root of N).
        row_labels: a label to the left of each row.
        title: a title above the grid.
    """
    colour = len(image_shape) == 3 and image_shape[0] == 3
    shape = tuple(image_shape) if colour else tuple(image_shape[-2:])
    x = images.detach().float().reshape(len(images), *shape).cpu().numpy()
    if colour:
        x = x.transpose(0, 2, 3, 1)
    lo, hi = value_range
    x = np.clip((x - lo) / (hi - lo), 0, 1)
    n = len(x)
    ncol = ncol or math.ceil(math.sqrt(n))
    nrow = math.ceil(n / ncol)
    h, w = x.shape[1:3]
    canvas = np.ones((nrow * (h + 1) + 1, ncol * (w + 1) + 1, *x.shape[3:]))
    for i in range(n):
        r, c = divmod(i, ncol)
        canvas[1 + r * (h + 1) : 1 + r * (h + 1) + h, 1 + c * (w + 1) : 1 + c * (w + 1) + w] = x[i]
    # about 40 screen pixels per image side at 100 dpi, whatever the image resolution
    inches_per_pixel = 0.4 / max(h, w)
    height, width = canvas.shape[:2]
    fig, ax = subplots(figsize=(width * inches_per_pixel + 0.6, height * inches_per_pixel + 0.5))
    ax.imshow(canvas, cmap=None if colour else "gray", vmin=0, vmax=1, interpolation="nearest")
    ax.set_xticks([])
    if row_labels:
        ax.set_yticks([1 + r * (h + 1) + h / 2 for r in range(len(row_labels))], row_labels)
    else:
        ax.set_yticks([])
    if title:
        ax.set_title(title)
    save_figure(fig, path)


Bounds2D = tuple[tuple[float, float], tuple[float, float]]
ArrayLike = np.ndarray | torch.Tensor


def to_numpy(data: ArrayLike) -> np.ndarray:
    """A NumPy copy of ``data``, from whatever device a tensor is on."""
    return data.detach().cpu().numpy() if isinstance(data, torch.Tensor) else np.asarray(data)


def _panels(
    panels: Sequence[tuple[str, ArrayLike]],
    path: str | os.PathLike,
    bounds: Bounds2D,
    draw: Callable[[Any, np.ndarray], None],
) -> None:
    """One square axes per (title, data) panel over ``bounds``, drawn by ``draw(ax, data)``."""
    fig, axes = subplots(1, len(panels), figsize=(4 * len(panels), 4), squeeze=False)
    for ax, (title, data) in zip(axes.flat, panels, strict=True):
        draw(ax, to_numpy(data))
        ax.set_xlim(*bounds[0])
        ax.set_ylim(*bounds[1])
        ax.set_aspect("equal")
        ax.set_title(title)
    save_figure(fig, path)


def density_panels(
    panels: Sequence[tuple[str, ArrayLike]], path: str | os.PathLike, *, bounds: Bounds2D
) -> None:
    """Side-by-side heat maps of 2-D densities evaluated on a grid (each (G, G)).

    Args:
        panels: (title, values (G, G)) per panel.
        path: the PNG written.
        bounds: ((x_min, x_max), (y_min, y_max)) of the grid.
    """
    (x0, x1), (y0, y1) = bounds

    def draw(ax, grid: np.ndarray) -> None:
        ax.imshow(grid.T, origin="lower", extent=(x0, x1, y0, y1), cmap="viridis")
        ax.set_xticks([])
        ax.set_yticks([])

    _panels(panels, path, bounds, draw)


def scatter_panels(
    panels: Sequence[tuple[str, ArrayLike]], path: str | os.PathLike, *, bounds: Bounds2D
) -> None:
    """Side-by-side scatter plots of 2-D point sets (each (N, 2)).

    Args:
        panels: (title, points (N, 2)) per panel.
        path: the PNG written.
        bounds: ((x_min, x_max), (y_min, y_max)) of the plotted square.
    """
    _panels(panels, path, bounds, lambda ax, pts: ax.scatter(pts[:, 0], pts[:, 1], s=1, alpha=0.5))
