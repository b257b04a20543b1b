"""The simulated device itself: each kind of violation is caught (negative controls),
and device mismatches at the public entry points are clear errors."""

import pytest
import torch

from ebmlab import conformance as cf
from ebmlab.energies import Gaussian, MLPEnergy
from ebmlab.samplers import Langevin
from ebmlab.samplers.base import SamplerState


def gaussian():
    return Gaussian(torch.zeros(2), torch.eye(2))


class CpuNoiseLangevin(Langevin):
    """A planted bug: the noise is drawn without device=, so it lands on the CPU."""

    def step(self, state, energy, generator=None):
        noise = torch.randn(state.x.shape)
        return SamplerState.start(state.x + noise, None, None, 0)


def test_a_planted_cpu_draw_is_caught():
    x0 = torch.zeros(4, 2)
    CpuNoiseLangevin(0.1).sample(gaussian(), x0, 2)  # fine on the CPU
    with cf.simulated_device(), pytest.raises(cf.DeviceViolationError, match="CPU tensor"):
        CpuNoiseLangevin(0.1).sample(cf.to_device(gaussian()), cf.to_device(x0), 2)


@pytest.mark.parametrize(
    "sync",
    [
        lambda x: x.sum().item(),
        lambda x: bool(x.sum() > 0),
        lambda x: x[x > 0],
        lambda x: x.tolist(),
        lambda x: x.cpu(),
        lambda x: torch.nonzero(x),
    ],
    ids=["item", "bool", "mask-index", "tolist", "cpu", "nonzero"],
)
def test_host_synchronisation_inside_no_sync_is_caught(sync):
    with cf.simulated_device() as sim:
        x = cf.to_device(torch.randn(5))
        sync(x)  # allowed outside a step
        with pytest.raises(cf.DeviceViolationError, match="host synchronisation"), sim.no_sync():
            sync(x)


def test_numpy_of_a_device_tensor_is_caught():
    with cf.simulated_device(), pytest.raises(cf.DeviceViolationError, match="numpy"):
        cf.to_device(torch.randn(3)).numpy()


def test_cpu_only_kernels_on_device_tensors_are_caught():
    w = torch.randn(4, 3)
    with cf.simulated_device(), pytest.raises(cf.DeviceViolationError, match="CPU-only kernel"):
        torch.ops.mkldnn._reorder_linear_weight(cf.to_device(w))


def test_values_compute_as_on_the_cpu():
    x = torch.randn(6, 2, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    model = MLPEnergy(2, hidden=(8,))
    want = model.energy_and_grad(x)
    with cf.simulated_device():
        got = cf.to_device(model).energy_and_grad(cf.to_device(x))
        assert all(cf.on_device(t) for t in got)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(cf.cpu_value(a), b)


def test_a_generator_on_another_device_is_a_clear_error():
    with cf.simulated_device():
        x0 = cf.to_device(torch.zeros(4, 2))
        with pytest.raises(
            ValueError, match="generator is a generator on cpu, but the data is on meta"
        ):
            Langevin(0.1).sample(cf.to_device(gaussian()), x0, 2, generator=torch.Generator())


def test_a_model_on_another_device_than_the_data_is_a_clear_error():
    with cf.simulated_device():
        x0 = cf.to_device(torch.zeros(4, 2))
        with pytest.raises(ValueError, match="x0 is on meta and the energy's parameters on cpu"):
            Langevin(0.1).sample(gaussian(), x0, 2)


def test_float64_on_a_device_without_it_is_caught():
    x0 = torch.zeros(4, 2)
    with cf.simulated_device(float64=False), pytest.raises(cf.DeviceViolationError, match="MPS"):
        cf.to_device(x0).double()
    with cf.simulated_device(float64=False), pytest.raises(cf.DeviceViolationError, match="MPS"):
        torch.zeros(3, dtype=torch.float64, device=cf.DEVICE)
    with cf.simulated_device(float64=False), pytest.raises(cf.DeviceViolationError, match="MPS"):
        cf.to_device(torch.zeros(3, dtype=torch.float64))
    with cf.simulated_device():  # a generic accelerator has float64
        assert cf.to_device(x0).double().dtype == torch.float64


def test_the_simulated_device_without_float64_is_declared_to_the_library():
    from ebmlab.devices import wide_dtype

    with cf.simulated_device(float64=False):
        assert wide_dtype(cf.DEVICE) == torch.float32
        assert wide_dtype(torch.device("cpu")) == torch.float64
    assert wide_dtype(cf.DEVICE) == torch.float64
    assert wide_dtype(torch.device("mps")) == torch.float32
