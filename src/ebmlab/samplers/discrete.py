"""Gradient-informed samplers for discrete variables: Gibbs-with-Gradients and
discrete Langevin.

Both use the gradient of a differentiable energy to guess, to first order, how
much the energy falls when a site changes value:

    Delta_{i,k}(x) = -<grad E(x), x' - x>,   x' = x with site i set to value k,

which is E(x) - E(x') up to the Taylor remainder (Grathwohl et al. 2021, eq. 3).
Sites are binary units in {0, 1} or, with ``one_hot=True``, categorical variables
stored one-hot along the last dimension. For a binary site Delta = g_i (2 x_i - 1);
for a categorical site Delta_{i,k} = g_{i,c} - g_{i,k}, c being the current value.

- :class:`GibbsWithGradients` (Grathwohl et al. 2021, Alg. 1) proposes a single
  change (i, k) with probability softmax(Delta / 2) over all changes, and corrects the
  approximation with a Metropolis-Hastings test using the reverse proposal's
  probability at x'.
- :class:`DiscreteLangevin` (Zhang et al. 2022, eq. 3) changes every site at once,
  independently: site i takes value k with probability proportional to
  exp(Delta_{i,k} / 2 - |x'_i - x_i|^2 / (2 alpha)). Unadjusted it is DULA;
  ``adjusted=True`` adds the Metropolis-Hastings test (DMALA).

A step costs one energy-and-gradient evaluation, at the proposal, which the next
step reuses when the proposal is accepted. ``accept_prob`` holds each chain's
acceptance probability of the last step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ebmlab import _checks
from ebmlab.energies.base import EnergyFn, energy_and_grad
from ebmlab.samplers.base import Sampler, SamplerState, accept, where_rows


@dataclass(frozen=True)
class DiscreteState(SamplerState):
    """Chains with their cached energy and gradient, and the last step's acceptance
    probability per chain."""

    accept_prob: torch.Tensor | None = None


def _gumbel(shape: torch.Size, like: torch.Tensor, generator: torch.Generator | None):
    """Standard Gumbel noise: argmax(logits + G) draws from softmax(logits)."""
    u = torch.rand(shape, generator=generator, dtype=like.dtype, device=like.device)
    return -torch.log(-torch.log(u.clamp_min(torch.finfo(like.dtype).tiny)))


class _Sites:
    """The discrete layout of a state: binary units, or one-hot categories (last dim).

    ``codes(x)`` gives each site's value (B, N) and ``gains(x, g)`` the first-order
    energy decrease Delta (B, N, K) of setting each site to each value (0 at the
    current value); ``with_codes`` builds the state holding new values.
    """

    def __init__(self, one_hot: bool) -> None:
        self.one_hot = one_hot

    def check(self, x0: torch.Tensor) -> torch.Tensor:
        binary = (x0 == 0) | (x0 == 1)
        if not binary.all():
            raise ValueError(
                "x0 must be discrete: every value 0 or 1"
                + (" (one-hot categories along the last dimension)" if self.one_hot else "")
                + "; continuous inputs need a continuous sampler such as Langevin or MALA"
            )
        if self.one_hot and (x0.ndim < 3 or not (x0.sum(-1) == 1).all()):
            raise ValueError(
                "x0 must be one-hot along its last dimension (shape (B, ..., K), exactly one "
                f"1 per site), got shape {tuple(x0.shape)}"
            )
        return x0.detach().clone()

    def codes(self, x: torch.Tensor) -> torch.Tensor:
        if self.one_hot:
            return x.flatten(1, -2).argmax(-1)
        return x.flatten(1).long()

    def gains(self, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        if self.one_hot:
            flat_g = g.flatten(1, -2)
            current = (flat_g * x.flatten(1, -2)).sum(-1, keepdim=True)
            return current - flat_g
        flat_x, flat_g = x.flatten(1), g.flatten(1)
        # value 0: -g (0 - x) = g x; value 1: -g (1 - x)
        return torch.stack([flat_g * flat_x, flat_g * (flat_x - 1)], -1)

    def with_codes(self, x: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        if self.one_hot:
            k = x.shape[-1]
            return torch.nn.functional.one_hot(codes, k).to(x.dtype).view(x.shape)
        return codes.to(x.dtype).view(x.shape)

    def n_values(self, x: torch.Tensor) -> int:
        return x.shape[-1] if self.one_hot else 2

    def distance(self) -> float:
        """|x'_i - x_i|^2 for a change of one site's value."""
        return 2.0 if self.one_hot else 1.0


class _DiscreteSampler(Sampler[DiscreteState]):
    def __init__(self, one_hot: bool) -> None:
        if not isinstance(one_hot, bool):
            raise TypeError(f"one_hot must be a bool, got {one_hot!r}")
        self.sites = _Sites(one_hot)

    def init(self, x0: torch.Tensor, energy: EnergyFn) -> DiscreteState:
        x = self.sites.check(x0)
        e, g = energy_and_grad(energy, x)
        base = SamplerState.start(x, e, g, n_grad_evals=1)
        return DiscreteState(**vars(base), accept_prob=torch.ones_like(e))

    def _metropolis(
        self,
        state: DiscreteState,
        proposal: torch.Tensor,
        log_q_ratio: torch.Tensor | None,
        e_new: torch.Tensor,
        g_new: torch.Tensor,
        generator: torch.Generator | None,
    ) -> DiscreteState:
        """Accept ``proposal`` per chain with probability min(1, exp(E(x) - E(x') +
        log q(x | x') - log q(x' | x))); ``log_q_ratio`` None accepts every proposal."""
        if log_q_ratio is None:
            ok = torch.ones_like(e_new, dtype=torch.bool)
            prob = torch.ones_like(e_new)
        else:
            log_ratio = state.energy - e_new + log_q_ratio
            ok = accept(log_ratio, generator)
            prob = log_ratio.clamp(max=0).exp().nan_to_num(0.0)
        return state.replace(
            x=where_rows(ok, proposal, state.x),
            energy=torch.where(ok, e_new, state.energy),
            grad=where_rows(ok, g_new, state.grad),
            accepted=state.accepted + ok,
            n_grad_evals=state.n_grad_evals + 1,
            t=state.t + 1,
            accept_prob=prob,
        )


class GibbsWithGradients(_DiscreteSampler):
    """Gibbs-with-Gradients (Grathwohl et al. 2021): one gradient-guided change per
    step, Metropolis-Hastings corrected, so the chain targets exp(-E)/Z exactly.

    Args:
        one_hot: the last dimension holds one-hot categories (else binary units).
    """

    def __init__(self, *, one_hot: bool = False) -> None:
        super().__init__(one_hot)

    def _log_q(self, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """log q((i, k) | x) over all changes (B, N * K); staying put has probability 0."""
        gains = self.sites.gains(x, g)
        stay = torch.nn.functional.one_hot(self.sites.codes(x), gains.shape[-1]).bool()
        logits = (gains / 2).masked_fill(stay, -torch.inf).flatten(1)
        return torch.log_softmax(logits, -1)

    def step(
        self, state: DiscreteState, energy: EnergyFn, generator: torch.Generator | None = None
    ) -> DiscreteState:
        x = state.x
        log_q = self._log_q(x, state.grad)
        move = (log_q + _gumbel(log_q.shape, log_q, generator)).argmax(-1, keepdim=True)
        n_values = self.sites.n_values(x)
        site, value = move // n_values, move % n_values
        codes = self.sites.codes(x)
        old_value = codes.gather(1, site)
        proposal = self.sites.with_codes(x, codes.scatter(1, site, value))
        e_new, g_new = energy_and_grad(energy, proposal)
        log_q_back = self._log_q(proposal, g_new).gather(1, site * n_values + old_value)
        log_q_ratio = (log_q_back - log_q.gather(1, move)).squeeze(1)
        return self._metropolis(state, proposal, log_q_ratio, e_new, g_new, generator)


class DiscreteLangevin(_DiscreteSampler):
    """Discrete Langevin proposals (Zhang et al. 2022): every site moves at once,
    independently, guided by the gradient; ``adjusted`` gives DMALA, else DULA.

    Args:
        step_size: alpha; small steps change few sites, large steps many.
        adjusted: Metropolis-Hastings correction (DMALA), exact for any alpha.
        one_hot: the last dimension holds one-hot categories (else binary units).
    """

    def __init__(self, step_size: float, *, adjusted: bool = True, one_hot: bool = False) -> None:
        super().__init__(one_hot)
        self.step_size = _checks.positive("step_size", step_size)
        if not isinstance(adjusted, bool):
            raise TypeError(f"adjusted must be a bool, got {adjusted!r}")
        self.adjusted = adjusted

    def _log_q(self, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """log q(x'_i = k | x) per site and value (B, N, K)."""
        gains = self.sites.gains(x, g)
        stay = torch.nn.functional.one_hot(self.sites.codes(x), gains.shape[-1]).bool()
        penalty = self.sites.distance() / (2 * self.step_size)
        logits = (gains / 2 - penalty).masked_fill(stay, 0.0)
        return torch.log_softmax(logits, -1)

    def step(
        self, state: DiscreteState, energy: EnergyFn, generator: torch.Generator | None = None
    ) -> DiscreteState:
        x = state.x
        log_q = self._log_q(x, state.grad)
        codes = (log_q + _gumbel(log_q.shape, log_q, generator)).argmax(-1)
        proposal = self.sites.with_codes(x, codes)
        e_new, g_new = energy_and_grad(energy, proposal)
        log_q_ratio = None
        if self.adjusted:
            forward = log_q.gather(-1, codes.unsqueeze(-1)).sum((1, 2))
            old = self.sites.codes(x).unsqueeze(-1)
            backward = self._log_q(proposal, g_new).gather(-1, old).sum((1, 2))
            log_q_ratio = backward - forward
        return self._metropolis(state, proposal, log_q_ratio, e_new, g_new, generator)
