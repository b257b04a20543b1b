"""Tempering: replica exchange over a temperature ladder, and annealing along a path.

Parallel tempering (Swendsen & Wang 1986; Geyer 1991) runs one copy of every chain
at each inverse temperature beta_k of a ladder 1 = beta_0 > beta_1 > ... with any
base kernel on the tempered energy beta_k E. Neighbouring replicas swap states
with probability min(1, exp((beta_k - beta_{k+1}) (E(x_k) - E(x_{k+1})))); even
and odd neighbour pairs alternate (deterministic even-odd swaps). Hot replicas
cross energy barriers and hand their states down, so the cold chain visits every
mode in proportion to its mass. The cached energies and gradients travel with the
swapped states, so a swap costs no evaluation.

:func:`geometric_path` and :func:`anneal` move samples along
E_beta = (1 - beta) E_0 + beta E_1, the path annealed importance sampling uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ebmlab import _checks
from ebmlab.energies.base import EnergyFn, EnergyLike, as_energy_fn
from ebmlab.samplers.base import Sampler, SamplerState, accept, frozen_parameters, per_chain


@dataclass(frozen=True)
class TemperingState(SamplerState):
    """Cold chains (x, energy, grad) plus all replicas' base state and swap statistics."""

    replicas: SamplerState | None = None
    swaps_accepted: torch.Tensor | None = None  # per neighbour pair (K - 1,)
    swaps_proposed: torch.Tensor | None = None


class ParallelTempering(Sampler[TemperingState]):
    """Replica exchange with base kernel ``base`` over inverse temperatures ``betas``.

    ``betas`` must start at 1 and decrease; ``swap_every`` base steps separate
    swap rounds. With ``scale_steps`` each replica's kernel has its step size
    rescaled to its temperature (``Sampler.tempered``), so hot replicas explore.
    ``accepted`` counts the cold chains' accepted swaps; ``swap_rates()`` reports
    each neighbour pair's acceptance rate. An adaptive base kernel (``AdaptiveHMC``,
    ``NUTS``) is tuned during burn-in with a mass of its own for every temperature.
    """

    def __init__(
        self, base: Sampler, betas: Sequence[float], swap_every: int = 1, scale_steps: bool = True
    ) -> None:
        if not isinstance(base, Sampler):
            raise TypeError(f"base must be a Sampler, got {type(base).__name__}")
        betas_t = torch.as_tensor(list(betas), dtype=torch.float64)
        if betas_t.ndim != 1 or len(betas_t) < 2:
            raise ValueError("betas must be a sequence of at least two inverse temperatures")
        if betas_t[0] != 1 or not (betas_t[1:] < betas_t[:-1]).all() or betas_t[-1] <= 0:
            raise ValueError(
                f"betas must start at 1.0 and decrease strictly to a value > 0, got {list(betas)}"
            )
        self.base = base
        self.betas = betas_t.float()
        self.swap_every = _checks.positive_int("swap_every", swap_every)
        self.scale_steps = scale_steps
        self._layouts: dict[tuple[int, torch.device], tuple[torch.Tensor, Sampler]] = {}

    @staticmethod
    def geometric_ladder(n_temperatures: int, min_beta: float) -> list[float]:
        """Inverse temperatures from 1 down to ``min_beta``, equally spaced in log."""
        _checks.positive_int("n_temperatures", n_temperatures)
        _checks.probability("min_beta", min_beta)
        return torch.logspace(0, torch.log10(torch.tensor(min_beta)), n_temperatures).tolist()

    def _layout(self, x: torch.Tensor) -> tuple[torch.Tensor, Sampler]:
        """Per-row inverse temperatures and the (rescaled) kernel for chains ``x``, built
        once per batch size and device."""
        key = (x.shape[0], x.device)
        if key not in self._layouts:
            beta_rows = self.betas.to(x.device).repeat_interleave(x.shape[0])
            kernel = self.base.tempered(beta_rows) if self.scale_steps else self.base
            self._layouts[key] = (beta_rows, kernel)
        return self._layouts[key]

    def _tempered(
        self, energy: EnergyFn, x: torch.Tensor
    ) -> tuple[EnergyFn, torch.Tensor, Sampler]:
        beta_rows, kernel = self._layout(x)
        return (lambda x: beta_rows.to(x.dtype) * energy(x)), beta_rows, kernel

    def _cold(self, replicas: SamplerState, n: int) -> dict:
        return {
            "x": replicas.x[:n],
            "energy": None if replicas.energy is None else replicas.energy[:n],
            "grad": None if replicas.grad is None else replicas.grad[:n],
        }

    def begin_warmup(self, state: TemperingState, n_steps: int) -> TemperingState:
        kernel = self._layout(state.x)[1]
        return state.replace(replicas=kernel.begin_warmup(state.replicas, n_steps))

    def end_warmup(self, state: TemperingState) -> TemperingState:
        kernel = self._layout(state.x)[1]
        return state.replace(replicas=kernel.end_warmup(state.replicas))

    def init(self, x0: torch.Tensor, energy: EnergyFn) -> TemperingState:
        k, n = len(self.betas), x0.shape[0]
        tempered, _, kernel = self._tempered(energy, x0)
        replicas = kernel.init(x0.repeat(k, *([1] * (x0.ndim - 1))), tempered)
        zeros = torch.zeros(n, dtype=torch.long, device=x0.device)
        return TemperingState(
            **self._cold(replicas, n),
            accepted=zeros,
            divergent=zeros.clone(),
            n_grad_evals=replicas.n_grad_evals,
            replicas=replicas,
            swaps_accepted=torch.zeros(k - 1, dtype=torch.long, device=x0.device),
            swaps_proposed=torch.zeros(k - 1, dtype=torch.long, device=x0.device),
        )

    def step(
        self, state: TemperingState, energy: EnergyFn, generator: torch.Generator | None = None
    ) -> TemperingState:
        n, k = state.x.shape[0], len(self.betas)
        tempered, beta_rows, kernel = self._tempered(energy, state.x)
        replicas = kernel.step(state.replicas, tempered, generator)
        accepted_cold = torch.zeros_like(state.accepted)
        swaps_acc, swaps_prop = state.swaps_accepted.clone(), state.swaps_proposed.clone()
        if (state.t + 1) % self.swap_every == 0:
            replicas, accepted_cold, swaps_acc, swaps_prop = self._swap(
                replicas.evaluated(tempered),
                beta_rows,
                n,
                k,
                state.t,
                generator,
                swaps_acc,
                swaps_prop,
            )
        return state.replace(
            **self._cold(replicas, n),
            replicas=replicas,
            accepted=state.accepted + accepted_cold,
            divergent=state.divergent + replicas.divergent[:n] - state.replicas.divergent[:n],
            n_grad_evals=replicas.n_grad_evals,
            swaps_accepted=swaps_acc,
            swaps_proposed=swaps_prop,
            t=state.t + 1,
        )

    def _swap(self, replicas, beta_rows, n, k, t, generator, swaps_acc, swaps_prop):
        """Even-odd neighbour swaps; energies and gradients move with the states,
        rescaled from the temperature they were computed at to their new one."""
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
        return replicas, (source[:n] >= n).long(), swaps_acc, swaps_prop

    @staticmethod
    def swap_rates(state: TemperingState) -> torch.Tensor:
        """Acceptance rate of swaps between each pair of neighbouring temperatures."""
        return state.swaps_accepted.double() / state.swaps_proposed.clamp_min(1).double()


def geometric_path(energy0: EnergyFn, energy1: EnergyFn, beta: float) -> EnergyFn:
    """E_beta(x) = (1 - beta) E_0(x) + beta E_1(x): the geometric-mean path of densities."""
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
    """Move ``x0`` through E_beta for each beta in ``betas`` (``steps_per_beta`` steps each).

    Without ``base_energy`` the path is beta E (simulated annealing when betas rise
    to 1); with it, (1 - beta) E_0 + beta E.
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
