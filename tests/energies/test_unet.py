"""The U-Net image networks: shapes, attention against PyTorch's, the dot-product head's
velocity, second derivatives."""

import pytest
import torch
from torch.nn import functional as F

from ebmlab.energies import ClassifierEnergy, ImageEnergy, UNetDot, UNetViT
from ebmlab.energies.unet import _Attention
from ebmlab.losses import flow_matching_loss


def small(shape=(1, 8, 8), k=3, **options):
    torch.manual_seed(0)
    settings = dict(width=8, mults=(1, 2), embed=16, heads=2, layers=1) | options
    return UNetViT(shape, k, **settings)


@pytest.mark.parametrize(
    "shape, mults, patch", [((1, 28, 28), (1, 2, 2), 7), ((3, 32, 32), (1, 2, 2, 2), 4)]
)
def test_shapes_levels_and_flat_rows(shape, mults, patch):
    net = small(shape, 10, mults=mults, patch=patch).eval()
    x = torch.randn(2, *shape)
    assert net(x).shape == (2, 10)
    torch.testing.assert_close(net(x.flatten(1)), net(x))
    pools = [m for m in net.modules() if isinstance(m, torch.nn.AvgPool2d)]
    assert len(pools) == len(mults) - 1


def test_written_out_attention_equals_pytorchs_fused_attention():
    """The attention computed by hand is scaled dot-product attention: the same as
    PyTorch's kernel on the same projections, head by head."""
    torch.manual_seed(0)
    attention = _Attention(16, 4)
    x = torch.randn(3, 5, 16)
    q, k, v = attention.qkv(x).view(3, 5, 3, 4, 4).permute(2, 0, 3, 1, 4)
    fused = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(3, 5, 16)
    torch.testing.assert_close(attention(x), attention.out(fused))


def test_flow_matching_of_the_potential_reaches_every_parameter():
    """-grad V regressed on flow targets differentiates the network twice. The residual
    blocks start as the identity (their last convolution at zero), so at first only
    that convolution of each block learns; after one step every parameter does, but
    the two biases that only shift V (the last norm's and the head's) and so leave
    -grad V as it is."""
    energy = ImageEnergy(small(k=1))
    optimizer = torch.optim.SGD(energy.parameters(), lr=1e-3)
    x1 = torch.rand(6, 64) * 2 - 1
    shifts = {"net.norm.bias", "net.head.bias"}
    for step in range(2):
        optimizer.zero_grad()
        gen = torch.Generator().manual_seed(step)
        flow_matching_loss(energy, x1, potential=True, generator=gen)[0].backward()
        optimizer.step()
        grads = {name: p.grad for name, p in energy.named_parameters()}
        assert all(grads[name] is None for name in shifts)
        moved = {n for n, g in grads.items() if g is not None and bool(g.abs().sum() > 0)}
        assert all(torch.isfinite(g).all() for n, g in grads.items() if n not in shifts)
        inner = {n for n in grads if ".body." in n and ".body.5." not in n}
        assert not (moved & inner) if step == 0 else moved == set(grads) - shifts


def test_a_classifier_energy_on_it():
    model = ClassifierEnergy(small(k=4), 4)
    x = torch.randn(3, 64)
    assert model.logits(x).shape == (3, 4) and model.energy(x).shape == (3,)


@pytest.mark.parametrize(
    "options, match",
    [
        (dict(embed=18, heads=4), "divisible by heads"),
        (dict(shape=(1, 10, 10), mults=(1, 2, 2)), "divisible by 4 for 3"),
        (dict(shape=(1, 8, 8), patch=3), "divisible by patch 3"),
        (dict(mults=()), "mults"),
    ],
)
def test_bad_settings(options, match):
    shape = options.pop("shape", (1, 8, 8))
    with pytest.raises(ValueError, match=match):
        small(shape, **options)


def dot(shape=(1, 8, 8), k=3):
    torch.manual_seed(0)
    net = UNetDot(shape, k, width=8, mults=(1, 2))
    for block in net.modules():  # leave the identity start: every block does something
        if hasattr(block, "body"):
            torch.nn.init.normal_(block.body[-1].weight, std=0.1)
    return net


def test_dot_head_classes_differ_by_the_bottleneck_read_out_alone():
    """out_k = <x, u(x)> + r_k(h): p(y | x) is the read-out's softmax, and JEM's energy
    is -<x, u(x)> - LogSumExp_y r_y(h). A patch-transformer head has no such split."""
    net, x = dot(k=4).eval(), torch.randn(5, 64)
    images, u, h = net.unet(x)
    assert images.shape == u.shape == (5, 1, 8, 8) and h.shape == (5, 16, 4, 4)
    inner = (images * u).flatten(1).sum(1)
    readout = net.readout(h.mean((2, 3)))
    torch.testing.assert_close(net(x), inner[:, None] + readout)
    model = ClassifierEnergy(net, 4)
    torch.testing.assert_close(model.energy(x), -inner - torch.logsumexp(readout, 1))
    torch.testing.assert_close(torch.softmax(model.logits(x), 1), torch.softmax(readout, 1))
    assert torch.allclose(net(x.view(5, 1, 8, 8)), net(x))


def test_dot_potential_velocity_is_the_unet_image_plus_its_transposed_jacobian():
    """-grad V for V = -out(x), with the read-out at zero, is u(x) + J_u(x)^T x (Wang &
    Du 2025's dot-product energy): the U-Net's own output image is one term of the
    velocity."""
    net = dot(k=1).double()
    torch.nn.init.zeros_(net.readout.weight)
    x = torch.randn(3, 64, dtype=torch.float64, requires_grad=True)

    def u(rows):
        return net.unet(rows)[1].flatten(1)

    potential = -net(x).sum()
    (velocity,) = torch.autograd.grad(-potential, x)
    _, transposed = torch.func.vjp(u, x)
    expected = u(x) + transposed(x.detach())[0]
    torch.testing.assert_close(velocity, expected)
    assert not torch.allclose(velocity, u(x), atol=1e-3)  # the Jacobian term is there


def test_flow_matching_of_the_dot_potential_reaches_every_parameter():
    """The flow loss differentiates the network twice; every parameter of the dot
    potential learns from it but the read-out's bias, which only shifts V."""
    energy = ImageEnergy(dot(k=1))
    loss, _ = flow_matching_loss(
        energy,
        torch.rand(6, 64) * 2 - 1,
        potential=True,
        generator=torch.Generator().manual_seed(0),
    )
    loss.backward()
    grads = {name: p.grad for name, p in energy.named_parameters()}
    assert grads.pop("net.readout.bias") is None
    assert all(g is not None and bool(g.abs().sum() > 0) for g in grads.values()), [
        n for n, g in grads.items() if g is None or not bool(g.abs().sum() > 0)
    ]


@pytest.mark.parametrize(
    "options, match",
    [
        (dict(num_outputs=0), "num_outputs"),
        (dict(mults=()), "mults"),
        (dict(image_shape=(1, 6, 6), mults=(1, 2, 2)), "divisible by 4"),
    ],
)
def test_dot_bad_settings(options, match):
    settings = dict(image_shape=(1, 8, 8), num_outputs=2, width=8) | options
    with pytest.raises(ValueError, match=match):
        UNetDot(**settings)
