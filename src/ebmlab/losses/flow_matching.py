"""Flow matching and Equilibrium Matching: regress a field on the velocities of paired
paths between noise and data.

For pairs (x0, x1) of noise and data from a coupling, t ~ U(0, 1) and the linear
interpolant x_t = (1 - t) x0 + t x1, conditional flow matching minimises

    L(v) = E |v(x_t, t) - (x1 - x0)|^2

(Lipman et al. 2023, eq. 9; Liu et al. 2023; Tong et al. 2024, eq. 12 with a minibatch
OT coupling). It has the same gradient as the regression on the marginal field
v*(x, t) = E[x1 - x0 | x_t = x], whose flow carries the noise distribution to the data
distribution; L(v) - L(v*) = E |v - v*|^2. The field is a velocity model v(x, t) or,
with ``potential``, a time-independent scalar potential V(x) whose velocity is
-grad V(x): the warm-up of Energy Matching (Balcerak et al. 2025, eq. 5), which shapes
V before its contrastive phase sharpens it into a Boltzmann density.

Equilibrium Matching (Wang & Du 2025, eq. 4) drops the time: a time-independent field
f(x), the negative gradient of an implicit energy, regresses on the same velocity scaled
by c(gamma) = lambda min(1, (1 - gamma) / (1 - a)), which vanishes at the data
(gamma = 1, here t), so that the data are equilibria of f and samples are found by
descending the energy (:class:`~ebmlab.samplers.EquilibriumDescent`). The paper's
truncated decay uses a = 0.8 and lambda = 4.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.energies.base import EnergyLike, as_energy_fn
from ebmlab.samplers.integrators import gaussian_noise
from ebmlab.transport.couplings import Pairs, independent_pairs, ot_pairs
from ebmlab.transport.ode import Field
from ebmlab.transport.paths import linear_interpolant

COUPLINGS = ("independent", "ot")


def potential_velocity(potential: EnergyLike) -> Field:
    """The velocity field -grad V(x) of a time-independent potential V (B, ...) -> (B,),
    as a field (x, t) -> velocity that ignores t. It keeps the graph for training where
    gradients are recorded, and also answers under ``torch.no_grad`` (as in
    :func:`~ebmlab.transport.odeint`), without one."""
    fn = as_energy_fn(potential)

    def velocity(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        training = torch.is_grad_enabled()
        with torch.enable_grad():
            xg = x if x.requires_grad else x.detach().requires_grad_(True)
            (grad,) = torch.autograd.grad(fn(xg).sum(), xg, create_graph=training)
        return -grad

    return velocity


def _paths(
    x1: torch.Tensor,
    x0: torch.Tensor | None,
    coupling: str,
    sigma: float,
    generator: torch.Generator | None,
    labels: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Pairs]:
    """Pairs from the coupling (within the ``labels``' classes, if given), a time per
    pair, and each pair's point and velocity: (t, x_t, x1 - x0, pairs)."""
    _checks.tensor("x1", x1, min_ndim=2, floating=True, finite=True)
    if coupling not in COUPLINGS:
        raise ArgumentError(f"coupling must be one of {COUPLINGS}, got {coupling!r}")
    x0 = gaussian_noise(x1, generator) if x0 is None else x0
    if coupling == "ot":
        pairs = ot_pairs(x0, x1, labels=labels, generator=generator)
    else:  # row i's noise goes with row i's data: within its class already
        pairs = independent_pairs(x0, x1)
    t = torch.rand(len(x1), generator=generator, dtype=x1.dtype, device=x1.device)
    xt, target = linear_interpolant(pairs.x0, pairs.x1, t, sigma=sigma, generator=generator)
    return t, xt, target, pairs


def flow_matching_loss(
    field: Field | EnergyLike,
    x1: torch.Tensor,
    *,
    x0: torch.Tensor | None = None,
    coupling: str = "independent",
    potential: bool = False,
    sigma: float = 0.0,
    time_weight: Callable[[torch.Tensor], torch.Tensor] | None = None,
    labels: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean over the batch of w(t) |v(x_t, t) - (x1 - x0)|^2, summed over each
    example's dimensions, and metrics (the coupling's transport cost).

    Args:
        field: a velocity field v(x, t) for points (B, ...) and times (B,), or with
            ``potential`` a potential V (B, ...) -> (B,) whose velocity is -grad V.
        x1: data (B, ...).
        x0: noise paired with the data (default: standard normal draws).
        coupling: ``"independent"`` (pairs as drawn) or ``"ot"`` (a minibatch optimal
            transport plan, :func:`~ebmlab.transport.ot_pairs`).
        potential: ``field`` is a potential V, time-independent.
        sigma: the noise added to the interpolant (conditional flow matching of Tong et
            al. 2024; 0 for rectified-flow paths).
        time_weight: w(t), a weight per pair from its time (B,) (``None``: 1), such as
            :func:`flow_decay`.
        labels: the data's classes (B,) for class-conditional flow matching: the OT
            plan pairs noise with data of the same class only
            (:func:`~ebmlab.transport.ot_pairs`), and ``field`` is the class's own field
            for each row (e.g. ``ClassifierEnergy.conditional(labels)``, whose -grad
            is each row's class potential's).
        generator: source of the noise, the times and the plan's draws, on x1's device.
    """
    t, xt, target, pairs = _paths(x1, x0, coupling, sigma, generator, labels)
    velocity = potential_velocity(field) if potential else field
    residual = (velocity(xt, t) - target).flatten(1).square().sum(1)
    if time_weight is not None:
        residual = residual * time_weight(t)
    return residual.mean(), {"transport_cost": float(pairs.cost)}


def flow_decay(tau_star: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """w(t) = 1 up to ``tau_star``, then falling linearly to 0 at t = 1 (Balcerak et al.
    2025, the flow term's weight in Energy Matching's second phase): near the data the
    contrastive term alone shapes the potential."""
    return lambda t: ((1 - t) / (1 - tau_star)).clamp(0.0, 1.0)


def equilibrium_scale(t: torch.Tensor, decay_start: float = 0.8, scale: float = 4.0):
    """c(gamma) = scale min(1, (1 - gamma) / (1 - decay_start)) (Wang & Du 2025, the
    truncated decay): constant up to ``decay_start``, then falling linearly to 0 at the
    data (gamma = t = 1)."""
    return scale * torch.clamp((1 - t) / (1 - decay_start), max=1.0)


def equilibrium_matching_loss(
    energy: EnergyLike,
    x1: torch.Tensor,
    *,
    x0: torch.Tensor | None = None,
    decay_start: float = 0.8,
    scale: float = 4.0,
    coupling: str = "independent",
    labels: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Equilibrium Matching: mean over the batch of |-grad E(x_gamma) - c(gamma)
    (x1 - x0)|^2, with gamma ~ U(0, 1) and x_gamma = gamma x1 + (1 - gamma) x0 (Wang &
    Du 2025, eq. 4, for an explicit energy E whose negative gradient is the field).

    Args:
        energy: E (B, ...) -> (B,); its negative gradient is the learned field.
        x1: data (B, ...).
        x0: noise (default: standard normal draws).
        decay_start: a, where c(gamma) starts to fall to 0, in [0, 1).
        scale: lambda, the gradient's magnitude away from the data.
        coupling: ``"independent"`` or ``"ot"``, as for :func:`flow_matching_loss`.
        labels: the data's classes (B,), for a class-conditional energy, as for
            :func:`flow_matching_loss`.
        generator: source of the noise, the times and the plan's draws, on x1's device.
    """
    _checks.probability("decay_start", decay_start)
    if decay_start >= 1:
        raise ArgumentError(f"decay_start must be < 1, got {decay_start}")
    _checks.positive("scale", scale)
    t, xt, target, pairs = _paths(x1, x0, coupling, 0.0, generator, labels)
    c = equilibrium_scale(t, decay_start, scale).view(-1, *([1] * (x1.ndim - 1)))
    residual = potential_velocity(energy)(xt, t) - c * target
    loss = residual.flatten(1).square().sum(1).mean()
    return loss, {"transport_cost": float(pairs.cost)}
