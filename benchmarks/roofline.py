"""How far a benchmark row is from what the device can do.

A row's useful work is counted once, by running it under a dispatch mode that applies
torch's flop formulas: the floating-point operations of its matrix products and
convolutions, forward and backward, the arithmetic that sets the pace of the networks
and RBMs measured here (elementwise work is left out, so the fraction is a floor).
The device's peak is measured once per run by a probe: a large square matrix product
in the row's dtype (float32, on a GPU also TF32 for the convolutions cuDNN runs in it
by default, bfloat16), and a device-to-device copy for the memory bandwidth. A row
then carries its FLOPs, its achieved rate and the fraction of the probe's rate, with
the probe named. A row without products (a random walk, a sampler on an analytic
target) is set against the copy instead, with the bytes its operations read and write
(:func:`count_bytes`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

from ebmlab import hardware


def count_flops(fn: Callable[[], object]) -> int:
    """The matrix-product and convolution FLOPs of one call of ``fn`` (run eagerly),
    counted on its second call: the first may include one-off work (a capability
    probe timing a product, a cache filled)."""
    fn()
    with _FlopCount() as counter:
        fn()
    return counter.total


class _FlopCount(TorchDispatchMode):
    """Sums the FLOPs of the operations torch's flop counter knows (products and
    convolutions). ``FlopCounterMode`` itself also tracks modules with hooks, which
    fail inside ``torch.autograd.grad`` (the samplers' and SGLD loops' gradients)."""

    total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        count = flop_registry.get(func._overloadpacket)
        sparse = [a for a in args if isinstance(a, torch.Tensor) and a.layout != torch.strided]
        if count is not None and sparse:  # the dense formula would count the zeros
            self.total += 2 * sparse[0]._nnz() * out.shape[-1]
        elif count is not None:
            self.total += int(count(*args, **kwargs, out_val=out))
        elif func._overloadpacket == _PACKED_LINEAR:  # oneDNN's, on packed CPU weights
            k = args[0].shape[-1]
            self.total += 2 * (args[0].numel() // k) * k * out.shape[-1]
        return out


_PACKED_LINEAR = torch.ops.mkldnn._linear_pointwise


def count_bytes(fn: Callable[[], object]) -> int:
    """The bytes one call of ``fn`` (run eagerly; its second call, as in
    :func:`count_flops`) reads and writes: each operation that computes reads its
    distinct tensor inputs and writes its outputs (views and allocations move
    nothing). Every operation's traffic counts, as an unfused run asks for it; where
    the tensors stay in cache the memory sees less, so against the copy probe the
    fraction says how far a row is from being bound by memory, not that it is."""
    fn()
    with _ByteCount() as counter:
        fn()
    return counter.total


_NO_TRAFFIC = {
    torch.ops.aten.empty,
    torch.ops.aten.empty_like,
    torch.ops.aten.empty_strided,
    torch.ops.aten.new_empty,
    torch.ops.aten.resize_,
    torch.ops.aten._local_scalar_dense,
    torch.ops.aten._unsafe_view,  # a view its schema does not declare
}


def _nbytes(tensors: list) -> int:
    dense = {id(t): t for t in tensors if isinstance(t, torch.Tensor) and t.layout == torch.strided}
    return sum(t.numel() * t.element_size() for t in dense.values())


class _ByteCount(TorchDispatchMode):
    """Sums the bytes of each computing operation's distinct inputs and its outputs (an
    in-place operation reads and writes its tensor: both count)."""

    total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not func.is_view and func._overloadpacket not in _NO_TRAFFIC:
            self.total += _nbytes(tree_leaves((args, kwargs))) + _nbytes(tree_leaves(out))
        return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _best_seconds(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    fn()
    _sync(device)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return best


def peak_flops(
    device: torch.device, dtype: torch.dtype = torch.float32, tf32: bool = False
) -> float:
    """FLOP/s of an n x n x n matrix product in ``dtype`` on ``device`` (n = 8192 on a
    GPU, 2048 on a CPU; the best of a few); ``tf32``: float32 products on a GPU's
    TF32 tensor cores, as cuDNN runs float32 convolutions by default."""
    return _probe(device, dtype, tf32)


@functools.cache  # one probe per device, dtype and TF32 setting, however it is asked for
def _probe(device: torch.device, dtype: torch.dtype, tf32: bool) -> float:
    n = 8192 if device.type == "cuda" else 2048
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    setting = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        seconds = _best_seconds(lambda: a @ b, device, 5)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = setting
    return 2 * n**3 / seconds


def _copy_bytes(device: torch.device) -> int:
    return 2**30 if device.type == "cuda" else 2**28


@functools.cache
def peak_bandwidth(device: torch.device) -> float:
    """Bytes/s of a device-to-device copy of 1 GiB on a GPU (256 MiB on a CPU), counting
    the bytes read and written."""
    size = _copy_bytes(device)
    src = torch.empty(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = _best_seconds(lambda: dst.copy_(src), device, 5)
    return 2 * size / seconds


def bandwidth_roofline(n_bytes: int, seconds: float, device: torch.device) -> dict:
    """The roofline fields of a row that moved ``n_bytes`` (:func:`count_bytes`) in
    ``seconds``, against the device's copy (:func:`peak_bandwidth`)."""
    peak = peak_bandwidth(device)
    return {
        "bytes": n_bytes,
        "gb_per_s": n_bytes / seconds / 1e9,
        "peak_gb_per_s": peak / 1e9,
        "peak": f"{_copy_bytes(device) >> 20} MiB copy probe",
        "fraction_of_peak": n_bytes / seconds / peak,
    }


def peak_name(device: torch.device, dtype: torch.dtype, tf32: bool = False) -> str:
    """How :func:`peak_flops` was measured, for the row."""
    n = 8192 if device.type == "cuda" else 2048
    tf32 = tf32 and dtype == torch.float32 and device.type == "cuda"
    label = "tf32" if tf32 else str(dtype).removeprefix("torch.")
    return f"{label} matmul {n}^3 probe"


def roofline(
    flops: int, seconds: float, device: torch.device, dtype: torch.dtype, tf32: bool = False
) -> dict:
    """The roofline fields of a row that did ``flops`` in ``seconds`` in ``dtype``
    (``tf32``: its float32 products ran on TF32 tensor cores). A bfloat16 row on a CPU
    without bfloat16 units ran in float32 (``hardware.reduced_precision``), and is set
    against the float32 peak."""
    dtype = hardware.reduced_precision(device, dtype) or torch.float32
    tf32 = tf32 and dtype == torch.float32 and device.type == "cuda"
    peak = peak_flops(device, dtype, tf32)
    return {
        "flops": flops,
        "tflop_per_s": flops / seconds / 1e12,
        "peak_tflop_per_s": peak / 1e12,
        "peak": peak_name(device, dtype, tf32),
        "fraction_of_peak": flops / seconds / peak,
    }
