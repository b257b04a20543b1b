"""Couplings, paths, ODE integration and the flow-matching loss against known answers:
the optimal assignment by enumeration, the integrators' orders of accuracy on an ODE
with a closed-form solution, and for Gaussian data the optimal flow-matching field in
closed form (the loss's minimiser, whose flow carries the noise to the data)."""

import itertools
import math

import pytest
import torch

from ebmlab._checks import ArgumentError
from ebmlab.energies import ClassifierEnergy, FeedForward
from ebmlab.losses import flow_matching_loss
from ebmlab.losses.flow_matching import potential_velocity
from ebmlab.transport import independent_pairs, linear_interpolant, odeint, ot_pairs
from ebmlab.transport.couplings import sinkhorn_log_plan

MEAN, SD = 2.0, 0.5  # the data: N(MEAN, SD^2) in each of D dimensions; noise N(0, 1)


def optimal_field(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """E[x1 - x0 | x_t = x] for independent x0 ~ N(0, I), x1 ~ N(MEAN, SD^2 I):
    MEAN + (t SD^2 - (1 - t)) / ((1 - t)^2 + t^2 SD^2) (x - t MEAN)."""
    t = t[:, None]
    gain = (t * SD**2 - (1 - t)) / ((1 - t) ** 2 + t**2 * SD**2)
    return MEAN + gain * (x - t * MEAN)


def test_exact_ot_pairs_are_the_cheapest_permutation():
    g = torch.Generator().manual_seed(0)
    x0, x1 = torch.randn(6, 2, generator=g), torch.randn(6, 2, generator=g) + 1
    best = min(
        float((x0[list(p)] - x1).square().sum(1).mean()) for p in itertools.permutations(range(6))
    )
    pairs = ot_pairs(x0, x1, method="exact")
    assert float(pairs.cost) == pytest.approx(best, rel=1e-6)
    assert sorted(pairs.x0[:, 0].tolist()) == sorted(x0[:, 0].tolist())  # a permutation
    assert float(independent_pairs(x0, x1).cost) > best  # the identity is not the optimum here


def test_sinkhorn_plan_has_uniform_marginals_and_approaches_the_exact_cost():
    g = torch.Generator().manual_seed(1)
    x0, x1 = torch.randn(64, 3, generator=g), torch.randn(64, 3, generator=g) * 0.5 + 1
    cost = torch.cdist(x0, x1).square()
    plan = sinkhorn_log_plan(cost, 0.01 * float(cost.mean()), 500).exp()
    assert torch.allclose(plan.sum(0), torch.full((64,), 1 / 64), atol=1e-5)
    assert torch.allclose(plan.sum(1), torch.full((64,), 1 / 64), atol=1e-5)
    exact = float(ot_pairs(x0, x1, method="exact").cost)
    entropic = float((plan * cost).sum())
    assert exact <= entropic < exact * 1.05
    drawn = ot_pairs(x0, x1, method="sinkhorn", reg=0.01, n_iter=500, generator=g)
    assert float(drawn.cost) < 0.6 * float(independent_pairs(x0, x1).cost)
    with pytest.raises(ArgumentError, match="one shape"):
        ot_pairs(x0, x1[:10])


def test_linear_interpolant_moves_each_pair_at_constant_velocity():
    x0, x1 = torch.zeros(3, 2), torch.ones(3, 2) * torch.tensor([[1.0], [2.0], [3.0]])
    xt, u = linear_interpolant(x0, x1, torch.tensor([0.0, 0.5, 1.0]))
    assert torch.equal(xt, torch.tensor([[0.0, 0.0], [1.0, 1.0], [3.0, 3.0]]))
    assert torch.equal(u, x1 - x0)


@pytest.mark.parametrize("method,order", [("euler", 1), ("heun", 2), ("rk4", 4)])
def test_fixed_step_integrators_converge_at_their_order(method, order):
    """dx/dt = x cos t has x(1) = x(0) exp(sin 1): halving the step divides the error by
    2^order."""
    x0 = torch.tensor([[1.0], [-0.5]], dtype=torch.float64)
    exact = x0 * math.exp(math.sin(1.0))

    def field(x, t):
        return x * torch.cos(t)[:, None]

    errors = [float((odeint(field, x0, method=method, n_steps=n) - exact).abs().max())
              for n in (20, 40)]  # fmt: skip
    assert errors[0] / errors[1] == pytest.approx(2**order, rel=0.15)


def test_dopri5_meets_its_tolerance_per_row():
    x0 = torch.tensor([[1.0], [-0.5], [3.0]], dtype=torch.float64)
    rates = torch.tensor([1.0, 5.0, 20.0], dtype=torch.float64)  # one stiffer row

    def field(x, t):
        return rates[:, None] * x * torch.cos(rates * t)[:, None]

    out = odeint(field, x0, method="dopri5", rtol=1e-8, atol=1e-10)
    exact = x0 * torch.exp(torch.sin(rates))[:, None]
    assert torch.allclose(out, exact, rtol=1e-6)
    backwards = odeint(field, out, 1.0, 0.0, method="dopri5", rtol=1e-8, atol=1e-10)
    assert torch.allclose(backwards, x0, rtol=1e-6)


def test_odeint_takes_two_times_and_names_a_grid_passed_instead():
    """torchdiffeq's users pass a grid of times; odeint integrates from t0 to t1, given
    as numbers (0-d tensors too), and says so."""
    x0 = torch.ones(2, 1)
    with pytest.raises(ArgumentError, match=r"t0 must be a number, got a tensor of shape \(3,\)"):
        odeint(lambda x, t: -x, x0, torch.linspace(0, 1, 3))
    with pytest.raises(ArgumentError, match="t1 must be a finite number"):
        odeint(lambda x, t: -x, x0, 0.0, float("inf"))
    out = odeint(lambda x, t: -x, x0, torch.tensor(0.0), 1.0, n_steps=200)
    torch.testing.assert_close(out, x0 * math.exp(-1), rtol=1e-6, atol=0)


def test_the_flow_of_the_optimal_field_carries_noise_to_the_data():
    g = torch.Generator().manual_seed(2)
    x0 = torch.randn(20_000, 2, generator=g, dtype=torch.float64)
    x1 = odeint(optimal_field, x0, method="rk4", n_steps=50)
    se_mean, se_sd = SD / math.sqrt(len(x1)), SD / math.sqrt(2 * len(x1))
    assert (x1.mean(0) - MEAN).abs().max() < 4 * se_mean
    assert (x1.std(0) - SD).abs().max() < 4 * se_sd


def test_flow_matching_loss_is_least_at_the_optimal_field():
    """L(v) - L(v*) = E |v - v*|^2: a field off by a constant c pays |c|^2 more, within
    Monte Carlo error; a target of the wrong sign is far off."""
    x1 = MEAN + SD * torch.randn(200_000, 2, generator=torch.Generator().manual_seed(3))
    shift = torch.tensor([0.3, -0.4])

    def loss(field):
        return float(flow_matching_loss(field, x1, generator=torch.Generator().manual_seed(4))[0])

    base = loss(optimal_field)
    excess = loss(lambda x, t: optimal_field(x, t) + shift) - base
    assert excess == pytest.approx(float(shift.square().sum()), abs=0.02)
    assert loss(lambda x, t: -optimal_field(x, t)) > base + 1.0


def test_flow_matching_loss_takes_a_potential_and_an_ot_coupling():
    """A potential V(x) = theta |x|^2 / 2 has velocity -theta x: its loss is the field's,
    and the gradient reaches theta; the OT coupling pairs the noise with the data near
    the optimal transport cost."""
    g = torch.Generator().manual_seed(5)
    x1 = torch.randn(256, 2, generator=g) + 3
    x0 = torch.randn(256, 2, generator=g)
    theta = torch.tensor(0.7, requires_grad=True)

    def potential(x):
        return 0.5 * theta * x.square().sum(1)

    loss, metrics = flow_matching_loss(potential, x1, x0=x0, potential=True,
                                       generator=torch.Generator().manual_seed(6))  # fmt: skip
    by_field, _ = flow_matching_loss(lambda x, t: -0.7 * x, x1, x0=x0,
                                     generator=torch.Generator().manual_seed(6))  # fmt: skip
    assert float(loss) == pytest.approx(float(by_field), rel=1e-6)
    loss.backward()
    assert theta.grad is not None and float(theta.grad) != 0
    _, ot = flow_matching_loss(potential, x1, x0=x0, potential=True, coupling="ot")
    # independent pairs pay |3|^2 * 2 + 2 * 2 = 22 on average; the OT plan comes near
    # the squared Wasserstein distance of the two Gaussians, 18 (a pure translation)
    assert ot["transport_cost"] < 18.6 < metrics["transport_cost"]
    with pytest.raises(ArgumentError, match="coupling must be one of"):
        flow_matching_loss(potential, x1, coupling="nearest")


def test_ot_pairs_with_labels_pair_within_each_class_at_its_optimal_cost():
    """With labels, noise row i belongs to row i's class and pairs only within it: the
    exact plan costs the sum of each class's cheapest assignment, and Sinkhorn's draws
    keep the classes too. Without labels the cheaper plan crosses classes (the control)."""
    g = torch.Generator().manual_seed(7)
    y = torch.arange(12) % 3
    centres = torch.tensor([[4.0, 0.0], [-4.0, 0.0], [0.0, 4.0]])
    x0, x1 = torch.randn(12, 2, generator=g), centres[y] + 0.3 * torch.randn(12, 2, generator=g)

    def owners(pairs):  # the original row of each paired noise row
        return torch.cdist(pairs.x0, x0).argmin(1)

    best = 0.0
    for c in range(3):
        rows = (y == c).nonzero().flatten()
        best += min(float((x0[rows[list(p)]] - x1[rows]).square().sum()) / 12
                    for p in itertools.permutations(range(len(rows))))  # fmt: skip
    labelled = ot_pairs(x0, x1, method="exact", labels=y)
    assert torch.equal(y[owners(labelled)], y)
    assert float(labelled.cost) == pytest.approx(best, rel=1e-6)
    free = ot_pairs(x0, x1, method="exact")
    assert not torch.equal(y[owners(free)], y) and float(free.cost) < best
    big = torch.arange(96) % 3
    z0, z1 = torch.randn(96, 2, generator=g), centres[big] + torch.randn(96, 2, generator=g)
    drawn = ot_pairs(z0, z1, method="sinkhorn", labels=big, generator=g)
    assert torch.equal(big[torch.cdist(drawn.x0, z0).argmin(1)], big)
    with pytest.raises(ArgumentError, match="labels must be integer classes"):
        ot_pairs(x0, x1, labels=y.float())
    with pytest.raises(ArgumentError, match=r"shape \(12,\)"):
        ot_pairs(x0, x1, labels=y[:5])


CLASS_CENTRES = torch.tensor([[3.0, 0.0], [-3.0, 0.0]])


def _class_flow_ends(labelled: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the flows of class potentials E(x, y) = -NN(x)[y], trained by OT flow
    matching on two classes (N((3, 0), 0.3^2 I) and N((-3, 0), 0.3^2 I)) with or
    without the labels in the coupling, carry fresh noise; and the noise's labels."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    model = ClassifierEnergy(FeedForward([2, 64, 64, 2], "silu"), 2)
    optimizer = torch.optim.Adam(model.parameters(), 3e-3)
    for _ in range(300):
        y = torch.randint(2, (256,), generator=g)
        x1 = CLASS_CENTRES[y] + 0.3 * torch.randn(256, 2, generator=g)
        loss, _ = flow_matching_loss(model.conditional(y), x1, potential=True, coupling="ot",
                                     labels=y if labelled else None, generator=g)  # fmt: skip
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    y = torch.arange(2000) % 2
    field = potential_velocity(model.conditional(y))
    with torch.no_grad():
        return odeint(field, torch.randn(2000, 2, generator=g), n_steps=50), y


@pytest.mark.slow
def test_class_conditional_flow_matching_carries_each_class_noise_to_its_own_data():
    """With the labels in the OT coupling, each class's potential carries all of the
    noise to that class: every sample on its class's side, the means within 0.2 of the
    centres (a time-independent field leaves the spread along the axis wider than the
    data's 0.3; Energy Matching's contrastive phase is what shapes it). With pairs
    across classes (the control) a class's potential never learns the half of the noise
    the plan gave the other class, and its flow ends short: means 0.7 off."""
    x, y = _class_flow_ends(labelled=True)
    assert bool(((x[:, 0] > 0) == (y == 0)).all())
    for c in range(2):
        assert float((x[y == c].mean(0) - CLASS_CENTRES[c]).abs().max()) < 0.2
    x, y = _class_flow_ends(labelled=False)
    assert float((x[y == 0].mean(0) - CLASS_CENTRES[0]).abs().max()) > 0.5
