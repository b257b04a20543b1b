"""TemperedEnergy: a potential's Boltzmann density at a temperature, exp(-V / T)."""

import pytest
import torch

from ebmlab.energies import Gaussian, MLPEnergy, TemperedEnergy
from ebmlab.energies.base import _autograd_energy_and_grad
from ebmlab.partition import quadrature_log_partition


def test_energy_and_fused_gradient_are_the_potentials_over_the_temperature():
    torch.manual_seed(0)
    v = MLPEnergy(3, hidden=(16, 16))
    tempered = TemperedEnergy(v, 0.2)
    x = torch.randn(40, 3)
    e, g = tempered.energy_and_grad(x)
    e_ref, g_ref = _autograd_energy_and_grad(tempered.energy, x)
    torch.testing.assert_close(e, v(x) / 0.2)
    torch.testing.assert_close(e, e_ref)
    torch.testing.assert_close(g, g_ref, rtol=1e-4, atol=1e-5)
    names = {f"potential.{n}" for n, _ in v.named_parameters()}
    assert set(dict(tempered.named_parameters())) == names


def test_a_gaussian_potential_at_temperature_t_has_variance_times_t():
    """exp(-|x|^2 / (2 T)) is N(0, T I): log Z = (d / 2) log(2 pi T)."""
    t = 0.3
    tempered = TemperedEnergy(Gaussian(torch.zeros(2), torch.eye(2)), t)
    est = quadrature_log_partition(tempered, [(-6.0, 6.0)] * 2, 512)
    exact = float(torch.log(torch.tensor(2 * torch.pi * t)))  # (d/2) log(2 pi T), d = 2
    assert est.log_z == pytest.approx(exact, abs=1e-4)
    untempered = quadrature_log_partition(tempered.potential, [(-6.0, 6.0)] * 2, 512)
    assert untempered.log_z == pytest.approx(exact - float(torch.log(torch.tensor(t))), abs=1e-4)


def test_temperature_must_be_positive():
    with pytest.raises(ValueError, match="temperature"):
        TemperedEnergy(MLPEnergy(2), 0.0)
