"""Hamiltonian Monte Carlo (Duane et al. 1987; Neal 2011) and its adaptive variant.

With momentum p ~ N(0, M) and diagonal inverse mass M^{-1}, the Hamiltonian
H(x, p) = E(x) + p^T M^{-1} p / 2 is integrated by leapfrog and the end point is
accepted with probability min(1, exp(H_start - H_end)). Gradients are cached in
the state, so a trajectory of L leapfrog steps costs exactly L gradient
evaluations. A trajectory whose energy error exceeds ``divergence_threshold`` is
counted as divergent and rejected.

:class:`AdaptiveHMC` tunes during burn-in, pooling statistics across the batch of
chains (many-chain adaptation in the spirit of ChEES-HMC, Hoffman, Radul &
Sountsov 2021, and MEADS, Hoffman & Sountsov 2022):

- the step size by Stan's search, then dual averaging (Hoffman & Gelman 2014, Alg. 5)
  towards a target mean acceptance probability, averaged over chains (one step size
  for all: the chains take the same number of leapfrog steps);
- the inverse mass, diagonal or full (Stan's ``dense_e``; by default the full one only
  where it makes the posterior nearly round), at the ends of Stan's doubling windows,
  from the variance (covariance) of the window's draws pooled over the chains that
  moved, regularised as in Stan (a covariance towards the diagonal mass);
  chains stuck over a window are restarted at the positions of moving ones
  (:class:`~ebmlab.samplers.adaptation.WarmupTuning`);
- the (maximum) trajectory length by Adam ascent on the ChEES criterion
  E[(|x' - mean x'|^2 - |x - mean x|^2)^2] / 4 divided by T^(1/4)
  (:attr:`AdaptiveHMC.LENGTH_COST`), its distances measured in the units that make
  the mass the identity (so that every coordinate counts, not only the widest), with
  trajectory lengths jittered in (0, T] both during and after burn-in by the base-2
  Halton sequence (quasi-random, as in ChEES-HMC), so that no random number is read
  back from the device to set a step's number of leapfrog steps. While the step size
  is too small to reach T within ``max_leapfrog`` steps (chains still far out in a
  steep region, early in warm-up), trajectories are cut to that many steps and T is
  kept, not adapted: shrinking it to the cap would make it crawl back at Adam's rate
  once the step size recovers.

Warm-up reads the pooled acceptance and criteria back to the host once per step (the
step size and length are host numbers); after warm-up a step reads nothing back.

As the base kernel of parallel tempering (:meth:`AdaptiveHMC.tempered`) every
temperature's replicas form a group with its own mass, started at 1 / beta (the
tempered target's width) and then adapted from the group's own variance; means and
variances in the criteria are taken per group. The step size and trajectory length,
measured in those per-group units, are shared; the step size is tuned to the lowest of
the groups' mean acceptance, so that no temperature falls below the target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.energies.base import EnergyFn
from ebmlab.samplers.adaptation import ChEESAdam, TunedState, WarmupTuning
from ebmlab.samplers.base import S, Sampler, SamplerState, metropolis_update
from ebmlab.samplers.integrators import (
    Mass,
    gaussian_noise,
    kinetic_energy,
    leapfrog,
    momentum,
    whiten,
)


@dataclass(frozen=True)
class Trajectory:
    """End point of a leapfrog trajectory and its Metropolis log-ratio."""

    x: torch.Tensor
    p: torch.Tensor
    energy: torch.Tensor
    grad: torch.Tensor
    log_ratio: torch.Tensor
    divergent: torch.Tensor


def halton(index: int, base: int = 2) -> float:
    """The ``index``-th (>= 1) element of the van der Corput / Halton sequence, in (0, 1).

    Args:
        base: the sequence's base (2 for the van der Corput sequence).
    """
    value, scale = 0.0, 1.0
    while index:
        index, digit = divmod(index, base)
        scale /= base
        value += digit * scale
    return value


class HMC(Sampler[SamplerState]):
    """Hamiltonian Monte Carlo with a fixed number of leapfrog steps.

    Args:
        step_size: leapfrog step size.
        n_leapfrog: leapfrog steps per trajectory.
        inv_mass: diagonal inverse mass (event-shaped tensor or scalar); default 1.
        jitter: each chain's step size is drawn uniformly in step_size * [1 - jitter,
            1 + jitter] every step, which avoids periodic trajectories (0 disables).
        step_spread: a factor s >= 1: each chain's step size is also drawn log-uniformly
            in [step_size / s, step_size * s] every step, so that trajectories suit
            every scale of a target whose scales differ by orders of magnitude (Neal's
            funnel, hierarchical models). A step size drawn independently of the state
            keeps the target invariant (Neal 2011, §5.4.2.2); 1 (the default) draws none.
        divergence_threshold: energy error beyond which a trajectory is divergent.
    """

    def __init__(
        self,
        step_size: float,
        n_leapfrog: int = 10,
        *,
        inv_mass: torch.Tensor | float = 1.0,
        jitter: float = 0.2,
        step_spread: float = 1.0,
        divergence_threshold: float = 1000.0,
    ) -> None:
        self.step_size = _checks.positive("step_size", step_size)
        self.n_leapfrog = _checks.positive_int("n_leapfrog", n_leapfrog)
        self.inv_mass = torch.as_tensor(inv_mass, dtype=torch.float32)
        self._inv_mass_copies: dict[torch.device, torch.Tensor] = {}
        if not (torch.isfinite(self.inv_mass).all() and (self.inv_mass > 0).all()):
            raise ArgumentError("inv_mass must be finite and > 0 everywhere")
        self.jitter = _checks.below_one("jitter", jitter)
        self.step_spread = _checks.positive("step_spread", step_spread)
        if step_spread < 1:
            raise ArgumentError(f"step_spread must be >= 1, got {step_spread}")
        self.divergence_threshold = _checks.positive("divergence_threshold", divergence_threshold)

    def replayable(self, state: SamplerState) -> bool:
        """Steps from any ``state`` alike: the jitter and spread are drawn on the device."""
        return True

    def init(self, x0: torch.Tensor, energy: EnergyFn) -> SamplerState:
        return SamplerState.start(x0.detach().clone(), None, None, 0).evaluated(energy)

    def _inv_mass_on(self, device: torch.device) -> torch.Tensor:
        """The inverse mass on ``device``, copied there once rather than every step."""
        if device not in self._inv_mass_copies:
            self._inv_mass_copies[device] = self.inv_mass.to(device)
        return self._inv_mass_copies[device]

    def tempered(self, beta: torch.Tensor) -> HMC:
        """Step size / sqrt(beta), matched to the tempered distributions' width."""
        return self._rescaled("step_size", beta, 0.5)

    def _jittered(self, base: float | torch.Tensor, x: torch.Tensor, generator) -> torch.Tensor:
        """Per-chain step sizes base (1 + jitter u) spread^w, u and w uniform on [-1, 1),
        on x's device."""
        u = torch.rand(x.shape[0], generator=generator, device=x.device)
        eps = base * (1 + self.jitter * (u * 2 - 1))
        if self.step_spread > 1:
            w = torch.rand(x.shape[0], generator=generator, device=x.device)
            eps = eps * self.step_spread ** (w * 2 - 1)
        return eps

    def trajectory(
        self,
        state: SamplerState,
        energy: EnergyFn,
        step_size: torch.Tensor,
        n_steps: int,
        inv_mass: Mass,
        generator: torch.Generator | None,
    ) -> Trajectory:
        """Draw a momentum p ~ N(0, M) from ``generator`` and integrate ``n_steps``
        leapfrog steps of size ``step_size`` (B,) from ``state`` under ``energy`` with
        ``inv_mass`` (diagonal, or dense); returns the proposal with its log acceptance
        ratio."""
        x0 = state.x
        p0 = momentum(gaussian_noise(x0, generator), inv_mass)
        x, p, e, g = leapfrog(energy, x0, p0, state.grad, step_size, n_steps, inv_mass)
        h0 = state.energy + kinetic_energy(p0, inv_mass)
        h1 = e + kinetic_energy(p, inv_mass)
        log_ratio = h0 - h1
        divergent = ~torch.isfinite(h1) | (h1 - h0 > self.divergence_threshold)
        log_ratio = torch.where(divergent, torch.full_like(log_ratio, -math.inf), log_ratio)
        return Trajectory(x, p, e, g, log_ratio, divergent)

    def _move(self, state: S, traj: Trajectory, n_steps: int, generator) -> S:
        """The Metropolis test of the trajectory's end point."""
        return metropolis_update(
            state, traj.x, traj.energy, traj.grad, traj.log_ratio, generator,
            n_grad_evals=n_steps, divergent=traj.divergent,
        )  # fmt: skip

    def step(
        self, state: SamplerState, energy: EnergyFn, generator: torch.Generator | None = None
    ) -> SamplerState:
        eps = self._jittered(self.step_size, state.x, generator)
        inv_mass = self._inv_mass_on(state.x.device)
        traj = self.trajectory(state, energy, eps, self.n_leapfrog, inv_mass, generator)
        return self._move(state, traj, self.n_leapfrog, generator)


@dataclass(frozen=True)
class AdaptiveState(TunedState):
    """HMC's tuned state plus the trajectory length and its adapter."""

    trajectory_length: float = 1.0
    chees: ChEESAdam = field(default_factory=ChEESAdam)


class AdaptiveHMC(HMC):
    """HMC whose step size, mass and trajectory length are tuned during burn-in.

    Use with ``burn_in`` (a few hundred steps): ``sampler.sample(energy, x0, n, burn_in=500)``.
    Adaptation pools statistics across chains, so it works best with many chains
    (16 or more: the mass is estimated from their draws together). The step size and mass
    are tuned by a :class:`~ebmlab.samplers.adaptation.WarmupTuning` (``tuning``), the
    trajectory length by ChEES here.

    Args:
        step_size: initial step size.
        trajectory_length: initial (maximum) trajectory length T.
        target_accept: mean acceptance probability the step size is tuned to.
        max_leapfrog: cap on leapfrog steps per trajectory (a longer one is cut, and
            its length is not adapted on that step).
        adapt_mass: False switches off mass-matrix adaptation.
        adapt_length: False switches off trajectory-length adaptation.
        divergence_threshold: energy error beyond which a trajectory is divergent.
        dense_mass: the inverse mass to adapt: True for a dense one (the draws'
            covariance; chains of flat rows (B, D)), False for a diagonal one,
            ``"auto"`` for the one that pays at each window's end (as ``NUTS``).
    """

    #: the power of T that the ChEES criterion is divided by: 1 rates lengths per
    #: gradient, 0 per transition; on the posterior benchmark 0.25 and 0.5 gave the
    #: same ESS per gradient, 0.25 the lower R-hat (docs/results/posteriors.md).
    LENGTH_COST: ClassVar[float] = 0.25

    def __init__(
        self,
        step_size: float = 0.1,
        trajectory_length: float = 1.0,
        *,
        target_accept: float = 0.8,
        max_leapfrog: int = 256,
        adapt_mass: bool = True,
        adapt_length: bool = True,
        divergence_threshold: float = 1000.0,
        dense_mass: bool | str = "auto",
    ) -> None:
        super().__init__(step_size, 1, jitter=0.0, divergence_threshold=divergence_threshold)
        self.trajectory_length = _checks.positive("trajectory_length", trajectory_length)
        self.max_leapfrog = _checks.positive_int("max_leapfrog", max_leapfrog)
        # one step size for all chains: they take the same number of leapfrog steps
        self.tuning = WarmupTuning(target_accept, adapt_mass, pool_step_size=True,
                                   dense_mass=dense_mass)  # fmt: skip
        self.adapt_length = adapt_length

    def init(self, x0: torch.Tensor, energy: EnergyFn) -> AdaptiveState:
        return self.tuning.initial(
            super().init(x0, energy),
            self.step_size,
            AdaptiveState,
            trajectory_length=self.trajectory_length,
        )

    def begin_warmup(self, state: AdaptiveState, n_steps: int) -> AdaptiveState:
        return self.tuning.begin(state, n_steps, search=True)

    def end_warmup(self, state: AdaptiveState) -> AdaptiveState:
        return self.tuning.finish(state)

    def tempered(self, beta: torch.Tensor) -> AdaptiveHMC:
        """This kernel for per-chain tempered energies beta E: chains of one beta get
        their own mass, 1 / beta at first (equivalent to HMC's step / sqrt(beta)), then
        adapted from their own variance."""
        return self._with(tuning=self.tuning.tempered(beta))

    def replayable(self, state: AdaptiveState) -> bool:
        """Never, whatever the ``state``: the trajectory's length follows the step index
        (Halton jitter)."""
        return False

    def _n_leapfrog(self, length: float, step_size: float) -> int:
        return max(1, min(self.max_leapfrog, math.ceil(length / step_size)))

    def step(
        self, state: AdaptiveState, energy: EnergyFn, generator: torch.Generator | None = None
    ) -> AdaptiveState:
        if state.search_due:
            state = self.tuning.search_step_size(state, energy, generator)
        n_chains = state.x.shape[0]
        u = halton(state.t + 1)
        step = float(state.step_size)
        cap = self.max_leapfrog * step
        capped = state.trajectory_length > cap
        length = u * min(state.trajectory_length, cap)
        n_steps = self._n_leapfrog(length, step)
        eps = torch.full((n_chains,), length / n_steps, dtype=state.x.dtype, device=state.x.device)
        traj = self.trajectory(state, energy, eps, n_steps, state.inv_mass, generator)
        new = self._move(state, traj, n_steps, generator)
        tuned = self.tuning.update(state, new)
        if self.adapt_length and self.tuning.warming(state) and not capped:
            return self._adapt_length(state, tuned, traj, u)
        return tuned

    def _adapt_length(
        self,
        old: AdaptiveState,
        new: AdaptiveState,
        traj: Trajectory,
        u: float,
    ) -> AdaptiveState:
        """One Adam step (beta1 = 0) up log(ChEES / T^LENGTH_COST) in log T.

        ChEES alone (Hoffman, Radul & Sountsov 2021) is flat beyond its first maximum, so
        T drifts to wasteful lengths; divided by T, the gradient cost, it favours the
        fast coordinates and leaves the slow ones mixing over too few transitions;
        :attr:`LENGTH_COST` sits between the two. T has no floor at the step size:
        for a few steps after each restart, dual averaging tries steps near ten times
        its last one (Hoffman & Gelman 2014, Alg. 5's mu = log(10 eps)), and a floor
        there lifted T to them for good. A trajectory shorter than one step is taken
        as one shorter step.
        """
        x1c = self.tuning.centred(traj.x)
        both = whiten(torch.stack([self.tuning.centred(old.x), x1c]), old.inv_mass)
        before, after = both.flatten(2).square().sum(2)  # squared whitened distances
        diff = after - before
        speed = (x1c * traj.p).flatten(1).sum(1)  # x1w . d x1w / dt, for any mass
        per_chain = diff * speed * u * new.trajectory_length  # d (diff^2 / 4) / d log T
        ok = torch.isfinite(per_chain) & ~traj.divergent
        weight = new.info.accept_prob * ok
        chees = float((torch.where(ok, diff * diff / 4, 0) * weight).sum())
        if float(weight.sum()) <= 0 or chees <= 0:
            return new
        grad = float((torch.where(ok, per_chain, 0) * weight).sum()) / chees - self.LENGTH_COST
        adam, log_t = new.chees.update(math.log(new.trajectory_length), grad)
        return new.replace(trajectory_length=math.exp(log_t), chees=adam)
