import pytest
import torch

from ebmlab.energies import DiagonalGaussian, MLPEnergy, as_energy_fn, energy_and_grad, score


def test_score_of_gaussian_is_analytic():
    g = DiagonalGaussian(torch.tensor([1.0, -1.0]), torch.tensor([0.5, 2.0]))
    x = torch.randn(7, 2)
    torch.testing.assert_close(g.score(x), -(x - g.mean) / g.std**2)


def test_log_ratio_needs_no_partition_function():
    g = DiagonalGaussian(torch.zeros(2), torch.ones(2))
    x1, x2 = torch.randn(4, 2), torch.randn(4, 2)
    torch.testing.assert_close(g.log_ratio(x1, x2), g.log_prob(x1) - g.log_prob(x2))


def test_plain_callables_are_energies():
    def quad(x):
        return 0.5 * (x**2).sum(1)

    x = torch.randn(3, 4)
    torch.testing.assert_close(score(quad, x), -x)
    e, g = energy_and_grad(as_energy_fn(quad), x)
    assert not e.requires_grad and not g.requires_grad


def test_energy_shape_is_checked():
    with pytest.raises(ValueError, match=r"one value per sample, shape \(3,\)"):
        as_energy_fn(lambda x: x.sum())(torch.randn(3, 2))
    with pytest.raises(TypeError, match="energy must be an EnergyModel or a callable"):
        as_energy_fn(3.0)


def test_an_energy_without_a_gradient_in_x_is_named_before_sampling():
    """Computed outside autograd (NumPy, detach) or not from x at all: one clear error at
    the chains' first evaluation, not autograd's own message."""
    from ebmlab.samplers import NUTS, Langevin

    x0 = torch.randn(4, 2)
    weight = torch.nn.Parameter(torch.ones(1))
    for energy in (
        lambda x: torch.as_tensor((x.detach().numpy() ** 2).sum(1)),
        lambda x: torch.zeros(len(x)) * weight,
    ):
        for sampler in (Langevin(0.1), NUTS()):
            with pytest.raises(ValueError, match="does not depend on x through autograd"):
                sampler.run(energy, x0, 5, burn_in=5)
    # a negative control: the same energy written in torch samples
    assert Langevin(0.1).run(lambda x: (x**2).sum(1), x0, 5).samples.isfinite().all()


def test_mlp_energy_shapes_and_options():
    m = MLPEnergy(4, hidden=(8, 8), spectral_norm=True)
    assert m(torch.randn(5, 4)).shape == (5,)
    assert m(torch.randn(5, 2, 2)).shape == (5,)
    with pytest.raises(ValueError, match="activation must be one of"):
        MLPEnergy(4, activation="gelu6")


@pytest.mark.fastpath
@pytest.mark.parametrize("packed", [True, False], ids=["onednn-packed", "plain"])
@pytest.mark.parametrize("hidden", [(16, 8), ()], ids=["two-hidden", "linear"])
@pytest.mark.parametrize("activation", ["silu", "elu", "relu", "tanh", "softplus", "leaky_relu"])
def test_fused_mlp_gradient_equals_autograd(activation, hidden, packed, monkeypatch):
    from ebmlab.energies import mlp
    from ebmlab.energies.base import _autograd_energy_and_grad

    if packed and not mlp.hardware._packed_linear(torch.float32):  # the kernel, not the policy
        pytest.skip("this CPU has no oneDNN packed float32 kernels")
    # both products on packed weights for any batch, or neither
    rows = 1 if packed else None
    monkeypatch.setattr(mlp.hardware, "packed_min_rows", lambda device, dtype, backward=False: rows)
    m = MLPEnergy(6, hidden=hidden, activation=activation)
    x = torch.randn(9, 2, 3)
    e, g = m.energy_and_grad(x)
    e_ref, g_ref = _autograd_energy_and_grad(m.energy, x)
    torch.testing.assert_close(e, e_ref)
    torch.testing.assert_close(g, g_ref, atol=1e-6, rtol=1e-5)
    assert not e.requires_grad and not g.requires_grad


@pytest.mark.parametrize("kind", ["bernoulli", "categorical"])
def test_closed_form_rbm_gradients_equal_autograd(kind):
    from ebmlab.energies import BernoulliRBM, CategoricalRBM
    from ebmlab.energies.base import _autograd_energy_and_grad

    torch.manual_seed(0)
    if kind == "bernoulli":
        model = BernoulliRBM(12, 5, init_std=0.5)
    else:
        model = CategoricalRBM(4, 3, 5, init_std=0.5)
    with torch.no_grad():
        model.b.normal_()
        model.c.normal_()
    x = torch.randint(0, 2, (70, 12)).float().view(70, 3, 4)  # image-shaped rows
    e, g = model.energy_and_grad(x)
    e_ref, g_ref = _autograd_energy_and_grad(model.energy, x)
    torch.testing.assert_close(e, e_ref)
    torch.testing.assert_close(g, g_ref, atol=1e-5, rtol=1e-5)
    assert g.shape == x.shape and not g.requires_grad


def test_closed_form_gaussian_gradients_equal_autograd():
    from ebmlab.energies import Gaussian
    from ebmlab.energies.base import _autograd_energy_and_grad

    cov = torch.tensor([[2.0, 0.3], [0.3, 0.5]])
    for model in (
        Gaussian(torch.ones(2), cov),
        DiagonalGaussian(torch.ones(2), torch.tensor([0.5, 2.0])),
    ):
        x = torch.randn(7, 2)
        e, g = model.energy_and_grad(x)
        e_ref, g_ref = _autograd_energy_and_grad(model.energy, x)
        torch.testing.assert_close(e, e_ref)
        torch.testing.assert_close(g, g_ref, atol=1e-5, rtol=1e-5)
