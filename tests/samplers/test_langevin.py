import math

import pytest
import torch

from ebmlab.energies import DiagonalGaussian, EnergyModel
from ebmlab.samplers import Langevin
from ebmlab.testing import assert_mean_close


def test_ula_stationary_variance_matches_theory():
    """ULA on N(0, s^2) with step h has stationary variance s^2 / (1 - h / (2 s^2))."""
    s, h = 1.0, 0.2
    g = DiagonalGaussian(torch.zeros(1), torch.full((1,), s))
    x = Langevin(h).sample(g, torch.zeros(20_000, 1), 100, generator=0)
    theory = s**2 / (1 - h / (2 * s**2))
    se = theory * math.sqrt(2 / len(x))
    assert abs(float(x.var()) - theory) < 4 * se
    assert abs(float(x.var()) - s**2) > 4 * se  # the bias is real and measurable


def test_recovers_mean_of_shifted_gaussian():
    g = DiagonalGaussian(torch.tensor([2.0, -1.0]), torch.tensor([1.0, 0.5]))
    x = Langevin(0.01).sample(g, torch.zeros(4000, 2), 400, generator=1)
    assert_mean_close(x, g.mean)


def test_sgld_form_uses_independent_noise_scale():
    g = DiagonalGaussian(torch.zeros(3), torch.ones(3))
    x0 = torch.full((2, 3), 2.0)
    x = Langevin(0.1, noise_scale=0.0).sample(g, x0, 1)
    torch.testing.assert_close(x, x0 - 0.1 * x0)


def test_same_seed_same_chain_and_trajectory_shape():
    g = DiagonalGaussian(torch.zeros(2), torch.ones(2))
    a = Langevin(0.1).sample(g, torch.zeros(5, 2), 30, thin=10, generator=7)
    b = Langevin(0.1).sample(g, torch.zeros(5, 2), 30, thin=10, generator=7)
    assert a.shape == (3, 5, 2) and torch.equal(a, b)


def test_run_reports_info_and_clamps():
    g = DiagonalGaussian(torch.zeros(2), torch.ones(2))
    run = Langevin(0.5, clamp=(-0.5, 0.5), grad_clip=0.1).run(g, torch.zeros(8, 2), 10, burn_in=5)
    assert run.samples.abs().max() <= 0.5
    # one gradient per step: the final state's is left to a later step
    assert run.info["n_grad_evals"] == 8 * 15 and run.info["acceptance_rate"] == 1.0
    assert run.final.energy is None
    evaluated = run.final.evaluated(g)
    e, grad = g.energy_and_grad(run.final.x)
    torch.testing.assert_close(evaluated.energy, e)
    torch.testing.assert_close(evaluated.grad, grad)
    assert evaluated.n_grad_evals == 16 and evaluated.evaluated(g) is evaluated


def test_module_parameters_untracked_during_sampling_and_restored():
    class Recording(EnergyModel):
        """Uses the default autograd gradient and records whether parameters were tracked."""

        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(2))
            self.tracked = []

        def energy(self, x):
            self.tracked.append(self.w.requires_grad)
            return 0.5 * ((x * self.w) ** 2).sum(1)

    m = Recording()
    Langevin(0.01).sample(m, torch.zeros(3, 2), 2)
    assert m.tracked and not any(m.tracked)
    assert m.w.requires_grad and m.w.grad is None


def test_validation():
    with pytest.raises(ValueError, match="step_size must be a finite number > 0"):
        Langevin(0.0)
    with pytest.raises(ValueError, match="clamp must be a pair"):
        Langevin(0.1, clamp=(1.0, -1.0))
    with pytest.raises(ValueError, match="x0 contains NaN"):
        Langevin(0.1).sample(lambda x: (x**2).sum(1), torch.tensor([[math.nan]]), 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_watch_names_the_first_chain_and_step_that_turned_non_finite(dtype):
    from ebmlab.samplers import MetropolisHastings, NonFiniteChainError

    class Planted(MetropolisHastings):
        def step(self, state, energy, generator=None):
            x = torch.full_like(state.x, 3e4)  # finite, though a row sums beyond float16
            if state.t + 1 >= 100:
                x[3, 1] = math.nan
            if state.t + 1 >= 90:
                x[1, 0] = math.inf
            return state.replace(x=x, t=state.t + 1)

    x0 = torch.zeros(5, 4, dtype=dtype)
    with pytest.raises(NonFiniteChainError, match=r"chain 1 became .* at step 90 of 128"):
        Planted(0.1).sample(lambda x: x.sum(1), x0, 200)
    # the last, partial window is read at the end of the run
    with pytest.raises(NonFiniteChainError, match=r"chain 1 .* at step 90 of 95"):
        Planted(0.1).sample(lambda x: x.sum(1), x0, 95)
    Planted(0.1).sample(lambda x: x.sum(1), x0, 89)  # finite, if large, until then


def test_a_diverging_chain_stops_the_run_naming_step_and_chain():
    from ebmlab.samplers import NonFiniteChainError

    x0 = torch.zeros(4, 1)
    x0[2] = 3.0  # only this chain is thrown out by the quartic's gradient at h = 5
    with pytest.raises(NonFiniteChainError, match=r"chain 2 became non-finite .* at step [1-9]"):
        Langevin(5.0, 0.0).sample(lambda x: (x**4).sum(1), x0, 500)
