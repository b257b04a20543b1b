"""The No-U-Turn Sampler (Hoffman & Gelman 2014), batched over chains.

Each step draws a momentum p ~ N(0, M) and doubles a leapfrog trajectory, forwards or
backwards in time at random, until the trajectory starts to turn back on itself or
reaches ``2^max_depth - 1`` leapfrog steps. The next state is drawn from all points of
the trajectory, so no step is ever rejected outright:

- multinomial sampling with weights exp(-H) (Betancourt 2017, appendix A.3): uniform
  progressive sampling among the points of a new subtree, then biased progressive
  sampling when the subtree joins the tree (it wins with probability
  min(1, w_subtree / w_tree));
- the generalised no-U-turn criterion on the summed momentum rho (Betancourt 2013): a
  stretch of trajectory turns when M^{-1} p_first . rho <= 0 or M^{-1} p_last . rho <= 0.
  It is checked for every aligned, power-of-two stretch of a new subtree as its last
  point is computed, and for the whole tree after each doubling. Where two halves A, B
  join, A plus the first point of B and B plus the last point of A are checked too
  (Stan's extra checks): without them a near-periodic trajectory, as on a Gaussian
  whose scales the mass has equalised, can miss its U-turn and run to the depth limit;
- a new subtree that turns inside, or whose energy error exceeds
  ``divergence_threshold`` (a divergence), is discarded and ends the chain's step.

All chains double in lockstep: a chain that has stopped keeps its tree while the others
go on, so a step costs 2^d - 1 gradient evaluations per chain, d the largest depth
among the chains (``run(...).info["n_grad_evals"]``); the evaluations each chain's own
tree used, the count Stan and BlackJAX report, are ``info["n_grad_evals_used"]``.
During burn-in the step size and the diagonal mass adapt as in Stan
(:class:`~ebmlab.samplers.adaptation.WarmupTuning`): a step-size search per chain, then
dual averaging of each chain's step size towards a mean acceptance statistic (the
average of min(1, exp(H_0 - H)) over the new points), the mass re-estimated at the ends
of doubling windows, and chains that stay stuck restarted at the windows' ends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ebmlab import _checks
from ebmlab.energies.base import EnergyFn
from ebmlab.samplers.adaptation import TunedState, WarmupTuning
from ebmlab.samplers.base import Sampler, SamplerState, StepInfo, where_rows
from ebmlab.samplers.integrators import gaussian_noise, kinetic_energy, leapfrog


@dataclass(frozen=True)
class _Point:
    """Position, momentum, energy and gradient of a point of the trajectory (per chain)."""

    x: torch.Tensor
    p: torch.Tensor
    energy: torch.Tensor
    grad: torch.Tensor

    def where(self, mask: torch.Tensor, other: _Point) -> _Point:
        """Row-wise: this point where ``mask``, else ``other``."""
        return _Point(
            where_rows(mask, self.x, other.x),
            where_rows(mask, self.p, other.p),
            torch.where(mask, self.energy, other.energy),
            where_rows(mask, self.grad, other.grad),
        )


@dataclass(frozen=True)
class _Subtree:
    """The outcome of one doubling: first momentum and last point, proposal, log weight,
    summed momentum, whether it may join the tree, divergences, and the acceptance
    statistic's terms."""

    first_p: torch.Tensor
    end: _Point
    proposal: _Point
    log_weight: torch.Tensor
    rho: torch.Tensor
    valid: torch.Tensor
    divergent: torch.Tensor
    accept_sum: torch.Tensor
    n_points: torch.Tensor


def _turning(
    p_first: torch.Tensor, p_last: torch.Tensor, rho: torch.Tensor, inv_mass: torch.Tensor
) -> torch.Tensor:
    """The generalised no-U-turn criterion per chain (True: the stretch turns back)."""
    first = (inv_mass * p_first * rho).flatten(1).sum(1)
    last = (inv_mass * p_last * rho).flatten(1).sum(1)
    return (first <= 0) | (last <= 0)


def _halves_turning(
    a_first: torch.Tensor,
    a_last: torch.Tensor,
    rho_a: torch.Tensor,
    b_first: torch.Tensor,
    b_last: torch.Tensor,
    rho_b: torch.Tensor,
    inv_mass: torch.Tensor,
) -> torch.Tensor:
    """The whole of A then B, and the extra checks across the join (A + b_first, a_last + B)."""
    return (
        _turning(a_first, b_last, rho_a + rho_b, inv_mass)
        | _turning(a_first, b_first, rho_a + b_first, inv_mass)
        | _turning(a_last, b_last, rho_b + a_last, inv_mass)
    )


def _log_uniform(n: int, like: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    return torch.rand(n, generator=generator, dtype=like.dtype, device=like.device).log()


class NUTS(Sampler[TunedState]):
    """No-U-Turn Sampler with multinomial proposals, batched over chains.

    Use with ``burn_in`` (a few hundred steps) so that the step size and diagonal mass
    adapt: ``NUTS().sample(energy, x0, n, burn_in=500)``. A step moves a chain unless
    every point it drew was outweighed by the start; ``run(...).info["acceptance_rate"]``
    is the fraction of steps that moved, and each state's ``info.accept_prob`` the
    acceptance statistic the step size is tuned on.

    Args:
        step_size: initial leapfrog step size.
        max_depth: most tree doublings per step (at most 2^max_depth - 1 gradients).
        target_accept: mean acceptance statistic the step size is tuned to (0.95 for
            posteriors with strong curvature, such as hierarchical models).
        adapt_mass: tune the diagonal inverse mass during burn-in.
        pool_step_size: one step size for all chains, tuned on their mean acceptance;
            by default each chain tunes its own, so that a chain in a region of
            strong curvature does not set (or take) the others' step.
        divergence_threshold: energy error beyond which a subtree is divergent.
    """

    def __init__(
        self,
        step_size: float = 0.1,
        *,
        max_depth: int = 10,
        target_accept: float = 0.8,
        adapt_mass: bool = True,
        pool_step_size: bool = False,
        divergence_threshold: float = 1000.0,
    ) -> None:
        self.step_size = _checks.positive("step_size", step_size)
        self.max_depth = _checks.positive_int("max_depth", max_depth)
        self.tuning = WarmupTuning(target_accept, adapt_mass, pool_step_size)
        self.divergence_threshold = _checks.positive("divergence_threshold", divergence_threshold)

    def init(self, x0: torch.Tensor, energy: EnergyFn) -> TunedState:
        start = SamplerState.start(x0.detach().clone(), None, None, 0).evaluated(energy)
        used = torch.ones(len(x0), dtype=torch.long, device=x0.device)
        return self.tuning.initial(start, self.step_size, TunedState, chain_grad_evals=used)

    def begin_warmup(self, state: TunedState, n_steps: int) -> TunedState:
        return self.tuning.begin(state, n_steps, search=True)

    def end_warmup(self, state: TunedState) -> TunedState:
        return self.tuning.finish(state)

    def tempered(self, beta: torch.Tensor) -> NUTS:
        """This kernel for per-chain tempered energies beta E: each temperature's chains
        get their own mass, 1 / beta at first, then adapted from their own variance."""
        return self._with(tuning=self.tuning.tempered(beta))

    def step(
        self, state: TunedState, energy: EnergyFn, generator: torch.Generator | None = None
    ) -> TunedState:
        if state.search_due:
            state = self.tuning.search_step_size(state, energy, generator)
        x0, inv_mass = state.x, state.inv_mass
        n = x0.shape[0]
        p0 = gaussian_noise(x0, generator) / inv_mass.sqrt()
        start = _Point(x0, p0, state.energy, state.grad)
        h0 = state.energy + kinetic_energy(p0, inv_mass)
        left = right = proposal = start
        log_weight = x0.new_zeros(n)  # log sum of exp(H_0 - H) over the tree
        rho = p0
        done = torch.zeros(n, dtype=torch.bool, device=x0.device)
        moved, divergent = done.clone(), done.clone()
        accept_sum = x0.new_zeros(n)
        n_points = x0.new_zeros(n)
        n_grads = 0
        for depth in range(self.max_depth):
            forward = torch.rand(n, generator=generator, device=x0.device) < 0.5
            edge = right.where(forward, left).where(~done, start)  # stopped chains idle at x0
            eps = torch.where(forward, state.step_size, -state.step_size).to(x0.dtype)
            sub = self._subtree(energy, edge, eps, depth, h0, ~done, inv_mass, generator)
            n_grads += 2**depth
            divergent |= sub.divergent
            accept_sum += sub.accept_sum
            n_points += sub.n_points
            join = sub.valid
            take = join & (_log_uniform(n, h0, generator) < sub.log_weight - log_weight)
            proposal = sub.proposal.where(take, proposal)
            moved |= take
            log_weight = torch.where(join, torch.logaddexp(log_weight, sub.log_weight), log_weight)
            # in time order the tree is A and the subtree B going forwards, else the reverse
            f = forward.view(-1, *([1] * (x0.ndim - 1)))
            turned = _halves_turning(
                torch.where(f, left.p, sub.end.p),
                torch.where(f, right.p, sub.first_p),
                torch.where(f, rho, sub.rho),
                torch.where(f, sub.first_p, left.p),
                torch.where(f, sub.end.p, right.p),
                torch.where(f, sub.rho, rho),
                inv_mass,
            )
            right = sub.end.where(join & forward, right)
            left = sub.end.where(join & ~forward, left)
            rho = where_rows(join, rho + sub.rho, rho)
            done = done | ~join | turned
            if bool(done.all()):
                break
        new = state.replace(
            x=proposal.x,
            energy=proposal.energy,
            grad=proposal.grad,
            accepted=state.accepted + moved,
            divergent=state.divergent + divergent.long(),
            n_grad_evals=state.n_grad_evals + n_grads,
            chain_grad_evals=state.chain_grad_evals + n_points.long(),
            t=state.t + 1,
            info=StepInfo(state.energy, (accept_sum / n_points.clamp(min=1)).log(), divergent),
        )
        return self.tuning.update(state, new)

    def _subtree(
        self,
        energy: EnergyFn,
        point: _Point,
        eps: torch.Tensor,
        depth: int,
        h0: torch.Tensor,
        live: torch.Tensor,
        inv_mass: torch.Tensor,
        generator: torch.Generator | None,
    ) -> _Subtree:
        """2^depth leapfrog steps of signed size ``eps`` from ``point`` for the ``live`` chains.

        Slot k of the checkpoints holds, for the latest point whose index is a multiple
        of 2^k, its momentum, the momentum of the point before it and the running rho
        before it: the start of the aligned stretch of length 2^k that ends when the
        index + 1 is a multiple of 2^k, whose halves start at slots k and k - 1.
        """
        n = h0.shape[0]
        first_p: dict[int, torch.Tensor] = {}
        prev_p: dict[int, torch.Tensor] = {}
        rho_before: dict[int, torch.Tensor] = {}
        start_p = previous = point.p
        rho = torch.zeros_like(point.p)
        log_weight = torch.full_like(h0, -math.inf)
        proposal = point
        valid = live.clone()
        divergent = torch.zeros_like(live)
        accept_sum = torch.zeros_like(h0)
        n_points = torch.zeros_like(h0)
        for i in range(2**depth):
            x, p, e, g = leapfrog(energy, point.x, point.p, point.grad, eps, 1, inv_mass)
            previous = point.p
            point = _Point(x, p, e, g).where(valid, point)  # chains that stopped stay put
            if i == 0:
                start_p = point.p
            log_w = torch.nan_to_num(h0 - e - kinetic_energy(p, inv_mass), nan=-math.inf)
            diverged = valid & (log_w < -self.divergence_threshold)
            accept_sum += torch.where(valid, log_w.clamp(max=0).exp(), 0.0)
            n_points += valid
            for k in range(depth + 1):
                if i % 2**k == 0:
                    first_p[k], prev_p[k], rho_before[k] = point.p, previous, rho
            rho = rho + point.p
            total = torch.logaddexp(log_weight, log_w)
            take = valid & ~diverged & (_log_uniform(n, h0, generator) < log_w - total)
            proposal = point.where(take, proposal)
            log_weight = torch.where(valid, total, log_weight)
            turned = torch.zeros_like(valid)
            for k in range(1, depth + 1):
                if (i + 1) % 2**k == 0:
                    turned |= _halves_turning(
                        first_p[k],
                        prev_p[k - 1],
                        rho_before[k - 1] - rho_before[k],
                        first_p[k - 1],
                        point.p,
                        rho - rho_before[k - 1],
                        inv_mass,
                    )
            divergent |= diverged
            valid = valid & ~diverged & ~turned
        return _Subtree(
            start_p, point, proposal, log_weight, rho, valid, divergent, accept_sum, n_points
        )
