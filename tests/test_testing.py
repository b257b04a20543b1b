import pytest
import torch

from ebmlab.testing import assert_mean_close


def test_assert_mean_close_passes_and_fails():
    x = torch.randn(10_000, 3, generator=torch.Generator().manual_seed(0))
    assert_mean_close(x, torch.zeros(3))
    with pytest.raises(AssertionError, match="standard errors"):
        assert_mean_close(x, torch.full((3,), 0.1))
    # a small effective sample size widens the tolerance
    assert_mean_close(x, torch.full((3,), 0.1), ess=100)
