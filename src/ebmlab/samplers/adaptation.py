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
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar

from ebmlab import _checks


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
        """A fresh adapter around ``step_size`` (also after the mass changes)."""
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
        """Whether step ``t`` (counted from 1) ends with a mass update."""
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
        new log T."""
        v = self.BETA2 * self.v + (1 - self.BETA2) * grad * grad
        count = self.count + 1
        v_hat = v / (1 - self.BETA2**count)
        step = self.LEARNING_RATE * grad / (math.sqrt(v_hat) + 1e-12)
        return ChEESAdam(v, count), log_length + step
