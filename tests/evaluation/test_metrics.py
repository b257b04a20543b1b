import torch

from ebmlab.evaluation import mmd2


def test_mmd_near_zero_for_same_distribution_and_positive_otherwise():
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(800, 2, generator=gen), torch.randn(800, 2, generator=gen)
    c = torch.randn(800, 2, generator=gen) + 0.5
    same, diff = mmd2(a, b), mmd2(a, c)
    assert abs(same) < 0.005
    assert diff > 10 * abs(same) and diff > 0.02


def test_permutation_test_rejects_different_distributions_only():
    from ebmlab.evaluation import mmd_permutation_test

    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(300, 2, generator=gen), torch.randn(300, 2, generator=gen)
    _, p_same = mmd_permutation_test(a, b, generator=gen)
    _, p_diff = mmd_permutation_test(a, b * 1.5, generator=gen)
    assert p_same > 0.05 and p_diff < 0.01
