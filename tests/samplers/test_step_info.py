"""Step reports against the run's summary (every sampler's reports are checked in
``tests/conformance/test_samplers.py``); the integrators and the shared warm-up tuning
behave as their papers say."""

import math

import pytest
import torch

from ebmlab.energies import DiagonalGaussian, Gaussian
from ebmlab.samplers import HMC, MALA, Langevin
from ebmlab.samplers.integrators import underdamped_step


def gaussian():
    return Gaussian(torch.tensor([1.0, -1.0]), torch.tensor([[1.0, 0.8], [0.8, 1.5]]))


def test_trace_agrees_with_the_run_summary_and_flags_divergences():
    """Mean acceptance probability of the kept steps matches the fraction accepted;
    a step far too large diverges, and the trace counts what the summary counts."""
    x0 = torch.randn(256, 2, generator=torch.Generator().manual_seed(0))
    run = MALA(0.5).run(gaussian(), x0, 200, burn_in=50, generator=1, trace=True)
    kept = run.trace["accept_prob"][50:].mean()
    assert abs(float(kept) - run.info["acceptance_rate"]) < 0.02
    assert 0.2 < float(kept) < 0.95
    run = HMC(50.0, 3, divergence_threshold=10.0).run(gaussian(), x0, 20, generator=1, trace=True)
    assert run.info["n_divergent"] == int(run.trace["divergent"].sum()) > 0
    assert (run.trace["accept_prob"][run.trace["divergent"]] == 0).all()
    assert Langevin(0.05).run(gaussian(), x0, 5, generator=0).trace is None  # opt-in


def test_progress_bar_shows_the_run_and_leaves_the_samples_alone(capsys):
    """``progress`` draws a bar of burn-in plus kept steps on stderr, under its label,
    and the chains are those of the run without it; without it nothing is printed."""
    x0 = torch.randn(64, 2, generator=torch.Generator().manual_seed(0))
    quiet = MALA(0.5).sample(gaussian(), x0, 70, burn_in=30, generator=3)
    assert capsys.readouterr().err == ""
    shown = MALA(0.5).sample(gaussian(), x0, 70, burn_in=30, generator=3, progress="chains")
    err = capsys.readouterr().err
    assert "chains" in err and "/100 [" in err  # burn-in and kept steps
    torch.testing.assert_close(shown, quiet, rtol=0, atol=0)


def test_obabo_applies_friction_gamma_per_step():
    """On a flat energy an OBABO step leaves E[v' | v] = exp(-gamma h) v: two half O
    steps make one step's worth of friction."""
    x = torch.zeros(200_000, 1)
    v = torch.ones_like(x)
    zero = lambda z: z.sum(1) * 0.0  # noqa: E731 - a flat energy
    gen = torch.Generator().manual_seed(0)
    _, v1, _, _ = underdamped_step(zero, x, v, torch.zeros_like(x), 0.5, 2.0, gen, "obabo")
    # sd of the mean: sqrt(1 - exp(-2 gamma h)) / sqrt(n) < 0.003
    assert abs(float(v1.mean()) - math.exp(-1.0)) < 0.01


def test_mala_tunes_a_diagonal_mass_on_an_ill_conditioned_gaussian():
    """With ``adapt_mass`` MALA's inverse mass learns the target's variances (scales
    0.1 ... 10), and the preconditioned chains recover them."""
    scales = torch.tensor([0.1, 1.0, 10.0], dtype=torch.float64)
    target = DiagonalGaussian(torch.zeros(3, dtype=torch.float64), scales)
    x0 = torch.randn(128, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    sampler = MALA(0.01, target_accept=0.574, adapt_mass=True)
    run = sampler.run(target, x0, 300, burn_in=600, thin=1, generator=3)
    ratio = run.final.inv_mass / scales**2
    assert (ratio / ratio.mean() - 1).abs().max() < 0.3
    assert torch.allclose(run.samples.reshape(-1, 3).std(0), scales, rtol=0.1)
    with pytest.raises(ValueError, match="adapt_mass=True needs target_accept"):
        MALA(0.1, adapt_mass=True)


def test_a_state_copy_changes_the_fields_named_and_refuses_others():
    """States are copied on every step without the frozen dataclass's ``__init__``
    (``samplers.base.replaced``): the copy is what ``dataclasses.replace`` gives, and a
    misspelt field is an error, not a silent new attribute."""
    import dataclasses

    from ebmlab.samplers.base import SamplerState

    state = MALA(0.5).init(torch.randn(4, 2), gaussian())
    x = torch.zeros(4, 2)
    copy = state.replace(x=x, t=3)
    assert copy == dataclasses.replace(state, x=x, t=3) and type(copy) is type(state)
    assert copy.x is x and state.t == 0 and copy.energy is state.energy
    with pytest.raises(TypeError, match=r"has no field \['steps'\]"):
        state.replace(steps=3)
    assert isinstance(state, SamplerState)
