"""The benchmarks' roofline: FLOPs counted by formula, the peak probe, the harness's
fields. A count that missed a product kind (oneDNN's packed one) would understate a
row's rate, so the counts are checked against the products' own sizes."""

import benchmarks.roofline as roofline_module
import pytest
import torch
from benchmarks.harness import Case, measure
from benchmarks.roofline import bandwidth_roofline, count_bytes, count_flops, peak_flops, roofline

from ebmlab import hardware


def test_products_and_their_backward_are_counted_by_their_sizes():
    a, b = torch.randn(30, 40), torch.randn(40, 50)
    assert count_flops(lambda: a @ b) == 2 * 30 * 40 * 50
    x = torch.randn(30, 40, requires_grad=True)
    # forward, then the input gradient only (b needs none)
    assert count_flops(lambda: torch.autograd.grad((x @ b).sum(), x)) == 2 * 2 * 30 * 40 * 50
    assert count_flops(lambda: a + 1) == 0  # elementwise work is not counted
    sparse = (a * (torch.rand_like(a) < 0.1)).to_sparse_csr()
    assert count_flops(lambda: sparse @ b) == 2 * sparse._nnz() * 50  # its nonzeros only


def test_onednn_packed_products_count_like_addmm():
    if not hardware.packed_linear(torch.device("cpu"), torch.float32):
        pytest.skip("no packed float32 kernel on this CPU: nothing to miss")
    w, x, bias = torch.randn(24, 40), torch.randn(300, 40), torch.randn(24)
    packed = torch.ops.mkldnn._reorder_linear_weight(w)
    ops = torch.ops.mkldnn._linear_pointwise
    counted = count_flops(lambda: ops(x, packed, bias, "none", [], ""))
    assert counted == count_flops(lambda: torch.addmm(bias, x, w.t())) == 2 * 300 * 40 * 24


def test_a_row_gets_its_rate_and_fraction_of_the_probe_peak():
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    peak = peak_flops(torch.device("cpu"))
    assert peak > 1e8  # any CPU multiplies faster than 0.1 GFLOP/s
    row = roofline(2 * 256**3, 1.0, torch.device("cpu"), torch.float32)
    assert row["flops"] == 2 * 256**3 and 0 < row["fraction_of_peak"] < 1
    result = measure(Case("a product", lambda: a @ b, lambda: b @ a, "the other", repeats=2))
    assert result.flops == 2 * 256**3
    assert result.fraction_of_peak > 0  # a ratio of timings: a loaded machine moves either
    walk = measure(Case("elementwise", lambda: a + 1, lambda: b + 1, "the other", repeats=2))
    assert walk.flops == 0 and walk.bytes == 2 * a.numel() * 4  # set against the copy
    assert walk.fraction_of_peak > 0


def test_bytes_are_each_computing_operations_inputs_and_outputs():
    a, b = torch.randn(30, 40), torch.randn(30, 40)
    size = a.numel() * 4
    assert count_bytes(lambda: a + b) == 3 * size  # two read, one written
    assert count_bytes(lambda: a.add_(b)) == 3 * size  # a read and written in place
    assert count_bytes(lambda: a * a) == 2 * size  # one tensor read once
    assert count_bytes(lambda: a.T.reshape(-1)) == 2 * size  # the view moves nothing, the copy does
    assert count_bytes(lambda: (a[:10], torch.empty(100))) == 0
    assert count_bytes(lambda: torch.randn(30, 40)) == size  # written only
    assert count_bytes(lambda: a.sum()) == size + 4
    row = bandwidth_roofline(10**9, 1.0, torch.device("cpu"))
    assert row["bytes"] == 10**9 and row["peak"] == "256 MiB copy probe"
    assert 0 < row["fraction_of_peak"] < 1  # any CPU copies faster than 1 GB/s


def test_a_bfloat16_row_that_ran_in_float32_is_set_against_the_float32_peak(monkeypatch):
    """Where a CPU has no bfloat16 units, ebmlab's bfloat16 requests run in float32, and
    the row's peak is float32's: the probe in emulated bfloat16 would both misstate the
    peak and take minutes (a 2048^3 product, some twenty times slower than float32).
    The probes are stood in for by fixed rates, so that no product runs here."""
    cpu = torch.device("cpu")
    rates = {torch.float32: 1e11, torch.bfloat16: 4e11}
    monkeypatch.setattr(roofline_module, "_probe", lambda device, dtype, tf32: rates[dtype])
    monkeypatch.setattr(hardware, "_cpu_bfloat16", lambda: False)
    row = roofline(10**9, 1.0, cpu, torch.bfloat16)
    assert row["peak"] == "float32 matmul 2048^3 probe" and row["peak_tflop_per_s"] == 0.1
    monkeypatch.setattr(hardware, "_cpu_bfloat16", lambda: True)
    row = roofline(10**9, 1.0, cpu, torch.bfloat16)
    assert row["peak"] == "bfloat16 matmul 2048^3 probe" and row["peak_tflop_per_s"] == 0.4
