"""Products x @ W for binary x, the inner loop of RBM annealing.

When x is 0/1, x @ W can run on 8-bit integer units: W is rounded to the 15-bit
fixed-point grid W_q = s (128 D1 + D0) with int8 digits D1 and D0, and the
activation [128 x | x] (uint8) times the stacked digits [D1; D0] gives x @ W_q
exactly in int32 accumulators, in one call to oneDNN's quantized linear, which
also applies the output scale and bias. On a CPU with AMX or VNNI this is several
times faster than a float32 GEMM. The rounding is not an approximation of the
estimator: annealing targets the RBM with weights W_q throughout, and one final
importance step from W_q to W (see ``ebmlab.partition.ais``) makes the estimate
refer to W again.

The quantized kernel runs only on CPU tensors, where it exists and passes a one-time
exactness check (:func:`quantized_available`); everywhere else (CUDA, MPS, CPUs
without it, ``EBMLAB_CPU_FAST_PATHS=0``) :class:`FloatProduct` keeps the same
interface with W_q = W in float32.
"""

from __future__ import annotations

import functools

import torch

from ebmlab import hardware
from ebmlab.devices import widen

_HIGH = 128  # weight of the high digit; [128 x | x] still fits in uint8
_MAX_INNER = 100_000  # keeps 16,319 * inner below 2^31 in the int32 accumulator


class FloatProduct:
    """x @ W in float32, with the activation written into a preallocated buffer."""

    def __init__(self, W: torch.Tensor, batch: int):
        self.W = W.float()
        # W_q is only read for one final importance weight, in the widest dtype the
        # device has
        self.Wq = widen(W)
        self.x = torch.empty(batch, W.shape[0], device=W.device)
        self._bits = torch.empty(batch, W.shape[0], dtype=torch.bool, device=W.device)

    def sample(self, u: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
        """Store x = 1[u < threshold] and return it as bool."""
        bits = torch.lt(u, threshold, out=self._bits)
        self.x.copy_(bits.view(torch.uint8))
        return bits

    def load(self, x: torch.Tensor) -> None:
        self.x.copy_(x)

    def __call__(self, scale: float, bias: torch.Tensor) -> torch.Tensor:
        """scale * (x @ W) + bias."""
        return torch.addmm(bias, self.x, self.W, alpha=scale)


class QuantizedProduct:
    """x @ W_q for binary x on int8 units; W_q = s (128 D1 + D0) is ``Wq``."""

    def __init__(self, W: torch.Tensor, batch: int):
        inner, outer = W.shape
        peak = float(W.abs().max())
        self.scale = peak / (_HIGH * 127 + _HIGH // 2 - 1) if peak > 0 else 1.0
        q = torch.round(W.double() / self.scale).long()
        low = (q + _HIGH // 2) % _HIGH - _HIGH // 2
        high = (q - low) // _HIGH
        self.Wq = self.scale * q.double()
        digits = torch.cat([high, low], 0).T.contiguous().to(torch.int8)
        self._packed = torch.ops.onednn.qlinear_prepack(digits, [batch, 2 * inner])
        self._w_scales = torch.full((outer,), self.scale, dtype=torch.float32)
        self._w_zeros = torch.zeros(outer, dtype=torch.long)
        self.x = torch.empty(batch, 2 * inner, dtype=torch.uint8)
        self._inner = inner

    def sample(self, u: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
        """Store x = 1[u < threshold] as [128 x | x] and return x as bool."""
        low = self.x[:, self._inner :]
        bits = torch.lt(u, threshold, out=low.view(torch.bool))
        torch.mul(low, _HIGH, out=self.x[:, : self._inner])
        return bits

    def load(self, x: torch.Tensor) -> None:
        low = x.to(torch.uint8)
        self.x[:, self._inner :] = low
        self.x[:, : self._inner] = low * _HIGH

    def __call__(self, scale: float, bias: torch.Tensor) -> torch.Tensor:
        """scale * (x @ W_q) + bias, in float32."""
        return torch.ops.onednn.qlinear_pointwise(
            self.x, scale, 0, self._packed, self._w_scales, self._w_zeros, bias,
            1.0, 0, torch.float32, "none", [], "",
        )  # fmt: skip


def quantized_available(device: torch.device) -> bool:
    """Whether binary products on ``device`` can use the int8 kernel: CPU tensors only,
    where the kernel exists and reproduces an exact product."""
    return device.type == "cpu" and hardware.cpu_fast_paths_allowed() and _quantized_exact()


@functools.cache
def _quantized_exact() -> bool:
    """Whether the int8 kernel exists on this CPU and reproduces an exact product."""
    try:
        gen = torch.Generator().manual_seed(0)
        W = torch.randn(37, 11, generator=gen, dtype=torch.float64)
        x = (torch.rand(5, 37, generator=gen) < 0.5).float()
        product = QuantizedProduct(W, 5)
        product.load(x)
        got = product(0.5, torch.ones(11)).double()
        want = 0.5 * (x.double() @ product.Wq) + 1
        return bool(torch.allclose(got, want, rtol=1e-6, atol=1e-5))
    except (AttributeError, RuntimeError):
        return False


def binary_products(
    W: torch.Tensor, batch: int
) -> tuple[QuantizedProduct, QuantizedProduct] | tuple[FloatProduct, FloatProduct]:
    """The fastest exact products x @ W and x @ W^T for ``batch`` binary rows here.

    Both use the same W_q (``Wq``), so they describe one model.
    """
    if max(W.shape) <= _MAX_INNER and quantized_available(W.device):
        return QuantizedProduct(W, batch), QuantizedProduct(W.T, batch)
    return FloatProduct(W, batch), FloatProduct(W.T, batch)
