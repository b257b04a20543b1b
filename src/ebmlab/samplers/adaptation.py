"""Warm-up adaptation as small immutable state machines, shared by the samplers.

Each adapter holds its own state and returns an updated copy from ``update``, so a
sampler keeps one in its chain state and the tuning is checkpointed and replayed with
the chains:

- :class:`DualAveraging`: the step size, towards a target mean acceptance probability
  (Nesterov 2009; Hoffman & Gelman 2014, Alg. 5), used by ``AdaptiveHMC``, ``NUTS`` and
  ``MALA(target_accept=...)``;
- :class:`MassWindows`: when to re-estimate a diagonal inverse mass from the chains'
  variance during burn-in;
- :class:`ChEESAdam`: the trajectory length, by Adam ascent on the ChEES criterion per
  gradient (Hoffman, Radul & Sountsov 2021).

:class:`WarmupTuning` composes the first two for a sampler: ``AdaptiveHMC``, ``NUTS``
and ``MALA`` each hold one and keep its products (step size, inverse mass, adapter) in
a :class:`TunedState`. Statistics are pooled across chains (many-chain adaptation in
the spirit of ChEES-HMC and MEADS, Hoffman & Sountsov 2022), per group of chains of
equal inverse temperature when the kernel runs inside parallel tempering.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace
from typing import ClassVar, TypeVar

import torch

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.samplers.base import SamplerState, per_chain


@dataclass(frozen=True)
class DualAveraging:
    """Dual averaging of log step size towards ``target`` mean acceptance.

    After m updates with acceptance a_m: h_m = (1 - 1/(m + T0)) h_{m-1} +
    (target - a_m) / (m + T0); log eps_m = mu - sqrt(m) / GAMMA h_m; the averaged
    log eps_bar_m = m^-KAPPA log eps_m + (1 - m^-KAPPA) log eps_bar_{m-1} is the step
    size kept after warm-up. mu = log(10 eps_0) biases the search towards larger steps.
    """

    GAMMA: ClassVar[float] = 0.05  # how fast the step responds to the acceptance
    T0: ClassVar[float] = 10.0  # damps the first updates
    KAPPA: ClassVar[float] = 0.75  # how fast the average forgets early steps

    target: float
    mu: float
    h: float = 0.0
    log_step_bar: float = 0.0
    count: int = 0

    @classmethod
    def start(cls, step_size: float, target: float) -> DualAveraging:
        """A fresh adapter around ``step_size`` (also after the mass changes).

        Args:
            target: the index of each example's correct answer, (B,) integers in [0, K).
        """
        _checks.positive("step_size", step_size)
        _checks.probability("target", target)
        return cls(target=target, mu=math.log(10 * step_size), log_step_bar=math.log(step_size))

    def update(self, accept_rate: float) -> tuple[DualAveraging, float]:
        """The adapter after one step that accepted at ``accept_rate`` (pooled over
        chains), and the step size to use next."""
        m = self.count + 1
        h = (1 - 1 / (m + self.T0)) * self.h + (self.target - accept_rate) / (m + self.T0)
        log_step = self.mu - math.sqrt(m) / self.GAMMA * h
        eta = m**-self.KAPPA
        log_step_bar = eta * log_step + (1 - eta) * self.log_step_bar
        return replace(self, h=h, log_step_bar=log_step_bar, count=m), math.exp(log_step)

    @property
    def final_step_size(self) -> float:
        """The averaged step size, to keep after warm-up."""
        return math.exp(self.log_step_bar)


@dataclass(frozen=True)
class MassWindows:
    """When a diagonal inverse mass is re-estimated during ``n_steps`` of burn-in: every
    1/COUNT of it from START to END of it, pooled over at least MIN_CHAINS chains
    (per group when tempered). Pooled over many chains the variance is usable early,
    and an early update spares costly first steps at a step size set by the narrowest
    scale."""

    START: ClassVar[float] = 0.05
    END: ClassVar[float] = 0.75
    COUNT: ClassVar[int] = 20
    MIN_CHAINS: ClassVar[int] = 16

    n_steps: int

    def due(self, t: int, n_chains: int) -> bool:
        """Whether step ``t`` (counted from 1) ends with a mass update.

        Args:
            n_chains: number of chains run side by side.
        """
        n = self.n_steps
        in_window = self.START * n <= t <= self.END * n
        return in_window and t % max(1, n // self.COUNT) == 0 and n_chains >= self.MIN_CHAINS


@dataclass(frozen=True)
class ChEESAdam:
    """Adam (beta1 = 0) on log trajectory length, following the gradient of
    log(ChEES / T) (the change in squared distance per gradient evaluation)."""

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
    """Which group each chain belongs to (``index``, (B,)) and how many chains each
    group has (``sizes``), fixed when a tempered kernel is made."""

    index: torch.Tensor
    sizes: torch.Tensor

    @classmethod
    def of(cls, labels: torch.Tensor) -> ChainGroups:
        """Chains with equal ``labels`` (B,) form a group."""
        index = torch.unique(labels, return_inverse=True)[1]
        return cls(index, torch.bincount(index))

    def means(self, x: torch.Tensor) -> torch.Tensor:
        """Mean of x (B, ...) over the chains of each group, (n_groups, ...)."""
        sums = x.new_zeros((len(self.sizes), *x.shape[1:])).index_add_(0, self.index, x)
        return sums / per_chain(self.sizes, sums)

    def centred(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, ...) minus the mean of its group of chains."""
        return x - self.means(x)[self.index]


def regularised_variance(x: torch.Tensor, groups: ChainGroups | None) -> torch.Tensor:
    """Cross-chain variance of x (B, ...), shrunk towards 1e-3 as in Stan
    ((k / (k + 5)) var + 1e-3 (5 / (k + 5)) over k chains): event-shaped, or per chain
    (B, ...) with the variance of each chain's group if ``groups`` is given."""
    if groups is None:
        k = x.shape[0]
        return (k / (k + 5)) * x.var(0) + 1e-3 * (5 / (k + 5))
    counts = per_chain(groups.sizes.to(x.dtype), x)
    centred = groups.centred(x)
    var = groups.means(centred * centred) * counts / (counts - 1)
    return ((counts / (counts + 5)) * var + 1e-3 * (5 / (counts + 5)))[groups.index]


@dataclass(frozen=True)
class TunedState(SamplerState):
    """A chain state with the step size and diagonal inverse mass a sampler tunes, the
    number of warm-up steps, and the step-size adapter while it runs."""

    step_size: float | torch.Tensor = 0.1
    inv_mass: torch.Tensor | None = None
    warmup_steps: int = 0
    dual: DualAveraging | None = None


T = TypeVar("T", bound=TunedState)


class WarmupTuning:
    """The step size by :class:`DualAveraging` and, if ``adapt_mass``, the diagonal
    inverse mass by :class:`MassWindows` and :func:`regularised_variance`, tuned during
    warm-up from statistics pooled across chains.

    Args:
        target_accept: mean acceptance probability the step size is tuned to.
        adapt_mass: also tune the inverse mass (with at least ``MassWindows.MIN_CHAINS``
            chains per group).
    """

    def __init__(self, target_accept: float, adapt_mass: bool) -> None:
        self.target_accept = _checks.probability("target_accept", target_accept)
        self.adapt_mass = adapt_mass
        # per-chain inverse temperatures and their groups when tempered, else None
        self.chain_betas: torch.Tensor | None = None
        self.groups: ChainGroups | None = None

    def tempered(self, beta: torch.Tensor) -> WarmupTuning:
        """This tuning for per-chain tempered energies beta E (B,): chains of one beta
        form a group with its own mass, 1 / beta at first, then its own variance; the
        step size follows the group with the lowest acceptance."""
        tuning = copy.copy(self)
        tuning.chain_betas, tuning.groups = beta, ChainGroups.of(beta)
        return tuning

    def initial(self, state: SamplerState, step_size: float, kind: type[T], **fields) -> T:
        """``state`` as a ``kind`` state with ``step_size``, unit inverse mass (1 / beta
        per chain when tempered) and the further ``fields``."""
        x = state.x
        inv_mass = torch.ones(x.shape[1:], dtype=x.dtype, device=x.device)
        if self.chain_betas is not None:
            if len(self.chain_betas) != len(x):
                raise ArgumentError(
                    f"a tempered kernel for {len(self.chain_betas)} chains got x0 with {len(x)}"
                )
            inv_mass = per_chain(1 / self.chain_betas, x) * inv_mass
        return state.as_kind(kind, step_size=step_size, inv_mass=inv_mass, **fields)

    def begin(self, state: T, n_steps: int) -> T:
        """``state`` before ``n_steps`` warm-up steps, with a fresh step-size adapter."""
        dual = DualAveraging.start(float(state.step_size), self.target_accept)
        return state.replace(warmup_steps=n_steps, dual=dual)

    def warming(self, state: TunedState) -> bool:
        """Whether the step from ``state`` is one of the warm-up's."""
        return state.dual is not None and state.t < state.warmup_steps

    def update(self, old: T, new: T) -> T:
        """``new``, the state after a step from ``old``, tuned if the step was one of the
        warm-up's on its acceptance probabilities (``new.info``): one dual averaging
        update (reading the pooled acceptance back to the host), and in its windows a
        new inverse mass, after which dual averaging restarts."""
        if not self.warming(old):
            return new
        groups, accept_prob = self.groups, new.info.accept_prob
        pooled = accept_prob.mean() if groups is None else groups.means(accept_prob).min()
        dual, step_size = new.dual.update(float(pooled))
        new = new.replace(step_size=step_size, dual=dual)
        if self.adapt_mass and MassWindows(old.warmup_steps).due(new.t, self.smallest_group(old.x)):
            new = self.begin(
                new.replace(inv_mass=regularised_variance(new.x, groups)), old.warmup_steps
            )
        return new

    def finish(self, state: T) -> T:
        """``state`` after warm-up: the averaged step size, the adapter dropped."""
        if state.dual is None:
            return state
        return state.replace(step_size=state.dual.final_step_size, warmup_steps=0, dual=None)

    def smallest_group(self, x: torch.Tensor) -> int:
        """The number of chains in the smallest group (all chains when untempered).

        Args:
            x: chains (B, ...).
        """
        return len(x) if self.groups is None else int(self.groups.sizes.min())

    def centred(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, ...) minus the mean of its group of chains."""
        return x - x.mean(0) if self.groups is None else self.groups.centred(x)
