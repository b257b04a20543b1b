"""U-Net image networks for potentials trained by flow matching (Energy Matching).

Energy Matching (Balcerak et al. 2025, §5 and appendix) learns one scalar potential
V(x) whose gradient -grad V carries noise to images. Its network keeps the image's
resolution where the flow needs it: a U-Net (Ronneberger et al. 2015; the
residual, group-normalised form of diffusion models) maps the image to an image of
features. Two heads turn that image into outputs. :class:`UNetViT`, the paper's, reads
it in patches by a small vision transformer (Dosovitskiy et al. 2021) and sums each
patch token's outputs. :class:`UNetDot` takes its inner product with the input, the
dot-product energy of Equilibrium Matching (Wang & Du 2025), whose gradient contains
the U-Net's output image itself. A classifier reads out K outputs as logits (JEM's
E(x) = -LogSumExp_y, through :class:`~ebmlab.energies.ClassifierEnergy`), a potential
one (through :class:`~ebmlab.energies.ImageEnergy`).

Training -grad V by flow matching differentiates the network twice. Attention is
therefore written out (softmax(Q K^T / sqrt(d)) V) rather than taken from the fused
attention kernels, some of which have no second derivative.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.energies.conv import as_images
from ebmlab.energies.mlp import ACTIVATIONS
from ebmlab.energies.resnet import norm_layer


class _ResBlock(nn.Module):
    """Two 3x3 convolutions after group norm and the activation, with a residual path
    (a 1x1 convolution where the width changes); the second convolution starts at zero,
    so the block starts as the identity."""

    def __init__(self, c_in: int, c_out: int, activation: str) -> None:
        super().__init__()
        act = ACTIVATIONS[activation]
        self.body = nn.Sequential(
            norm_layer("group", c_in),
            act(),
            nn.Conv2d(c_in, c_out, 3, padding=1),
            norm_layer("group", c_out),
            act(),
            nn.Conv2d(c_out, c_out, 3, padding=1),
        )
        nn.init.zeros_(self.body[-1].weight)
        nn.init.zeros_(self.body[-1].bias)
        self.skip = nn.Identity() if c_in == c_out else nn.Conv2d(c_in, c_out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.skip(x) + self.body(x)


class _Attention(nn.Module):
    """Multi-head self-attention over tokens (B, N, E), written out."""

    def __init__(self, embed: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(embed, 3 * embed)
        self.out = nn.Linear(embed, embed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, e = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, e // self.heads).permute(2, 0, 3, 1, 4)
        weights = torch.softmax(q @ k.transpose(-2, -1) * (e // self.heads) ** -0.5, dim=-1)
        return self.out((weights @ v).transpose(1, 2).reshape(b, n, e))


class _TransformerLayer(nn.Module):
    """Pre-norm transformer layer: attention, then an MLP of 4 x the width."""

    def __init__(self, embed: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(embed), nn.LayerNorm(embed)
        self.attention = _Attention(embed, heads)
        self.mlp = nn.Sequential(
            nn.Linear(embed, 4 * embed), nn.GELU(), nn.Linear(4 * embed, embed)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class _UNet(nn.Module):
    """The U-Net (Ronneberger et al. 2015, in the residual, group-normalised form of
    diffusion models) that both image networks below start with: it maps an image to an
    image of its shape, and keeps the bottleneck's features for a read-out."""

    def __init__(
        self,
        image_shape: tuple[int, int, int],
        width: int,
        mults: Sequence[int],
        blocks: int,
        activation: str,
    ) -> None:
        super().__init__()
        c, h, w = _checks.image_shape("image_shape", image_shape)
        _checks.one_of("activation", activation, list(ACTIVATIONS))
        _checks.positive_int("width", width)
        mults = _checks.positive_ints("mults", mults)
        if not mults:
            raise ArgumentError("mults must name at least one U-Net level, got ()")
        _checks.positive_int("blocks", blocks)
        scale = 2 ** (len(mults) - 1)
        if h % scale or w % scale:
            raise ArgumentError(
                f"image height and width must be divisible by {scale} for {len(mults)} "
                f"U-Net levels, got {h}x{w}"
            )
        self.image_shape = (c, h, w)
        widths = [width * m for m in mults]
        self.stem = nn.Conv2d(c, widths[0], 3, padding=1)
        self.down = nn.ModuleList()
        c_prev = widths[0]
        for c_out in widths:
            stage = [
                _ResBlock(c_prev if i == 0 else c_out, c_out, activation) for i in range(blocks)
            ]
            self.down.append(nn.Sequential(*stage))
            c_prev = c_out
        self.pools = nn.ModuleList(nn.AvgPool2d(2) for _ in widths[1:])
        self.middle = _ResBlock(c_prev, c_prev, activation)
        self.bottleneck_width = c_prev
        self.up = nn.ModuleList()
        for level in reversed(range(len(widths))):
            c_out = widths[level]
            stage = [
                _ResBlock((c_prev + c_out) if i == 0 else c_out, c_out, activation)
                for i in range(blocks)
            ]
            if level > 0:
                stage.append(nn.Upsample(scale_factor=2, mode="nearest"))
            self.up.append(nn.Sequential(*stage))
            c_prev = c_out
        self.to_image = nn.Sequential(
            norm_layer("group", c_prev),
            ACTIVATIONS[activation](),
            nn.Conv2d(c_prev, c, 3, padding=1),
        )

    def unet(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The images x (B, C, H, W) from ``x`` (images or flat rows), the image the
        U-Net maps them to, and the bottleneck's feature map (for a read-out)."""
        x = as_images(x, self.image_shape, self.stem)
        z = self.stem(x)
        skips = []
        for level, stage in enumerate(self.down):
            z = stage(z)
            skips.append(z)  # each level's skip, before its downsampling
            if level < len(self.pools):
                z = self.pools[level](z)
        bottleneck = z = self.middle(z)
        for stage in self.up:
            z = stage(torch.cat([z, skips.pop()], 1))
        return x, self.to_image(z), bottleneck


class UNetViT(_UNet):
    """A U-Net, image to image, then a patch transformer, image to K outputs, each the
    sum over the patches of a token's output (Balcerak et al. 2025's potential).

    Args:
        image_shape: (channels, height, width) of the input images; height and width
            divisible by 2^(len(mults) - 1) and by ``patch``.
        num_outputs: K, the outputs (1 for a potential, the classes for a classifier).
        width: channels of the U-Net's first level.
        mults: each level's channels as multiples of ``width``; each level after the
            first halves the resolution.
        blocks: residual blocks per level, on the way down and on the way up.
        patch: the transformer's patch size.
        embed: the tokens' width.
        heads: attention heads (dividing ``embed``).
        layers: transformer layers.
        activation: the U-Net's nonlinearity.
    """

    def __init__(
        self,
        image_shape: tuple[int, int, int],
        num_outputs: int = 1,
        width: int = 32,
        mults: Sequence[int] = (1, 2, 2),
        blocks: int = 1,
        patch: int = 4,
        embed: int = 128,
        heads: int = 4,
        layers: int = 2,
        activation: str = "silu",
    ) -> None:
        super().__init__(image_shape, width, mults, blocks, activation)
        _checks.positive_int("num_outputs", num_outputs)
        _checks.positive_int("patch", patch)
        _checks.positive_int("heads", heads)
        _checks.positive_int("layers", layers)
        if _checks.positive_int("embed", embed) % heads:
            raise ArgumentError(f"embed ({embed}) must be divisible by heads ({heads})")
        c, h, w = self.image_shape
        if h % patch or w % patch:
            raise ArgumentError(
                f"image height and width must be divisible by patch {patch}, got {h}x{w}"
            )
        self.patches = nn.Conv2d(c, embed, patch, stride=patch)
        self.position = nn.Parameter(torch.zeros(1, (h // patch) * (w // patch), embed))
        nn.init.normal_(self.position, std=0.02)
        self.transformer = nn.Sequential(*(_TransformerLayer(embed, heads) for _ in range(layers)))
        self.norm = nn.LayerNorm(embed)
        self.head = nn.Linear(embed, num_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, image, _ = self.unet(x)
        u = x + image  # the image of features the transformer reads
        tokens = self.patches(u).flatten(2).transpose(1, 2) + self.position
        return self.head(self.norm(self.transformer(tokens))).sum(1)


class UNetDot(_UNet):
    """A U-Net u whose K outputs are the image's inner product with the image the
    U-Net maps it to, plus a linear read-out r of the bottleneck's features h:
    out_k(x) = <x, u(x)> + r_k(h(x)).

    As a potential, V(x) = -<x, u(x)> is the dot-product explicit energy of Equilibrium
    Matching (Wang & Du 2025). Its velocity -grad V = u(x) + J_u(x)^T x holds the
    U-Net's output image itself, where a scalar head (:class:`UNetViT`,
    :class:`~ebmlab.energies.ConvNet`) reaches the image only through the network's
    transpose; regressed on flow-matching velocities it follows them more closely
    (docs/results/fashion-mnist.md). The read-out gives a classifier's K outputs
    their differences: the shared inner product cancels in p(y | x), and JEM's
    E(x) = -LogSumExp_y out_y(x) is -<x, u(x)> - LogSumExp_y r_y(h(x)).

    Args:
        image_shape: (channels, height, width) of the input images; height and width
            divisible by 2^(len(mults) - 1).
        num_outputs: K, the outputs (1 for a potential, the classes for a classifier).
        width: channels of the U-Net's first level.
        mults: each level's channels as multiples of ``width``; each level after the
            first halves the resolution.
        blocks: residual blocks per level, on the way down and on the way up.
        activation: the U-Net's nonlinearity.
    """

    def __init__(
        self,
        image_shape: tuple[int, int, int],
        num_outputs: int = 1,
        width: int = 32,
        mults: Sequence[int] = (1, 2, 2),
        blocks: int = 1,
        activation: str = "silu",
    ) -> None:
        super().__init__(image_shape, width, mults, blocks, activation)
        self.readout = nn.Linear(
            self.bottleneck_width, _checks.positive_int("num_outputs", num_outputs)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, image, bottleneck = self.unet(x)
        features = bottleneck.mean((2, 3))
        return (x * image).flatten(1).sum(1, keepdim=True) + self.readout(features)
