import pytest
import torch

from ebmlab.convergence import RESOLUTION_ULPS, working_tol


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_a_tolerance_is_raised_to_what_the_dtype_resolves(dtype):
    eps = torch.finfo(dtype).eps
    assert working_tol(1e-20, dtype) == RESOLUTION_ULPS * eps
    assert working_tol(1e-20, dtype, scale=100.0) == pytest.approx(100 * RESOLUTION_ULPS * eps)
    assert working_tol(0.5, dtype) == 0.5  # a coarse request is kept
