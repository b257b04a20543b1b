"""Warm-up adaptation as small immutable state machines, shared by the samplers.

Each adapter holds its own state and returns an updated copy from ``update``, so a
sampler keeps one in its chain state and the tuning is checkpointed and replayed with
the chains:

- :class:`DualAveraging`: the step size, per chain or pooled, towards a target mean
  acceptance probability (Nesterov 2009; Hoffman & Gelman 2014, Alg. 5), used by
  ``AdaptiveHMC``, ``NUTS`` and ``MALA(target_accept=...)``;
- :class:`WarmupWindows`: Stan's windowed schedule (Stan Reference Manual, "HMC
  algorithm parameters"): a fast initial buffer for the step size, slow windows of
  doubling length at whose ends the mass is re-estimated, and a fast final buffer;
- :class:`WindowStats`: per-chain Welford moments and move counts over the current
  window, for the mass estimate and for finding chains that are stuck;
- :class:`ChEESAdam`: the trajectory length, by Adam ascent on the ChEES criterion per
  gradient (Hoffman, Radul & Sountsov 2021).

:class:`WarmupTuning` composes them for a sampler: ``AdaptiveHMC``, ``NUTS`` and
``MALA`` each hold one and keep its products (step size, inverse mass, adapter) in a
:class:`TunedState`. Before the first warm-up step and after each mass update a
Hamiltonian sampler searches each chain's step size as Stan does (double or halve until
one leapfrog step's acceptance crosses 0.8). The inverse mass is the variance of the
window's draws pooled over the chains that moved (per group of chains of equal inverse
temperature when the kernel runs inside parallel tempering), or their covariance for a
dense mass, regularised as in Stan (the covariance towards the diagonal mass rather than
the identity). By default a dense mass only where it pays: where the window's covariance
makes the energy's mean curvature nearly round and the diagonal does not, or where the
diagonal leaves it hopelessly stretched, and in either case not where the posterior
changes shape across the window's draws (:func:`mass_spread`); that dense mass also uses
the window's gradients (:meth:`WindowStats.chosen_mass`). At the end of the initial
buffer and of every window, a chain that never moved or diverged on every step since the
last check, or whose energy sits far above the others' (still on its way in from its
start), is restarted at the position of a chain that moves (Stan re-draws such inits;
here the many chains supply them) and left out of the mass estimate.
"""

from __future__ import annotations

import copy
import math
import warnings
from dataclasses import dataclass, replace
from typing import ClassVar, TypeVar

import torch

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.energies.base import EnergyFn
from ebmlab.samplers.base import SamplerState, per_chain
from ebmlab.samplers.diagnostics import (
    DENSE_UP_TO,
    SamplingWarning,
    condition_number,
    rarely_moving,
)
from ebmlab.samplers.integrators import (
    DenseMass,
    Mass,
    gaussian_noise,
    kinetic_energy,
    leapfrog,
    momentum,
)


@dataclass(frozen=True)
class DualAveraging:
    """Dual averaging of log step size towards ``target`` mean acceptance, on tensors:
    one adapter per chain ((B,) fields) or one for all (0-d fields), updated on the
    device without reading anything back.

    After m updates with acceptance a_m: h_m = (1 - 1/(m + T0)) h_{m-1} +
    (target - a_m) / (m + T0); log eps_m = mu - sqrt(m) / GAMMA h_m; the averaged
    log eps_bar_m = m^-KAPPA log eps_m + (1 - m^-KAPPA) log eps_bar_{m-1} is the step
    size kept after warm-up. mu = log(10 eps_0) biases the search towards larger steps.
    """

    GAMMA: ClassVar[float] = 0.05  # how fast the step responds to the acceptance
    T0: ClassVar[float] = 10.0  # damps the first updates
    KAPPA: ClassVar[float] = 0.75  # how fast the average forgets early steps

    target: float
    mu: torch.Tensor
    h: torch.Tensor
    log_step_bar: torch.Tensor
    count: int | torch.Tensor = 0

    @classmethod
    def start(cls, step_size: torch.Tensor, target: float) -> DualAveraging:
        """A fresh adapter around ``step_size`` (a tensor: (B,) per chain or 0-d),
        also after the mass changes.

        Args:
            target: the mean acceptance probability to reach, in (0, 1).
        """
        _checks.probability("target", target)
        log_step = step_size.log()
        return cls(target, log_step + math.log(10), torch.zeros_like(log_step), log_step)

    def update(
        self, accept_rate: torch.Tensor, rows: torch.Tensor | None = None
    ) -> tuple[DualAveraging, torch.Tensor]:
        """The adapter after one step that accepted at ``accept_rate`` (per chain, or
        pooled: the shape of the step size), and the step size to use next. Given
        ``rows`` (B,), only those chains count a step (chains that finish their
        transitions at different times, as NUTS's own trees do); the count is then per
        chain."""
        count = self.count + 1 if rows is None else rows.long() + self.count
        m = count if rows is None else count.to(self.h.dtype)
        h = (1 - 1 / (m + self.T0)) * self.h + (self.target - accept_rate) / (m + self.T0)
        log_step = self.mu - m**0.5 / self.GAMMA * h
        eta = m**-self.KAPPA
        log_step_bar = eta * log_step + (1 - eta) * self.log_step_bar
        if rows is not None:  # the other chains keep their state (their next step: the caller's)
            h = torch.where(rows, h, self.h)
            log_step_bar = torch.where(rows, log_step_bar, self.log_step_bar)
        return replace(self, h=h, log_step_bar=log_step_bar, count=count), log_step.exp()

    def take(self, rows: torch.Tensor, donors: torch.Tensor) -> DualAveraging:
        """Per-chain adapters with chain ``rows[i]``'s state replaced by ``donors[i]``'s."""
        if self.mu.ndim == 0:
            return self
        fields = {}
        for name in ("mu", "h", "log_step_bar", "count"):
            value = getattr(self, name)
            if isinstance(value, torch.Tensor):
                value = value.clone()
                value[rows] = value[donors]
                fields[name] = value
        return replace(self, **fields)

    @property
    def final_step_size(self) -> torch.Tensor:
        """The averaged step size, to keep after warm-up."""
        return self.log_step_bar.exp()


@dataclass(frozen=True)
class WarmupWindows:
    """Stan's schedule for ``n_steps`` of warm-up: a fast initial buffer (step size
    only, 75 steps), slow windows from 25 steps doubling in length (the last one
    stretched to the final buffer), and a fast final buffer (50 steps); below 150 steps
    the buffers are 15 % and 10 % and one window takes the rest, and below 20 steps
    only the step size adapts. ``checks`` are the steps (counted from 1) that end the
    initial buffer or a window, ``mass_updates`` those that end a window."""

    INIT_BUFFER: ClassVar[int] = 75
    BASE_WINDOW: ClassVar[int] = 25
    TERM_BUFFER: ClassVar[int] = 50
    MIN_STEPS: ClassVar[int] = 20

    checks: tuple[int, ...]
    mass_updates: tuple[int, ...]

    @classmethod
    def plan(cls, n_steps: int) -> WarmupWindows:
        """The schedule of ``n_steps`` warm-up steps."""
        if n_steps < cls.MIN_STEPS:
            return cls((), ())
        init, base, term = cls.INIT_BUFFER, cls.BASE_WINDOW, cls.TERM_BUFFER
        if init + base + term > n_steps:
            init, term = int(0.15 * n_steps), int(0.1 * n_steps)
            base = n_steps - init - term
        last, ends, start, size = n_steps - term, [], init, base
        while start < last:
            end = start + size
            if end + 2 * size >= last:
                end = last
            ends.append(end)
            start, size = end, 2 * size
        return cls((init, *ends), tuple(ends))


@dataclass(frozen=True)
class WindowDraws:
    """An evenly thinned record of a window's draws, their energy gradients and which
    chains had arrived (not far behind), at most ``limit`` steps of them: when full,
    every other kept step is dropped and ``every`` doubles, so the record spans the
    whole window without drawing a random number. For :func:`mass_spread`."""

    limit: int
    steps: tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], ...] = ()
    every: int = 1
    seen: int = 0

    @classmethod
    def for_chains(cls, x: torch.Tensor) -> WindowDraws:
        """An empty record for flat chains x (B, D), of at most :data:`SPLIT_NUMBERS`
        numbers per kept tensor."""
        chains, d = x.shape
        return cls(max(1, SPLIT_NUMBERS // (d * chains)))

    def add(self, x: torch.Tensor, grad: torch.Tensor, arrived: torch.Tensor) -> WindowDraws:
        """The record after one more step at ``x`` (B, D)."""
        seen = self.seen + 1
        if self.seen % self.every:
            return replace(self, seen=seen)
        steps, every = (*self.steps, (x.clone(), grad.clone(), arrived.clone())), self.every
        if len(steps) > self.limit:
            steps, every = steps[::2], 2 * every
        return replace(self, steps=steps, every=every, seen=seen)

    def rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The kept draws of arrived chains and their gradients, (N, D) each."""
        x = torch.cat([x[arrived] for x, _, arrived in self.steps])
        grad = torch.cat([grad[arrived] for _, grad, arrived in self.steps])
        return x, grad


def fisher_mass_factor(chol: torch.Tensor, fisher: torch.Tensor) -> tuple[torch.Tensor, float]:
    """A factor H (D, D) of the inverse mass Sigma = H H^T that minimises the Fisher
    divergence from the pulled-back target to N(0, I) (Seyboldt, Carlson & Carpenter
    2026, arXiv:2603.18845), and the condition number of F in C's units. Sigma solves
    Sigma F Sigma = C for the draws' covariance C = L L^T (``chol``) and the gradients'
    F (``fisher``): the geometric mean of C and F^{-1}, H = L V Lambda^{-1/4} with
    L^T F L = V Lambda V^T. Where F is singular in C's units (some direction of
    constant gradient), H is not finite and the condition number infinite."""
    eig, vec = torch.linalg.eigh(chol.mT @ fisher @ chol)
    if not bool(eig[0] > 0):
        return torch.full_like(chol, math.inf), math.inf
    return chol @ (vec * eig.pow(-0.25)), float(eig[-1] / eig[0])


def mass_spread(x: torch.Tensor, grad: torch.Tensor) -> float:
    """How much the Fisher-divergence mass (:func:`fisher_mass_factor`) changes across
    draws x (N, D) with energy gradients ``grad`` (N, D): the draws are split into equal
    halves at the median of their projection on the widest direction of their
    covariance (in the diagonal mass's units), each half gets its own mass, and the
    spread is the condition number of one half's mass in the other's units. For a
    Gaussian target every subset of draws gives the same mass (F = P C P for any draws,
    P the precision), so the spread is 1 up to noise; a target whose shape changes from
    place to place (a Gaussian process's latent values, whose scale follows the
    kernel's hyperparameters) spreads far more. NaN where a half's draws or gradients
    span fewer than D directions (chains that barely moved: the first window of
    posteriordb's arma11 held 59 distinct points of 300), so that the test cannot
    tell."""
    cov = x.T.cov()
    scale = cov.diagonal().sqrt()
    widest = torch.linalg.eigh(cov / scale[:, None] / scale[None, :])[1][:, -1] / scale
    side = (x - x.mean(0)) @ widest
    lower = side < side.median()
    halves = []
    for rows in (lower, ~lower):
        chol, failed = torch.linalg.cholesky_ex(x[rows].T.cov())
        if bool(failed):
            return math.nan
        factor, conditioned = fisher_mass_factor(chol, grad[rows].T.cov())
        if math.isinf(conditioned):
            return math.nan
        halves.append(factor)
    # Sigma_2 in Sigma_1's units: H1^-1 H2 (H1^-1 H2)^T
    inner = torch.linalg.solve(halves[0], halves[1])
    return condition_number(inner @ inner.mT)


@dataclass(frozen=True)
class WindowStats:
    """Per-chain moments of the draws since the last check (Welford: the mean and the
    sum of squared deviations), and the chains' accepted and divergent counts when it
    began. For a dense mass it also sums the deviations' outer products over all
    chains, (D, D), which a chain that never moves adds nothing to; to choose between
    the two masses (:meth:`chosen_mass`), also the sums of the energy's gradients at
    the draws and of their outer products, (D,) and (D, D), over the chains not far
    behind, and a thinned ``record`` of the draws and gradients themselves."""

    count: int
    mean: torch.Tensor
    m2: torch.Tensor
    accepted0: torch.Tensor
    divergent0: torch.Tensor
    outer: torch.Tensor | None = None
    fisher: torch.Tensor | None = None
    fisher_draws: torch.Tensor | None = None
    grad_sum: torch.Tensor | None = None
    record: WindowDraws | None = None

    @classmethod
    def begin(cls, state: SamplerState, dense: bool = False, choose: bool = False) -> WindowStats:
        """An empty window from ``state``; ``dense`` keeps the outer products of flat
        chains (B, D), ``choose`` also the sums and outer products of their gradients."""
        x, d = state.x, state.x.shape[-1]
        square = x.new_zeros((d, d)) if dense or choose else None
        fisher = draws = grad_sum = record = None
        if choose:
            fisher, draws, grad_sum = torch.zeros_like(square), x.new_zeros(()), x.new_zeros(d)
            record = WindowDraws.for_chains(x)
        return cls(0, torch.zeros_like(x), torch.zeros_like(x), state.accepted.clone(),
                   state.divergent.clone(), square, fisher, draws, grad_sum, record)  # fmt: skip

    def add(
        self,
        x: torch.Tensor,
        moments: bool = True,
        grad: torch.Tensor | None = None,
        arrived: torch.Tensor | None = None,
    ) -> WindowStats:
        """The window after one more step at ``x``; without ``moments`` only the step
        is counted (a tuning without a mass to estimate needs no moments). A window
        that chooses its mass also adds the outer products of ``grad`` (B, D) over the
        ``arrived`` chains (B,)."""
        if not moments:
            return replace(self, count=self.count + 1)
        count = self.count + 1
        delta = x - self.mean
        mean = self.mean + delta / count
        after = x - mean
        outer = None if self.outer is None else self.outer + delta.T @ after
        fisher, draws, grad_sum, record = self.fisher, self.fisher_draws, self.grad_sum, self.record
        if fisher is not None and grad is not None and arrived is not None:
            counted = grad * arrived[:, None].to(grad.dtype)
            fisher, grad_sum = fisher + counted.T @ grad, grad_sum + counted.sum(0)
            draws = draws + arrived.sum()
            record = record.add(x, grad, arrived)
        return replace(self, count=count, mean=mean, m2=self.m2 + delta * after, outer=outer,
                       fisher=fisher, fisher_draws=draws, grad_sum=grad_sum,
                       record=record)  # fmt: skip

    def stuck(self, state: SamplerState) -> torch.Tensor:
        """Chains that never moved, or diverged on every step, in the window (B,)."""
        never_moved = state.accepted == self.accepted0
        always_divergent = state.divergent - self.divergent0 >= self.count
        return never_moved | always_divergent

    def variance(self, keep: torch.Tensor, groups: ChainGroups | None) -> torch.Tensor:
        """The variance of the window's draws of the ``keep`` chains (B,), all of them
        pooled (within and between chains), regularised as in Stan: (n / (n + 5)) var
        + 1e-3 (5 / (n + 5)) over n draws. Event-shaped, or per chain (B, ...) with the
        variance of each chain's group if ``groups`` is given."""
        w = per_chain(keep.to(self.mean.dtype), self.mean)
        index = torch.zeros(len(keep), dtype=torch.long, device=keep.device)
        index = index if groups is None else groups.index
        n_groups = 1 if groups is None else len(groups.sizes)

        def group_sum(t: torch.Tensor) -> torch.Tensor:
            return t.sum(0, keepdim=True) if groups is None else groups.sums(t)

        chains = group_sum(keep.to(self.mean.dtype)).clamp(min=1)
        grand = group_sum(w * self.mean) / per_chain(chains, self.mean[:n_groups])
        spread = self.mean - grand[index]
        n = per_chain(chains * self.count, self.mean[:n_groups])
        total = group_sum(w * (self.m2 + self.count * spread * spread))
        var = total / (n - 1).clamp(min=1)
        var = _shrunk(var, n, 1.0)
        return var[0] if groups is None else var[index]

    def covariance(self, keep: torch.Tensor) -> DenseMass:
        """The covariance (D, D) of the window's draws of the ``keep`` chains (B,) pooled
        within and between chains, regularised as Stan's ``dense_e`` is but in each
        coordinate's own units: (n / (n + 5)) cov + 1e-3 (5 / (n + 5)) V over n draws,
        with V the diagonal mass (:meth:`variance`) where Stan has the identity.
        Stan's absolute term swamps the correlations a dense mass is for wherever a
        coordinate's variance is small. On posteriordb's kilpisjarvi (a slope of sd
        0.0075 on uncentred years, correlation -0.99999 with the intercept), exact
        draws whitened by Stan's regularised covariance of 800 draws leave the mean
        Hessian a condition number of 4,700; with V, 1.6. The within-chain part sums
        over all chains (one D x D sum, not one per chain): a stuck chain adds nothing
        to it, but a chain far behind adds its spread along the way in. The
        between-chain part leaves both out. After their restart the next window is
        clean."""
        w = keep.to(self.mean.dtype)
        chains = w.sum().clamp(min=1)
        grand = (w[:, None] * self.mean).sum(0) / chains
        spread = self.mean - grand
        total = self.outer + self.count * (w[:, None] * spread).T @ spread
        n = chains * self.count
        cov = total / (n - 1).clamp(min=1)
        return DenseMass(_shrunk((cov + cov.T) / 2, n, torch.diag(self.variance(keep, None))))

    def chosen_mass(self, keep: torch.Tensor) -> tuple[Mass, float | None]:
        """A dense inverse mass where it pays, else the diagonal one (:meth:`variance`),
        and the split test's spread where that test refused the dense mass (else None).

        Which pays is read off F, the covariance of the energy's gradients at the draws
        (under the target their mean is zero and F the mean Hessian of E): HMC's
        gradients per effective draw grow with the square root of the condition number
        of F in the mass's units (Neal 2011, sec. 4: the step follows the narrowest
        direction, the trajectory the widest). Dense pays where the draws' covariance
        C (:meth:`covariance`) whitens F to a condition number of at most
        :data:`WHITE_ENOUGH` and the diagonal leaves at least :data:`DENSE_GAIN` times
        that (the posterior is nearly Gaussian), or where the diagonal leaves at least
        :data:`DIAGONAL_HOPELESS` and the dense mass below is :data:`DENSE_GAIN` times
        rounder (chains that crawl along a narrow ridge, whose window cannot show its
        length).
        A posterior that no linear map makes nearly round (a funnel; a Gaussian
        process's latent values with their hyperparameters) changes shape from place
        to place, and one dense mass fits it worse than per-coordinate scales. Such a
        shape can still pass the ridge test (a 41-point GP's diagonal leaves 10^4), so
        the dense mass is also refused where the window's two halves want masses more
        than :data:`SPLIT_LIMIT` apart (:meth:`spread`).

        The dense mass is the affine map that minimises the Fisher divergence from the
        pulled-back target to N(0, I) over the window (Seyboldt, Carlson & Carpenter
        2026, arXiv:2603.18845): the Sigma with Sigma F Sigma = C, the geometric mean
        of C and F^{-1}, computed as L (L^T F L)^{-1/2} L^T with C = L L^T. For a
        Gaussian, F = P C P for any draws (P its precision), so Sigma = P^{-1}
        exactly, however little of the target the window's chains have covered; C
        alone is right only once they have covered it. Needs :data:`DRAWS_PER_COORD`
        draws per coordinate from chains not far behind, else the diagonal."""
        var = self.variance(keep, None)
        d = len(var)
        draws = float(self.fisher_draws) if self.fisher_draws is not None else 0.0
        if draws < DRAWS_PER_COORD * d:
            return var, None
        grad_mean = self.grad_sum / draws
        fisher = self.fisher / draws - grad_mean[:, None] * grad_mean[None, :]
        cov, scale = self.covariance(keep), var.sqrt()
        diagonal = condition_number(scale[:, None] * fisher * scale[None, :])
        half, dense = fisher_mass_factor(cov.chol, fisher)
        if math.isinf(dense):  # some direction of constant gradient
            return var, None
        nearly_gaussian = dense <= WHITE_ENOUGH and diagonal >= DENSE_GAIN * dense
        # Sigma F Sigma = C has condition number sqrt(dense) in Sigma's units
        ridge = diagonal >= DIAGONAL_HOPELESS and diagonal >= DENSE_GAIN * math.sqrt(dense)
        if not (nearly_gaussian or ridge):
            return var, None
        spread = self.spread()
        if spread > SPLIT_LIMIT:
            return var, spread
        return DenseMass(half @ half.mT), None

    def spread(self) -> float:
        """How far apart the masses of the recorded draws' two halves are
        (:func:`mass_spread`); NaN where it cannot tell, which refuses nothing: there,
        or where fewer than :data:`DRAWS_PER_COORD` rows per coordinate were recorded."""
        x, grad = self.record.rows()
        if len(x) < DRAWS_PER_COORD * x.shape[1]:
            return math.nan
        return mass_spread(x, grad)


# a dense mass is chosen when the draws' covariance leaves the mean Hessian this round
# (condition number)...
WHITE_ENOUGH = 10.0
# ... and the diagonal leaves it this many times less round (sqrt(10) ~ 3x the steps)
DENSE_GAIN = 10.0
# ... or when the diagonal leaves it this ill-conditioned (about 100 leapfrog steps per
# effective draw), and the Fisher-divergence mass is DENSE_GAIN times rounder
DIAGONAL_HOPELESS = 1e4
# ... unless the window's two halves want dense masses this far apart (condition number
# of one in the other's units; 1 for a Gaussian, 1-2.3 for a random halving)
SPLIT_LIMIT = 25.0
# the record of a window's draws for that test keeps at most this many numbers of
# draws and as many of gradients (8 MiB each in float64): every draw of 32 chains of 43
# coordinates over a 150-step window; for D above 323 too few for the test
SPLIT_NUMBERS = 2**20
# draws per coordinate either choice needs
DRAWS_PER_COORD = 10


def _shrunk(estimate: torch.Tensor, n: torch.Tensor, unit: torch.Tensor | float) -> torch.Tensor:
    """Stan's regularisation of a mass estimate from n draws: (n / (n + 5)) estimate
    + 1e-3 (5 / (n + 5)) ``unit`` (1 for a variance, the diagonal mass for a
    covariance)."""
    return (n / (n + 5)) * estimate + 1e-3 * (5 / (n + 5)) * unit


@dataclass(frozen=True)
class ChEESAdam:
    """Adam (beta1 = 0) on log trajectory length, following the gradient of
    log(ChEES / T^c) (:attr:`~ebmlab.samplers.hmc.AdaptiveHMC.LENGTH_COST`)."""

    BETA2: ClassVar[float] = 0.95
    LEARNING_RATE: ClassVar[float] = 0.025

    v: float = 0.0
    count: int = 0

    def update(self, log_length: float, grad: float) -> tuple[ChEESAdam, float]:
        """The adapter after one gradient ``grad`` of the criterion in log T, and the
        new log T.

        Args:
            log_length: log T, the current trajectory length's log.
        """
        v = self.BETA2 * self.v + (1 - self.BETA2) * grad * grad
        count = self.count + 1
        v_hat = v / (1 - self.BETA2**count)
        step = self.LEARNING_RATE * grad / (math.sqrt(v_hat) + 1e-12)
        return ChEESAdam(v, count), log_length + step


@dataclass(frozen=True)
class ChainGroups:
    """Which group each chain belongs to (``index``, (B,)), how many chains each group
    has (``sizes``) and which chains are in each (``members``, (n_groups, B)), fixed
    when a tempered kernel is made."""

    index: torch.Tensor
    sizes: torch.Tensor
    members: torch.Tensor

    @classmethod
    def of(cls, labels: torch.Tensor) -> ChainGroups:
        """Chains with equal ``labels`` (B,) form a group."""
        index = torch.unique(labels, return_inverse=True)[1]
        sizes = torch.bincount(index)
        groups = torch.arange(len(sizes), device=index.device)
        return cls(index, sizes, groups[:, None] == index)

    def sums(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of x (B, ...) over the chains of each group, (n_groups, ...), as a masked
        sum over the chains: its order of additions is fixed, where CUDA's ``index_add_``
        adds by atomics in an order that changes from run to run (and with it a seeded
        run's draws), and it keeps x's precision (a product with the indicator matrix
        would run in TF32 where a program allows it)."""
        weights = self.members.to(x.dtype).view(*self.members.shape, *[1] * (x.dim() - 1))
        return (weights * x).sum(1)

    def means(self, x: torch.Tensor) -> torch.Tensor:
        """Mean of x (B, ...) over the chains of each group, (n_groups, ...)."""
        sums = self.sums(x)
        return sums / per_chain(self.sizes, sums)

    def centred(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, ...) minus the mean of its group of chains."""
        return x - self.means(x)[self.index]


@dataclass(frozen=True)
class TunedState(SamplerState):
    """A chain state with the step size (a float, or a tensor: (B,) per chain, 0-d
    pooled) and inverse mass (diagonal, or a :class:`DenseMass`) a sampler tunes, the
    number of warm-up steps, and while warm-up runs: the step-size adapter, the window
    schedule and statistics, and whether a step-size search is due before the next
    step; after a mass window whose dense mass the split test refused, its spread."""

    step_size: float | torch.Tensor = 0.1
    inv_mass: Mass | None = None
    warmup_steps: int = 0
    dual: DualAveraging | None = None
    windows: WarmupWindows | None = None
    window: WindowStats | None = None
    search_due: bool = False
    # the split test's spread where it refused the last window a dense mass (the posterior
    # changes shape), for the summary's advice; else None
    refused_spread: float | None = None
    # per chain, the gradient evaluations its own transitions used (NUTS: its tree's
    # points; the batch computes more for chains that wait), or None where that is n_grad_evals
    chain_grad_evals: torch.Tensor | None = None


T = TypeVar("T", bound=TunedState)

LOG_TARGET_SEARCH = math.log(0.8)  # the one-step acceptance Stan's step-size search aims at


class WarmupTuning:
    """The step size by :class:`DualAveraging` (per chain, or pooled with
    ``pool_step_size``) and, if ``adapt_mass``, the inverse mass at the ends of
    :class:`WarmupWindows`, tuned during warm-up; chains that are stuck, or far behind
    the others in energy, are restarted at the window ends and left out of the mass.

    Args:
        target_accept: mean acceptance probability the step size is tuned to.
        adapt_mass: also tune the inverse mass (pooled over the chains that move).
        pool_step_size: one step size for all chains (per group of the lowest
            acceptance when tempered), tuned on the mean acceptance; else one per chain.
        dense_mass: tune a dense inverse mass, the draws' covariance, for chains of
            flat rows (B, D) (True); a diagonal one (False); or at each window's end
            the one that pays (``"auto"``: :meth:`WindowStats.chosen_mass`; diagonal
            for chains that are not flat rows, of more than
            :data:`~ebmlab.samplers.diagnostics.DENSE_UP_TO` coordinates, or tempered).
        keep_step_average: dual averaging runs on through the window ends rather than
            restarting there, for a kernel whose metric is not tuned (nothing the step
            size fits changes at a window's end; a restart would try steps near ten
            times the last and drop the average of all steps so far).
    """

    BEHIND: ClassVar[float] = 10.0  # a chain may lag by 10 (1 + sqrt(D / 2)) nats (far_behind)

    def __init__(
        self,
        target_accept: float,
        adapt_mass: bool,
        pool_step_size: bool = False,
        dense_mass: bool | str = "auto",
        keep_step_average: bool = False,
    ):
        self.target_accept = _checks.probability("target_accept", target_accept)
        self.adapt_mass = adapt_mass
        self.pool_step_size = pool_step_size
        if dense_mass not in (True, False, "auto"):
            raise ArgumentError(f"dense_mass must be True, False or 'auto', got {dense_mass!r}")
        self.dense_mass = dense_mass
        self.keep_step_average = keep_step_average
        # per-chain inverse temperatures and their groups when tempered, else None
        self.chain_betas: torch.Tensor | None = None
        self.groups: ChainGroups | None = None

    def tempered(self, beta: torch.Tensor) -> WarmupTuning:
        """This tuning for per-chain tempered energies beta E (B,): chains of one beta
        form a group with its own mass, 1 / beta at first, then its own variance; a
        pooled step size follows the group with the lowest acceptance."""
        if self.dense_mass is True:
            raise ArgumentError("a dense mass cannot be tempered: use dense_mass=False")
        tuning = copy.copy(self)
        tuning.dense_mass = False
        tuning.chain_betas, tuning.groups = beta, ChainGroups.of(beta)
        return tuning

    def initial(self, state: SamplerState, step_size: float, kind: type[T], **fields) -> T:
        """``state`` as a ``kind`` state with ``step_size``, unit inverse mass (1 / beta
        per chain when tempered) and the further ``fields``."""
        x = state.x
        if self.dense_mass is True and x.ndim != 2:
            raise ArgumentError(
                f"dense_mass needs chains of flat rows (B, D), got x0 of shape {tuple(x.shape)}"
            )
        inv_mass = torch.ones(x.shape[1:], dtype=x.dtype, device=x.device)
        if self.chain_betas is not None:
            if len(self.chain_betas) != len(x):
                raise ArgumentError(
                    f"a tempered kernel for {len(self.chain_betas)} chains got x0 with {len(x)}"
                )
            inv_mass = per_chain(1 / self.chain_betas, x) * inv_mass
        return state.as_kind(kind, step_size=step_size, inv_mass=inv_mass, **fields)

    def begin(self, state: T, n_steps: int, search: bool = False) -> T:
        """``state`` before ``n_steps`` warm-up steps: step sizes as tensors (one per
        chain unless pooled), a fresh adapter, the window schedule; ``search`` asks for
        a step-size search before the first step (:meth:`search_step_size`)."""
        if n_steps == 0:
            return state
        x = state.x
        step = torch.as_tensor(state.step_size, dtype=x.dtype, device=x.device)
        step = step.mean() if self.pool_step_size else step.expand(len(x)).clone()
        return state.replace(
            step_size=step,
            warmup_steps=n_steps,
            dual=DualAveraging.start(step, self.target_accept),
            windows=WarmupWindows.plan(n_steps),
            window=self._window(state),
            search_due=search,
        )

    def _window(self, state: SamplerState) -> WindowStats:
        """An empty window for ``state``'s chains, with the statistics the mass needs."""
        x = state.x
        choose = (self.dense_mass == "auto" and self.adapt_mass and x.ndim == 2
                  and 1 < x.shape[1] <= DENSE_UP_TO)  # fmt: skip
        return WindowStats.begin(state, self.dense_mass is True, choose)

    def warming(self, state: TunedState) -> bool:
        """Whether the step from ``state`` is one of the warm-up's."""
        return state.dual is not None and state.t < state.warmup_steps

    def update(self, old: T, new: T, step_adapted: bool = False) -> T:
        """``new``, the state after a step from ``old``, tuned if the step was one of the
        warm-up's on its acceptance probabilities (``new.info``): a dual averaging
        update (on the device; skipped if ``step_adapted``: the kernel updated
        ``new.dual`` itself, chain by chain), and at the end of the initial buffer or a
        window the chains that were stuck or are :meth:`far_behind` restarted and (at a
        window's end) a new inverse mass from the others, after which the step size is
        searched again and dual averaging restarts (unless ``keep_step_average``)."""
        if not self.warming(old):
            return new
        if not step_adapted:
            accept_prob = new.info.accept_prob
            if self.pool_step_size:
                groups = self.groups
                accept_prob = (accept_prob.mean() if groups is None
                               else groups.means(accept_prob).min())  # fmt: skip
            dual, step_size = new.dual.update(accept_prob.to(new.dual.h.dtype))
            new = new.replace(step_size=step_size, dual=dual)
        # a window that chooses its mass leaves chains far behind out of F at every step
        behind = self.far_behind(new) if new.window.fisher is not None else None
        arrived = None if behind is None else ~behind
        window = new.window.add(new.x, moments=self.adapt_mass, grad=new.grad, arrived=arrived)
        new = new.replace(window=window)
        if new.t not in new.windows.checks:
            return new
        stuck = new.window.stuck(new)
        behind = self.far_behind(new) if behind is None else behind
        behind = behind & ~stuck
        reasons, since = [], new.t - new.window.count
        if bool(stuck.any()):
            reasons.append(f"chain(s) {_chains(stuck.nonzero().flatten())} had not moved, or "
                           f"diverged on every step, since step {since}")  # fmt: skip
        if bool(behind.any()):
            rows = behind.nonzero().flatten()
            reasons.append(f"chain(s) {_chains(rows)} had energies {_listed(new.energy, rows)}, "
                           f"more than {self.behind_margin(new.x):.3g} above the lower "
                           "quartile of the chains' (far behind)")  # fmt: skip
        stuck = stuck | behind
        new = self._restart(new, stuck, "; ".join(reasons))
        if self.adapt_mass and new.t in new.windows.mass_updates:
            moving = ~stuck if bool((~stuck).any()) else torch.ones_like(stuck)
            window = new.window
            refused = None
            if window.fisher is not None:
                mass, refused = window.chosen_mass(moving)
            elif self.dense_mass is True:
                mass = window.covariance(moving)
            else:
                mass = window.variance(moving, self.groups)
            new = new.replace(inv_mass=mass, search_due=True, refused_spread=refused)
        if self.keep_step_average:
            return new.replace(window=self._window(new))
        restart = DualAveraging.start(new.step_size, self.target_accept)
        return new.replace(dual=restart, window=self._window(new))

    def behind_margin(self, x: torch.Tensor) -> float:
        """BEHIND (1 + sqrt(D / 2)) for chains x (B, ...) of D numbers each: how far a
        chain's energy may sit above the lower quartile of the chains' before it counts
        as far behind."""
        return self.BEHIND * (1 + math.sqrt(x[0].numel() / 2))

    def far_behind(self, state: SamplerState) -> torch.Tensor:
        """Chains whose energy exceeds the lower quartile of the chains' by more than
        :meth:`behind_margin` (B,); none when tempered (the chains' energies are at
        different temperatures) or for fewer than 4 chains (no quartile to speak of).

        In the typical set of a D-dimensional target the chains' energies spread by
        about sqrt(D / 2) (E - min E ~ Gamma(D / 2, 1) for a Gaussian), so a chain this
        far above a quarter of them, ten such spreads and more, sits where the density
        is e^-10 of theirs or less: it is still on its way in from its start, or caught
        in a minor mode. On its way in, its draws would inflate the window's variance
        by orders of magnitude (the benchmark regression's chains started at uniform(-2,
        2) take 100 to 250 warm-up steps to come in). In a mode this far above the
        others, which holds a negligible share of the mass unless its volume is larger
        by a similar factor, it would stay: posteriordb's Lotka-Volterra model holds
        chains from Stan's starts in two such modes, 40 and 72 nats above the
        posterior's (13 and 24 of these units for its 8 parameters;
        docs/results/posteriors.md). Restarted at a chain that has arrived, it samples
        the target from the next window on. A heavy-tailed target's chain far out in
        its tail may be restarted too (one of the 10-d funnel's 32 chains, 12 units up
        at a window's end), which during warm-up costs it only its place."""
        energy = state.energy
        if self.groups is not None or len(energy) < 4:
            return torch.zeros_like(energy, dtype=torch.bool)
        return energy > torch.quantile(energy, 0.25) + self.behind_margin(state.x)

    def _restart(self, state: T, stuck: torch.Tensor, why: str) -> T:
        """``state`` with each ``stuck`` chain moved to the position (and step size) of
        a chain that is not, taken in turn; a warning names them and says ``why``.
        Nothing changes when every chain is stuck, or for tempered chains (whose
        donors would have to share their temperature)."""
        if self.groups is not None:  # a tempered chain would need a donor of its own group
            return state
        rows = stuck.nonzero().flatten()
        healthy = (~stuck).nonzero().flatten()
        if len(rows) == 0 or len(healthy) == 0:
            return state
        donors = healthy[torch.arange(len(rows), device=rows.device) % len(healthy)]
        steps = state.step_size
        step_sizes = torch.as_tensor(steps).expand(len(stuck))
        warnings.warn(
            f"warm-up step {state.t}: restarted chain(s) {_chains(rows)} at the positions of "
            f"chain(s) {_chains(donors)}: {why} (step sizes {_listed(step_sizes, rows)})",
            SamplingWarning,
            stacklevel=2,
        )

        def take(t: torch.Tensor) -> torch.Tensor:
            t = t.clone()
            t[rows] = t[donors]
            return t

        per_row = isinstance(steps, torch.Tensor) and steps.ndim == 1
        return state.replace(
            x=take(state.x),
            energy=take(state.energy),
            grad=take(state.grad),
            step_size=take(steps) if per_row else steps,
            dual=state.dual.take(rows, donors),
        )

    def finish(self, state: T) -> T:
        """``state`` after warm-up: the averaged step size, the adapter dropped; a
        warning names chains whose step size ended below a tenth of the median or that
        rarely moved since the last window (:func:`~ebmlab.samplers.diagnostics.rarely_moving`)."""
        if state.dual is None:
            return state
        step = state.dual.final_step_size
        if step.ndim == 1 and state.window is not None and state.window.count > 0:
            moved = (state.accepted - state.window.accepted0).to(step.dtype) / state.window.count
            poor = (step < 0.1 * step.median()) | rarely_moving(moved, state.window.count)
            if bool(poor.any()):
                rows = poor.nonzero().flatten()
                warnings.warn(
                    f"after warm-up, chain(s) {_chains(rows)} mix poorly: step sizes "
                    f"{_listed(step, rows)} (median {float(step.median()):.3g}), moved on "
                    f"{_listed(moved, rows)} of the last {state.window.count} steps",
                    SamplingWarning,
                    stacklevel=2,
                )
        # a pooled step size goes back to the host once, so that no later step reads it
        final = float(step) if step.ndim == 0 else step
        return state.replace(step_size=final, warmup_steps=0, dual=None, windows=None, window=None)

    def finite_starts(self, state: T) -> T:
        """``state`` with the chains whose energy or gradient is not finite restarted at
        chains whose are; raises, naming the first such chain and its position, when no
        chain's is (or when tempered: a restart would need a donor of the same
        temperature)."""
        bad = ~torch.isfinite(state.energy) | ~torch.isfinite(state.grad).flatten(1).all(1)
        if not bool(bad.any()):
            return state
        i = int(bad.nonzero()[0])
        if bool(bad.all()) or self.groups is not None:
            raise ArgumentError(
                f"the energy or its gradient is not finite at chain {i}'s start "
                f"x0[{i}] = {_position(state.x[i])} (energy {float(state.energy[i])}): "
                "start the chains where both are finite"
            )
        return self._restart(state, bad, "their energy or gradient is not finite")

    def search_step_size(self, state: T, energy: EnergyFn, generator: torch.Generator | None) -> T:
        """``state`` with each chain's step size searched as Stan does before warm-up
        and after each mass update: from the current size, double (or halve) until one
        leapfrog step from the chain's position with a fresh momentum accepts with
        probability below (above) 0.8, doubling to at most 1e7 and halving as long as
        the dtype has a smaller positive step (a start far out in a tail, with an
        energy of 1e100, needs steps near 1e-100); a pooled step size becomes the
        median of the chains'. Dual averaging restarts around the result. Chains whose
        energy is not finite at their start are restarted at finite ones first; raises
        when no chain's is, or when a chain's step halves to zero without one leapfrog
        step that accepts."""
        state = self.finite_starts(state)
        x, inv_mass = state.x, state.inv_mass
        eps = torch.as_tensor(state.step_size, dtype=x.dtype, device=x.device).expand(len(x))

        def one_step_log_accept(eps: torch.Tensor) -> torch.Tensor:
            p = momentum(gaussian_noise(x, generator), inv_mass)
            _, p1, e1, _ = leapfrog(energy, x, p, state.grad, eps, 1, inv_mass)
            delta = state.energy + kinetic_energy(p, inv_mass) - e1 - kinetic_energy(p1, inv_mass)
            return delta.nan_to_num(nan=-math.inf)

        up = one_step_log_accept(eps) > LOG_TARGET_SEARCH
        active, factor = torch.ones_like(up), torch.where(up, 2.0, 0.5).to(x.dtype)
        lost = torch.zeros_like(up)
        probes = 1
        while True:
            trial = eps * factor
            halved_away = active & (trial == 0)  # below the dtype's smallest step
            lost, active = lost | halved_away, active & ~halved_away
            if not bool(active.any()):
                break
            eps = torch.where(active, trial, eps)
            delta = one_step_log_accept(eps)
            probes += 1
            still = torch.where(up, (delta > LOG_TARGET_SEARCH) & (eps < 1e7),
                                delta < LOG_TARGET_SEARCH)  # fmt: skip
            active = active & still
        if bool(lost.any()):
            i = int(lost.nonzero()[0])
            raise ArgumentError(
                f"chain {i} at x = {_position(x[i])} finds no step size that accepts one "
                f"leapfrog step (halved down to {float(eps[i]):.3g})"
            )
        step = eps.median() if self.pool_step_size else eps.clone()
        return state.replace(
            step_size=step,
            dual=DualAveraging.start(step, self.target_accept),
            search_due=False,
            n_grad_evals=state.n_grad_evals + probes,
            chain_grad_evals=None
            if state.chain_grad_evals is None
            else state.chain_grad_evals + probes,
        )

    def centred(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, ...) minus the mean of its group of chains."""
        return x - x.mean(0) if self.groups is None else self.groups.centred(x)


def _chains(rows: torch.Tensor, limit: int = 8) -> str:
    """Chain indices as a short printed list (the first ``limit``, then how many)."""
    shown = ", ".join(str(i) for i in rows[:limit].tolist())
    return f"[{shown}, ... ({len(rows)} in all)]" if len(rows) > limit else f"[{shown}]"


def _listed(values: torch.Tensor, rows: torch.Tensor, limit: int = 8) -> str:
    """The values at ``rows`` as a short printed list (the first ``limit``)."""
    shown = [f"{v:.3g}" for v in values[rows[:limit]].tolist()]
    return "[" + ", ".join(shown) + (", ...]" if len(rows) > limit else "]")


def _position(x: torch.Tensor, limit: int = 6) -> str:
    """A chain's position, its first ``limit`` coordinates printed."""
    flat = x.flatten().tolist()
    shown = ", ".join(f"{v:.4g}" for v in flat[:limit])
    return f"[{shown}{', ...' if len(flat) > limit else ''}]"
