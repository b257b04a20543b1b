"""Convolutional networks for images: a classifier body and a scalar image energy.

:class:`ConvNet` maps (B, C, H, W) images to K outputs; :class:`ConvEnergy` reads a
one-output ConvNet as the energy E(x) of an unnormalised image density
p(x) = exp(-E(x)) / Z (Song & Kingma 2021; Du & Mordatch 2019 train such energies with Langevin
negatives). Spectral normalisation (Miyato et al. 2018) of every layer keeps the energy
smooth, which short-run Langevin sampling needs.
"""

from __future__ import annotations

import torch
from torch import nn

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.energies.base import EnergyModel
from ebmlab.energies.mlp import ACTIVATIONS


class ConvNet(nn.Module):
    """A small convolutional network for (B, C, H, W) images (H, W divisible by 4).

    Two blocks of two 3x3 convolutions with a smooth activation and 2x2 average
    pooling, then a linear layer to K outputs: enough for MNIST-scale data on a CPU.
    Flattened rows (B, C * H * W) are accepted too. ``spectral_norm`` wraps every
    convolution and the linear layer in spectral normalisation.

    Args:
        image_shape: (channels, height, width) of the input images.
        num_classes: number of classes.
    """

    def __init__(
        self,
        image_shape: tuple[int, int, int],
        num_classes: int,
        width: int = 32,
        activation: str = "silu",
        spectral_norm: bool = False,
    ):
        super().__init__()
        _checks.one_of("activation", activation, list(ACTIVATIONS))
        c, h, w = _checks.image_shape("image_shape", image_shape)
        if h % 4 or w % 4:
            raise ArgumentError(f"image height and width must be divisible by 4, got {h}x{w}")
        _checks.positive_int("num_classes", num_classes)
        _checks.positive_int("width", width)
        act = ACTIVATIONS[activation]
        wrap = nn.utils.parametrizations.spectral_norm if spectral_norm else (lambda m: m)
        self.image_shape = tuple(image_shape)
        self.features = nn.Sequential(
            wrap(nn.Conv2d(c, width, 3, padding=1)),
            act(),
            wrap(nn.Conv2d(width, width, 3, padding=1)),
            act(),
            nn.AvgPool2d(2),
            wrap(nn.Conv2d(width, 2 * width, 3, padding=1)),
            act(),
            wrap(nn.Conv2d(2 * width, 2 * width, 3, padding=1)),
            act(),
            nn.AvgPool2d(2),
        )
        self.head = wrap(nn.Linear(2 * width * (h // 4) * (w // 4), num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(as_images(x, self.image_shape, self.features)).flatten(1))


def as_images(x: torch.Tensor, image_shape: tuple[int, ...], body: nn.Module) -> torch.Tensor:
    """Rows (B, C*H*W) or images as (B, C, H, W), in the memory layout of ``body``'s
    convolution weights: NHWC when the model was put in channels-last layout
    (``model.to(memory_format=torch.channels_last)``), so no convolution converts.

    Args:
        image_shape: (channels, height, width) of the input images.
    """
    x = x.view(x.shape[0], *image_shape)
    w = next(p for p in body.parameters() if p.ndim == 4)
    if w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous():
        x = x.contiguous(memory_format=torch.channels_last)
    return x


class ImageEnergy(EnergyModel):
    """E(x) = net(x)[:, 0] for an image network with one output (:class:`ConvNet`,
    :class:`~ebmlab.energies.WideResNet`, :class:`~ebmlab.energies.SNResNet`), on
    (B, C, H, W) images or their flattened rows.

    Any sampler runs on it (gradients by autograd; ``grad_dtype = torch.bfloat16``
    for reduced-precision Langevin), and the contrastive-divergence, score-matching
    and NCE losses train it like any other energy.
    """

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        if not hasattr(net, "image_shape"):
            raise ArgumentError("net must be an image network with an image_shape attribute")
        self.net = net

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return self.net.image_shape

    def energy(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)[:, 0]


class ConvEnergy(ImageEnergy):
    """E(x) = ConvNet(x), one output: the small convolutional energy.

    Args:
        image_shape: (channels, height, width) of the input images.
        activation: the nonlinearity (``"silu"``, ``"relu"``, ...).
        spectral_norm: spectrally normalise every layer (Miyato et al. 2018).
    """

    def __init__(
        self,
        image_shape: tuple[int, int, int],
        width: int = 32,
        activation: str = "silu",
        spectral_norm: bool = False,
    ) -> None:
        super().__init__(ConvNet(image_shape, 1, width, activation, spectral_norm))
