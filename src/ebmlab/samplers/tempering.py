"""Tempering: replica exchange over a temperature ladder, and annealing along a path.

Parallel tempering (Swendsen & Wang 1986; Geyer 1991) runs one copy of every chain
at each inverse temperature beta_k of a ladder 1 = beta_0 > beta_1 > ... with any
base kernel on the tempered energy beta_k E. Neighbouring replicas swap states
with probability min(1, exp((beta_k - beta_{k+1}) (E(x_k) - E(x_{k+1})))); even
and odd neighbour pairs alternate (deterministic even-odd swaps: the non-reversible
scheme of Syed et al. 2021, whose states sweep the ladder instead of diffusing on it).
Hot replicas cross energy barriers and hand their states down, so the cold chain
visits every mode in proportion to its mass. The cached energies and gradients
travel with the swapped states, so a swap costs no evaluation.

With ``tune_ladder`` the warm-up runs rounds of doubling length; after each, the
ladder moves so that every neighbour pair rejects equally often (Syed et al. 2021,
Alg. 4): the swap rejection rates r_k accumulate into the communication barrier
Lambda(beta), and the new ladder takes equal steps of Lambda. The total barrier
Lambda = sum_k r_k measures how hard the target is to temper; about 2 Lambda + 1
temperatures suit it (:func:`tuned_ladder`). Every state carries a walker label, so
the run counts round trips (hottest to coldest and back), the figure of merit of a
ladder.

:func:`geometric_path` and :func:`anneal` move samples along
E_beta = (1 - beta) E_0 + beta E_1, the path annealed importance sampling uses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.devices import widen
from ebmlab.energies.base import EnergyFn, EnergyLike, as_energy_fn
from ebmlab.samplers.base import Sampler, SamplerState, accept, frozen_parameters, per_chain


@dataclass(frozen=True)
class TemperingState(SamplerState):
    """Cold chains (x, energy, grad) plus all replicas' base state and swap statistics."""

    replicas: SamplerState | None = None
    swaps_accepted: torch.Tensor | None = None  # per neighbour pair (K - 1,)
    swaps_proposed: torch.Tensor | None = None
    betas: torch.Tensor | None = None  # the ladder in use (K,), coldest first
    walkers: torch.Tensor | None = None  # the walker label of every replica slot
    last_end: torch.Tensor | None = None  # per walker: 0 none yet, 1 coldest, 2 hottest
    round_trips: torch.Tensor | None = None  # completed hottest -> coldest -> hottest
    tune_at: tuple[int, ...] = ()  # steps after which the ladder is retuned


class ParallelTempering(Sampler[TemperingState]):
    """Replica exchange with base kernel ``base`` over inverse temperatures ``betas``.

    ``betas`` must start at 1 and decrease; ``swap_every`` base steps separate
    swap rounds. With ``scale_steps`` each replica's kernel has its step size
    rescaled to its temperature (``Sampler.tempered``), so hot replicas explore.
    ``accepted`` counts the cold chains' accepted swaps; ``swap_rates()`` reports
    each neighbour pair's acceptance rate, ``barrier()`` the communication barrier and
    ``round_trips`` the walkers' round trips. An adaptive base kernel (``AdaptiveHMC``,
    ``NUTS``) is tuned during burn-in with a mass of its own for every temperature.
    With ``tune_ladder`` the inner temperatures move during burn-in until all pairs
    reject equally often (the hottest and coldest stay). Swap and round-trip counts
    restart after burn-in.
    """

    def __init__(
        self,
        base: Sampler,
        betas: Sequence[float],
        swap_every: int = 1,
        scale_steps: bool = True,
        tune_ladder: bool = False,
    ) -> None:
        _checks.instance("base", base, Sampler, "a Sampler")
        betas_t = torch.as_tensor(list(betas), dtype=torch.float64)
        if betas_t.ndim != 1 or len(betas_t) < 2:
            raise ArgumentError("betas must be a sequence of at least two inverse temperatures")
        if betas_t[0] != 1 or not (betas_t[1:] < betas_t[:-1]).all() or betas_t[-1] <= 0:
            raise ArgumentError(
                "betas must start at 1.0 and decrease strictly to a value > 0 (inverse "
                f"temperatures, coldest first), got {list(betas)}"
            )
        if not isinstance(tune_ladder, bool):
            raise ArgumentError(f"tune_ladder must be a bool, got {tune_ladder!r}")
        self.base = base
        self.betas = betas_t.float()
        self.swap_every = _checks.positive_int("swap_every", swap_every)
        self.scale_steps = scale_steps
        self.tune_ladder = tune_ladder
        self._layouts: dict[tuple[int, torch.device], tuple[torch.Tensor, torch.Tensor, Sampler]]
        self._layouts = {}

    @staticmethod
    def geometric_ladder(n_temperatures: int, min_beta: float) -> list[float]:
        """``n_temperatures`` inverse temperatures from 1 down to ``min_beta``, equally
        spaced in log."""
        _checks.positive_int("n_temperatures", n_temperatures)
        _checks.probability("min_beta", min_beta)
        return torch.logspace(0, torch.log10(torch.tensor(min_beta)), n_temperatures).tolist()

    def _layout(self, betas: torch.Tensor, n: int) -> tuple[torch.Tensor, Sampler]:
        """Per-row inverse temperatures and the (rescaled) kernel for ``n`` chains per
        temperature, rebuilt only when the ladder or the batch changes."""
        key = (n, betas.device)
        cached = self._layouts.get(key)
        if cached is None or cached[0] is not betas:
            beta_rows = betas.repeat_interleave(n)
            kernel = self.base.tempered(beta_rows) if self.scale_steps else self.base
            cached = self._layouts[key] = (betas, beta_rows, kernel)
        return cached[1], cached[2]

    def _tempered(
        self, energy: EnergyFn, state: TemperingState
    ) -> tuple[EnergyFn, torch.Tensor, Sampler]:
        beta_rows, kernel = self._layout(state.betas, state.x.shape[0])
        return (lambda x: beta_rows.to(x.dtype) * energy(x)), beta_rows, kernel

    def _cold(self, replicas: SamplerState, n: int) -> dict:
        return {
            "x": replicas.x[:n],
            "energy": None if replicas.energy is None else replicas.energy[:n],
            "grad": None if replicas.grad is None else replicas.grad[:n],
        }

    def begin_warmup(self, state: TemperingState, n_steps: int) -> TemperingState:
        kernel = self._layout(state.betas, state.x.shape[0])[1]
        state = state.replace(replicas=kernel.begin_warmup(state.replicas, n_steps))
        if self.tune_ladder and len(self.betas) > 2:
            state = state.replace(tune_at=tuple(state.t + b for b in _round_ends(n_steps)))
        return state

    def end_warmup(self, state: TemperingState) -> TemperingState:
        kernel = self._layout(state.betas, state.x.shape[0])[1]
        zero = torch.zeros_like(state.swaps_accepted)
        # swap and round-trip statistics describe the kept phase (and the tuned ladder)
        return state.replace(
            replicas=kernel.end_warmup(state.replicas),
            tune_at=(),
            swaps_accepted=zero,
            swaps_proposed=zero.clone(),
            round_trips=torch.zeros_like(state.round_trips),
            last_end=torch.zeros_like(state.last_end),
        )

    def init(self, x0: torch.Tensor, energy: EnergyFn) -> TemperingState:
        k, n, device = len(self.betas), x0.shape[0], x0.device
        zeros = torch.zeros(n, dtype=torch.long, device=device)
        pairs = torch.zeros(k - 1, dtype=torch.long, device=device)
        state = TemperingState(
            x=x0,
            energy=None,
            grad=None,
            accepted=zeros,
            divergent=zeros.clone(),
            betas=self.betas.to(device),
            walkers=torch.arange(k * n, device=device),
            last_end=torch.zeros(k * n, dtype=torch.int8, device=device),
            round_trips=torch.zeros((), dtype=torch.long, device=device),
            swaps_accepted=pairs,
            swaps_proposed=pairs.clone(),
        )
        tempered, _, kernel = self._tempered(energy, state)
        replicas = kernel.init(x0.repeat(k, *([1] * (x0.ndim - 1))), tempered)
        return state.replace(
            **self._cold(replicas, n), n_grad_evals=replicas.n_grad_evals, replicas=replicas
        )

    def step(
        self, state: TemperingState, energy: EnergyFn, generator: torch.Generator | None = None
    ) -> TemperingState:
        n, k = state.x.shape[0], len(self.betas)
        tempered, beta_rows, kernel = self._tempered(energy, state)
        replicas = kernel.step(state.replicas, tempered, generator)
        accepted_cold = torch.zeros_like(state.accepted)
        swaps_acc, swaps_prop = state.swaps_accepted.clone(), state.swaps_proposed.clone()
        walkers = state.walkers
        if (state.t + 1) % self.swap_every == 0:
            replicas, source, swaps_acc, swaps_prop = self._swap(
                replicas.evaluated(tempered),
                beta_rows,
                n,
                k,
                (state.t + 1) // self.swap_every,
                generator,
                swaps_acc,
                swaps_prop,
            )
            accepted_cold = (source[:n] >= n).long()
            walkers = walkers.index_select(0, source)
            last_end, round_trips = _count_round_trips(
                walkers, state.last_end, state.round_trips, n
            )
        else:  # walkers only move in swaps
            last_end, round_trips = state.last_end, state.round_trips
        state = state.replace(
            **self._cold(replicas, n),
            replicas=replicas,
            accepted=state.accepted + accepted_cold,
            divergent=state.divergent + replicas.divergent[:n] - state.replicas.divergent[:n],
            n_grad_evals=replicas.n_grad_evals,
            swaps_accepted=swaps_acc,
            swaps_proposed=swaps_prop,
            walkers=walkers,
            last_end=last_end,
            round_trips=round_trips,
            t=state.t + 1,
            info=replicas.info.first(n),
        )
        return self._retuned(state) if state.t in state.tune_at else state

    def _retuned(self, state: TemperingState) -> TemperingState:
        """The state on a ladder whose inner temperatures equalise the rejection rates of
        the round just ended; cached energies and gradients are rescaled to it, and the
        swap counts restart for the next round."""
        rejection = (1 - self.swap_rates(state)).cpu()
        betas = _equal_barrier_ladder(widen(state.betas.cpu()), rejection, len(state.betas))
        betas = betas.to(state.betas)
        n = state.x.shape[0]
        factor = (betas / state.betas).repeat_interleave(n)
        replicas = state.replicas
        replicas = replicas.replace(
            energy=None if replicas.energy is None else replicas.energy * factor,
            grad=None
            if replicas.grad is None
            else replicas.grad * per_chain(factor, replicas.grad),
        )
        return state.replace(
            **self._cold(replicas, n),
            replicas=replicas,
            betas=betas,
            swaps_accepted=torch.zeros_like(state.swaps_accepted),
            swaps_proposed=torch.zeros_like(state.swaps_proposed),
        )

    def _swap(self, replicas, beta_rows, n, k, t, generator, swaps_acc, swaps_prop):
        """Even-odd neighbour swaps (even pairs in even swap rounds ``t``, odd pairs in
        odd ones); energies and gradients move with the states, rescaled from the
        temperature they were computed at to their new one."""
        raw_e = (replicas.energy / beta_rows).view(k, n)
        # the row whose state each slot takes
        source = torch.arange(k * n, device=raw_e.device).view(k, n)
        lo, hi = slice(t % 2, k - 1, 2), slice(t % 2 + 1, k, 2)  # the neighbour pairs
        if t % 2 < k - 1:
            betas = beta_rows.view(k, n)[:, :1]
            log_ratio = (betas[lo] - betas[hi]) * (raw_e[lo] - raw_e[hi])
            ok = accept(log_ratio, generator)  # (pairs, n)
            swaps_prop[lo] += n
            swaps_acc[lo] += ok.sum(1)
            low, high = source[lo], source[hi]
            source[lo], source[hi] = torch.where(ok, high, low), torch.where(ok, low, high)
        source = source.view(-1)
        rescale = (beta_rows / beta_rows[source]).to(replicas.energy.dtype)
        grad = replicas.grad
        if grad is not None:
            grad = grad.index_select(0, source) * per_chain(rescale, grad)
        replicas = replicas.replace(
            x=replicas.x.index_select(0, source),
            energy=replicas.energy.index_select(0, source) * rescale,
            grad=grad,
        )
        return replicas, source, swaps_acc, swaps_prop

    @staticmethod
    def swap_rates(state: TemperingState) -> torch.Tensor:
        """Acceptance rate of swaps between each pair of neighbouring temperatures of
        ``state`` (K - 1,), coldest pair first."""
        return widen(state.swaps_accepted) / widen(state.swaps_proposed.clamp_min(1))

    @staticmethod
    def barrier(state: TemperingState) -> float:
        """The communication barrier Lambda of ``state``'s ladder: the sum of the pairs'
        swap rejection rates (Syed et al. 2021, eq. 20), about the number of swaps a
        state needs to cross."""
        return float((1 - ParallelTempering.swap_rates(state)).sum())


_MIN_ROUND = 16  # steps of the first tuning round


def _round_ends(n_steps: int) -> list[int]:
    """Ends of tuning rounds of doubling length filling ``n_steps`` warm-up steps."""
    rounds = max(0, min(8, int(math.log2(max(n_steps, 1) / _MIN_ROUND + 1))))
    if rounds == 0:
        return []
    unit = n_steps / (2**rounds - 1)
    return sorted({round(unit * (2**j - 1)) for j in range(1, rounds + 1)} - {0})


def _equal_barrier_ladder(
    betas: torch.Tensor, rejection: torch.Tensor, n_temperatures: int
) -> torch.Tensor:
    """``n_temperatures`` inverse temperatures from betas[0] = 1 down to betas[-1] taking
    equal steps of the cumulative barrier, piecewise linear between the old ones."""
    ascending = betas.flip(0)
    cumulative = torch.cat([rejection.new_zeros(1), rejection.flip(0).clamp_min(1e-6).cumsum(0)])
    targets = torch.linspace(0, float(cumulative[-1]), n_temperatures, dtype=cumulative.dtype)
    i = torch.searchsorted(cumulative, targets).clamp(1, len(cumulative) - 1)
    lo, hi = cumulative[i - 1], cumulative[i]
    w = ((targets - lo) / (hi - lo)).clamp(0, 1)
    new = ascending[i - 1] + w * (ascending[i] - ascending[i - 1])
    new[0], new[-1] = ascending[0], ascending[-1]
    return new.flip(0)


def _count_round_trips(
    walkers: torch.Tensor, last_end: torch.Tensor, trips: torch.Tensor, n: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mark the walkers in the coldest (first n) and hottest (last n) slots; a walker
    reaching the hottest temperature after the coldest completes a round trip."""
    cold, hot = walkers[:n], walkers[-n:]
    trips = trips + (last_end.index_select(0, hot) == 1).sum()
    last_end = last_end.index_fill(0, cold, 1).index_fill(0, hot, 2)
    return last_end, trips


def tuned_ladder(
    base: Sampler,
    energy: EnergyLike,
    x0: torch.Tensor,
    min_beta: float,
    *,
    pilot_temperatures: int = 8,
    pilot_steps: int = 500,
    generator: torch.Generator | int | None = None,
) -> list[float]:
    """A ladder from 1 down to ``min_beta`` sized to the target's communication barrier.

    A pilot run tunes a ``pilot_temperatures`` ladder over ``pilot_steps`` warm-up steps
    and measures the barrier Lambda on it; the returned ladder has max(3, ceil(2 Lambda)
    + 1) temperatures at equal barrier steps (Syed et al. 2021, §5.3: about 2 Lambda
    temperatures make round trips fastest).

    Args:
        base: the kernel each replica runs (tempered per temperature).
        energy: the target's energy.
        x0: starting chains (B, ...) of the pilot run, one set per temperature.
        min_beta: the hottest inverse temperature.
        pilot_temperatures: the pilot ladder's size.
        pilot_steps: the pilot run's warm-up (and measuring) steps.
        generator: a ``torch.Generator`` on x0's device, or an int seed.

    Returns:
        The inverse temperatures, 1 first.
    """
    pilot = ParallelTempering(
        base,
        ParallelTempering.geometric_ladder(pilot_temperatures, min_beta),
        tune_ladder=True,
    )
    run = pilot.run(energy, x0, pilot_steps, burn_in=pilot_steps, generator=generator)
    state = run.final
    rejection = (1 - ParallelTempering.swap_rates(state)).cpu()
    barrier = float(rejection.sum())
    size = max(3, math.ceil(2 * barrier) + 1)
    return _equal_barrier_ladder(widen(state.betas.cpu()), rejection, size).tolist()


def geometric_path(energy0: EnergyFn, energy1: EnergyFn, beta: float | torch.Tensor) -> EnergyFn:
    """E_beta(x) = (1 - beta) E_0(x) + beta E_1(x): the geometric-mean path of densities
    from ``energy0`` to ``energy1``.

    ``beta`` is one inverse temperature, or a tensor of one per row of the batches the
    path will be evaluated on (each chain at its own point of the path). Returns the
    energy callable (B, ...) -> (B,)."""
    if not isinstance(beta, torch.Tensor):
        _checks.probability("beta", beta)
    return lambda x: (1 - beta) * energy0(x) + beta * energy1(x)


def anneal(
    sampler: Sampler,
    energy: EnergyLike,
    x0: torch.Tensor,
    betas: Sequence[float],
    *,
    steps_per_beta: int = 1,
    base_energy: EnergyLike | None = None,
    generator: torch.Generator | int | None = None,
) -> torch.Tensor:
    """Move ``x0`` (B, ...) through E_beta for each beta in ``betas`` with ``sampler``,
    ``steps_per_beta`` steps each, drawing from ``generator``.

    Without ``base_energy`` the path is beta E for the ``energy`` E (simulated annealing
    when betas rise to 1); with it, (1 - beta) E_0 + beta E. Returns the final chains,
    x0's shape.
    """
    _checks.positive_int("steps_per_beta", steps_per_beta)
    gen = _checks.generator("generator", generator, x0.device)
    fn = as_energy_fn(energy)
    fn0 = (
        as_energy_fn(base_energy)
        if base_energy is not None
        else (lambda x: x.new_zeros(x.shape[0]))
    )
    x = x0
    with frozen_parameters(energy):
        for beta in betas:
            path = geometric_path(fn0, fn, float(beta))
            state = sampler.init(x, path)
            for _ in range(steps_per_beta):
                state = sampler.step(state, path, gen)
            x = state.x
    return x
