"""Approximate inference on pairwise energies against exhaustive enumeration."""

import itertools

import pytest
import torch

from ebmlab.energies import BoltzmannMachine
from ebmlab.inference import (
    PairwiseMRF,
    annealed_gibbs,
    chain_energy,
    chain_marginals,
    icm,
    mean_field,
    mean_field_free_energy,
)


def all_states(d: int, k: int) -> torch.Tensor:
    return torch.tensor(list(itertools.product(range(k), repeat=d)))


def random_mrf(b: int, d: int, k: int, scale: float, seed: int) -> PairwiseMRF:
    gen = torch.Generator().manual_seed(seed)
    unary = torch.randn(b, d, k, generator=gen, dtype=torch.float64)
    p = scale * torch.randn(d, d, k, k, generator=gen, dtype=torch.float64)
    p = (p + p.permute(1, 0, 3, 2)) / 2
    p[torch.arange(d), torch.arange(d)] = 0
    return PairwiseMRF(unary, p)


def exhaustive(mrf: PairwiseMRF) -> torch.Tensor:
    """(B, K^D) energies of every state."""
    states = all_states(mrf.n_sites, mrf.n_states)
    return torch.stack([mrf.energy(s.expand(mrf.unary.shape[0], -1)) for s in states], 1)


def test_special_cases_match_their_own_energies():
    gen = torch.Generator().manual_seed(0)
    unary, transition = torch.randn(3, 5, 4, generator=gen), torch.randn(4, 4, generator=gen)
    y = torch.randint(4, (3, 5), generator=gen)
    torch.testing.assert_close(
        PairwiseMRF.from_chain(unary, transition).energy(y), chain_energy(unary, transition, y)
    )
    bm = BoltzmannMachine(6)
    with torch.no_grad():
        bm.b.normal_(generator=gen)
        bm.W.normal_(generator=gen)
        bm.W.copy_((bm.W + bm.W.T) / 2 - torch.diag(torch.diagonal(bm.W)))
    x = torch.randint(2, (7, 6), generator=gen)
    mrf = PairwiseMRF.from_binary(bm.b.detach().expand(7, 6), bm.W.detach())
    torch.testing.assert_close(mrf.energy(x), bm.energy(x.float()).detach())


def test_annealed_gibbs_finds_the_exact_argmin_on_loopy_models():
    mrf = random_mrf(64, 8, 3, scale=1.0, seed=1)
    exact = exhaustive(mrf).min(1).values
    _, e = annealed_gibbs(mrf, 500, generator=0)
    found = (e - exact).abs() < 1e-9
    assert found.double().mean() >= 0.95
    assert (e >= exact - 1e-9).all()


def test_gibbs_at_unit_temperature_samples_the_boltzmann_distribution():
    mrf = random_mrf(1, 4, 2, scale=1.0, seed=2)
    probs = torch.softmax(-exhaustive(mrf)[0], 0)
    chains = PairwiseMRF(mrf.unary.expand(20_000, -1, -1), mrf.pairwise)
    y, _ = annealed_gibbs(chains, 20, beta_start=1.0, beta_end=1.0, generator=3)
    codes = (y * 2 ** torch.arange(3, -1, -1)).sum(1)
    freq = torch.bincount(codes, minlength=16).double() / len(codes)
    se = (probs * (1 - probs) / len(codes)).sqrt()
    assert ((freq - probs).abs() < 5 * se + 1e-3).all()


def test_icm_stops_in_a_single_site_local_minimum_below_its_start():
    mrf = random_mrf(32, 7, 3, scale=1.0, seed=4)
    start = torch.randint(3, (32, 7), generator=torch.Generator().manual_seed(5))
    y, e = icm(mrf, y0=start)
    assert (e <= mrf.energy(start) + 1e-12).all()
    for i in range(7):
        for a in range(3):
            moved = y.clone()
            moved[:, i] = a
            assert (mrf.energy(moved) >= e - 1e-9).all()


def test_mean_field_is_exact_without_couplings_and_close_on_weak_chains():
    free = random_mrf(4, 5, 3, scale=0.0, seed=6)
    q = mean_field(free)
    torch.testing.assert_close(q, torch.softmax(-free.unary, 2))
    # the free energy bound is tight when the distribution factorises
    log_z = torch.logsumexp(-exhaustive(free), 1)
    torch.testing.assert_close(mean_field_free_energy(free, q), -log_z)
    gen = torch.Generator().manual_seed(7)
    unary, transition = torch.randn(8, 6, 3, generator=gen), 0.2 * torch.randn(3, 3, generator=gen)
    q = mean_field(PairwiseMRF.from_chain(unary.double(), transition.double()))
    exact = chain_marginals(unary.double(), transition.double())
    assert (q - exact).abs().max() < 0.03


def test_mean_field_free_energy_bounds_the_exact_one():
    mrf = random_mrf(16, 6, 2, scale=1.5, seed=8)
    q = mean_field(mrf)
    exact = -torch.logsumexp(-exhaustive(mrf), 1)
    assert (mean_field_free_energy(mrf, q) >= exact - 1e-9).all()


def test_augmented_energy_subtracts_the_margin_times_hamming():
    mrf = random_mrf(5, 6, 3, scale=1.0, seed=9)
    gen = torch.Generator().manual_seed(10)
    y, other = torch.randint(3, (2, 5, 6), generator=gen)
    hamming = (y != other).sum(1).double()
    torch.testing.assert_close(
        mrf.augmented(y, 0.7).energy(other), mrf.energy(other) - 0.7 * hamming
    )


def test_bad_inputs():
    with pytest.raises(ValueError, match="symmetric"):
        PairwiseMRF(torch.zeros(1, 2, 2), torch.randn(2, 2, 2, 2))
    with pytest.raises(ValueError, match="pairwise must have shape"):
        PairwiseMRF(torch.zeros(1, 2, 2), torch.zeros(3, 3, 2, 2))
    mrf = random_mrf(2, 3, 2, 1.0, 0)
    with pytest.raises(ValueError, match="y0 must have 2 rows"):
        icm(mrf, y0=torch.zeros(3, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="n_sweeps"):
        annealed_gibbs(mrf, 0)
