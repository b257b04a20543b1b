"""WALNUTS (Bou-Rabee et al. 2025): NUTS when no step is split, reversible macro steps
where steps are split, and the right moments of a funnel where NUTS with the same step
diverges."""

import math

import pytest
import torch

from ebmlab.energies import DiagonalGaussian
from ebmlab.samplers import NUTS, WALNUTS
from ebmlab.samplers.base import where_rows
from ebmlab.samplers.diagnostics import effective_sample_size
from ebmlab.samplers.integrators import kinetic_energy, leapfrog
from ebmlab.samplers.nuts import _layouts
from ebmlab.testing import assert_mean_close

SCALE = 1.5  # of the funnel's log-scale coordinate v ~ N(0, SCALE^2)


def funnel(z: torch.Tensor) -> torch.Tensor:
    """Neal's funnel in two dimensions: v ~ N(0, SCALE^2), x | v ~ N(0, e^v)."""
    v, x = z[:, 0], z[:, 1]
    return 0.5 * v**2 / SCALE**2 + 0.5 * x**2 * torch.exp(-v) + 0.5 * v


def test_walnuts_that_never_halves_a_step_is_nuts():
    """With an error bound no step exceeds, every macro step is one leapfrog step: the
    same draws and gradient counts as NUTS from the same seed."""
    g = DiagonalGaussian(torch.zeros(3), torch.tensor([0.5, 1.0, 2.0]))
    x0 = g.sample(16, torch.Generator().manual_seed(0))
    runs = [
        kind(0.3, adapt_mass=False, max_depth=6, **extra).run(g, x0, 30, thin=1, generator=1)
        for kind, extra in ((NUTS, {}), (WALNUTS, {"max_error": 1e12}))
    ]
    assert torch.equal(runs[0].samples, runs[1].samples)
    for key in ("n_grad_evals", "n_grad_evals_used"):
        assert runs[0].info[key] == runs[1].info[key]


def macro_steps(sampler, point, step, mass):
    """Every chain's macro step from ``point`` (packed registers), run to its end: the
    fields of :class:`Move` as each chain finished it."""
    done, out = torch.zeros(len(point), dtype=torch.bool), {}
    steps = sampler._idle_steps(point)
    while not done.all():
        move, steps = sampler._advance(funnel, point, step, mass, ~done, steps)
        for name, value in move._asdict().items():
            if isinstance(value, torch.Tensor):
                out[name] = where_rows(move.ready, value, out.get(name, value))
        done |= move.ready
    return out


def test_a_macro_step_is_undone_by_the_reverse_step_unless_flagged_irreversible():
    """Macro steps of size 1 from the funnel's neck (v = -3) need several halvings. A
    step marked reversible, taken back from its end, chooses the same level and lands on
    its start; a step marked irreversible, taken back, chooses a coarser level and lands
    elsewhere: the flag says exactly when the reverse step differs."""
    gen = torch.Generator().manual_seed(0)
    n, mass = 512, 1.0
    sampler = WALNUTS(max_error=0.5, max_halvings=10)
    v = torch.full((n,), -3.0, dtype=torch.float64)
    x = torch.randn(n, generator=gen, dtype=torch.float64) * math.exp(-1.5)
    z = torch.stack([v, x], 1).requires_grad_(True)
    e = funnel(z)
    (grad,) = torch.autograd.grad(e.sum(), z)
    z, e = z.detach(), e.detach()
    p = torch.randn(n, 2, generator=gen, dtype=torch.float64)
    P = _layouts(2)[0]
    step = torch.ones(n, dtype=torch.float64)
    out = macro_steps(sampler, P.pack(z, x=z, p=p, grad=grad, energy=e), step, mass)
    assert (out["grads"] > 1).float().mean() > 0.5  # most steps were halved
    end = P.pack(z, x=out["x"], p=out["p"], grad=out["grad"], energy=out["energy"])
    back = macro_steps(sampler, end, -step, mass)
    returned = (back["x"] - z).abs().amax(1) < 1e-8
    reversible = ~out["diverged"] & ~out["irreversible"]
    irreversible = ~out["diverged"] & out["irreversible"]
    assert reversible.sum() > 100 and irreversible.sum() > 0
    assert returned[reversible].all() and not back["irreversible"][reversible].any()
    assert torch.equal(back["grads"][reversible], out["grads"][reversible])
    assert not returned[irreversible].any()
    # a reverse step that stops at a coarser level has taken fewer gradients
    assert (back["grads"][irreversible] < out["grads"][irreversible]).all()
    # the coarsest level's energy error is the step-size statistic
    _, p1, e1, _ = leapfrog(funnel, z, p, grad, step, 1, mass)
    error = (e1 + kinetic_energy(p1, mass) - e - kinetic_energy(p, mass)).abs()
    assert torch.allclose(out["log_accept"], -torch.nan_to_num(error, nan=math.inf))


@pytest.mark.slow
def test_walnuts_keeps_the_funnel_where_nuts_with_its_step_diverges():
    """From exact draws of the funnel, macro steps of 1.0 (NUTS diverges on about 5 % of
    its transitions with that step) halve where the neck needs it: no divergence, and
    E[v] = 0, E[v^2] = SCALE^2 and E[x^2] = exp(SCALE^2 / 2) within 4 Monte Carlo
    errors after 100 transitions, so the halved, reverse-checked steps leave the target
    in place."""
    gen = torch.Generator().manual_seed(0)
    v = torch.randn(128, generator=gen, dtype=torch.float64) * SCALE
    x0 = torch.stack([v, torch.randn(128, generator=gen, dtype=torch.float64) * (v / 2).exp()], 1)
    expected = torch.tensor([0.0, SCALE**2, math.exp(SCALE**2 / 2)], dtype=torch.float64)
    runs = {
        kind: kind(1.0, adapt_mass=False).run(funnel, x0, 100, thin=1, generator=1)
        for kind in (WALNUTS, NUTS)
    }
    assert runs[NUTS].info["n_divergent"] > 0.02 * 128 * 100
    run = runs[WALNUTS]
    assert run.info["n_divergent"] == 0
    assert run.info["n_grad_evals_used"] > 1.5 * runs[NUTS].info["n_grad_evals_used"]
    z = run.samples
    stats = torch.stack([z[..., 0], z[..., 0] ** 2, z[..., 1] ** 2], -1)
    assert_mean_close(stats.reshape(-1, 3), expected, ess=effective_sample_size(stats))


@pytest.mark.cuda
def test_walnuts_keeps_the_funnel_on_a_gpu():
    """On an accelerator nothing is read back to the host within a macro step: the trees'
    bookkeeping runs at every micro step, masked. The funnel's moments hold there too."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    v = torch.randn(128, generator=gen, dtype=torch.float64, device="cuda") * SCALE
    x = torch.randn(128, generator=gen, dtype=torch.float64, device="cuda") * (v / 2).exp()
    run = WALNUTS(1.0, adapt_mass=False).run(funnel, torch.stack([v, x], 1), 100, thin=1,
                                             generator=1)  # fmt: skip
    assert run.info["n_divergent"] == 0
    z = run.samples
    stats = torch.stack([z[..., 0], z[..., 0] ** 2, z[..., 1] ** 2], -1)
    expected = torch.tensor([0.0, SCALE**2, math.exp(SCALE**2 / 2)], dtype=torch.float64)
    assert_mean_close(stats.reshape(-1, 3).cpu(), expected,
                      ess=effective_sample_size(stats.cpu()))  # fmt: skip


def test_validation():
    with pytest.raises(ValueError, match="max_error"):
        WALNUTS(max_error=0.0)
    with pytest.raises((ValueError, TypeError), match="max_halvings"):
        WALNUTS(max_halvings=0)
    with pytest.raises(ValueError, match="max_depth"):
        WALNUTS(max_depth=0)
