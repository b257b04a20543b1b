"""Learning a fully visible Boltzmann machine (Tomczak 2024, eq. 6.32).

The negative log-likelihood of data under p(x) = exp(-E(x)) / Z is
mean E(x_data) + log Z; for small D, :func:`ebmlab.losses.exact_nll` gives it with its
exact gradient (6.41). Beyond that, :class:`BMContrastiveDivergence` replaces the
model expectation by single-site Gibbs samples, restarted at the data (CD-k) or
persistent (PCD), and returns the surrogate loss mean E(x_data) - mean E(x_negative)
whose gradient is that estimate.
"""

from __future__ import annotations

import torch

from ebmlab import _checks
from ebmlab.energies.boltzmann import BoltzmannMachine
from ebmlab.learning.chains import PersistentChains
from ebmlab.samplers.gibbs import Gibbs


class BMContrastiveDivergence(PersistentChains):
    """CD-k / PCD for a Boltzmann machine with single-site Gibbs negatives.

    Args:
        bm: the Boltzmann machine trained.
        persistent: keep the negative chains between updates (PCD).
        n_chains: number of chains run side by side.
    """

    def __init__(
        self,
        bm: BoltzmannMachine,
        k: int = 1,
        *,
        persistent: bool = False,
        n_chains: int | None = None,
    ) -> None:
        super().__init__(persistent, n_chains)
        self.bm = bm
        self.k = _checks.positive_int("k", k)
        self.sampler = Gibbs("sequential", model=bm)

    def loss(self, data: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Surrogate loss whose gradient is the CD estimate of the NLL gradient.

        Args:
            generator: source of randomness, a ``torch.Generator`` on the data's device
                (``None``: the global one).
        """
        start = self.start(data, generator)
        negatives = self.sampler.sample(self.bm, start, self.k, generator=generator)
        self.keep(negatives)
        return self.bm.energy(data).mean() - self.bm.energy(negatives).mean()
