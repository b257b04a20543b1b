"""SoftAbs Riemannian HMC (Betancourt 2013): the metric's smooth absolute value, the
force against finite differences of the Hamiltonian, a reversible generalised
leapfrog, the Euclidean leapfrog where the metric is constant, and the moments of a
funnel, from exact draws and from Stan's starts."""

import math
import warnings

import pytest
import torch

from ebmlab.energies import DiagonalGaussian
from ebmlab.samplers import NUTS, ParallelTempering, SoftAbsHMC
from ebmlab.samplers.diagnostics import SamplingWarning, effective_sample_size, split_rhat
from ebmlab.samplers.integrators import DenseMass, leapfrog
from ebmlab.samplers.riemannian import Geometry, softabs
from ebmlab.testing import assert_mean_close

SCALE = 3.0  # Neal's funnel: v ~ N(0, SCALE^2), x | v ~ N(0, e^v)


def funnel(z: torch.Tensor) -> torch.Tensor:
    v, x = z[:, 0], z[:, 1]
    return 0.5 * v**2 / SCALE**2 + 0.5 * x**2 * torch.exp(-v) + 0.5 * v


def bumpy(x: torch.Tensor) -> torch.Tensor:
    """A 3-d energy that is neither convex nor Gaussian, with a varying Hessian."""
    return (0.5 * x[:, 0] ** 2 * torch.exp(x[:, 1]) + x[:, 1] ** 2 / 18
            + torch.sin(x[:, 2] * x[:, 0]) + 0.1 * x[:, 2] ** 4)  # fmt: skip


def funnel_draws(n: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    v = torch.randn(n, generator=gen, dtype=torch.float64) * SCALE
    return torch.stack([v, torch.randn(n, generator=gen, dtype=torch.float64) * (v / 2).exp()], 1)


def test_softabs_is_a_smooth_absolute_value_with_its_derivative():
    """lambda coth(alpha lambda) is |lambda| far from 0 and 1 / alpha at 0; f' matches the
    numerical derivative across the switch from series to closed form (|alpha lambda| =
    0.1), and single precision keeps 1e-6 of double's."""
    lam = torch.linspace(-3, 3, 60001, dtype=torch.float64)
    f, fp = softabs(lam, 10.0)
    far = (10 * lam).abs() > 40
    torch.testing.assert_close(f[far], lam[far].abs(), rtol=1e-12, atol=0)
    assert float(softabs(torch.zeros(1, dtype=torch.float64), 10.0)[0]) == pytest.approx(0.1)
    numerical = torch.gradient(f, spacing=(lam,))[0]
    assert float((fp - numerical)[1:-1].abs().max()) < 1e-6
    f32, fp32 = softabs(lam.float(), 10.0)
    assert float(((f32.double() - f) / f).abs().max()) < 1e-6
    assert float((fp32.double() - fp).abs().max()) < 1e-5


@pytest.mark.parametrize("alpha", [1.0, 10.0, 1e6])
def test_force_is_the_gradient_of_the_hamiltonian(alpha):
    """dH/dx from one backward pass through the Hessian (the Daleckii-Krein form of the
    metric's derivative) against central differences of H(x, p) at fixed p."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 3, generator=gen, dtype=torch.float64)
    p = torch.randn(6, 3, generator=gen, dtype=torch.float64)
    force = Geometry.at(bumpy, x, alpha, graph=True).force(p)
    h, numerical = 1e-5, torch.zeros_like(x)
    for i in range(3):
        dx = torch.zeros_like(x)
        dx[:, i] = h
        up, down = (
            Geometry.at(bumpy, x + s * dx, alpha, graph=False).hamiltonian(p) for s in (1, -1)
        )
        numerical[:, i] = (up - down) / (2 * h)
    assert float(((force - numerical).abs() / (1 + numerical.abs())).max()) < 1e-7


def trajectory(sampler, energy, x, p, step, n):
    geometry = Geometry.at(energy, x, sampler.alpha, graph=True)
    failed = torch.zeros(len(x), dtype=torch.bool)
    for _ in range(n):
        geometry, p, broke = sampler.leapfrog(energy, geometry, p, step)
        failed |= broke
    return geometry, p, failed


def test_generalised_leapfrog_is_reversible_and_nearly_conserves_h():
    """From funnel draws, 6 steps of 0.1 forwards, the momentum flipped, 6 steps back: the
    start again to 1e-8 where the implicit updates were solved to 1e-10 (40 iterations;
    they contract linearly), and H changed by little."""
    sampler = SoftAbsHMC(n_leapfrog=6, fixed_point_steps=40, tolerance=1e-10)
    x = funnel_draws(16, seed=1)
    start = Geometry.at(funnel, x, sampler.alpha, graph=True)
    gen = torch.Generator().manual_seed(2)
    p = start.metric.momentum(torch.randn(x.shape, generator=gen, dtype=torch.float64))
    step = torch.full((16, 1), 0.1, dtype=torch.float64)
    end, p1, failed = trajectory(sampler, funnel, x, p, step, 6)
    back, p0, failed_back = trajectory(sampler, funnel, end.x.detach(), -p1, step, 6)
    solved = ~(failed | failed_back)
    assert int(solved.sum()) >= 12
    torch.testing.assert_close(back.x.detach()[solved], x[solved], rtol=0, atol=1e-8)
    torch.testing.assert_close(-p0[solved], p[solved], rtol=0, atol=1e-8)
    error = (end.hamiltonian(p1) - start.hamiltonian(p))[solved].abs()
    assert float(error.max()) < 0.5


def test_on_a_gaussian_it_is_the_euclidean_leapfrog_with_the_inverse_covariance():
    """A Gaussian's Hessian is its precision, constant, so (alpha large) the metric is
    the precision and the implicit updates are solved at their second iteration: the
    trajectory is ebmlab's Euclidean leapfrog with the dense inverse mass Sigma."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(3, 3, generator=gen, dtype=torch.float64)
    q, _ = torch.linalg.qr(a)
    cov = q @ torch.diag(torch.tensor([1e-4, 1.0, 1e2], dtype=torch.float64)) @ q.T
    precision = torch.linalg.inv(cov)

    def gaussian(x):
        return 0.5 * ((x @ precision) * x).sum(1)

    sampler = SoftAbsHMC(softabs=1e8, fixed_point_steps=2, tolerance=1e-9)
    x = torch.randn(8, 3, generator=gen, dtype=torch.float64) @ torch.linalg.cholesky(cov).T
    p = torch.randn(8, 3, generator=gen, dtype=torch.float64) @ torch.linalg.cholesky(precision).T
    step = torch.full((8, 1), 0.4, dtype=torch.float64)
    end, p1, failed = trajectory(sampler, gaussian, x, p, step, 5)
    assert not failed.any()
    grad = x @ precision
    x_e, p_e, _, _ = leapfrog(gaussian, x, p, grad, step[:, 0], 5, DenseMass(cov))
    torch.testing.assert_close(end.x.detach(), x_e, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(p1, p_e, rtol=1e-7, atol=1e-7)


def test_an_unsolved_implicit_update_is_a_rejected_divergence():
    """Two fixed-point iterations cannot solve the funnel's updates to 1e-12: every
    transition is divergent and no chain moves. On a Gaussian (a constant metric) the
    same settings solve them exactly: no divergence."""
    x0 = funnel_draws(8)
    sampler = SoftAbsHMC(1.0, 4, fixed_point_steps=2, tolerance=1e-12)
    run = sampler.run(funnel, x0, 5, thin=1, generator=0)
    assert run.info["n_divergent"] == 8 * 5
    assert torch.equal(run.samples[-1], x0)
    g = DiagonalGaussian(torch.zeros(2), torch.tensor([0.1, 10.0]))
    run = sampler.run(g, x0.float() / 10, 5, thin=1, generator=0)
    assert run.info["n_divergent"] == 0 and run.info["acceptance_rate"] > 0.5


@pytest.mark.slow
def test_samples_the_funnel_from_exact_draws_where_nuts_with_its_step_diverges():
    """Neal's funnel with sd 3 of v (the neck's scale is 1e-4 of the mouth's at 3 sd):
    with step 0.1 and no tuning, NUTS diverges on more than 1 % of its transitions,
    SoftAbsHMC on fewer than 0.5 %, and E[v] = 0, E[v^2] = 9 and P(x > 0) = 1/2 hold
    within 4 Monte Carlo errors after 60 transitions of 64 chains."""
    x0 = funnel_draws(64)
    run = SoftAbsHMC(0.1).run(funnel, x0, 60, thin=1, generator=1)
    with warnings.catch_warnings():  # NUTS's chains stuck in the neck are the point
        warnings.simplefilter("ignore", SamplingWarning)
        nuts = NUTS(0.1, adapt_mass=False).run(funnel, x0, 60, thin=1, generator=1)
    assert nuts.info["n_divergent"] > 0.01 * 64 * 60
    assert run.info["n_divergent"] < 0.005 * 64 * 60
    z = run.samples
    stats = torch.stack([z[..., 0], z[..., 0] ** 2, (z[..., 1] > 0).double()], -1)
    expected = torch.tensor([0.0, SCALE**2, 0.5], dtype=torch.float64)
    assert_mean_close(stats.reshape(-1, 3), expected, ess=effective_sample_size(stats))
    assert run.info["n_grad_evals"] == 64 * (1 + 60 * SoftAbsHMC().grad_evals_per_step(2))


@pytest.mark.slow
def test_warms_up_per_chain_step_sizes_from_stan_starts():
    """From uniform(-2, 2) starts with 100 warm-up steps, on a funnel with sd 1.5 of v,
    each chain has its own step size (tuned to acceptance 0.8); after 150 draws the
    chains agree (R-hat < 1.1; 1.03 here) and E[v] = 0, E[v^2] = 2.25 hold within 4 Monte
    Carlo errors. An event-shaped chain (B, 2, 1) runs through the same energy."""
    gen = torch.Generator().manual_seed(3)
    x0 = torch.rand(32, 2, 1, generator=gen, dtype=torch.float64) * 4 - 2

    def shaped(z):
        v, x = z[:, 0, 0], z[:, 1, 0]
        return 0.5 * v**2 / 1.5**2 + 0.5 * x**2 * torch.exp(-v) + 0.5 * v

    sampler = SoftAbsHMC(n_leapfrog=6, target_accept=0.8)
    run = sampler.run(shaped, x0, 150, burn_in=100, thin=1, generator=0)
    step = run.final.step_size
    assert step.shape == (32,) and float(step.std()) > 0
    z = run.samples[..., 0]
    assert float(split_rhat(z).max()) < 1.1
    stats = torch.stack([z[..., 0], z[..., 0] ** 2], -1)
    expected = torch.tensor([0.0, 1.5**2], dtype=torch.float64)
    assert_mean_close(stats.reshape(-1, 2), expected, ess=effective_sample_size(stats))


def test_dual_averaging_runs_through_the_window_ends():
    """Without a mass to re-estimate, the window ends (steps 15 and 90 of 100) restart
    stuck chains but not the step-size average: all 100 warm-up steps count in it."""
    target = DiagonalGaussian(torch.zeros(2, dtype=torch.float64), torch.tensor([0.1, 3.0]))
    sampler = SoftAbsHMC(n_leapfrog=2)
    x0 = torch.randn(8, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    state = sampler.begin_warmup(sampler.init(x0, target), 100)
    assert state.windows.checks == (15, 90)
    for _ in range(100):
        state = sampler.step(state, target, None)
    assert state.dual.count == 100


@pytest.mark.slow
def test_as_the_kernel_of_parallel_tempering():
    """Tempered, each temperature's chains form a group of the tuning (no restarts across
    them), and the metric follows beta E by itself: the cold replicas of a Gaussian with
    scales 0.1 and 3 have its means and variances within 4 Monte Carlo errors."""
    scales = torch.tensor([0.1, 3.0], dtype=torch.float64)
    target = DiagonalGaussian(torch.zeros(2, dtype=torch.float64), scales)
    pt = ParallelTempering(SoftAbsHMC(n_leapfrog=4), [1.0, 0.5, 0.25])
    gen = torch.Generator().manual_seed(0)
    x0 = torch.randn(16, 2, generator=gen, dtype=torch.float64)
    run = pt.run(target, x0, 100, burn_in=50, thin=1, generator=0)
    assert run.final.replicas.step_size.shape == (48,)
    cold = run.samples
    stats = torch.cat([cold, cold**2], -1)
    expected = torch.cat([torch.zeros(2, dtype=torch.float64), scales**2])
    assert_mean_close(stats.reshape(-1, 4), expected, ess=effective_sample_size(stats))


def test_bad_input():
    with pytest.raises(ValueError, match="softabs"):
        SoftAbsHMC(softabs=0.0)
    with pytest.raises(ValueError, match="fixed_point_steps"):
        SoftAbsHMC(fixed_point_steps=1)
    with pytest.raises(ValueError, match="tolerance"):
        SoftAbsHMC(tolerance=-1.0)
    with pytest.raises(ValueError, match="jitter"):
        SoftAbsHMC(jitter=1.0)
    with pytest.raises(ValueError, match="target_accept"):
        SoftAbsHMC(target_accept=1.5)

    def nowhere(x):
        return torch.full((len(x),), math.inf, dtype=x.dtype) + x.sum(1)

    with pytest.raises(ValueError, match=r"not finite at chain 0's start x0\[0\]"):
        SoftAbsHMC().run(nowhere, torch.zeros(4, 2), 2, burn_in=20)
