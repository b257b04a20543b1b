"""Capability checks: made on first use, reported, and able to turn the fast paths off."""

import subprocess
import sys

import pytest
import torch

from ebmlab import devices, hardware

pytestmark = pytest.mark.fastpath


def test_import_reads_and_registers_nothing():
    code = (
        "import builtins, io, torch\n"
        "from torch.optim import optimizer\n"
        "hooks = len(optimizer._global_optimizer_post_hooks)\n"
        "opened = []\n"
        "real_open = builtins.open\n"
        "def spy(f, *a, **k):\n"
        "    opened.append(str(f))\n"
        "    return real_open(f, *a, **k)\n"
        "builtins.open = io.open = spy\n"
        "import ebmlab, ebmlab.energies, ebmlab.samplers, ebmlab.partition, ebmlab.training\n"
        "builtins.open = io.open = real_open\n"
        "assert len(optimizer._global_optimizer_post_hooks) == hooks\n"
        "assert not [f for f in opened if f.startswith(('/sys', '/proc'))], opened\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    planted = code.replace(
        "builtins.open = io", "ebmlab.hardware.l2_cache_bytes()\nbuiltins.open = io"
    )
    assert subprocess.run([sys.executable, "-c", planted], capture_output=True).returncode != 0


def test_fast_paths_are_for_cpu_tensors_only():
    for device in (torch.device("meta"), torch.device("cuda", 0)):
        assert not hardware.packed_linear(device, torch.float32)
        assert not hardware.cache_blocking(device)


@pytest.mark.parametrize(
    ("vendor", "dtype", "forward", "backward"),
    [
        ("AuthenticAMD", torch.float32, 64, 64),  # the BLAS leaves AVX-512 unused there
        ("GenuineIntel", torch.float32, 256, None),
        ("GenuineIntel", torch.bfloat16, 1, 1),
        ("AuthenticAMD", torch.bfloat16, 1, 1),
    ],
)
def test_packed_products_from_the_rows_that_pay_off(vendor, dtype, forward, backward, monkeypatch):
    monkeypatch.setattr(hardware, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(hardware, "packed_linear", lambda device, dtype: True)
    cpu = torch.device("cpu")
    assert hardware.packed_min_rows(cpu, dtype) == forward
    assert hardware.packed_min_rows(cpu, dtype, backward=True) == backward
    monkeypatch.setattr(hardware, "packed_linear", lambda device, dtype: False)
    assert hardware.packed_min_rows(cpu, dtype) is None
    assert hardware.packed_min_rows(cpu, dtype, backward=True) is None


@pytest.mark.fastpath
@pytest.mark.parametrize("rows", [1, None], ids=["onednn", "addmm"])
def test_matmul_is_the_product_on_either_kernel(rows, monkeypatch):
    if rows and not hardware._packed_linear(torch.float32):  # the kernel, not the policy
        pytest.skip("this CPU has no oneDNN float32 kernels")
    monkeypatch.setattr(hardware, "packed_min_rows", lambda device, dtype, backward=False: rows)
    gen = torch.Generator().manual_seed(0)
    a, b, bias = (torch.randn(*shape, generator=gen) for shape in ((70, 30), (30, 20), (20,)))
    for right in (b, b.T.contiguous().T):  # either memory layout of the right factor
        torch.testing.assert_close(hardware.matmul(a, right, bias), a @ b + bias)
        torch.testing.assert_close(hardware.matmul(a, right), a @ b)
    # a product autograd records differentiates correctly
    b.requires_grad_(True)
    hardware.matmul(a, b, bias).sum().backward()
    torch.testing.assert_close(b.grad, a.sum(0)[:, None].expand(-1, 20))


def test_the_override_turns_every_cpu_fast_path_off(monkeypatch):
    monkeypatch.setenv("EBMLAB_CPU_FAST_PATHS", "0")
    hardware._packed_linear.cache_clear()
    try:
        cpu = torch.device("cpu")
        assert not hardware.packed_linear(cpu, torch.float32)
        assert not hardware.packed_linear(cpu, torch.bfloat16)
        assert not hardware.cache_blocking(cpu)
    finally:
        hardware._packed_linear.cache_clear()


def test_packed_kernels_follow_the_onednn_isa_limit(monkeypatch):
    """oneDNN held at AVX2 has neither bfloat16 nor AVX-512 float32 kernels: its packed
    float32 product would then be slower than the BLAS behind addmm, which is not held."""
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    hardware._packed_linear.cache_clear()
    try:
        assert not hardware.packed_linear(torch.device("cpu"), torch.bfloat16)
        assert not hardware.packed_linear(torch.device("cpu"), torch.float32)
    finally:
        hardware._packed_linear.cache_clear()


def test_avx512_float32_packing_when_onednn_is_not_held(monkeypatch):
    if not hardware.cpu_features()["avx512"]:
        pytest.skip("an AVX-512 CPU")
    monkeypatch.delenv("EBMLAB_CPU_FAST_PATHS", raising=False)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE")
    hardware._packed_linear.cache_clear()
    try:  # the negative control of the test above: the same check, not held
        if not hardware._packed_linear(torch.float32):
            pytest.skip("oneDNN's packed float32 product does not run here")
        assert hardware.packed_linear(torch.device("cpu"), torch.float32)
    finally:
        hardware._packed_linear.cache_clear()


def test_report_lists_devices_features_and_fast_paths():
    report = hardware.report()
    assert report["devices"][-1] == "cpu"
    assert set(report["cpu_features"]) >= {"avx2", "avx512", "amx", "avx512_bf16"}
    assert set(report["fast_paths"]) >= {"onednn_packed_float32", "onednn_packed_bfloat16"}


def test_resolve_device():
    assert devices.resolve_device("auto") == torch.device(devices.available()[0])
    assert devices.resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="device must be one of auto, cpu, cuda"):
        devices.resolve_device("gpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"'cuda:1' is not available here; available: .*cpu"):
            devices.resolve_device("cuda:1")


def test_bfloat16_requests_take_the_float32_path_without_bfloat16_units(monkeypatch):
    from ebmlab.energies import MLPEnergy

    monkeypatch.setattr(hardware, "_cpu_bfloat16", lambda: False)
    cpu = torch.device("cpu")
    assert hardware.reduced_precision(cpu, torch.bfloat16) is None
    assert hardware.reduced_precision(torch.device("cuda"), torch.bfloat16) == torch.bfloat16
    torch.manual_seed(0)
    model, x = MLPEnergy(4, hidden=(16,)), torch.randn(5, 4)
    want = model.energy_and_grad(x)
    model.grad_dtype = torch.bfloat16
    for got, exact in zip(model.energy_and_grad(x), want, strict=True):
        assert torch.equal(got, exact)


@pytest.mark.parametrize(
    ("vendor", "amx", "avx512_bf16", "pays"),
    [
        ("GenuineIntel", True, True, True),  # AMX tiles
        ("GenuineIntel", False, True, False),  # AVX512-BF16 alone: half float32's rate
        ("AuthenticAMD", False, True, True),  # Zen 4
        ("AuthenticAMD", False, False, False),  # AVX2 only
    ],
)
def test_bfloat16_is_taken_only_where_its_products_outrun_float32(vendor, amx, avx512_bf16, pays):
    features = {"avx2": True, "avx512": avx512_bf16, "avx512_bf16": avx512_bf16, "amx": amx}
    assert hardware.bfloat16_pays(vendor, features) is pays
