"""Residual networks for image EBMs: the WideResNet of JEM and the spectrally
normalised ResNet of IGEBM.

:class:`WideResNet` (Zagoruyko & Komodakis 2016) is the backbone of JEM (Grathwohl et
al. 2020) and JEM++ on CIFAR and SVHN: depth 6n + 4 with n pre-activation blocks in each
of three stages of widths 16k, 32k and 64k. JEM's WRN-28-10 drops batch normalisation
(``norm="none"``), since per-batch statistics mix data and samples, and uses leaky ReLU
(slope 0.2). :class:`SNResNet` follows IGEBM (Du & Mordatch 2019, appendix): residual
blocks with spectral normalisation (Miyato et al. 2018) on every layer, average-pool
downsampling and a smooth activation, which keep the energy Lipschitz so that short-run
Langevin sampling behaves. Both map (B, C, H, W) images, or their flattened rows, to K
outputs: logits for :class:`~ebmlab.energies.ClassifierEnergy`, or one output as an
energy through :class:`~ebmlab.energies.ImageEnergy`.
"""

from __future__ import annotations

import torch
from torch import nn

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.energies.conv import as_images
from ebmlab.energies.mlp import ACTIVATIONS

NORMS = ("none", "batch", "group", "layer")
GROUPS = 16  # channels per group of group normalisation (fewer groups for narrow layers)


def norm_layer(kind: str, channels: int) -> nn.Module:
    """A normalisation layer of ``kind`` (one of NORMS) for ``channels`` channels."""
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    if kind == "group":
        return nn.GroupNorm(max(1, channels // GROUPS), channels)
    if kind == "layer":
        return nn.GroupNorm(1, channels)
    return nn.Identity()


class _WideBlock(nn.Module):
    """Pre-activation block: norm, act, 3x3 conv, dropout, norm, act, 3x3 conv, plus the
    input (through a 1x1 convolution when the width or resolution changes)."""

    def __init__(self, c_in: int, c_out: int, stride: int, norm: str, act, dropout: float):
        super().__init__()
        self.pre = nn.Sequential(norm_layer(norm, c_in), act())
        self.body = nn.Sequential(
            nn.Conv2d(c_in, c_out, 3, stride, 1),
            nn.Dropout(dropout),
            norm_layer(norm, c_out),
            act(),
            nn.Conv2d(c_out, c_out, 3, 1, 1),
        )
        self.shortcut = nn.Conv2d(c_in, c_out, 1, stride) if stride != 1 or c_in != c_out else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.pre(x)
        return self.body(h) + (x if self.shortcut is None else self.shortcut(h))


class WideResNet(nn.Module):
    """WRN-depth-widen (Zagoruyko & Komodakis 2016) with K outputs.

    ``depth`` = 6n + 4 (28 for JEM), ``widen`` the width multiplier k (10 for JEM),
    ``norm`` one of none|batch|group|layer, ``activation`` any of
    :data:`~ebmlab.energies.mlp.ACTIVATIONS` (JEM's is ``leaky_relu``, slope 0.2).

    Args:
        image_shape: (channels, height, width) of the input images.
        num_outputs: K, the outputs (1 for an energy, the classes for JEM).
        dropout: dropout probability inside the residual blocks.
    """

    def __init__(
        self,
        image_shape: tuple[int, int, int],
        num_outputs: int,
        depth: int = 28,
        widen: int = 10,
        dropout: float = 0.0,
        norm: str = "none",
        activation: str = "leaky_relu",
    ) -> None:
        super().__init__()
        _checks.image_shape("image_shape", image_shape)
        if depth < 10 or (depth - 4) % 6:
            raise ArgumentError(
                f"depth must be 6n + 4 with n >= 1 (10, 16, 22, 28, ...), got {depth}"
            )
        _checks.positive_int("num_outputs", num_outputs)
        _checks.positive_int("widen", widen)
        _checks.probability("dropout", dropout)
        _checks.one_of("norm", norm, NORMS)
        act = ACTIVATIONS[_checks.one_of("activation", activation, list(ACTIVATIONS))]
        self.image_shape = tuple(image_shape)
        n = (depth - 4) // 6
        widths = [16, 16 * widen, 32 * widen, 64 * widen]
        layers: list[nn.Module] = [nn.Conv2d(image_shape[0], widths[0], 3, 1, 1)]
        for stage in range(3):
            for i in range(n):
                c_in = widths[stage] if i == 0 else widths[stage + 1]
                stride = 2 if stage > 0 and i == 0 else 1
                layers.append(_WideBlock(c_in, widths[stage + 1], stride, norm, act, dropout))
        layers += [norm_layer(norm, widths[3]), act(), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(widths[3], num_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(as_images(x, self.image_shape, self.features)))


class _SNBlock(nn.Module):
    """act, 3x3 conv, act, 3x3 conv, plus the input; then 2x2 average pooling when
    downsampling (IGEBM's block, every convolution spectrally normalised)."""

    def __init__(self, c_in: int, c_out: int, downsample: bool, act) -> None:
        super().__init__()
        sn = nn.utils.parametrizations.spectral_norm
        self.body = nn.Sequential(
            act(), sn(nn.Conv2d(c_in, c_out, 3, 1, 1)), act(), sn(nn.Conv2d(c_out, c_out, 3, 1, 1))
        )
        self.shortcut = sn(nn.Conv2d(c_in, c_out, 1)) if c_in != c_out else nn.Identity()
        self.pool = nn.AvgPool2d(2) if downsample else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.body(x) + self.shortcut(x))


class SNResNet(nn.Module):
    """IGEBM's spectrally normalised ResNet (Du & Mordatch 2019) with K outputs:
    a 3x3 convolution to ``width`` channels, ``stages`` stages of ``blocks`` residual
    blocks (width doubling and resolution halving at the end of each stage but the
    last), then the activation, a sum over positions and a linear layer.

    Args:
        image_shape: (channels, height, width) of the input images.
        num_outputs: K, the outputs (1 for an energy, the classes for JEM).
    """

    def __init__(
        self,
        image_shape: tuple[int, int, int],
        num_outputs: int,
        width: int = 64,
        stages: int = 3,
        blocks: int = 1,
        activation: str = "silu",
    ) -> None:
        super().__init__()
        _checks.image_shape("image_shape", image_shape)
        _checks.positive_int("num_outputs", num_outputs)
        _checks.positive_int("width", width)
        _checks.positive_int("stages", stages)
        _checks.positive_int("blocks", blocks)
        c, h, w = image_shape
        if h % 2 ** (stages - 1) or w % 2 ** (stages - 1):
            raise ArgumentError(
                f"image height and width must be divisible by {2 ** (stages - 1)} for "
                f"{stages} stages, got {h}x{w}"
            )
        act = ACTIVATIONS[_checks.one_of("activation", activation, list(ACTIVATIONS))]
        sn = nn.utils.parametrizations.spectral_norm
        self.image_shape = tuple(image_shape)
        layers: list[nn.Module] = [sn(nn.Conv2d(c, width, 3, 1, 1))]
        c_in = width
        for stage in range(stages):
            c_out = width * 2**stage
            for i in range(blocks):
                last = i == blocks - 1 and stage < stages - 1
                layers.append(_SNBlock(c_in, c_out, last, act))
                c_in = c_out
        layers.append(act())
        self.features = nn.Sequential(*layers)
        self.head = sn(nn.Linear(c_in, num_outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.features(as_images(x, self.image_shape, self.features))
        return self.head(h.sum((2, 3)))
