import torch

from ebmlab.evaluation import mmd2


def test_mmd_near_zero_for_same_distribution_and_positive_otherwise():
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(800, 2, generator=gen), torch.randn(800, 2, generator=gen)
    c = torch.randn(800, 2, generator=gen) + 0.5
    same, diff = mmd2(a, b), mmd2(a, c)
    assert abs(same) < 0.005
    assert diff > 10 * abs(same) and diff > 0.02
