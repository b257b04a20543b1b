"""The Inception-v3 network of the FID and Inception-score literature, read from a local
weights file, and the Inception score.

Papers report FID (Heusel et al. 2017), KID (Bińkowski et al. 2018) and the Inception
score (Salimans et al. 2016) in one network: the TensorFlow Inception-v3 graph of
2015-12-05 (Szegedy et al. 2016), with 2048 pool features and 1008 class logits. The
PyTorch FID tools distribute a port of it as a state dict of tensors
(``pt_inception-2015-12-05-6726825d.pth``; torch-fidelity's
``weights-inception-2015-12-05-6726825d.pth``). :func:`load_inception` reads that file
with ``torch.load(weights_only=True)``, which refuses pickled code, into
:class:`InceptionV3`, whose parameter names and shapes are the file's. The graph differs
from the Inception-v3 of image classification libraries in two places, both kept here:
the average pools inside the mixed blocks leave the zero padding out of the mean, and
the last block pools by maximum.

Images enter in [0, 1] at any size, grey or colour (grey is repeated over three
channels), and are brought to the graph's 299 x 299 inputs in one of two ways:

- ``"tensorflow"`` (default), as the graph itself does and as the original FID and
  Inception-score code and torch-fidelity feed it: pixels quantised to 8 bits (as when
  samples are saved as PNG), resized by TensorFlow 1's bilinear interpolation (source
  coordinate i * in / out, no half-pixel offset), then (x - 128) / 128;
- ``"pytorch-fid"``, as pytorch-fid does: PyTorch's bilinear interpolation (half-pixel
  centres) of the unquantised pixels, then 2 x - 1. Its FIDs differ slightly from the
  TensorFlow code's.

The Inception score uses the logits of the original code: the pool features times the
classifier's weights, without its bias.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.devices import widen
from ebmlab.energies.base import in_chunks

INPUT_SIZE = 299
PREPROCESSING = ("tensorflow", "pytorch-fid")
CHUNK = 64  # images per forward pass: 299 x 299 activations are about 40 MB an image
FEATURES = 2048
CLASSES = 1008  # the graph's 1000 ImageNet classes and 8 unused outputs


class _Conv(nn.Sequential):
    """Convolution without bias, batch norm (eps 1e-3) and ReLU: every layer of the net."""

    def __init__(self, cin: int, cout: int, kernel: int | tuple[int, int], **options: Any):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, bias=False, **options)
        self.bn = nn.BatchNorm2d(cout, eps=1e-3)
        self.relu = nn.ReLU(inplace=True)  # the batch norm output is used once


def _average(x: torch.Tensor) -> torch.Tensor:
    return F.avg_pool2d(x, 3, stride=1, padding=1, count_include_pad=False)


def _maximum(x: torch.Tensor) -> torch.Tensor:
    return F.max_pool2d(x, 3, stride=1, padding=1)


def _reduce(x: torch.Tensor) -> torch.Tensor:
    return F.max_pool2d(x, 3, stride=2)


class _Mixed(nn.Module):
    """An Inception block: parallel branches, concatenated along the channels.

    A branch is a path of layer names; a tuple inside a path forks, and the fork's
    outputs are concatenated. The pooling branch pools the input, then applies the
    layer ``branch_pool`` when the block has one.
    """

    def __init__(
        self,
        layers: dict[str, _Conv],
        branches: tuple[tuple[str | tuple[str, ...], ...], ...],
        pool: Callable[[torch.Tensor], torch.Tensor],
    ) -> None:
        super().__init__()
        for name, layer in layers.items():
            self.add_module(name, layer)
        self.branches = branches
        self.pool = pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outputs = []
        for path in self.branches:
            h = x
            for step in path:
                if isinstance(step, tuple):
                    h = torch.cat([self.get_submodule(name)(h) for name in step], 1)
                else:
                    h = self.get_submodule(step)(h)
            outputs.append(h)
        pooled = self.pool(x)
        outputs.append(self.branch_pool(pooled) if hasattr(self, "branch_pool") else pooled)
        return torch.cat(outputs, 1)


def _block_a(cin: int, pool_features: int) -> _Mixed:
    """35 x 35 grid: 1x1, 5x5 and two 3x3 branches; out 224 + pool_features channels."""
    layers = {
        "branch1x1": _Conv(cin, 64, 1),
        "branch5x5_1": _Conv(cin, 48, 1),
        "branch5x5_2": _Conv(48, 64, 5, padding=2),
        "branch3x3dbl_1": _Conv(cin, 64, 1),
        "branch3x3dbl_2": _Conv(64, 96, 3, padding=1),
        "branch3x3dbl_3": _Conv(96, 96, 3, padding=1),
        "branch_pool": _Conv(cin, pool_features, 1),
    }
    paths = (("branch1x1",), ("branch5x5_1", "branch5x5_2"),
             ("branch3x3dbl_1", "branch3x3dbl_2", "branch3x3dbl_3"))  # fmt: skip
    return _Mixed(layers, paths, _average)


def _block_b(cin: int) -> _Mixed:
    """35 x 35 to 17 x 17: strided 3x3 branches beside a max pool; out cin + 480."""
    layers = {
        "branch3x3": _Conv(cin, 384, 3, stride=2),
        "branch3x3dbl_1": _Conv(cin, 64, 1),
        "branch3x3dbl_2": _Conv(64, 96, 3, padding=1),
        "branch3x3dbl_3": _Conv(96, 96, 3, stride=2),
    }
    paths = (("branch3x3",), ("branch3x3dbl_1", "branch3x3dbl_2", "branch3x3dbl_3"))
    return _Mixed(layers, paths, _reduce)


def _block_c(cin: int, c7: int) -> _Mixed:
    """17 x 17 grid: 7x7 convolutions factored into 1x7 and 7x1; out 768 channels."""
    row, column = {"padding": (0, 3)}, {"padding": (3, 0)}
    layers = {
        "branch1x1": _Conv(cin, 192, 1),
        "branch7x7_1": _Conv(cin, c7, 1),
        "branch7x7_2": _Conv(c7, c7, (1, 7), **row),
        "branch7x7_3": _Conv(c7, 192, (7, 1), **column),
        "branch7x7dbl_1": _Conv(cin, c7, 1),
        "branch7x7dbl_2": _Conv(c7, c7, (7, 1), **column),
        "branch7x7dbl_3": _Conv(c7, c7, (1, 7), **row),
        "branch7x7dbl_4": _Conv(c7, c7, (7, 1), **column),
        "branch7x7dbl_5": _Conv(c7, 192, (1, 7), **row),
        "branch_pool": _Conv(cin, 192, 1),
    }
    double = tuple(f"branch7x7dbl_{i}" for i in range(1, 6))
    paths = (("branch1x1",), ("branch7x7_1", "branch7x7_2", "branch7x7_3"), double)
    return _Mixed(layers, paths, _average)


def _block_d(cin: int) -> _Mixed:
    """17 x 17 to 8 x 8: strided 3x3 branches beside a max pool; out cin + 512."""
    layers = {
        "branch3x3_1": _Conv(cin, 192, 1),
        "branch3x3_2": _Conv(192, 320, 3, stride=2),
        "branch7x7x3_1": _Conv(cin, 192, 1),
        "branch7x7x3_2": _Conv(192, 192, (1, 7), padding=(0, 3)),
        "branch7x7x3_3": _Conv(192, 192, (7, 1), padding=(3, 0)),
        "branch7x7x3_4": _Conv(192, 192, 3, stride=2),
    }
    paths = (("branch3x3_1", "branch3x3_2"), tuple(f"branch7x7x3_{i}" for i in range(1, 5)))
    return _Mixed(layers, paths, _reduce)


def _block_e(cin: int, pool: Callable[[torch.Tensor], torch.Tensor]) -> _Mixed:
    """8 x 8 grid: 3x3 branches forking into 1x3 and 3x1; out 2048 channels."""
    layers = {
        "branch1x1": _Conv(cin, 320, 1),
        "branch3x3_1": _Conv(cin, 384, 1),
        "branch3x3_2a": _Conv(384, 384, (1, 3), padding=(0, 1)),
        "branch3x3_2b": _Conv(384, 384, (3, 1), padding=(1, 0)),
        "branch3x3dbl_1": _Conv(cin, 448, 1),
        "branch3x3dbl_2": _Conv(448, 384, 3, padding=1),
        "branch3x3dbl_3a": _Conv(384, 384, (1, 3), padding=(0, 1)),
        "branch3x3dbl_3b": _Conv(384, 384, (3, 1), padding=(1, 0)),
        "branch_pool": _Conv(cin, 192, 1),
    }
    paths = (
        ("branch1x1",),
        ("branch3x3_1", ("branch3x3_2a", "branch3x3_2b")),
        ("branch3x3dbl_1", "branch3x3dbl_2", ("branch3x3dbl_3a", "branch3x3dbl_3b")),
    )
    return _Mixed(layers, paths, pool)


def _source_rows(n_in: int, n_out: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """TensorFlow 1's bilinear sampling along one axis: output i reads the input at
    i * n_in / n_out between rows ``low`` and ``low + 1`` (clamped) with weight ``frac``,
    in exact integer arithmetic."""
    scaled = torch.arange(n_out, device=device) * n_in
    low = torch.div(scaled, n_out, rounding_mode="floor")
    frac = (scaled - low * n_out).float() / n_out
    return low, (low + 1).clamp(max=n_in - 1), frac


def resize_like_tensorflow(images: torch.Tensor, size: int) -> torch.Tensor:
    """Images (N, C, H, W) resized to ``size`` x ``size`` as TensorFlow 1's
    ``resize_bilinear`` (align_corners=False) does, the resize inside the FID graph."""
    low, high, frac = _source_rows(images.shape[-2], size, images.device)
    x = images[..., low, :] * (1 - frac)[:, None] + images[..., high, :] * frac[:, None]
    low, high, frac = _source_rows(images.shape[-1], size, images.device)
    return x[..., low] * (1 - frac) + x[..., high] * frac


class InceptionV3(nn.Module):
    """Inception-v3 as FID, KID and the Inception score use it (Szegedy et al. 2016).

    ``forward`` maps images (N, 1 or 3, H, W) in [0, 1] to the 2048 pool features and
    the 1008 logits of the Inception score (without the classifier's bias). Untrained
    as constructed: :func:`load_inception` gives the published weights.

    Args:
        preprocessing: ``"tensorflow"`` (the graph's own: 8-bit pixels, TensorFlow 1's
            bilinear resize) or ``"pytorch-fid"`` (pytorch-fid's); see the module.
    """

    def __init__(self, preprocessing: str = "tensorflow") -> None:
        super().__init__()
        self.preprocessing = _checks.one_of("preprocessing", preprocessing, PREPROCESSING)
        stem = [
            ("Conv2d_1a_3x3", _Conv(3, 32, 3, stride=2)),
            ("Conv2d_2a_3x3", _Conv(32, 32, 3)),
            ("Conv2d_2b_3x3", _Conv(32, 64, 3, padding=1)),
            ("maxpool1", nn.MaxPool2d(3, stride=2)),
            ("Conv2d_3b_1x1", _Conv(64, 80, 1)),
            ("Conv2d_4a_3x3", _Conv(80, 192, 3)),
            ("maxpool2", nn.MaxPool2d(3, stride=2)),
        ]
        mixed = [
            ("Mixed_5b", _block_a(192, 32)),
            ("Mixed_5c", _block_a(256, 64)),
            ("Mixed_5d", _block_a(288, 64)),
            ("Mixed_6a", _block_b(288)),
            ("Mixed_6b", _block_c(768, 128)),
            ("Mixed_6c", _block_c(768, 160)),
            ("Mixed_6d", _block_c(768, 160)),
            ("Mixed_6e", _block_c(768, 192)),
            ("Mixed_7a", _block_d(768)),
            ("Mixed_7b", _block_e(1280, _average)),
            ("Mixed_7c", _block_e(2048, _maximum)),
        ]
        self.order = [name for name, _ in stem + mixed]
        for name, layer in stem + mixed:
            self.add_module(name, layer)
        self.fc = nn.Linear(FEATURES, CLASSES)
        # channels-last convolutions: 1.4x (AVX2) to 1.7x (AVX-512) faster on CPUs, and
        # the layout of tensor cores on GPUs; loading weights keeps the layout
        self.to(memory_format=torch.channels_last)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = images.float()
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        if self.preprocessing == "tensorflow":
            x = torch.floor(x.clamp(0, 1) * 255 + 0.5)  # the 8-bit pixels of a PNG
            x = (resize_like_tensorflow(x, INPUT_SIZE) - 128) / 128
        else:
            x = F.interpolate(x, (INPUT_SIZE, INPUT_SIZE), mode="bilinear", align_corners=False)
            x = 2 * x - 1
        x = x.contiguous(memory_format=torch.channels_last)
        for name in self.order:
            x = self.get_submodule(name)(x)
        features = x.mean((2, 3))
        return features, features @ self.fc.weight.T


def _without_counters(keys: Any) -> set[str]:
    """The names, less batch norm's step counters (which older ports lack)."""
    return {k for k in keys if not k.endswith("num_batches_tracked")}


def load_inception(
    path: str | os.PathLike, device: torch.device | str = "cpu", preprocessing: str = "tensorflow"
) -> InceptionV3:
    """The Inception-v3 of the FID tools from a local state-dict file (the
    ``pt_inception-2015-12-05`` port), on ``device`` in evaluation mode.

    The file is read as tensors only: pickled code in it is refused, not run. Its names
    and shapes must be :class:`InceptionV3`'s (batch-norm step counters optional).

    Args:
        path: the weights file, a state dict saved by ``torch.save``.
        device: where the network is placed.
        preprocessing: how images reach the network's inputs: ``"tensorflow"`` or
            ``"pytorch-fid"`` (see the module).
    """
    _checks.one_of("preprocessing", preprocessing, PREPROCESSING)
    path = Path(path)
    if not path.is_file():
        raise ArgumentError(f"inception weights: no file {str(path)!r}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # not a torch file, truncated, or pickled code refused
        raise ArgumentError(
            f"inception weights {str(path)!r}: not a state dict of tensors "
            f"readable without running code ({type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''})"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ArgumentError(f"inception weights {str(path)!r}: expected a dict of tensors")
    network = InceptionV3(preprocessing)
    expected = network.state_dict()
    wanted, given = _without_counters(expected), _without_counters(state)
    if wanted != given:
        missing, extra = sorted(wanted - given), sorted(given - wanted)
        raise ArgumentError(
            f"inception weights {str(path)!r}: not the FID Inception-v3 layout "
            f"({len(missing)} names missing, e.g. {missing[:3]}; "
            f"{len(extra)} unexpected, e.g. {extra[:3]})"
        )
    for name in sorted(wanted):
        if state[name].shape != expected[name].shape:
            raise ArgumentError(
                f"inception weights {str(path)!r}: {name} has shape "
                f"{tuple(state[name].shape)}, expected {tuple(expected[name].shape)}"
            )
    network.load_state_dict({k: state[k] for k in wanted}, strict=False)
    return network.to(device).eval().requires_grad_(False)


def inception_outputs(
    network: InceptionV3, images: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pool features (N, 2048) and logits (N, 1008) of images (N, C, H, W) in [0, 1],
    computed in chunks without gradients, in the wide dtype of the images' device.

    Args:
        network: the network, from :func:`load_inception`.
        images: (N, 1 or 3, H, W), any size; resized by the network.
    """
    _checks.tensor("images", images, ndim=4, floating=True)
    if images.shape[1] not in (1, 3):
        raise ArgumentError(f"images must have 1 or 3 channels, got shape {tuple(images.shape)}")
    with torch.no_grad():
        features, logits = in_chunks(network, images, CHUNK)
    return widen(features), widen(logits)


def inception_score(logits: torch.Tensor, splits: int = 10) -> tuple[float, float]:
    """The Inception score exp(E_x KL(p(y | x) || p(y))) (Salimans et al. 2016, sec. 4),
    its mean over ``splits`` disjoint parts of the samples, with the standard error of
    that mean (papers quote the standard deviation over the parts, sqrt(splits) times
    larger).

    It runs from 1 (every image gives the same class distribution) to the number of
    classes (each image one certain class, classes used equally often).

    Args:
        logits: class logits of the samples (N, K), e.g. from :func:`inception_outputs`.
        splits: the number of parts (at least 2, of at least 2 samples each).
    """
    _checks.tensor("logits", logits, ndim=2)
    splits = _checks.positive_int("splits", splits)
    if splits < 2 or len(logits) < 2 * splits:
        raise ArgumentError(
            f"splits must be >= 2 with at least 2 samples each, got {splits} splits "
            f"of {len(logits)} samples"
        )
    log_p = torch.log_softmax(widen(logits), 1)
    scores = []
    for part in log_p.tensor_split(splits):
        log_marginal = torch.logsumexp(part, 0) - math.log(len(part))
        kl = (part.exp() * (part - log_marginal)).sum(1).mean()
        scores.append(kl.exp())
    values = torch.stack(scores)
    return float(values.mean()), float(values.std() / math.sqrt(splits))
