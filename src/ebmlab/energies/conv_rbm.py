"""Convolutional RBM (Lee, Grosse, Ranganath & Ng 2009; Norouzi, Ranjbar & Mori 2009).

An image v (C x H x W) and K binary feature maps h^k (H' x W', H' = H - r + 1) share
K filters w^k (C x r x r) over every position: with * the valid cross-correlation,

    E(v, h) = -sum_k h^k . (w^k * v) - sum_k c_k sum_ij h^k_ij - b . v      (binary v)
    E(v, h) = |v - b|^2 / 2 - sum_k h^k . (w^k * v) - sum_k c_k sum_ij h^k_ij (Gaussian v)

(Lee et al. 2009, eqs. 1-2), with one hidden bias c_k per map and one visible bias b_c
per channel, or (``visible_bias="pixel"``) one per pixel, which lets the model say that
an image's borders are usually blank without spending filters on it. Each hidden unit
sees one r x r patch, so

    p(h^k_ij = 1 | v) = sigmoid((w^k * v)_ij + c_k),
    p(v | h) = sigmoid(b + sum_k w^k (x) h^k)  or  N(b + sum_k w^k (x) h^k, I),

where (x) is the full convolution (the transpose of *), and summing h out gives the
free energy F(v) = -b . v - sum_kij softplus((w^k * v)_ij + c_k) (or with |v - b|^2 / 2
in place of -b . v). Unrolled, the model is an ordinary RBM whose weight matrix repeats
each filter at every position (:meth:`ConvolutionalRBM.as_rbm`), which is how exact log Z
and AIS reach it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.energies.boltzmann import (
    _RBM,
    BernoulliRBM,
    GaussianBernoulliRBM,
    bernoulli_draw,
    gaussian_draw,
)

VISIBLE_UNITS = ("binary", "gaussian")
VISIBLE_BIASES = ("channel", "pixel")


class ConvolutionalRBM(_RBM):
    """RBM with K shared r x r filters over an image (Lee et al. 2009).

    Args:
        image_shape: (C, H, W) of the visible images, or (H, W) for one channel.
        n_filters: feature maps K.
        filter_size: side r of the square filters (at most min(H, W)).
        visible: ``binary`` units, or ``gaussian`` units of unit variance (for
            standardised images).
        visible_bias: one bias per ``channel`` (translation invariant, as in Lee et al.
            2009) or per ``pixel``.
        init_std: standard deviation of the initial filters.

    Images come flat (B, C H W) or as (B, C, H, W); hidden states are flat
    (B, K H' W'). ``W`` holds the filters (K, C, r, r), ``b`` the visible biases (C)
    or (C, H, W), and ``c`` the map biases.
    """

    def __init__(
        self,
        image_shape: Sequence[int],
        n_filters: int,
        filter_size: int,
        visible: str = "binary",
        visible_bias: str = "channel",
        init_std: float = 0.01,
    ) -> None:
        shape = tuple(image_shape)
        self.image_shape = _checks.image_shape(
            "image_shape", shape if len(shape) == 3 else (1, *shape)
        )
        self.n_filters = _checks.positive_int("n_filters", n_filters)
        self.filter_size = _checks.positive_int("filter_size", filter_size)
        self.visible = _checks.one_of("visible", visible, VISIBLE_UNITS)
        self.visible_bias = _checks.one_of("visible_bias", visible_bias, VISIBLE_BIASES)
        channels, height, width = self.image_shape
        if filter_size > min(height, width):
            raise ArgumentError(
                f"filter_size must be at most the image's side {min(height, width)}, "
                f"got {filter_size}"
            )
        self.hidden_shape = (n_filters, height - filter_size + 1, width - filter_size + 1)
        n_hidden = n_filters * self.hidden_shape[1] * self.hidden_shape[2]
        super().__init__(channels * height * width, n_hidden, init_std)

    def init_parameters(self, init_std: float) -> None:
        """Filters W (K, C, r, r) with N(0, init_std^2) entries, zero biases b (C, or
        C x H x W per pixel) and c (K)."""
        channels = self.image_shape[0]
        r = self.filter_size
        self.W = nn.Parameter(torch.randn(self.n_filters, channels, r, r) * init_std)
        per_pixel = self.visible_bias == "pixel"
        self.b = nn.Parameter(torch.zeros(self.image_shape if per_pixel else (channels,)))
        self.c = nn.Parameter(torch.zeros(self.n_filters))

    def _images(self, v: torch.Tensor) -> torch.Tensor:
        """Visible rows as images (B, C, H, W), checked against the model's shape."""
        if v.dim() < 2 or v[0].numel() != self.n_visible:
            raise ArgumentError(
                f"v must be images of shape {self.image_shape}, flat or not, got shape "
                f"{tuple(v.shape)}"
            )
        return v.reshape(-1, *self.image_shape)

    def _visible_bias(self) -> torch.Tensor:
        """b broadcastable to an image: (C, 1, 1) or (C, H, W)."""
        return self.b if self.visible_bias == "pixel" else self.b[:, None, None]

    def _top_down(self, h: torch.Tensor) -> torch.Tensor:
        """b + sum_k w^k (x) h^k for flat hidden states (B, M): (B, C, H, W)."""
        maps = h.reshape(-1, *self.hidden_shape)
        return F.conv_transpose2d(maps, self.W) + self._visible_bias()

    def _visible_term(self, images: torch.Tensor) -> torch.Tensor:
        """The part of the energy with v alone: -b . v, or |v - b|^2 / 2 for Gaussian
        units: (B,)."""
        if self.visible == "gaussian":
            return ((images - self._visible_bias()) ** 2).sum((1, 2, 3)) / 2
        return -(images * self._visible_bias()).sum((1, 2, 3))

    def hidden_logits(self, v: torch.Tensor) -> torch.Tensor:
        """(w^k * v)_ij + c_k, the log-odds of p(h = 1 | v): flat (B, K H' W')."""
        return F.conv2d(self._images(v), self.W, self.c).flatten(1)

    def joint_energy(self, v: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """E(v, h) of images and flat hidden states: (B,)."""
        images = self._images(v)
        return self._visible_term(images) - (h * self.hidden_logits(images)).sum(1)

    def free_energy_from_logits(self, v: torch.Tensor, hidden_logits: torch.Tensor) -> torch.Tensor:
        """F(v) given the hidden logits already computed for v: (B,).

        Args:
            hidden_logits: the feature maps' total inputs, as :meth:`hidden_logits`
                returns them for v.
        """
        return self._visible_term(self._images(v)) - F.softplus(hidden_logits).sum(1)

    def visible_mean(self, h: torch.Tensor) -> torch.Tensor:
        """E[v | h]: sigmoid(b + sum_k w^k (x) h^k), or the Gaussian mean itself, flat (B, D)."""
        top_down = self._top_down(h).flatten(1)
        return top_down if self.visible == "gaussian" else torch.sigmoid(top_down)

    def sample_visible(
        self, h: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """A draw of v ~ p(v | h), flat (B, D).

        Args:
            generator: source of randomness, a ``torch.Generator`` on the data's device
                (``None``: the global one).
        """
        mean = self.visible_mean(h)
        if self.visible == "gaussian":
            return gaussian_draw(mean, mean.new_ones(()), generator)
        return bernoulli_draw(mean, generator)

    def dense_weights(self) -> torch.Tensor:
        """The unrolled weight matrix (D, M): column (k, i, j) holds filter k placed at
        position (i, j), zero elsewhere."""
        basis = torch.eye(self.n_visible, dtype=self.W.dtype, device=self.W.device)
        return F.conv2d(basis.view(-1, *self.image_shape), self.W).flatten(1)

    def as_rbm(self) -> BernoulliRBM | GaussianBernoulliRBM:
        """The same energy as a dense RBM (Bernoulli or Gaussian-Bernoulli with sigma = 1)
        over the flat image, detached: its weights repeat each filter at every position
        and its biases repeat b over the pixels and c over the positions, so every RBM
        tool (exact enumeration of the smaller side, AIS, Bethe, TRW) applies."""
        positions = self.hidden_shape[1] * self.hidden_shape[2]
        with torch.no_grad():
            weights = self.dense_weights()
            b = self._visible_bias().expand(self.image_shape).flatten()
            c = self.c.repeat_interleave(positions)
        dense = BernoulliRBM if self.visible == "binary" else GaussianBernoulliRBM
        return dense.from_parameters(weights, b, c)

    def filter_images(self) -> torch.Tensor:
        """The filters as flat images (K, C r r), for pictures."""
        return self.W.detach().flatten(1)
