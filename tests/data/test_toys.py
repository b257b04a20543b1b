import math

import pytest
import torch
from scipy import stats

from ebmlab.data import load_dataset
from ebmlab.data.toys import TOYS, EightGaussians, make_toy
from ebmlab.partition import grid_points


@pytest.mark.parametrize("name", sorted(TOYS))
def test_log_prob_integrates_to_one(name):
    toy = make_toy(name)
    pts, cell = grid_points(toy.bounds, 800)
    total = torch.logsumexp(toy.log_prob(pts.float()).double(), 0).exp() * cell
    assert abs(float(total) - 1.0) < 5e-3


def chi_square_pvalue(toy, x, bins=12, sub=40):
    """Binned goodness of fit: counts of x against the quadrature of exp(log_prob) per bin."""
    (x0, x1), (y0, y1) = toy.bounds
    ix = ((x[:, 0] - x0) / (x1 - x0) * bins).long().clamp(0, bins - 1)
    iy = ((x[:, 1] - y0) / (y1 - y0) * bins).long().clamp(0, bins - 1)
    counts = torch.bincount(ix * bins + iy, minlength=bins * bins).double()
    pts, cell = grid_points(toy.bounds, bins * sub)
    dens = toy.log_prob(pts.float()).double().exp() * cell
    probs = dens.reshape(bins, sub, bins, sub).sum((1, 3)).reshape(-1)
    expected = probs / probs.sum() * len(x)
    keep = expected > 5
    chi2 = float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    return stats.chi2.sf(chi2, int(keep.sum()) - 1)


@pytest.mark.parametrize("name", sorted(TOYS))
def test_samples_match_log_prob(name):
    toy = make_toy(name)
    x = toy.sample(40_000, torch.Generator().manual_seed(3))
    assert chi_square_pvalue(toy, x) > 1e-4


def test_goodness_of_fit_rejects_a_wrong_sampler():
    """The check above can fail: samples from a ring of radius 2.1 are rejected."""
    x = EightGaussians(radius=2.1).sample(40_000, torch.Generator().manual_seed(3))
    assert chi_square_pvalue(EightGaussians(), x) < 1e-6


def test_eight_gaussians_modes_equal_weight():
    toy = EightGaussians()
    x = toy.sample(80_000, torch.Generator().manual_seed(0))
    weights = torch.bincount(toy.component(x), minlength=8).double() / len(x)
    assert (weights - 1 / 8).abs().max() < 0.01


def test_checkerboard_log_prob_values():
    toy = make_toy("checkerboard")
    x = torch.tensor([[-3.0, -3.0], [-1.0, -3.0], [5.0, 0.0]])
    lp = toy.log_prob(x)
    assert lp[0] == pytest.approx(-math.log(32))
    assert lp[1] == -math.inf and lp[2] == -math.inf


def test_toy_splits_are_fixed_and_distinct():
    a = load_dataset("rings", "train", n=100).x
    b = load_dataset("rings", "train", n=100).x
    c = load_dataset("rings", "test", n=100).x
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_bad_input_is_rejected():
    with pytest.raises(ValueError, match="name must be one of"):
        make_toy("spirals")
    with pytest.raises(ValueError, match="x must end in shape"):
        make_toy("8gaussians").log_prob(torch.zeros(3, 3))


def rejection_sample(toy, n, generator):
    """Independent exact sampler: uniform proposals in the box, accepted with p(x) / max p."""
    (x0, x1), (y0, y1) = toy.bounds
    pts, _ = grid_points(toy.bounds, 400)
    bound = 1.5 * float(toy.log_prob(pts.float()).exp().max())
    out = []
    while sum(len(o) for o in out) < n:
        u = torch.rand(20 * n, 2, generator=generator)
        cand = torch.stack([x0 + (x1 - x0) * u[:, 0], y0 + (y1 - y0) * u[:, 1]], 1)
        keep = torch.rand(20 * n, generator=generator) * bound < toy.log_prob(cand).exp()
        out.append(cand[keep])
    return torch.cat(out)[:n]


@pytest.mark.parametrize("name", sorted(TOYS))
def test_two_sample_test_against_rejection_sampling(name):
    from ebmlab.evaluation import mmd_permutation_test

    toy = make_toy(name)
    gen = torch.Generator().manual_seed(7)
    a = toy.sample(600, gen)
    b = rejection_sample(toy, 600, gen)
    _, p_value = mmd_permutation_test(a, b, n_permutations=100, generator=gen)
    assert p_value > 0.01
