"""Energy Matching against its closed form: for Gaussian data N(m, s^2 I) the contrastive
phase's stationary potential is V = eps_max |x - m|^2 / (2 s^2), and its negatives
follow the generation schedule."""

import pytest
import torch

from ebmlab._checks import ArgumentError
from ebmlab.energies import Gaussian
from ebmlab.losses import energy_matching_loss
from ebmlab.losses.energy_matching import energy_matching_negatives
from ebmlab.samplers.energy_matching import energy_matching_temperature

M, S, EPS = torch.tensor([1.0, -1.0]), 0.5, 0.1


def test_temperature_is_zero_then_ramps_to_eps_max():
    t = torch.tensor([0.0, 0.5, 0.75, 1.0, 1.5])
    want = torch.tensor([0.0, 0.0, 0.05, 0.1, 0.1])
    assert torch.allclose(energy_matching_temperature(t, 0.5, 0.1), want)


def test_negatives_follow_the_boltzmann_density_of_the_potential():
    """For V = theta |x - m|^2 / 2 at eps_max the negatives end near N(m, eps / theta),
    from data and from noise alike; with eps_max -> 0 the noise-started ones flow to m."""
    theta = 0.4
    g = torch.Generator().manual_seed(0)

    def potential(x):
        return 0.5 * theta * (x - M).square().sum(1)

    data = M + S * torch.randn(4000, 2, generator=g)
    noise = torch.randn(4000, 2, generator=g)
    neg = energy_matching_negatives(potential, data, noise, tau_star=0.5, eps_max=EPS,
                                    steps=400, dt=0.05, generator=g)  # fmt: skip
    variance = EPS / (theta * (1 - theta * 0.05 / 2))  # ULA's stationary variance
    from_data, from_noise = neg[:4000], neg[4000:]
    assert (from_data.mean(0) - M).abs().max() < 0.03
    assert (from_data.var(0) / variance - 1).abs().max() < 0.06
    # from noise: no noise until tau_star, then the ramp ends at eps_max with the run
    assert (from_noise.mean(0) - M).abs().max() < 0.05
    assert ((from_noise.var(0) < variance) & (from_noise.var(0) > 0.3 * variance)).all()
    cold = energy_matching_negatives(potential, data[:0], noise, tau_star=0.5, eps_max=1e-12,
                                     steps=400, dt=0.05, generator=g)  # fmt: skip
    assert (cold - M).abs().max() < 5e-3  # (1 - theta dt)^400 = 3e-4 of the start's offset


def test_contrastive_phase_is_stationary_at_the_closed_form_potential():
    """d/dtheta (E_data V - E_neg V) = (D s^2 - E_neg |x - m|^2) / 2 for V = theta |x - m|^2
    / 2 and negatives from exp(-V / eps_max) (started at the data): zero at
    theta* = eps_max / s^2, about +0.12 at 2 theta* and -0.25 at theta* / 2."""
    g = torch.Generator().manual_seed(1)
    x1 = M + S * torch.randn(8000, 2, generator=g)
    star = EPS / S**2

    def gradient(theta_value: float) -> float:
        theta = torch.tensor(theta_value, requires_grad=True)

        def potential(x):
            return 0.5 * theta * (x - M).square().sum(1)

        loss, _ = energy_matching_loss(
            potential, x1, tau_star=0.5, eps_max=EPS, flow_weight=0.0, steps=300, dt=0.05,
            noise_starts=0.0, coupling="independent",
            generator=torch.Generator().manual_seed(2),
        )  # fmt: skip
        loss.backward()
        return float(theta.grad)

    at_star, above, below = gradient(star), gradient(2 * star), gradient(star / 2)
    # D s^2 / 2 = 0.25 sets the scale: at theta* the gradient is within a few percent of 0
    assert abs(at_star) < 0.015
    assert above == pytest.approx(0.12, abs=0.02) and below == pytest.approx(-0.25, abs=0.03)


def test_flow_phase_is_ot_flow_matching_and_bad_arguments_are_refused():
    x1 = M + S * torch.randn(64, 2, generator=torch.Generator().manual_seed(3))

    def potential(x):
        return 0.5 * x.square().sum(1)

    loss, metrics = energy_matching_loss(potential, x1, tau_star=0.5, eps_max=EPS, phase="flow")
    assert "contrastive_gap" not in metrics and metrics["flow_loss"] == pytest.approx(float(loss))
    with pytest.raises(ArgumentError, match="phase must be one of"):
        energy_matching_loss(potential, x1, tau_star=0.5, eps_max=EPS, phase="cd")
    with pytest.raises(ArgumentError, match="tau_star must be < 1"):
        energy_matching_loss(potential, x1, tau_star=1.0, eps_max=EPS)
    with pytest.raises(ArgumentError, match="cannot keep each row's class"):
        energy_matching_loss(potential, x1, tau_star=0.5, eps_max=EPS, negatives="smc",
                             labels=torch.arange(64) % 2)  # fmt: skip


def test_the_flow_term_decays_to_zero_at_the_data_in_the_joint_phase():
    """w(t) is 1 up to tau_star and falls linearly to 0 at t = 1; weighting the flow
    term by it is the unweighted term where w = 1, nothing where w = 0."""
    from ebmlab.losses.flow_matching import flow_decay, flow_matching_loss

    w = flow_decay(0.8)
    torch.testing.assert_close(
        w(torch.tensor([0.0, 0.5, 0.8, 0.9, 1.0])), torch.tensor([1.0, 1.0, 1.0, 0.5, 0.0])
    )
    potential = Gaussian(torch.zeros(2), torch.eye(2))
    x1 = torch.randn(64, 2, generator=torch.Generator().manual_seed(0))

    def loss(weight):
        gen = torch.Generator().manual_seed(1)  # the same pairs and times each time
        return flow_matching_loss(potential, x1, potential=True, time_weight=weight,
                                  generator=gen)[0]  # fmt: skip

    plain = loss(None)
    torch.testing.assert_close(loss(lambda t: torch.ones_like(t)), plain)
    assert float(loss(lambda t: torch.zeros_like(t))) == 0.0
    assert 0 < float(loss(w)) < float(plain)  # some pairs' times fall past tau_star


def test_smc_negatives_take_the_potentials_mode_weights_not_the_batchs():
    """V = -eps log p for modes of weights 0.2 and 0.8, 12 sds apart, and a batch split
    50/50 between them: SMC negatives fall 20 % in the light mode, as exp(-V / eps) does;
    the generation schedule started at the batch keeps its 50 %."""
    from ebmlab.energies import GaussianMixture
    from ebmlab.losses.energy_matching import boltzmann_negatives

    means = torch.tensor([[-3.0, 0.0], [3.0, 0.0]])
    p = GaussianMixture(torch.tensor([0.2, 0.8]), means, torch.eye(2).expand(2, 2, 2) * 0.0625)

    def potential(x):
        return EPS * p(x)

    g = torch.Generator().manual_seed(0)
    batch = means.repeat_interleave(1000, 0) + 0.25 * torch.randn(2000, 2, generator=g)
    drawn = boltzmann_negatives(potential, batch, eps_max=EPS, generator=g)
    share = float((drawn[:, 0] < 0).double().mean())
    assert abs(share - 0.2) < 0.05 and drawn.shape == batch.shape
    assert abs(float(drawn[drawn[:, 0] > 0, 1].std()) - 0.25) < 0.03
    chains = energy_matching_negatives(potential, batch, batch[:0], tau_star=0.5, eps_max=EPS,
                                       steps=200, dt=0.002, generator=g)  # fmt: skip
    assert abs(float((chains[:, 0] < 0).double().mean()) - 0.5) < 0.01
    with pytest.raises(ArgumentError, match="negatives must be one of"):
        energy_matching_loss(potential, batch, tau_star=0.5, eps_max=EPS, negatives="pcd")


def test_trimmed_negatives_and_the_clamp():
    """trim drops the negatives with the highest V from their mean; clamp stops the
    term at -clamp (the gradient is then zero)."""
    theta = torch.tensor(1.0, requires_grad=True)

    def potential(x):
        return theta * x[:, 0]

    g = torch.Generator().manual_seed(0)
    kwargs = dict(tau_star=0.5, eps_max=EPS, flow_weight=0.0, steps=1, dt=1e-9,
                  noise_starts=0.0, generator=g)  # fmt: skip
    # negatives started at the data (a step of 1e-9 leaves them there), one far away
    data = torch.cat([torch.zeros(9, 2), torch.tensor([[100.0, 0.0]])])
    _, metrics = energy_matching_loss(potential, data, **kwargs)
    assert metrics["contrastive_gap"] == pytest.approx(0.0, abs=1e-3)
    _, metrics = energy_matching_loss(potential, data, trim=0.1, **kwargs)
    # the far negative is dropped: mean V(data) = 10, mean V(kept negatives) ~ 0
    assert metrics["contrastive_gap"] == pytest.approx(10.0, abs=1e-3)
    # every negative started at noise placed at x = 5: V(data) - V(negatives) = -5
    far = dict(kwargs, noise_starts=1.0, x0=torch.full((10, 2), 5.0))
    low = energy_matching_loss(potential, torch.zeros(10, 2), **far)[0]
    assert float(low.detach()) == pytest.approx(-5.0, abs=1e-3)
    clamped = energy_matching_loss(potential, torch.zeros(10, 2), clamp=0.02, **far)[0]
    assert float(clamped.detach()) == pytest.approx(-0.02)
    clamped.backward()
    assert float(theta.grad) == 0.0
    with pytest.raises(ArgumentError, match="trim must be in"):
        energy_matching_loss(potential, data, trim=1.0, **kwargs)


def test_given_negatives_enter_the_contrastive_term_as_drawn():
    """A tensor of negatives (the caller's chains) is used as it is, detached: the gap
    is mean V(data) - mean V(negatives) and the potential's gradient is the gap's;
    negatives of another row shape are refused."""
    theta = torch.tensor(1.0, requires_grad=True)

    def potential(x):
        return theta * x[:, 0]

    data, drawn = torch.zeros(6, 2), torch.full((4, 2), 3.0, requires_grad=True)
    loss, metrics = energy_matching_loss(
        potential, data, tau_star=0.5, eps_max=EPS, flow_weight=0.0, negatives=drawn
    )
    assert metrics["contrastive_gap"] == pytest.approx(-3.0)
    loss.backward()
    assert float(theta.grad) == pytest.approx(-3.0) and drawn.grad is None
    with pytest.raises(ArgumentError, match="negatives must be rows shaped like"):
        energy_matching_loss(potential, data, tau_star=0.5, eps_max=EPS,
                             negatives=torch.zeros(4, 3))  # fmt: skip
