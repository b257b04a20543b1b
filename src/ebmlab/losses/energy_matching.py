"""Energy Matching (Balcerak et al. 2025): one time-independent potential V that
transports noise to data and is, near the data, a Boltzmann density exp(-V / eps_max).

Training has two phases. The warm-up regresses -grad V on optimal-transport
flow-matching velocities (:func:`~ebmlab.losses.flow_matching_loss` with
``potential=True, coupling="ot"``; their eq. 5). The second phase adds a contrastive
term, E_data[V] - E_neg[V] (their eq. 7), whose negatives follow the generation
dynamics (:class:`~ebmlab.samplers.EnergyMatchingSampler`)
x <- x - dt grad V(x) + sqrt(2 eps(t) dt) xi. The temperature eps(t) is 0 before
tau_star (a noise-free flow), rises linearly to eps_max at t = 1, and stays there. Half
of the negatives start at data (t = 1: Langevin at eps_max), half at noise (t = 0: the
whole flow), so that the contrastive term shapes V both on the data and on the paths
that lead there. At its stationary point, with negatives drawn from
exp(-V / eps_max), V = -eps_max log p_data + const (a Gaussian data set gives
V = eps_max |x - m|^2 / (2 s^2)). Negatives started at noise reach eps_max only at the
schedule's end, so with them the stationary point moves slightly.

Chains that start at the data or at the flow's end keep the mode weights they start
with: they hardly cross between modes, so the contrastive term corrects each mode's
shape but not the modes' relative weights (docs/results/density.md). With
``negatives="smc"`` the negatives are instead draws of exp(-V / eps_max) by tempered
SMC from a Gaussian covering the batch (:func:`~ebmlab.partition.smc_sample`), whose
population moves mass between the modes by their weights, and the contrastive term is
the log-likelihood gradient of the Boltzmann density.
"""

from __future__ import annotations

import torch

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.energies.analytic import DiagonalGaussian
from ebmlab.energies.base import EnergyLike, as_energy_fn
from ebmlab.losses.flow_matching import flow_decay as decay
from ebmlab.losses.flow_matching import flow_matching_loss
from ebmlab.partition.smc import smc_sample
from ebmlab.samplers.energy_matching import EnergyMatchingSampler
from ebmlab.samplers.hmc import HMC
from ebmlab.samplers.integrators import gaussian_noise

PHASES = ("flow", "joint")
NEGATIVES = ("generation", "smc")
# smc negatives: the base is N(mean, (BASE_WIDTH sd)^2) of the batch, the moves HMC of
# SMC_LEAPFROG steps of SMC_STEP_PER_SD times the batch's mean sd
BASE_WIDTH, SMC_STEP_PER_SD, SMC_LEAPFROG = 1.5, 0.035, 5


def energy_matching_negatives(
    potential: EnergyLike,
    x_data: torch.Tensor,
    x_noise: torch.Tensor,
    *,
    tau_star: float,
    eps_max: float,
    steps: int = 200,
    dt: float = 0.01,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Negatives for the contrastive phase: ``steps`` steps of
    :class:`~ebmlab.samplers.EnergyMatchingSampler` from the data (at t = 1 throughout)
    and from the noise (t going from 0 to 1 over the steps), concatenated (data-started
    first), detached.

    Args:
        potential: V (B, ...) -> (B,).
        x_data: data starts (B1, ...).
        x_noise: noise starts (B2, ...).
        tau_star: where the temperature starts to rise, in [0, 1).
        eps_max: the temperature at and after t = 1.
        steps: generation steps.
        dt: the step size.
        generator: source of the noise, on the data's device.
    """
    _checks.positive_int("steps", steps)
    _checks.positive("dt", dt)
    x = torch.cat([x_data, x_noise]).detach()
    start = torch.cat([x.new_ones(len(x_data)), x.new_zeros(len(x_noise))])
    sampler = EnergyMatchingSampler(
        dt, tau_star=tau_star, eps_max=eps_max, flow_steps=steps, start_time=start
    )
    return sampler.sample(potential, x, steps, generator=generator)


def boltzmann_negatives(
    potential: EnergyLike,
    x_data: torch.Tensor,
    *,
    eps_max: float,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """As many draws of exp(-V / eps_max) as ``x_data`` has rows, by tempered SMC
    (:func:`~ebmlab.partition.smc_sample`) from the diagonal Gaussian of the batch's
    mean and 1.5 times its sd, with HMC moves scaled to the batch's sd; detached."""
    flat = x_data.flatten(1)
    sd = flat.std(0).clamp_min(1e-6)
    base = DiagonalGaussian(flat.mean(0), BASE_WIDTH * sd)
    fn = as_energy_fn(potential)

    def energy(x: torch.Tensor) -> torch.Tensor:
        return fn(x.view(-1, *x_data.shape[1:])) / eps_max

    kernel = HMC(SMC_STEP_PER_SD * float(sd.mean()), SMC_LEAPFROG)
    draws = smc_sample(energy, base, kernel, len(x_data), generator=generator)
    return draws.view_as(x_data)


def energy_matching_loss(
    potential: EnergyLike,
    x1: torch.Tensor,
    *,
    tau_star: float,
    eps_max: float,
    phase: str = "joint",
    x0: torch.Tensor | None = None,
    flow_weight: float = 1.0,
    contrastive_weight: float = 1.0,
    steps: int = 200,
    dt: float = 0.01,
    noise_starts: float = 0.5,
    negatives: str | torch.Tensor = "generation",
    trim: float = 0.0,
    clamp: float | None = None,
    coupling: str = "ot",
    flow_decay: bool = True,
    labels: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The Energy Matching objective of a potential V on the data ``x1`` (B, ...).

    ``phase="flow"`` is the warm-up: OT flow matching of -grad V. ``phase="joint"`` adds
    ``contrastive_weight`` (mean V(data) - mean V(negatives)), the negatives from
    :func:`energy_matching_negatives` started at the data and, a share ``noise_starts``
    of them (the paper's half), at the noise, or with ``negatives="smc"`` from
    :func:`boltzmann_negatives`, or the caller's own draws (a tensor: e.g. persistent
    chains of Langevin dynamics at eps_max, which images need where every step of the
    generation schedule costs a pass of the network).

    Args:
        potential: V (B, ...) -> (B,), time-independent.
        x1: data (B, ...).
        tau_star: where the generation temperature starts to rise, in [0, 1).
        eps_max: the temperature of the Boltzmann density exp(-V / eps_max).
        phase: ``"flow"`` or ``"joint"``.
        x0: noise paired with the data (default: standard normal draws).
        flow_weight: the flow-matching term's weight.
        contrastive_weight: the contrastive term's weight.
        steps: generation steps for the negatives.
        dt: their step size.
        noise_starts: the share of negatives started at noise, in [0, 1]. Those started
            at the data run at eps_max throughout, so with 0 the negatives approach
            exp(-V / eps_max) and the contrastive term's stationary point is exact.
        trim: the share of negatives with the highest V left out of their mean, in
            [0, 1): generation chains that have not reached the data sit high and
            would dominate the term (the paper trims 0.1).
        clamp: if given, the weighted contrastive term is clamped from below at
            -clamp, so that a potential already below the negatives on the data stops
            being pushed (the paper's 0.02).
        coupling: the flow term's coupling, ``"ot"`` (the paper's) or ``"independent"``.
        flow_decay: in the joint phase, weight the flow term by w(t), 1 up to tau_star
            and falling to 0 at t = 1 (:func:`~ebmlab.losses.flow_matching.flow_decay`),
            so that near the data the contrastive term alone shapes V.
        labels: the data's classes (B,) for class-conditional Energy Matching: the
            flow term's plan pairs noise with data of the same class
            (:func:`~ebmlab.losses.flow_matching_loss`), and ``potential`` is each
            row's class potential V(x | y) (``ClassifierEnergy.conditional(labels)``).
            Row i of the generated negatives, data- or noise-started, keeps row i's
            class, so the default negatives and a caller's drawn row by row with the
            same labels both fit.
        generator: source of all randomness, on x1's device.
    """
    if phase not in PHASES:
        raise ArgumentError(f"phase must be one of {PHASES}, got {phase!r}")
    _checks.below_one("tau_star", tau_star)
    _checks.positive("eps_max", eps_max)
    _checks.positive("flow_weight", flow_weight, allow_zero=True)
    _checks.positive("contrastive_weight", contrastive_weight, allow_zero=True)
    _checks.probability("noise_starts", noise_starts)
    if isinstance(negatives, torch.Tensor):
        if negatives.shape[1:] != x1.shape[1:] or not len(negatives):
            raise ArgumentError(
                f"negatives must be rows shaped like x1's {tuple(x1.shape[1:])}, got "
                f"{tuple(negatives.shape)}"
            )
    else:
        _checks.one_of("negatives", negatives, NEGATIVES)
        if negatives == "smc" and labels is not None:
            raise ArgumentError(
                "negatives='smc' draws from one density and cannot keep each row's class; "
                "with labels use 'generation' or pass class-conditional draws"
            )
    if not 0 <= trim < 1:
        raise ArgumentError(f"trim must be in [0, 1), got {trim}")
    if clamp is not None:
        _checks.positive("clamp", clamp, allow_zero=True)
    x0 = gaussian_noise(x1, generator) if x0 is None else x0
    weight = decay(tau_star) if flow_decay and phase == "joint" else None
    flow, metrics = flow_matching_loss(
        potential, x1, x0=x0, coupling=coupling, potential=True, time_weight=weight,
        labels=labels, generator=generator,
    )  # fmt: skip
    metrics["flow_loss"] = float(flow.detach())
    if phase == "flow":
        return flow, metrics
    if isinstance(negatives, torch.Tensor):
        drawn = negatives.detach()
    elif negatives == "smc":
        drawn = boltzmann_negatives(potential, x1, eps_max=eps_max, generator=generator)
    else:
        split = len(x1) - round(noise_starts * len(x1))
        drawn = energy_matching_negatives(
            potential, x1[:split], x0[split:], tau_star=tau_star, eps_max=eps_max,
            steps=steps, dt=dt, generator=generator,
        )  # fmt: skip
    fn = as_energy_fn(potential)
    v_neg = fn(drawn)
    kept = len(v_neg) - int(trim * len(v_neg))
    if kept < len(v_neg):  # the lowest ``kept`` potentials
        v_neg = torch.topk(v_neg, kept, largest=False, sorted=False).values
    gap = fn(x1).mean() - v_neg.mean()
    metrics["contrastive_gap"] = float(gap.detach())
    contrastive = contrastive_weight * gap
    if clamp is not None:
        contrastive = contrastive.clamp(min=-clamp)
    return flow_weight * flow + contrastive, metrics
