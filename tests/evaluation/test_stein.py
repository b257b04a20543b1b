"""The kernel Stein discrepancy: kernel algebra, standard error, test size and power."""

import math

import pytest
import torch

from ebmlab.energies import Gaussian, GaussianMixture
from ebmlab.evaluation import kernel_stein_discrepancy
from ebmlab.evaluation.stein import stein_kernel_matrix

MEANS = torch.tensor([[-2.0, 0.0], [2.0, 0.0]])


def test_stein_kernel_matches_autograd():
    torch.manual_seed(0)
    x = torch.randn(4, 3, dtype=torch.float64)
    s = torch.randn(4, 3, dtype=torch.float64)
    c = 1.3
    got = stein_kernel_matrix(x, s, c)
    for i in range(4):
        for j in range(4):
            xi, xj = x[i].clone().requires_grad_(), x[j].clone().requires_grad_()
            k = (c**2 + ((xi - xj) ** 2).sum()) ** -0.5
            gx, gy = torch.autograd.grad(k, (xi, xj), create_graph=True)
            trace = sum(torch.autograd.grad(gx[d], xj, retain_graph=True)[0][d] for d in range(3))
            want = s[i] @ s[j] * k + s[i] @ gy + s[j] @ gx + trace
            assert abs(float(got[i, j] - want.detach())) < 1e-12


def test_size_and_power_at_1000_samples():
    """H0 true: rejections at 5 % stay near 5 %; a mixture shifted by 0.5: always found."""
    model = GaussianMixture.isotropic(MEANS, 1.0)
    wrong = GaussianMixture.isotropic(MEANS + torch.tensor([0.5, 0.0]), 1.0)
    gen = torch.Generator().manual_seed(0)
    runs = 30
    null = alt = 0
    for r in range(runs):
        x = model.sample(1000, gen)
        null += kernel_stein_discrepancy(x, model, n_bootstrap=500, generator=r).reject()
        alt += kernel_stein_discrepancy(x, wrong, n_bootstrap=500, generator=r).reject()
    assert null <= 4  # P(Binomial(30, 0.05) > 4) < 2 %
    assert alt >= 27


def test_standard_error_matches_spread_across_replicates():
    gen = torch.Generator().manual_seed(1)
    wrong = Gaussian(torch.tensor([0.3, 0.0]), torch.eye(2))
    results = [
        kernel_stein_discrepancy(torch.randn(400, 2, generator=gen), wrong, n_bootstrap=10)
        for _ in range(40)
    ]
    values = torch.tensor([r.ksd2 for r in results])
    reported = torch.tensor([r.stderr for r in results]).mean()
    assert 0.7 < float(values.std() / reported) < 1.4
    assert float(values.mean()) > 5 * float(reported) / math.sqrt(40)


def test_bad_input():
    model = Gaussian(torch.zeros(2), torch.eye(2))
    with pytest.raises(ValueError, match="at least 2 draws"):
        kernel_stein_discrepancy(torch.zeros(1, 2), model)
    with pytest.raises(ValueError, match="samples contains NaN"):
        kernel_stein_discrepancy(torch.tensor([[0.0, math.nan], [1.0, 1.0]]), model)
    with pytest.raises(ValueError, match="scale"):
        kernel_stein_discrepancy(torch.zeros(3, 2), model, scale=0.0)
