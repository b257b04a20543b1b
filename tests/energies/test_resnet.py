"""The residual image networks: shapes, the WRN depth rule, normalisations, energies."""

import pytest
import torch

from ebmlab.energies import ClassifierEnergy, ImageEnergy, SNResNet, WideResNet
from ebmlab.samplers import Langevin


def count(net):
    return sum(p.numel() for p in net.parameters())


def test_wrn_28_10_has_the_published_size():
    """WRN-28-10 on CIFAR: 36.5 M parameters (Zagoruyko & Komodakis 2016, table 1)."""
    net = WideResNet((3, 32, 32), 10, depth=28, widen=10)
    assert count(net) == pytest.approx(36.5e6, rel=0.01)
    blocks = [m for m in net.modules() if type(m).__name__ == "_WideBlock"]
    assert len(blocks) == 12  # (28 - 4) / 6 = 4 blocks in each of 3 stages


@pytest.mark.parametrize("norm", ["none", "batch", "group", "layer"])
def test_wrn_norms_shapes_and_flat_rows(norm):
    net = WideResNet((3, 16, 16), 7, depth=10, widen=2, norm=norm, dropout=0.1, activation="silu")
    x = torch.randn(4, 3 * 16 * 16)
    assert net(x).shape == (4, 7)
    torch.testing.assert_close(net.eval()(x), net(x.view(4, 3, 16, 16)))
    has_bn = any(isinstance(m, torch.nn.BatchNorm2d) for m in net.modules())
    assert has_bn == (norm == "batch")


def test_snresnet_is_spectrally_normalised_and_samples():
    torch.manual_seed(0)
    net = SNResNet((1, 8, 8), 1, width=8, stages=2, blocks=2)
    convs = [m for m in net.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    assert convs and all(hasattr(m, "parametrizations") for m in convs)
    energy = ImageEnergy(net.eval())
    x = Langevin(0.01, 0.005).sample(energy, torch.randn(5, 64), 10, generator=0)
    assert x.shape == (5, 64) and torch.isfinite(x).all()


def test_wrn_as_a_jem_classifier_energy():
    model = ClassifierEnergy(WideResNet((3, 8, 8), 4, depth=10, widen=1), 4)
    x = torch.randn(3, 3, 8, 8)
    assert model.logits(x).shape == (3, 4) and model.energy(x).shape == (3,)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: WideResNet((3, 32, 32), 10, depth=27), "6n \\+ 4"),
        (lambda: WideResNet((3, 32, 32), 10, norm="instance"), "norm must be one of"),
        (lambda: WideResNet((32, 32), 10), "image_shape"),
        (lambda: WideResNet((3, 32, 32), 10, activation="tanhh"), "activation"),
        (lambda: SNResNet((3, 30, 30), 10, stages=3), "divisible by 4"),
        (lambda: ImageEnergy(torch.nn.Linear(3, 1)), "image network"),
    ],
)
def test_bad_settings(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()
