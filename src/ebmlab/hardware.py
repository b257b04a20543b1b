"""What this machine offers, and which fast paths ebmlab takes on it.

Each question is answered once, on first use, and cached: importing ebmlab reads
nothing and changes nothing. A CPU fast path (oneDNN's packed weights, its int8
products, cache blocking) is taken only for tensors on the CPU and only where the
check below says the kernel exists and reproduces the portable result; everywhere
else (other CPUs, CUDA, MPS) the portable PyTorch path gives the same answer within
rounding.

Two settings restrict the fast paths, for testing the portable path on a CPU that
has more: ``ONEDNN_MAX_CPU_ISA`` naming an instruction set without bfloat16 units
(``AVX2``, ``AVX``, ``SSE41``, ``AVX2_VNNI``) turns the bfloat16 kernels off, as
oneDNN itself would, and ``EBMLAB_CPU_FAST_PATHS=0`` turns every CPU fast path off.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
from pathlib import Path
from typing import Any

import torch

from ebmlab import devices

# oneDNN instruction-set limits under which its AVX-512 and bfloat16 kernels are unavailable
_ISAS_WITHOUT_AVX512 = {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2"}
_ISAS_WITHOUT_BF16 = _ISAS_WITHOUT_AVX512 - {"AVX2_VNNI_2"}


@functools.cache
def _cpuinfo() -> dict[str, str]:
    """The first processor's entries in Linux's /proc/cpuinfo (empty elsewhere)."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                break
            key, _, value = line.partition(":")
            info[key.strip()] = value.strip()
    except OSError:
        pass
    return info


def cpu_name() -> str:
    """The CPU's model name, or the machine's architecture where none is reported."""
    return _cpuinfo().get("model name") or platform.processor() or platform.machine()


def cpu_vendor() -> str:
    """The CPU's vendor as Linux reports it (``GenuineIntel``, ``AuthenticAMD``; empty
    elsewhere)."""
    return _cpuinfo().get("vendor_id", "")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux reports them (empty elsewhere), read once."""
    info = _cpuinfo()
    return frozenset((info.get("flags") or info.get("Features") or "").split())


def cpu_features() -> dict[str, bool]:
    """The instruction-set extensions that matter for ebmlab's CPU kernels."""
    flags = cpu_flags()
    return {
        "avx2": "avx2" in flags,
        "avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags,
        "avx512_bf16": "avx512_bf16" in flags,
        "amx": {"amx_tile", "amx_bf16"} <= flags,
        "avx_vnni": "avx_vnni" in flags or "avx512_vnni" in flags,
        "neon": "asimd" in flags or platform.machine() in ("arm64", "aarch64"),
    }


@functools.cache
def l2_cache_bytes(default: int = 1 << 20) -> int:
    """A core's level-2 cache size as Linux reports it, else ``default``."""
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            if (index / "level").read_text().strip() == "2":
                size = (index / "size").read_text().strip().upper()
                scale = {"K": 1 << 10, "M": 1 << 20}.get(size[-1:], 1)
                return int(size.rstrip("KM")) * scale
        except (OSError, ValueError):
            break
    return default


def cpu_fast_paths_allowed() -> bool:
    """False when ``EBMLAB_CPU_FAST_PATHS=0`` asks for the portable path everywhere."""
    return os.environ.get("EBMLAB_CPU_FAST_PATHS", "1").lower() not in ("0", "off", "false")


def _onednn_isa_limit() -> str:
    return os.environ.get("ONEDNN_MAX_CPU_ISA", os.environ.get("DNNL_MAX_CPU_ISA", "")).upper()


def _onednn_isa_has_bf16() -> bool:
    return _onednn_isa_limit() not in _ISAS_WITHOUT_BF16


def _packed_linear_works(dtype: torch.dtype) -> bool:
    """Whether oneDNN's packed linear runs here in ``dtype`` and matches ``addmm``."""
    try:
        gen = torch.Generator().manual_seed(0)
        w = torch.randn(24, 40, generator=gen).to(dtype)
        x = torch.randn(300, 40, generator=gen).to(dtype)
        b = torch.randn(24, generator=gen).to(dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(w)
        got = torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], "")
        want = torch.addmm(b.float(), x.float(), w.float().t())
        return bool(torch.allclose(got.float(), want, rtol=2e-2, atol=2e-2))
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


@functools.cache
def _packed_linear(dtype: torch.dtype) -> bool:
    if not (cpu_fast_paths_allowed() and torch.backends.mkldnn.is_available()):
        return False
    if dtype == torch.bfloat16 and not (
        _onednn_isa_has_bf16() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    ):
        return False
    return _packed_linear_works(dtype)


def packed_linear(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether weights on ``device`` in ``dtype`` can use oneDNN's packed layout here:
    bfloat16 where it pays (:func:`bfloat16_pays`), float32 on AVX-512 CPUs whose oneDNN is not
    held below AVX-512 (``ONEDNN_MAX_CPU_ISA``): on AVX2 ones, AMD EPYC among them, the
    packed float32 product measured slower than ``addmm``."""
    if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
        return False
    if dtype == torch.float32 and (
        not cpu_features()["avx512"] or _onednn_isa_limit() in _ISAS_WITHOUT_AVX512
    ):
        return False
    if dtype == torch.bfloat16 and not _cpu_bfloat16():
        return False
    return _packed_linear(dtype)


def packed_min_rows(device: torch.device, dtype: torch.dtype, backward: bool = False) -> int | None:
    """The fewest rows from which a product with weights on ``device`` in ``dtype`` runs
    faster on oneDNN's packed weights than on ``addmm``, or None where it never does.

    ``backward`` asks about the input-gradient product g W rather than the forward
    product h W^T + b. bfloat16: both products, from one row. float32 on AMD CPUs with
    AVX-512: both products from 64 rows (1.1x at 64 rows, 2.2x from 256 rows up, widths
    64-512, one thread of a Zen 4 EPYC: the BLAS behind ``addmm`` does not use these
    cores' AVX-512 units). float32 on other AVX-512 CPUs: the forward product from 256
    rows (5-20 % faster; smaller products get slower).

    Args:
        device: where the weights live.
        dtype: the products' precision.
        backward: the input-gradient product instead of the forward one.
    """
    if not packed_linear(device, dtype):
        return None
    if dtype == torch.bfloat16:
        return 1
    if cpu_vendor() == "AuthenticAMD":
        return 64
    return None if backward else 256


def bfloat16_pays(vendor: str, features: dict[str, bool]) -> bool:
    """Whether a CPU of this ``vendor`` with these :func:`cpu_features` multiplies
    bfloat16 matrices faster than float32 ones: with AMX tiles (Intel), or with
    AVX512-BF16 on AMD (Zen 4: 1.4-1.6x float32 in the sampler and RBM benchmarks). On Intel
    CPUs with AVX512-BF16 but no AMX (or AMX that the hypervisor hides), oneDNN's
    AVX512-BF16 kernel ran at half float32's rate (84 against 155 GFLOP/s for 2048^3,
    one thread of a Xeon), so bfloat16 requests take the float32 path there.

    Args:
        vendor: :func:`cpu_vendor`'s answer, such as ``"GenuineIntel"``.
        features: :func:`cpu_features`'s answer (``amx`` and ``avx512_bf16`` are read).
    """
    return features["amx"] or (vendor == "AuthenticAMD" and features["avx512_bf16"])


@functools.cache
def _cpu_bfloat16() -> bool:
    return (
        cpu_fast_paths_allowed()
        and _onednn_isa_has_bf16()
        and torch.ops.mkldnn._is_mkldnn_bf16_supported()
        and bfloat16_pays(cpu_vendor(), cpu_features())
    )


def matmul(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """a @ b + bias for a (B, n), b (n, m) and bias (m,) or None, the same result within
    rounding wherever it runs: float32 products on oneDNN's kernel where
    :func:`packed_min_rows` says they pay off for B rows (b read in place, for factors
    that change between calls), else ``addmm`` (which sends bfloat16 products to
    oneDNN by itself, and takes a sparse CSR ``a``). Products that autograd records
    stay on ``addmm``: the oneDNN kernel has no backward. ``a`` may be a transposed
    view: the BLAS behind float32 ``addmm`` and the GPUs' read it in place, and it is
    laid out row-major for the CPU's oneDNN kernels (packed float32, 16-bit products)."""
    rows = packed_min_rows(a.device, a.dtype, backward=True)
    recorded = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (a, b, bias)
    )
    strided = a.layout == torch.strided
    packed = rows is not None and len(a) >= rows and not recorded
    if strided and a.dtype == torch.float32 and packed:
        return torch.ops.mkldnn._linear_pointwise(a.contiguous(), b.T, bias, "none", [], "")
    if strided and a.device.type == "cpu" and a.element_size() < 4:
        a = a.contiguous()
    return a @ b if bias is None else torch.addmm(bias, a, b)


def reduced_precision(device: torch.device, dtype: torch.dtype | None) -> torch.dtype | None:
    """``dtype`` where arithmetic in it is fast on ``device``, else None (work in the
    inputs' precision): accelerators take any, a CPU takes bfloat16 only where its
    products outrun float32's (:func:`bfloat16_pays`). Without bfloat16 units PyTorch
    emulates bfloat16 products some twenty times slower than float32, for no gain in
    accuracy."""
    if dtype is None or device.type != "cpu" or dtype != torch.bfloat16:
        return dtype
    return dtype if _cpu_bfloat16() else None


def autocast(
    device: torch.device, dtype: torch.dtype | None
) -> torch.autocast | contextlib.nullcontext:
    """``torch.autocast`` on ``device`` in ``dtype`` where :func:`reduced_precision`
    allows it, else nothing (also for ``dtype`` None, and so on any device)."""
    dtype = reduced_precision(device, dtype)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype)


def cache_blocking(device: torch.device) -> bool:
    """Whether element-wise passes are worth splitting into cache-sized row blocks
    (CPUs only: a GPU keeps the whole batch in one kernel launch) on ``device``."""
    return device.type == "cpu" and cpu_fast_paths_allowed()


def report() -> dict[str, Any]:
    """Everything ``ebmlab info`` prints about the hardware, as plain data."""
    cuda = [
        {"device": f"cuda:{i}", "name": torch.cuda.get_device_name(i),
         "bf16": torch.cuda.is_bf16_supported()}
        for i in range(torch.cuda.device_count())
    ]  # fmt: skip
    cpu = torch.device("cpu")
    return {
        "cpu": cpu_name(),
        "cpu_features": cpu_features(),
        "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cuda": cuda,
        "mps": torch.backends.mps.is_available(),
        "devices": devices.available(),
        "fast_paths": {
            "onednn_packed_float32": packed_linear(cpu, torch.float32),
            "onednn_packed_float32_from_rows": packed_min_rows(cpu, torch.float32),
            "onednn_packed_bfloat16": packed_linear(cpu, torch.bfloat16),
            "bfloat16_arithmetic": reduced_precision(cpu, torch.bfloat16) is not None,
            "l2_cache_blocking": cache_blocking(cpu),
            "l2_cache_bytes": l2_cache_bytes(),
        },
    }
