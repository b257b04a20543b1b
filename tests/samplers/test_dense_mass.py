"""A dense inverse mass (Stan's dense_e): its momentum, velocity and kinetic energy, the
pooled and regularised covariance the warm-up estimates, NUTS and AdaptiveHMC whitening
a strongly correlated Gaussian, the choice between dense and diagonal, and the starts it
refuses."""

import math

import pytest
import torch

from ebmlab._checks import ArgumentError
from ebmlab.samplers import NUTS, AdaptiveHMC, ParallelTempering, adaptation
from ebmlab.samplers.adaptation import WindowDraws, WindowStats, mass_spread
from ebmlab.samplers.base import SamplerState
from ebmlab.samplers.diagnostics import condition_number, effective_sample_size
from ebmlab.samplers.integrators import DenseMass, kinetic_energy, momentum, velocity, whiten


def correlated_gaussian(dim: int = 3, rho: float = 0.99):
    """N(mu, C) with unit variances and correlations rho^|i - j|, whose condition
    number (about 400 for rho 0.99) no diagonal mass reduces."""
    idx = torch.arange(dim, dtype=torch.float64)
    cov = rho ** (idx[:, None] - idx[None]).abs()
    mu = idx + 1.0
    prec = torch.linalg.inv(cov)

    def energy(x: torch.Tensor) -> torch.Tensor:
        d = x - mu
        return 0.5 * ((d @ prec) * d).sum(1)

    return energy, mu, cov


def test_momenta_velocity_kinetic_energy_and_whitening_follow_the_matrix():
    m_inv = torch.tensor([[2.0, 0.6], [0.6, 0.5]], dtype=torch.float64)
    mass = DenseMass(m_inv)
    p = torch.tensor([[1.0, -2.0], [0.5, 3.0]], dtype=torch.float64)
    torch.testing.assert_close(velocity(p, mass), p @ m_inv)
    quadratic = torch.einsum("bi,ij,bj->b", p, m_inv, p)
    torch.testing.assert_close(kinetic_energy(p, mass), 0.5 * quadratic)
    noise = torch.randn(200_000, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    draws = momentum(noise, mass)  # N(0, M), M = m_inv^-1
    torch.testing.assert_close(draws.T.cov(), torch.linalg.inv(m_inv), rtol=0.02, atol=0.02)
    # a diagonal mass is unchanged: p / sqrt(m) and m p
    diag = torch.tensor([4.0, 0.25], dtype=torch.float64)
    torch.testing.assert_close(momentum(noise[:2], diag), noise[:2] / 2 * torch.tensor([1.0, 4.0]))
    torch.testing.assert_close(velocity(p, diag), p * diag)
    # whitened positions: |w|^2 = x^T M x, and M^{1/2} x for a diagonal mass
    x = p.flip(1)
    quadratic = torch.einsum("bi,ij,bj->b", x, torch.linalg.inv(m_inv), x)
    torch.testing.assert_close(whiten(x, mass).square().sum(1), quadratic)
    torch.testing.assert_close(whiten(x, diag), x * torch.tensor([0.5, 2.0], dtype=torch.float64))


def test_the_window_covariance_pools_chains_and_is_shrunk_towards_the_diagonal_mass():
    """Three moving chains pooled, and a fourth left out: a stuck chain, which stays
    where it is (its distance from the others would inflate the estimate). Stan's
    shrinkage, with the diagonal mass in place of the identity."""
    g = torch.Generator().manual_seed(1)
    draws = torch.randn(40, 4, 3, generator=g, dtype=torch.float64) + torch.arange(4.0)[:, None]
    draws[:, 2] = torch.tensor([9.0, -9.0, 9.0], dtype=torch.float64)
    start = SamplerState.start(draws[0], torch.zeros(4), torch.zeros(4, 3), 0)
    window = WindowStats.begin(start, dense=True)
    for x in draws:
        window = window.add(x)
    keep = torch.tensor([True, True, False, True])
    pooled = draws[:, keep].reshape(-1, 3)
    n = len(pooled)
    diagonal = (n / (n + 5)) * pooled.var(0) + 1e-3 * (5 / (n + 5))
    expected = (n / (n + 5)) * pooled.T.cov() + 1e-3 * (5 / (n + 5)) * torch.diag(diagonal)
    torch.testing.assert_close(window.covariance(keep).matrix, expected.to(torch.float64))


def test_the_window_covariance_keeps_a_tight_correlation_of_badly_scaled_coordinates():
    """posteriordb's kilpisjarvi in shape: sds 30 and 0.0075, correlation -0.99999.
    From 32 chains x 25 exact draws the regularised covariance whitens the true one to
    a condition number below 3; shrunk towards the identity, as Stan shrinks it, the
    same estimate leaves over 1000 (the negative control)."""
    sd = torch.tensor([30.0, 0.0075], dtype=torch.float64)
    corr = torch.tensor([[1.0, -0.99999], [-0.99999, 1.0]], dtype=torch.float64)
    truth = sd[:, None] * corr * sd[None, :]
    g = torch.Generator().manual_seed(2)
    draws = (
        torch.randn(25, 32, 2, generator=g, dtype=torch.float64) @ torch.linalg.cholesky(truth).T
    )
    start = SamplerState.start(draws[0], torch.zeros(32), torch.zeros(32, 2), 0)
    window = WindowStats.begin(start, dense=True)
    for x in draws:
        window = window.add(x)

    def whitened(mass: torch.Tensor) -> float:
        factor = torch.linalg.cholesky(mass)
        inner = torch.linalg.solve_triangular(factor, truth, upper=False)
        return condition_number(torch.linalg.solve_triangular(factor, inner.T, upper=False))

    assert whitened(window.covariance(torch.ones(32, dtype=torch.bool)).matrix) < 3
    n = 32 * 25
    pooled = draws.reshape(-1, 2)
    stan = (n / (n + 5)) * pooled.T.cov() + 1e-3 * (5 / (n + 5)) * torch.eye(2)
    assert whitened(stan.to(torch.float64)) > 1000


@pytest.mark.parametrize(
    "sampler",
    [
        pytest.param(
            lambda dense: NUTS(max_depth=5, dense_mass=dense), id="nuts", marks=pytest.mark.slow
        ),
        pytest.param(lambda dense: AdaptiveHMC(dense_mass=dense), id="adaptive-hmc"),
    ],
)
def test_a_dense_mass_whitens_a_correlated_gaussian(sampler):
    """After warm-up the inverse mass is the target's covariance (within 0.25), the
    moments come out within Monte Carlo error, and the chains need several times fewer
    gradients per effective draw than with a diagonal mass (measured: 15-30x for NUTS
    over seeds 0-2, 4x for AdaptiveHMC)."""
    energy, mu, cov = correlated_gaussian()
    x0 = torch.rand(32, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 4 - 2
    efficiency = {}
    for dense, steps in ((False, 100), (True, 150)):  # the diagonal's trees are the deep ones
        run = sampler(dense).run(energy, x0, steps, burn_in=steps + 50, thin=1, generator=0)
        ess = effective_sample_size(run.samples)
        efficiency[dense] = float(ess.min()) / run.info["n_grad_evals_used"]
    flat = run.samples.flatten(0, 1)
    err = (cov.diagonal() / ess).sqrt()
    assert bool(((flat.mean(0) - mu).abs() < 5 * err).all())
    torch.testing.assert_close(flat.T.cov(), cov, rtol=0, atol=0.15)
    mass = run.final.inv_mass
    assert isinstance(mass, DenseMass)
    torch.testing.assert_close(mass.matrix, cov, rtol=0, atol=0.25)
    assert efficiency[True] > 3 * efficiency[False]


def test_a_dense_mass_needs_flat_untempered_chains():
    energy, _, _ = correlated_gaussian()
    with pytest.raises(ArgumentError, match=r"dense_mass needs chains of flat rows \(B, D\)"):
        images = torch.zeros(8, 1, 3)
        NUTS(dense_mass=True).run(lambda x: energy(x.flatten(1)), images, 5, burn_in=5)
    with pytest.raises(ArgumentError, match="a dense mass cannot be tempered"):
        ParallelTempering(AdaptiveHMC(dense_mass=True), [1.0, 0.5]).run(
            energy, torch.zeros(8, 3), 5, burn_in=5
        )


def _choice(draws: torch.Tensor, grad, arrived: torch.Tensor | None = None):
    """The mass a choosing window picks after the draws (T, B, D) with gradients grad(x),
    and the split test's spread where it refused a dense mass."""
    arrived = torch.ones(draws.shape[1], dtype=torch.bool) if arrived is None else arrived
    start = SamplerState.start(draws[0], torch.zeros(draws.shape[1]), torch.zeros_like(draws[0]), 0)
    window = WindowStats.begin(start, choose=True)
    for x in draws:
        window = window.add(x, grad=grad(x), arrived=arrived)
    return window.chosen_mass(torch.ones(draws.shape[1], dtype=torch.bool))


def _chosen(draws: torch.Tensor, grad, arrived: torch.Tensor | None = None):
    return _choice(draws, grad, arrived)[0]


def _gaussian_draws(cov: torch.Tensor, steps: int = 50, chains: int = 16):
    g = torch.Generator().manual_seed(0)
    chol, prec = torch.linalg.cholesky(cov), torch.linalg.inv(cov)
    draws = torch.randn(steps, chains, len(cov), generator=g, dtype=torch.float64) @ chol.T
    return draws, lambda x: x @ prec


def test_the_auto_mass_is_dense_only_where_it_makes_the_posterior_round():
    """Exact Gaussian draws: correlations of 0.99 (the diagonal leaves a condition number
    of about 400, the covariance 1) get the dense mass, near the target's covariance;
    independent coordinates on scales 0.01 to 1, or correlations of 0.5, the diagonal;
    so does Neal's funnel, which no covariance makes round; and so do too few draws
    (fewer than ten per coordinate), or far-behind chains' gradients, however steep."""
    _, _, cov = correlated_gaussian(rho=0.99)
    draws, grad = _gaussian_draws(cov)
    mass = _chosen(draws, grad)
    assert isinstance(mass, DenseMass)
    torch.testing.assert_close(mass.matrix, cov, rtol=0, atol=0.2)
    assert isinstance(_chosen(draws[:1, :2], grad), torch.Tensor)  # 2 draws of 3 coordinates
    scales = torch.diag(torch.tensor([1e-4, 1e-2, 1.0], dtype=torch.float64))
    for other in (correlated_gaussian(rho=0.5)[2], scales):
        draws, grad = _gaussian_draws(other)
        mass = _chosen(draws, grad)
        assert isinstance(mass, torch.Tensor)
        torch.testing.assert_close(mass, other.diagonal(), rtol=0.3, atol=0)
    # Neal's funnel in 4-d: v ~ N(0, 9), x_i | v ~ N(0, e^v)
    g = torch.Generator().manual_seed(1)
    z = torch.randn(50, 16, 4, generator=g, dtype=torch.float64)
    funnel = torch.cat([3 * z[..., :1], z[..., 1:] * (1.5 * z[..., :1]).exp()], -1)

    def funnel_grad(x):
        v, rest = x[:, :1], x[:, 1:]
        dv = v / 9 + 0.5 * rest.shape[1] - 0.5 * (rest**2 * (-v).exp()).sum(1, keepdim=True)
        return torch.cat([dv, rest * (-v).exp()], 1)

    assert isinstance(_chosen(funnel, funnel_grad), torch.Tensor)
    # a correlated target whose chains are not yet in: their gradients are left out
    draws, grad = _gaussian_draws(cov)
    steep = lambda x: grad(x) * torch.tensor([[1.0], [1e6]] + [[1.0]] * 14, dtype=x.dtype)  # noqa: E731
    behind = torch.ones(16, dtype=torch.bool)
    behind[1] = False
    assert isinstance(_chosen(draws, steep, behind), DenseMass)


def test_the_auto_mass_finds_a_ridge_its_chains_have_not_crossed():
    """A posterior along a narrow ridge (posteriordb's kilpisjarvi: intercept and slope
    at correlation -0.9999), whose chains under a diagonal mass have spread over a
    tenth of the ridge's length: the draws' covariance whitens the mean Hessian only to
    a condition number of about 100, and the diagonal leaves 10^6. The chosen mass is
    the Fisher-divergence one, Sigma F Sigma = C, which for a Gaussian is its covariance
    whatever the draws: it leaves the Hessian within 1.2 of round."""
    scales = torch.tensor([1.0, 0.01, 2.0], dtype=torch.float64)
    corr = torch.eye(3, dtype=torch.float64)
    corr[0, 1] = corr[1, 0] = -0.9999
    cov = scales[:, None] * corr * scales[None, :]
    precision = torch.linalg.inv(cov)
    eig, vec = torch.linalg.eigh(cov)
    eig[-1] /= 100  # the ridge's length, seen a tenth of the way
    seen = (vec * eig) @ vec.T
    g = torch.Generator().manual_seed(0)
    draws = torch.randn(50, 16, 3, generator=g, dtype=torch.float64) @ torch.linalg.cholesky(seen).T

    def whitened(inv_mass: torch.Tensor) -> float:
        chol = torch.linalg.cholesky(inv_mass)
        return condition_number(chol.T @ precision @ chol)

    flat = draws.flatten(0, 1)
    assert whitened(flat.T.cov()) > 50  # the window's covariance alone does not whiten
    mass = _chosen(draws, lambda x: x @ precision)
    assert isinstance(mass, DenseMass)
    assert whitened(mass.matrix) < 1.2


def _widening_ridge(widening: float):
    """Exact draws (50 steps x 16 chains) and gradients of a ridge x2 ~ N(x1, (w e^{k x1})^2)
    with x1, x3 ~ N(0, 1), w = 0.01: correlation 0.9999 between x1 and x2, a ridge whose
    width grows by e^k per unit of x1 (k = ``widening``)."""
    z = torch.randn(50, 16, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    width = lambda a: 0.01 * torch.exp(widening * a)  # noqa: E731
    draws = torch.stack([z[..., 0], z[..., 0] + width(z[..., 0]) * z[..., 1], z[..., 2]], -1)

    def grad(x):  # of x1^2 / 2 + r^2 / 2 + log width(x1) + x3^2 / 2, r = (x2 - x1) / width
        a, b, c = x.unbind(-1)
        r = (b - a) / width(a)
        da = a - r / width(a) * (1 + widening * (b - a)) + widening
        return torch.stack([da, r / width(a), c], -1)

    return draws, grad


def test_the_auto_mass_refuses_a_ridge_that_changes_width(monkeypatch):
    """A ridge of constant width is Gaussian: each half of its draws wants the same mass
    (spread 1), and the auto mass is dense. One whose width grows e-fold per sd along it
    passes the ridge test too, but its halves want masses about 40 apart (past
    SPLIT_LIMIT), so its mass stays diagonal; without the split test it would be dense."""
    draws, grad = _widening_ridge(0.0)
    flat = draws.flatten(0, 1)
    assert mass_spread(flat, grad(flat)) < 1.01
    mass, refused = _choice(draws, grad)
    assert isinstance(mass, DenseMass) and refused is None
    draws, grad = _widening_ridge(1.0)
    flat = draws.flatten(0, 1)
    spread = mass_spread(flat, grad(flat))
    assert spread > adaptation.SPLIT_LIMIT
    mass, refused = _choice(draws, grad)
    assert isinstance(mass, torch.Tensor) and refused == spread
    monkeypatch.setattr(adaptation, "SPLIT_LIMIT", float("inf"))
    assert isinstance(_chosen(draws, grad), DenseMass)
    # draws on a line (chains that barely moved) cannot tell: NaN, which refuses nothing
    line = torch.linspace(-1, 1, 300, dtype=torch.float64)[:, None].expand(300, 3)
    assert math.isnan(mass_spread(line, line))


def test_the_window_record_keeps_evenly_spaced_steps():
    """The record of a window's draws keeps at most its limit of steps: when full it drops
    every other one, so 50 steps into a record of 8 keep every 8th, from the first."""
    record = WindowDraws(limit=8)
    arrived = torch.tensor([True, False])
    for t in range(50):
        step = torch.full((2, 1), float(t))
        record = record.add(step, -step, arrived)
    x, grad = record.rows()
    assert record.every == 8
    assert x.flatten().tolist() == [0.0, 8.0, 16.0, 24.0, 32.0, 40.0, 48.0]
    torch.testing.assert_close(grad, -x)


@pytest.mark.slow
def test_the_auto_mass_runs_on_any_chains():
    """The default, ``dense_mass="auto"``: NUTS picks the dense mass for the correlated
    Gaussian and keeps it diagonal for a diagonal one; images and tempered chains get
    the diagonal mass without complaint; anything but True, False or "auto" is refused."""
    energy, _, _ = correlated_gaussian()
    x0 = torch.rand(16, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 4 - 2
    # short trees (at most 15 leapfrog steps) explore enough to choose the mass
    run = NUTS(max_depth=4).run(energy, x0, 20, burn_in=200, thin=1, generator=0)
    assert isinstance(run.final.inv_mass, DenseMass)
    scales = torch.tensor([0.2, 1.0, 5.0], dtype=torch.float64)
    run = NUTS(max_depth=4).run(lambda x: 0.5 * ((x / scales) ** 2).sum(1), x0, 20, burn_in=200,
                                thin=1, generator=0)  # fmt: skip
    assert isinstance(run.final.inv_mass, torch.Tensor)
    torch.testing.assert_close(run.final.inv_mass, scales**2, rtol=0.5, atol=0)
    images = torch.randn(16, 1, 3, generator=torch.Generator().manual_seed(1))
    run = NUTS().run(lambda x: 0.5 * (x**2).flatten(1).sum(1), images, 5, burn_in=150)
    assert run.final.inv_mass.shape == (1, 3)
    tempered = ParallelTempering(AdaptiveHMC(), [1.0, 0.5]).run(
        lambda x: energy(x.double()), x0, 5, burn_in=150
    )
    assert tempered.samples.shape[-1] == 3
    with pytest.raises(ArgumentError, match="dense_mass must be True, False or 'auto', got 'yes'"):
        NUTS(dense_mass="yes")
