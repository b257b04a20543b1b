import itertools

import pytest
import torch

from ebmlab.inference import (
    argmin_answer,
    candidate_energies,
    chain_energy,
    chain_free_energy,
    gradient_argmin,
    most_offending,
    most_offending_continuous,
    viterbi,
)


def test_candidate_energies_and_argmin():
    x = torch.tensor([[0.0], [2.0]])
    candidates = torch.tensor([[0.0], [1.0], [2.0]])
    table = candidate_energies(lambda xs, ys: ((xs - ys) ** 2).sum(1), x, candidates)
    assert table.shape == (2, 3)
    assert argmin_answer(table).tolist() == [0, 2]


def test_most_offending_respects_eps():
    energies = torch.tensor([[0.0, 0.1, 5.0, 0.3]])
    target = torch.tensor([0])
    assert most_offending(energies, target).tolist() == [1]
    positions = torch.tensor([0.0, 0.5, 3.0, 2.0])
    distances = (positions[:, None] - positions[None]).abs()
    assert most_offending(energies, target, distances=distances, eps=1.0).tolist() == [3]
    with pytest.raises(ValueError, match="no answer at distance"):
        most_offending(energies, target, distances=distances, eps=10.0)


def test_gradient_argmin_with_restarts_finds_the_global_minimum():
    # double well with a deeper minimum at y = -1
    def energy(y):
        return ((y**2 - 1) ** 2 + 0.3 * y).sum(1)

    y, _ = gradient_argmin(
        energy,
        torch.full((4, 1), 1.0),
        steps=300,
        lr=0.02,
        restarts=24,
        init_scale=1.5,
        generator=torch.Generator().manual_seed(0),
    )
    assert torch.allclose(y, torch.full((4, 1), -1.036), atol=0.01)
    y1, _ = gradient_argmin(
        energy, torch.full((4, 1), 1.0), steps=300, lr=0.02, restarts=1, init_scale=0.0
    )
    assert (y1 > 0).all()  # a single descent from y = 1 stays in the shallow well


def test_most_offending_continuous_stays_outside_the_ball():
    target = torch.tensor([[0.5, -0.5]])

    def energy(y):
        return ((y - target) ** 2).sum(1)  # minimum exactly at the target

    y, e = most_offending_continuous(
        energy, target, eps=0.3, steps=200, lr=0.05, generator=torch.Generator().manual_seed(0)
    )
    dist = float((y - target).norm())
    assert 0.3 < dist < 0.31 and float(e) == pytest.approx(0.09, rel=0.01)


def brute_force(unary, transition, beta):
    b, t, k = unary.shape
    seqs = torch.tensor(list(itertools.product(range(k), repeat=t)))
    energies = torch.stack([chain_energy(unary, transition, s.expand(b, t)) for s in seqs], 1)
    best = energies.argmin(1)
    return seqs[best], energies.min(1).values, -torch.logsumexp(-beta * energies, 1) / beta


@pytest.mark.parametrize("beta", [1.0, 3.0])
def test_viterbi_and_forward_match_brute_force(beta):
    gen = torch.Generator().manual_seed(0)
    unary = torch.randn(5, 4, 3, generator=gen, dtype=torch.float64)
    transition = torch.randn(3, 3, generator=gen, dtype=torch.float64)
    labels, energies = viterbi(unary, transition)
    want_labels, want_e, want_f = brute_force(unary, transition, beta)
    assert torch.equal(labels, want_labels)
    torch.testing.assert_close(energies, want_e)
    torch.testing.assert_close(chain_free_energy(unary, transition, beta), want_f)


def test_chain_marginals_match_brute_force():
    from ebmlab.inference import chain_marginals

    gen = torch.Generator().manual_seed(3)
    unary = torch.randn(2, 4, 3, generator=gen, dtype=torch.float64)
    transition = torch.randn(3, 3, generator=gen, dtype=torch.float64)
    seqs = torch.tensor(list(itertools.product(range(3), repeat=4)))
    energies = torch.stack([chain_energy(unary, transition, s.expand(2, 4)) for s in seqs], 1)
    p = torch.softmax(-2.0 * energies, 1)  # beta = 2
    want = torch.einsum("bs,stk->btk", p, torch.nn.functional.one_hot(seqs, 3).double())
    torch.testing.assert_close(chain_marginals(unary, transition, beta=2.0), want)
