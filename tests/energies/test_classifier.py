import copy

import pytest
import torch

from ebmlab.energies import ClassifierEnergy, ConvNet, FeedForward, mlp
from ebmlab.energies.base import _autograd_energy_and_grad

pytestmark = pytest.mark.fastpath


def model(hidden=16, activation="silu"):
    torch.manual_seed(0)
    return ClassifierEnergy(FeedForward([6, hidden, hidden, 4], activation), 4)


def test_energies_match_the_seed_equations():
    m = model()
    x = torch.randn(5, 6)
    logits = m.logits(x)
    y = torch.tensor([0, 1, 2, 3, 0])
    torch.testing.assert_close(m.energy(x, y), -logits[torch.arange(5), y])  # eq. 6.5
    torch.testing.assert_close(m.energy(x), -torch.logsumexp(logits, 1))  # eq. 6.12
    # p(y | x) = exp(-E(x, y)) / exp(-E(x)) is the softmax (eq. 6.16)
    torch.testing.assert_close(
        m.predict_proba(x)[torch.arange(5), y], torch.exp(m.energy(x) - m.energy(x, y))
    )
    assert torch.equal(m.predict(x), logits.argmax(1))


def test_calibrate_recovers_the_inverse_temperature_of_the_labels():
    # Labels drawn from softmax(2.5 NN(x)): the NLL-minimising beta is 2.5 up to sampling
    # noise, predictions and energies do not change, and NLL is larger on either side.
    torch.manual_seed(0)
    m = ClassifierEnergy(torch.nn.Linear(6, 4), 4)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(20000, 6, generator=gen)
    with torch.no_grad():
        y = torch.multinomial(torch.softmax(2.5 * m.logits(x), 1), 1, generator=gen).squeeze(1)
        energy, labels = m.energy(x), m.predict(x)
    beta = m.calibrate(x, y)
    assert beta == pytest.approx(2.5, rel=0.05)
    assert float(m.beta) == beta and "beta" in m.state_dict()
    assert torch.equal(m.predict(x), labels) and torch.equal(m.energy(x), energy)

    def nll(b):
        return float(torch.nn.functional.cross_entropy(b * m.logits(x), y))

    with torch.no_grad():
        torch.testing.assert_close(m.predict_proba(x), torch.softmax(beta * m.logits(x), 1))
        assert nll(beta) < min(nll(0.95 * beta), nll(1.05 * beta))


def test_calibrate_rejects_bad_labels():
    m = model()
    x = torch.randn(5, 6)
    with pytest.raises(ValueError, match="y must have shape"):
        m.calibrate(x, torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"class indices in \[0, 4\)"):
        m.calibrate(x, torch.tensor([0, 1, 2, 3, 4]))
    with pytest.raises(ValueError, match="non-empty batch"):
        m.calibrate(torch.zeros(0, 6), torch.zeros(0, dtype=torch.long))


def test_fused_gradients_equal_autograd_for_marginal_and_conditional():
    m = model()
    x = torch.randn(7, 6)
    e, g = m.energy_and_grad(x)
    e_ref, g_ref = _autograd_energy_and_grad(m.energy, x)
    torch.testing.assert_close(e, e_ref)
    torch.testing.assert_close(g, g_ref, atol=1e-6, rtol=1e-5)
    y = torch.randint(4, (7,))
    for guidance in (0.0, 1.5):
        cond = m.conditional(y, guidance)
        e, g = cond.energy_and_grad(x)
        e_ref, g_ref = _autograd_energy_and_grad(cond.energy, x)
        torch.testing.assert_close(e, e_ref)
        torch.testing.assert_close(g, g_ref, atol=1e-6, rtol=1e-5)


class TwoGaussians(torch.nn.Module):
    """Logits [a x - x^2 / 2, -a x - x^2 / 2]: p(x | y) = N(+-a, 1), p(y = 0 | x) =
    sigmoid(2 a x)."""

    def __init__(self, a):
        super().__init__()
        self.a = a

    def forward(self, x):
        return torch.cat([self.a * x - x**2 / 2, -self.a * x - x**2 / 2], 1)


def test_guidance_multiplies_the_class_density_by_the_classifiers_power():
    # E_w(x | y) = -log N(x; a, 1) - w log sigmoid(2 a x) + const for class 0: compare
    # differences over a grid, where the constants cancel; w = 0 is the plain E(x, y).
    a = 0.7
    m = ClassifierEnergy(TwoGaussians(a), 2)
    x = torch.linspace(-3, 3, 13, dtype=torch.float64).view(-1, 1)
    y = torch.tensor(0)
    gauss = (x[:, 0] - a) ** 2 / 2
    for w in (0.0, 0.5, 3.0):
        exact = gauss - w * torch.nn.functional.logsigmoid(2 * a * x[:, 0])
        guided = m.conditional(y, w).energy(x)
        torch.testing.assert_close(guided - guided[0], exact - exact[0])
    torch.testing.assert_close(m.conditional(y).energy(x), m.energy(x, y.expand(13)))
    with pytest.raises(ValueError, match="guidance must be"):
        m.conditional(y, -1.0)


def test_conv_net_classifier():
    net = ConvNet((1, 8, 8), 10, width=4)
    m = ClassifierEnergy(net, 10)
    x = torch.randn(3, 64)
    assert m.logits(x).shape == (3, 10)
    e, g = m.energy_and_grad(x)
    assert e.shape == (3,) and g.shape == (3, 64)


def test_validation():
    with pytest.raises(ValueError, match=r"net must return logits of shape \(B, 5\)"):
        ClassifierEnergy(FeedForward([6, 4]), 5).logits(torch.randn(2, 6))
    with pytest.raises(TypeError, match=r"net must be a torch\.nn\.Module"):
        ClassifierEnergy(lambda x: x, 3)
    with pytest.raises(ValueError, match="divisible by 4"):
        ConvNet((1, 6, 6), 10)


@pytest.mark.usefixtures("bfloat16_anywhere")
@pytest.mark.parametrize("activation", ["silu", "elu"])
@pytest.mark.parametrize("packed", [True, False], ids=["onednn-packed", "plain"])
def test_reduced_precision_gradients_are_close(packed, activation, monkeypatch):
    if packed and not mlp.hardware._packed_linear(torch.bfloat16):  # the kernel, not the policy
        pytest.skip("this CPU has no oneDNN packed bfloat16 kernels")
    monkeypatch.setattr(mlp.hardware, "packed_linear", lambda device, dtype: packed)
    m = model(64, activation)
    x = torch.randn(32, 6)
    e32, g32 = m.energy_and_grad(x)
    m.grad_dtype = torch.bfloat16
    e16, g16 = m.energy_and_grad(x)
    assert e16.dtype == torch.float32 and g16.dtype == torch.float32
    assert not torch.equal(g16, g32)  # the layers did run in bfloat16
    assert (e16 - e32).abs().max() < 0.05
    assert (g16 - g32).norm() / g32.norm() < 0.05
    conv = ClassifierEnergy(ConvNet((1, 8, 8), 10, width=4), 10)
    conv.grad_dtype = torch.bfloat16
    _, g = conv.energy_and_grad(torch.randn(3, 64))
    assert g.dtype == torch.float32


def test_large_batches_go_through_in_cache_blocks_with_the_same_result(monkeypatch):
    m = model(32)
    x = torch.randn(300, 6)
    whole = m.energy_and_grad(x)
    monkeypatch.setattr(mlp.hardware, "l2_cache_bytes", lambda: 2 * 32 * 4 * 100)  # 128-row blocks
    monkeypatch.setattr(mlp.hardware, "cache_blocking", lambda device: True)
    calls = []
    fused_pass = m.net._fused_pass
    monkeypatch.setattr(
        m.net, "_fused_pass", lambda h, *a: calls.append(len(h)) or fused_pass(h, *a)
    )
    blocked = m.energy_and_grad(x)
    assert calls == [128, 128, 44]
    for a, b in zip(blocked, whole, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.usefixtures("bfloat16_anywhere")
def test_reduced_precision_weights_follow_optimizer_steps():
    m = model(64)
    m.grad_dtype = torch.bfloat16
    x = torch.randn(4, 6)
    _, before = m.energy_and_grad(x)
    opt = torch.optim.SGD(m.parameters(), lr=1.0)
    m.energy(x).sum().backward()
    opt.step()
    _, after = m.energy_and_grad(x)
    m.grad_dtype = None
    _, exact = m.energy_and_grad(x)
    assert not torch.allclose(before, after)
    assert (after - exact).norm() / exact.norm() < 0.05


@pytest.mark.usefixtures("bfloat16_anywhere")
def test_fused_weights_follow_loaded_and_replaced_parameters():
    m, other = model(64), model(64)
    x = torch.randn(4, 6)
    m.grad_dtype = other.grad_dtype = torch.bfloat16
    m.energy_and_grad(x)
    m.load_state_dict(other.state_dict())
    torch.testing.assert_close(m.energy_and_grad(x), other.energy_and_grad(x))
    first = m.net.net[0]
    first.weight = torch.nn.Parameter(first.weight * 2)
    with torch.no_grad():
        other.net.net[0].weight.mul_(2)
    torch.testing.assert_close(m.energy_and_grad(x), other.energy_and_grad(x))


@pytest.mark.usefixtures("bfloat16_anywhere")
@pytest.mark.parametrize("copied", [False, True], ids=["original", "deepcopy"])
@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_fused_weights_follow_fused_optimizer_steps(optimizer, copied):
    """Fused optimizers update in place without version bumps; the cached copies
    (bfloat16, and packed float32 for large blocks) must still follow, in copies too."""
    m = model(64)
    if copied:
        m.energy_and_grad(torch.randn(300, 6))  # a copy made with prepared layers in it
        m = copy.deepcopy(m)
    x = torch.randn(300, 6)
    params = list(m.parameters())
    opt = (
        torch.optim.AdamW(params, lr=0.1, fused=True)
        if optimizer == "adamw"
        else torch.optim.SGD(params, lr=0.1, fused=True)
    )
    for dtype in (torch.bfloat16, None):
        m.grad_dtype = dtype
        m.energy_and_grad(x)
    m.energy(x).sum().backward()
    opt.step()
    for dtype in (torch.bfloat16, None):
        m.grad_dtype = dtype
        fused = m.energy_and_grad(x)[1]
        reference = _autograd_energy_and_grad(m.energy, x)[1]
        assert (fused - reference).norm() / reference.norm() < 0.05
