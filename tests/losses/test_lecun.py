import math

import pytest
import torch
from torch.nn import functional as F

from ebmlab import losses as L

MARGIN_LOSSES = {
    "hinge": lambda c, o: L.hinge_loss(c, o, margin=0.5, reduction="none"),
    "log": lambda c, o: L.log_loss(c, o, reduction="none"),
    "lvq2": lambda c, o: L.lvq2_loss(c, o, delta=0.2, reduction="none"),
    "mce": lambda c, o: L.mce_loss(c, o, reduction="none"),
    "square_square": lambda c, o: L.square_square_loss(c, o, margin=2.0, reduction="none"),
    "square_exponential": lambda c, o: L.square_exponential_loss(c, o, gamma=0.7, reduction="none"),
}


def direct(name, c, o):
    """Each formula written out for scalars, straight from the 2006 tutorial."""
    return {
        "hinge": max(0.0, 0.5 + c - o),
        "log": math.log(1 + math.exp(c - o)),
        "lvq2": min(1.0, max(0.0, (c - o) / (0.2 * o))),
        "mce": 1 / (1 + math.exp(-(c - o))),
        "square_square": c**2 + max(0.0, 2.0 - o) ** 2,
        "square_exponential": c**2 + 0.7 * math.exp(-o),
    }[name]


PAIRS = [(0.3, 1.2), (1.5, 1.0), (2.0, 2.1), (0.9, 0.5)]


@pytest.mark.parametrize("name", list(MARGIN_LOSSES))
def test_margin_losses_match_their_formulas(name):
    c = torch.tensor([p[0] for p in PAIRS], dtype=torch.float64)
    o = torch.tensor([p[1] for p in PAIRS], dtype=torch.float64)
    got = MARGIN_LOSSES[name](c, o)
    want = torch.tensor([direct(name, *p) for p in PAIRS], dtype=torch.float64)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("name", list(MARGIN_LOSSES))
def test_margin_losses_push_the_right_way(name):
    """dL/dE(Y^i) >= 0 and dL/dE(Ybar) <= 0 everywhere (the tutorial's sign conditions)."""
    c = torch.linspace(0.1, 3.0, 15, dtype=torch.float64).repeat_interleave(15).requires_grad_()
    o = torch.linspace(0.1, 3.0, 15, dtype=torch.float64).repeat(15).requires_grad_()
    MARGIN_LOSSES[name](c, o).sum().backward()
    assert (c.grad >= 0).all() and (o.grad <= 0).all()


def test_hinge_is_zero_exactly_when_the_margin_is_met():
    c, o = torch.tensor([0.0, 0.0]), torch.tensor([1.0, 0.9])
    assert L.hinge_loss(c, o, margin=1.0, reduction="none").tolist() == pytest.approx([0.0, 0.1])


def test_perceptron_nll_and_mee():
    energies = torch.tensor([[1.0, 0.2, 3.0], [0.5, 0.7, -1.0]], dtype=torch.float64)
    target = torch.tensor([0, 2])
    torch.testing.assert_close(
        L.perceptron_loss(energies, target, reduction="none"),
        torch.tensor([0.8, 0.0], dtype=torch.float64),
    )
    # NLL with beta = 1 is the cross-entropy of softmax(-E)
    torch.testing.assert_close(L.nll_loss(energies, target), F.cross_entropy(-energies, target))
    beta = 2.5
    torch.testing.assert_close(
        L.nll_loss(energies, target, beta=beta), F.cross_entropy(-beta * energies, target) / beta
    )
    p = torch.softmax(-energies, 1)[[0, 1], [0, 2]]
    torch.testing.assert_close(L.mee_loss(energies, target, reduction="none"), 1 - p)


def test_nll_tends_to_the_perceptron_loss_as_beta_grows():
    energies = torch.randn(6, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    target = torch.tensor([0, 1, 2, 3, 4, 0])
    perceptron = L.perceptron_loss(energies, target)
    gaps = [
        abs(float(L.nll_loss(energies, target, beta=b) - perceptron)) for b in (1, 10, 100, 1000)
    ]
    assert gaps == sorted(gaps, reverse=True) and gaps[-1] < 1e-3


def test_energy_loss_and_contrastive_update():
    c, o = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 1.0])
    assert float(L.energy_loss(c)) == 1.5
    assert float(L.contrastive_update_loss(c, o, reduction="sum")) == -1.0


def test_bad_input():
    with pytest.raises(ValueError, match="same shape"):
        L.hinge_loss(torch.zeros(3), torch.zeros(2))
    with pytest.raises(ValueError, match="integer class indices"):
        L.nll_loss(torch.zeros(2, 3), torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="reduction must be one of"):
        L.log_loss(torch.zeros(2), torch.zeros(2), reduction="avg")
    with pytest.raises(ValueError, match="beta must be a finite number > 0"):
        L.mee_loss(torch.zeros(2, 3), torch.tensor([0, 1]), beta=0.0)
