"""Negative chains for the Boltzmann family's learning rules.

Contrastive divergence (CD-k, Hinton 2002) starts the negative Gibbs chains at the data
of each update; persistent CD (PCD, Tieleman 2008) carries them from one update to the
next, starting them once at random data rows, so that they approach the model's
distribution as training goes on. Every learning rule in :mod:`ebmlab.learning` keeps
its chains through :class:`PersistentChains`.
"""

from __future__ import annotations

from typing import Any

import torch

from ebmlab import _checks
from ebmlab.samplers.base import diverged_rows, where_rows


class PersistentChains:
    """Where a rule's negative chains start and what it keeps of them.

    Args:
        persistent: carry the chains across updates (PCD); otherwise restart them at
            each batch of data (CD-k).
        n_chains: how many persistent chains (default: the first batch's size).

    ``chains`` holds the current chains (None until the first update); a checkpoint
    saves and restores it.
    """

    def __init__(self, persistent: bool = True, n_chains: int | None = None) -> None:
        self.persistent = persistent
        self.n_chains = None if n_chains is None else _checks.positive_int("n_chains", n_chains)
        self.chains: Any = None

    def start(self, data: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """The chains' starting states for a batch ``data`` (B, D): the data itself (CD),
        or the persistent chains, begun at ``n_chains`` random rows of it (PCD).

        Args:
            generator: source of randomness, a ``torch.Generator`` on the data's device
                (``None``: the global one).
        """
        if not self.persistent:
            return data
        if self.chains is None:
            self.chains = random_rows(data, self.n_chains or data.shape[0], generator)
        return self.chains

    def keep(self, negatives: Any, dtype: torch.dtype | None = None) -> None:
        """Store the negatives as the chains to continue (PCD only), in ``dtype`` if
        given (the model's, when the chains ran in reduced precision)."""
        if self.persistent:
            self.chains = negatives if dtype is None else negatives.to(dtype)

    def reset_diverged(self, data: torch.Tensor, generator: torch.Generator | None) -> int:
        """Restart at random rows of ``data`` every chain with a non-finite state and
        return how many: recovery after a divergence, between updates. Chains kept as
        a tuple of layers (a deep Boltzmann machine's) all restart at the next update
        when any of them diverged.

        Args:
            generator: source of randomness, a ``torch.Generator`` on the data's device
                (``None``: the global one).
        """
        if self.chains is None:
            return 0
        layers = self.chains if isinstance(self.chains, tuple) else (self.chains,)
        bad = torch.stack([diverged_rows(s) for s in layers]).any(0)
        n = int(bad.sum())
        if not n:
            return 0
        if isinstance(self.chains, tuple):
            self.chains = None
        else:
            fresh = random_rows(data, self.chains.shape[0], generator).to(self.chains.dtype)
            self.chains = where_rows(bad, fresh, self.chains)
        return n


def random_rows(data: torch.Tensor, n: int, generator: torch.Generator | None) -> torch.Tensor:
    """``n`` rows of ``data`` drawn uniformly with replacement, as a new tensor.

    Args:
        generator: source of randomness, a ``torch.Generator`` on the data's device
            (``None``: the global one).
    """
    pick = torch.randint(data.shape[0], (n,), generator=generator, device=data.device)
    return data[pick].clone()
