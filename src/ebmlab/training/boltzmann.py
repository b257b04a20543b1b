"""Learning a fully visible Boltzmann machine (Tomczak 2024, eq. 6.32).

The negative log-likelihood of data under p(x) = exp(-E(x)) / Z is
mean E(x_data) + log Z. For small D, :func:`exact_nll` sums Z over all 2^D states
with a differentiable log-sum-exp, so autograd gives the exact gradient (6.41).
Beyond that, :class:`BMContrastiveDivergence` replaces the model expectation by
single-site Gibbs samples, restarted at the data (CD-k) or persistent (PCD), and
returns the surrogate loss mean E(x_data) - mean E(x_negative) whose gradient is
that estimate.
"""

from __future__ import annotations

import torch

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.energies.boltzmann import BoltzmannMachine
from ebmlab.partition.exact import MAX_ENUMERATION_BITS, binary_states
from ebmlab.samplers.gibbs import Gibbs


def exact_nll(bm: BoltzmannMachine, data: torch.Tensor) -> torch.Tensor:
    """mean E(data) + log Z, differentiable in the parameters (2^D states enumerated)."""
    if bm.n_visible > MAX_ENUMERATION_BITS:
        raise ArgumentError(f"exact_nll enumerates 2^D states; D must be <= {MAX_ENUMERATION_BITS}")
    states = binary_states(bm.n_visible).to(bm.b.dtype)
    return bm.energy(data).mean() + torch.logsumexp(-bm.energy(states), 0)


class BMContrastiveDivergence:
    """CD-k / PCD for a Boltzmann machine with single-site Gibbs negatives."""

    def __init__(
        self,
        bm: BoltzmannMachine,
        k: int = 1,
        *,
        persistent: bool = False,
        n_chains: int | None = None,
    ) -> None:
        self.bm = bm
        self.k = _checks.positive_int("k", k)
        self.persistent = persistent
        self.n_chains = None if n_chains is None else _checks.positive_int("n_chains", n_chains)
        self.sampler = Gibbs("sequential", model=bm)
        self.chains: torch.Tensor | None = None

    def loss(self, data: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Surrogate loss whose gradient is the CD estimate of the NLL gradient."""
        if self.persistent:
            if self.chains is None:
                n = self.n_chains or data.shape[0]
                pick = torch.randint(data.shape[0], (n,), generator=generator, device=data.device)
                self.chains = data[pick].clone()
            start = self.chains
        else:
            start = data
        negatives = self.sampler.sample(self.bm, start, self.k, generator=generator)
        if self.persistent:
            self.chains = negatives
        return self.bm.energy(data).mean() - self.bm.energy(negatives).mean()
