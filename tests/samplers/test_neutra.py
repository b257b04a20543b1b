"""NeuTra (Hoffman et al. 2019): the autoregressive flow against its exact inverse and
Jacobian, the variational fit against a Gaussian's log Z, and the draws of a funnel
sampled in the flow's latent space against their exact moments."""

import math

import pytest
import torch

from ebmlab._checks import ArgumentError
from ebmlab.samplers import MALA, NUTS, FlowFitError, NeuTra
from ebmlab.samplers.diagnostics import effective_sample_size
from ebmlab.samplers.neutra import AutoregressiveFlow, fit_flow
from ebmlab.testing import assert_mean_close

D64 = torch.zeros((), dtype=torch.float64)


def random_flow(dim: int, layers: int, seed: int = 0) -> AutoregressiveFlow:
    """A flow far from the identity: every weight drawn at random."""
    gen = torch.Generator().manual_seed(seed)
    flow = AutoregressiveFlow(dim, layers, 16, gen, D64)
    with torch.no_grad():
        for p in flow.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return flow


def test_flow_is_autoregressive_and_its_log_det_is_the_jacobians():
    """log |det dT/dz| from one pass equals the log determinant of the Jacobian from
    autograd, which is triangular in each layer's order; the inverse recovers z."""
    flow = random_flow(4, 3)
    z = torch.randn(5, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with torch.no_grad():
        x, log_det = flow(z)
    for i in range(len(z)):
        jac = torch.autograd.functional.jacobian(lambda v: flow(v[None])[0][0], z[i])
        assert float(log_det[i]) == pytest.approx(float(torch.linalg.slogdet(jac)[1]), abs=1e-10)
    torch.testing.assert_close(flow.inverse(x), z, rtol=0, atol=1e-10)
    # one layer alone: coordinate i depends on the coordinates before it, not after
    one = random_flow(4, 1)
    jac = torch.autograd.functional.jacobian(lambda v: one(v[None])[0][0], z[0])
    assert float(jac.triu(1).abs().max()) == 0.0
    assert float(jac.tril(-1).abs().max()) > 0.01


def test_inverse_holds_where_a_guess_of_the_later_coordinates_overflows():
    """A funnel-like layer: coordinate 1 shifts by 30 x coordinate 0 and coordinate 2's
    log-scale is 50 x coordinate 1. Solving from x = (-1, -20, 1) with x itself as the
    first guess of z puts -20 where z_1 = 10 belongs, so the guess of z_2 overflows to
    inf, and masked weights times inf made every coordinate NaN. The inverse solves one
    rank per pass from zeros and recovers z."""
    flow = AutoregressiveFlow(3, 1, 4, None, D64)
    layer = flow.steps[0]
    with torch.no_grad():
        layer.w_skip[1, 0] = 30.0
        layer.w_skip[3 + 2, 1] = 50.0
    x = torch.tensor([[-1.0, -20.0, 1.0]], dtype=torch.float64)
    z = flow.inverse(x)
    assert bool(z.isfinite().all())
    torch.testing.assert_close(z[0, :2], torch.tensor([-1.0, 10.0], dtype=torch.float64))
    torch.testing.assert_close(flow(z)[0], x, rtol=1e-12, atol=0)


@pytest.mark.parametrize("samples", [1, 8])
def test_fit_reaches_a_gaussians_log_z(samples):
    """A correlated Gaussian is in the flow's family: the evidence lower bound (1
    sample a term) and the importance-weighted one (8) reach log Z = (D log 2 pi -
    log det P) / 2, and one fit step stays well below it."""
    precision = torch.tensor([[2.0, 0.9, 0.0], [0.9, 1.0, 0.3], [0.0, 0.3, 0.5]],
                             dtype=torch.float64)  # fmt: skip
    mean = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)

    def energy(x: torch.Tensor) -> torch.Tensor:
        r = x - mean
        return 0.5 * ((r @ precision) * r).sum(-1)

    log_z = 0.5 * (3 * math.log(2 * math.pi) - float(torch.logdet(precision)))
    gen = torch.Generator().manual_seed(0)
    flow = AutoregressiveFlow(3, 2, 16, gen, D64)
    elbo = fit_flow(energy, flow, torch.Size([3]), 600, 128, samples, 1e-2, gen)
    assert float(elbo) == pytest.approx(log_z, abs=0.02)
    x = flow(torch.randn(20000, 3, generator=gen, dtype=torch.float64))[0]
    assert_mean_close(x, mean, what="the fitted flow's mean")
    crude = AutoregressiveFlow(3, 2, 16, torch.Generator().manual_seed(0), D64)
    assert float(fit_flow(energy, crude, torch.Size([3]), 1, 256, samples, 1e-2, gen)) < log_z - 0.5


def funnel(x: torch.Tensor) -> torch.Tensor:
    """v ~ N(0, 1), each of two x | v ~ N(0, e^v): E[x^2] = e^(1/2)."""
    v, r = x[:, 0], x[:, 1:]
    return 0.5 * v**2 + 0.5 * (r**2 * torch.exp(-v)[:, None]).sum(1) + v


class NoJacobian(NeuTra):
    """The pulled-back energy without its log-determinant: the wrong target."""

    def pulled_back(self, energy, flow, event):
        return lambda z: energy(flow(z)[0].view(len(z), *event))


def funnel_moments(sampler: NeuTra, steps: int = 200):
    x0 = torch.rand(16, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    run = sampler.run(funnel, 4 * x0 - 2, steps, burn_in=steps, thin=1, generator=0)
    v, r = run.samples[..., 0], run.samples[..., 1:]
    stats = torch.stack([v, v**2, (r**2).mean(-1)], -1)  # (T, C, 3)
    return run, stats


@pytest.mark.slow
def test_funnel_moments_in_the_latent_space():
    """E[v], E[v^2] and E[x^2] of the funnel within 4 Monte Carlo errors, from the
    draws of NUTS in the latent space mapped back; without the Jacobian term they
    are not."""
    fit = {"layers": 2, "fit_steps": 500, "fit_batch": 128}
    run, stats = funnel_moments(NeuTra(NUTS(), **fit))
    exact = torch.tensor([0.0, 1.0, math.exp(0.5)], dtype=torch.float64)
    ess = effective_sample_size(stats)
    assert_mean_close(stats.flatten(0, 1), exact, ess=ess, what="the funnel's moments")
    assert run.info["n_divergent"] == 0
    # every gradient counted: the fit's and the chains' own
    inner = run.final.inner
    assert run.info["n_grad_evals_used"] == 500 * 128 + int(inner.chain_grad_evals.sum())
    # half the steps suffice to see the bias: 12-33 errors off at 100 + 100 steps
    _, wrong = funnel_moments(NoJacobian(NUTS(), **fit), steps=100)
    with pytest.raises(AssertionError):
        ess = effective_sample_size(wrong)
        assert_mean_close(wrong.flatten(0, 1), exact, ess=ess, what="the funnel's moments")


def test_seeded_runs_repeat_and_positions_keep_their_shape():
    x0 = torch.randn(4, 2, 2, generator=torch.Generator().manual_seed(0))

    def energy(x: torch.Tensor) -> torch.Tensor:
        return 0.5 * (x**2).flatten(1).sum(1)

    sampler = NeuTra(MALA(0.5), layers=1, hidden=8, fit_steps=20, fit_batch=32)
    a = sampler.run(energy, x0, 10, burn_in=5, thin=1, generator=3)
    b = sampler.run(energy, x0, 10, burn_in=5, thin=1, generator=3)
    assert a.samples.shape == (10, 4, 2, 2)
    assert a.samples.dtype == x0.dtype
    torch.testing.assert_close(a.samples, b.samples, rtol=0, atol=0)
    assert float(a.final.fit_elbo) < 0.5 * 4 * math.log(2 * math.pi) + 0.5


def test_bad_input_is_refused_before_sampling():
    with pytest.raises(ArgumentError, match="sampler must be an ebmlab Sampler"):
        NeuTra("nuts")
    for name in ("layers", "hidden", "fit_steps", "fit_batch", "fit_samples"):
        with pytest.raises(ArgumentError, match=name):
            NeuTra(**{name: 0})
    with pytest.raises(ArgumentError, match="learning_rate"):
        NeuTra(learning_rate=-1.0)
    with pytest.raises(ArgumentError, match="fit_batch must be a multiple of fit_samples"):
        NeuTra(fit_batch=100, fit_samples=8)

    def nowhere(x: torch.Tensor) -> torch.Tensor:
        return torch.full((len(x),), math.inf, dtype=x.dtype)

    with pytest.raises(ArgumentError, match="energy is not finite"):
        NeuTra(MALA(0.1), fit_steps=5).run(nowhere, torch.zeros(4, 2), 3)

    def narrow(x: torch.Tensor) -> torch.Tensor:
        return 5000.0 * (x * x).sum(-1)

    # the fit narrows the flow (sd 0.01), so its inverse overflows at a start of 1e308
    starts = torch.zeros(4, 2, dtype=torch.float64)
    starts[2, 1] = 1e308
    with pytest.raises(FlowFitError, match="chain 2's start"):
        NeuTra(MALA(0.1), fit_steps=100, fit_batch=8).run(narrow, starts, 3, generator=0)
    # a learning rate that takes the flow's weights past float64's range
    with pytest.raises(FlowFitError, match="fit diverged"):
        NeuTra(MALA(0.1), fit_steps=20, fit_batch=8, learning_rate=1e308).run(
            narrow, torch.zeros(4, 2, dtype=torch.float64), 3, generator=0
        )
