import pytest
import torch

from ebmlab.energies import ConvEnergy
from ebmlab.energies.base import _autograd_energy_and_grad
from ebmlab.losses import contrastive_divergence_loss
from ebmlab.samplers import Langevin


def test_conv_energy_reads_images_and_rows_and_checks_its_shape():
    energy = ConvEnergy((1, 8, 8), width=4)
    x = torch.randn(5, 1, 8, 8)
    torch.testing.assert_close(energy(x), energy(x.flatten(1)))
    assert energy(x).shape == (5,)
    e, g = energy.energy_and_grad(x)
    e_ref, g_ref = _autograd_energy_and_grad(energy.energy, x)
    torch.testing.assert_close(e, e_ref)
    torch.testing.assert_close(g, g_ref)
    assert g.shape == x.shape
    with pytest.raises(ValueError, match="divisible by 4"):
        ConvEnergy((1, 6, 6))
    with pytest.raises(ValueError, match=r"\(channels, height, width\)"):
        ConvEnergy((8, 8))


def test_spectral_norm_bounds_every_layer():
    """After power iterations in training mode, every layer's reshaped weight has
    largest singular value 1, so the energy's slope stays bounded as inputs grow."""
    torch.manual_seed(0)
    energy = ConvEnergy((1, 8, 8), width=4, spectral_norm=True)
    x = torch.randn(16, 1, 8, 8)
    for _ in range(30):
        energy(x)
    layers = [m for m in energy.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    assert len(layers) == 5
    for layer in layers:
        top = torch.linalg.matrix_norm(layer.weight.detach().flatten(1), ord=2)
        assert abs(float(top) - 1) < 0.02
    plain = ConvEnergy((1, 8, 8), width=4)
    assert not any(hasattr(m, "parametrizations") for m in plain.modules())


def test_conv_energy_learns_to_prefer_data_over_noise():
    """A few contrastive-divergence steps with short-run Langevin negatives push the
    energy of digit-like images below that of uniform noise."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    # data: bright vertical bars on a dark 8x8 canvas
    data = torch.zeros(64, 1, 8, 8)
    data[:, :, :, 3:5] = 1.0
    data += 0.05 * torch.randn(data.shape, generator=gen)
    energy = ConvEnergy((1, 8, 8), width=4)
    opt = torch.optim.Adam(energy.parameters(), lr=1e-2)
    sampler = Langevin(0.01, noise_scale=0.005, clamp=(0.0, 1.0))
    noise = torch.rand(64, 1, 8, 8, generator=gen)
    with torch.no_grad():
        gap_before = float(energy(noise).mean() - energy(data).mean())
    for _ in range(40):
        x_neg = sampler.sample(energy, torch.rand(64, 1, 8, 8, generator=gen), 10, generator=gen)
        loss, _ = contrastive_divergence_loss(energy, data, x_neg, l2=0.01)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        gap_after = float(energy(noise).mean() - energy(data).mean())
    assert gap_after > gap_before + 1.0, (gap_before, gap_after)
