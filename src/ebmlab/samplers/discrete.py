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
  probability at x'. With ``n_flips = R > 1`` on binary sites it draws R flips from
  the same distribution at x (a path of flips; a site drawn twice flips back) and
  tests the path against the same flips drawn at x' (the path auxiliary proposal of
  Sun et al. 2022): R sites can change for the price of one gradient.
- :class:`DiscreteLangevin` (Zhang et al. 2022, eq. 3) changes every site at once,
  independently: site i takes value k with probability proportional to
  exp(Delta_{i,k} / 2 - |x'_i - x_i|^2 / (2 alpha)). Unadjusted it is DULA;
  ``adjusted=True`` adds the Metropolis-Hastings test (DMALA).

A step costs one energy-and-gradient evaluation, at the proposal, which the next
step reuses when the proposal is accepted. The state's ``info.accept_prob`` holds each
chain's acceptance probability of the last step.
"""

from __future__ import annotations

import torch

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.energies.base import EnergyFn, energy_and_grad
from ebmlab.samplers.base import Sampler, SamplerState, categorical, metropolis_update


def _check_discrete(x0: torch.Tensor, one_hot: bool) -> torch.Tensor:
    if not ((x0 == 0) | (x0 == 1)).all():
        raise ArgumentError(
            "x0 must be discrete: every value 0 or 1"
            + (" (one-hot categories along the last dimension)" if one_hot else "")
            + "; continuous inputs need a continuous sampler such as Langevin or MALA"
        )
    if one_hot and (x0.ndim < 3 or not (x0.sum(-1) == 1).all()):
        raise ArgumentError(
            "x0 must be one-hot along its last dimension (shape (B, ..., K), exactly one "
            f"1 per site), got shape {tuple(x0.shape)}"
        )
    return x0.detach().clone()


class _BinarySites:
    """Sites in {0, 1}: the one change of site i is a flip, with gain
    Delta_i = g_i (2 x_i - 1); |x' - x|^2 = 1 per flip."""

    distance = 1.0

    @staticmethod
    def move_logits(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """Gibbs-with-Gradients' log-weights Delta / 2 of every change (B, N)."""
        return (g * (2 * x - 1)).flatten(1) / 2

    @staticmethod
    def apply(x: torch.Tensor, moves: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x with the flips ``moves`` (B, R) made, a site drawn twice flipping back, and
        the flips that undo them (the same ones)."""
        flat = x.flatten(1)
        ones = torch.ones_like(moves, dtype=flat.dtype)
        odd = torch.zeros_like(flat).scatter_add_(1, moves, ones).remainder_(2)
        return (flat + odd * (1 - 2 * flat)).view(x.shape), moves

    def langevin(
        self, x: torch.Tensor, g: torch.Tensor, alpha: float, generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A discrete Langevin proposal and log q(x' | x): each site flips independently
        with probability sigmoid(Delta_i / 2 - 1 / (2 alpha))."""
        logit = self.move_logits(x, g) - self.distance / (2 * alpha)
        u = torch.rand(logit.shape, generator=generator, dtype=logit.dtype, device=logit.device)
        flips = u.log_() < torch.nn.functional.logsigmoid(logit)
        proposal = torch.where(flips, 1 - x.flatten(1), x.flatten(1)).view(x.shape)
        return proposal, self._log_q(logit, flips)

    def langevin_log_q(
        self, x: torch.Tensor, g: torch.Tensor, alpha: float, back_to: torch.Tensor
    ) -> torch.Tensor:
        """log q(back_to | x) of the same proposal."""
        logit = self.move_logits(x, g) - self.distance / (2 * alpha)
        return self._log_q(logit, x.flatten(1) != back_to.flatten(1))

    @staticmethod
    def _log_q(logit: torch.Tensor, flips: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.logsigmoid(torch.where(flips, logit, -logit)).sum(1)


class _OneHotSites:
    """Categorical sites stored one-hot along the last dimension (K values): setting
    site i to k gains Delta_{i,k} = g_{i,c} - g_{i,k}; |x' - x|^2 = 2 per change."""

    distance = 2.0

    @staticmethod
    def _gains(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        flat_x, flat_g = x.flatten(1, -2), g.flatten(1, -2)
        return (flat_g * flat_x).sum(-1, keepdim=True) - flat_g  # (B, N, K)

    def move_logits(self, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """Log-weights Delta / 2 of every change (B, N * K); staying put is excluded."""
        stay = x.flatten(1, -2).bool()
        return (self._gains(x, g) / 2).masked_fill(stay, -torch.inf).flatten(1)

    @staticmethod
    def apply(x: torch.Tensor, move: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k = x.shape[-1]
        site = move // k
        rows = x.flatten(1, -2)
        old = rows.gather(1, site[..., None].expand(-1, -1, k)).argmax(-1)
        new_row = torch.nn.functional.one_hot(move % k, k).to(x.dtype)
        changed = rows.scatter(1, site[..., None].expand(-1, -1, k), new_row)
        return changed.view(x.shape), site * k + old

    def _langevin_log_probs(self, x: torch.Tensor, g: torch.Tensor, alpha: float):
        stay = x.flatten(1, -2).bool()
        logits = (self._gains(x, g) / 2 - self.distance / (2 * alpha)).masked_fill(stay, 0.0)
        return torch.log_softmax(logits, -1)  # (B, N, K)

    def langevin(self, x: torch.Tensor, g: torch.Tensor, alpha: float, generator):
        log_p = self._langevin_log_probs(x, g, alpha)
        codes = categorical(log_p, 1, generator)  # (B, N, 1)
        proposal = torch.zeros_like(log_p).scatter_(-1, codes, 1.0).to(x.dtype).view(x.shape)
        return proposal, log_p.gather(-1, codes).sum((1, 2))

    def langevin_log_q(self, x, g, alpha: float, back_to: torch.Tensor) -> torch.Tensor:
        log_p = self._langevin_log_probs(x, g, alpha)
        return (log_p * back_to.flatten(1, -2)).sum((1, 2))


class _DiscreteSampler(Sampler[SamplerState]):
    def __init__(self, one_hot: bool) -> None:
        if not isinstance(one_hot, bool):
            raise ArgumentError(f"one_hot must be a bool, got {one_hot!r}")
        self.one_hot = one_hot
        self.sites = _OneHotSites() if one_hot else _BinarySites()

    def init(self, x0: torch.Tensor, energy: EnergyFn) -> SamplerState:
        x = _check_discrete(x0, self.one_hot)
        return SamplerState.start(x, None, None, 0).evaluated(energy)

    def _metropolis(
        self,
        state: SamplerState,
        proposal: torch.Tensor,
        log_q_ratio: torch.Tensor | None,
        e_new: torch.Tensor,
        g_new: torch.Tensor,
        generator: torch.Generator | None,
    ) -> SamplerState:
        """Accept ``proposal`` per chain with probability min(1, exp(E(x) - E(x') +
        log q(x | x') - log q(x' | x))); ``log_q_ratio`` None accepts every proposal."""
        log_ratio = None if log_q_ratio is None else state.energy - e_new + log_q_ratio
        return metropolis_update(state, proposal, e_new, g_new, log_ratio, generator)


class GibbsWithGradients(_DiscreteSampler):
    """Gibbs-with-Gradients (Grathwohl et al. 2021): gradient-guided changes,
    Metropolis-Hastings corrected, so the chain targets exp(-E)/Z exactly.

    Args:
        n_flips: changes proposed per step. 1 is Gibbs-with-Gradients; more (binary
            sites only) draws that many flips from the proposal at x and corrects with
            the same flips' probability at x' (Sun et al. 2022, path auxiliary
            proposal), so one gradient moves several sites: up to n_flips times the
            effective samples per step where one flip barely changes the gradient
            elsewhere (large, weakly coupled grids); on small or strongly coupled
            models the acceptance falls and one flip does better.
        one_hot: the last dimension holds one-hot categories (else binary units).
    """

    def __init__(self, *, n_flips: int = 1, one_hot: bool = False) -> None:
        super().__init__(one_hot)
        self.n_flips = _checks.positive_int("n_flips", n_flips)
        if one_hot and n_flips > 1:
            raise ArgumentError(
                f"n_flips must be 1 with one_hot=True (paths of several changes need binary "
                f"sites), got {n_flips}"
            )

    def step(
        self, state: SamplerState, energy: EnergyFn, generator: torch.Generator | None = None
    ) -> SamplerState:
        log_q = torch.log_softmax(self.sites.move_logits(state.x, state.grad), -1)
        moves = categorical(log_q, self.n_flips, generator)
        proposal, back = self.sites.apply(state.x, moves)
        e_new, g_new = energy_and_grad(energy, proposal)
        log_q_back = torch.log_softmax(self.sites.move_logits(proposal, g_new), -1)
        log_q_ratio = (log_q_back.gather(1, back) - log_q.gather(1, moves)).sum(1)
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
            raise ArgumentError(f"adjusted must be a bool, got {adjusted!r}")
        self.adjusted = adjusted

    def step(
        self, state: SamplerState, energy: EnergyFn, generator: torch.Generator | None = None
    ) -> SamplerState:
        alpha = self.step_size
        proposal, forward = self.sites.langevin(state.x, state.grad, alpha, generator)
        e_new, g_new = energy_and_grad(energy, proposal)
        log_q_ratio = None
        if self.adjusted:
            backward = self.sites.langevin_log_q(proposal, g_new, alpha, state.x)
            log_q_ratio = backward - forward
        return self._metropolis(state, proposal, log_q_ratio, e_new, g_new, generator)
