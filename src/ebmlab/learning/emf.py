"""Learning with the extended mean-field (TAP) free energy (Gabrié, Tramel & Krzakala 2015).

The negative log-likelihood of a Boltzmann machine or RBM is mean F(data) + log Z. EMF
learning replaces log Z by its Plefka expansion to second (TAP) or third order,
max_m [S(m) + U(m)] (:func:`ebmlab.partition.plefka_free_energy`). At the maximising
magnetisations m* the expansion's gradient in the parameters is its partial gradient
with m* held fixed, so each update needs only m*: no sampling, and a deterministic
negative phase. As in the paper (§4), the magnetisations persist across updates, a
batch of them started at data rows and moved by a few damped TAP iterations per update,
which tracks the solutions as the parameters move, the way persistent CD tracks the
model's samples; the gradient averages over them.
"""

from __future__ import annotations

import torch

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.energies.boltzmann import BernoulliRBM, BoltzmannMachine
from ebmlab.learning.chains import PersistentChains, random_rows
from ebmlab.partition.plefka import check_order, plefka_free_energy, plefka_magnetisations
from ebmlab.partition.variational import pairwise_potentials


class EMFLearning(PersistentChains):
    """The TAP / EMF learning rule for a Boltzmann machine or Bernoulli RBM.

    Args:
        model: a :class:`~ebmlab.energies.BoltzmannMachine` or
            :class:`~ebmlab.energies.BernoulliRBM`.
        order: 1 (naive mean field), 2 (TAP) or 3 (the third-order EMF; graphs without
            triangles, which every RBM is).
        n_particles: persistent magnetisations (default: the first batch's size).
        n_iter: TAP iterations per update (3 in Gabrié et al. 2015).
        damping: weight of the previous magnetisations in each iteration.

    ``loss(data)`` is a surrogate whose gradient is the EMF estimate of the negative
    log-likelihood's; ``chains`` holds the magnetisations (P, D), or (P, D + M) with
    the hidden ones after the visible ones for an RBM.
    """

    def __init__(
        self,
        model: BernoulliRBM | BoltzmannMachine,
        order: int = 2,
        *,
        n_particles: int | None = None,
        n_iter: int = 3,
        damping: float = 0.5,
    ) -> None:
        if not isinstance(model, BernoulliRBM | BoltzmannMachine):
            raise ArgumentError(
                f"model must be a BoltzmannMachine or BernoulliRBM, got {type(model).__name__}"
            )
        super().__init__(True, n_particles)
        self.model = model
        self.n_iter = _checks.positive_int("n_iter", n_iter)
        self.damping = _checks.probability("damping", damping)
        if damping >= 1:
            raise ArgumentError(f"damping must be below 1, got {damping}")
        self.edges = pairwise_potentials(model)[2]
        self.order = check_order(model, self.edges, order)

    def potentials(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The fields (n,) and couplings (E,) of the model's pairwise form, differentiable
        in its parameters (a Boltzmann machine's pairs enter x^T W x twice)."""
        model = self.model
        if isinstance(model, BernoulliRBM):
            return torch.cat([model.b, model.c]), model.W.reshape(-1)
        i, j = self.edges[:, 0], self.edges[:, 1]
        return model.b, 2 * model.W[i, j]

    def _start(self, data: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """The persistent magnetisations, begun on the first call at random data rows
        (pulled into [0.01, 0.99]) and, for an RBM, their p(h | row)."""
        if self.chains is None:
            rows = random_rows(data, self.n_chains or len(data), generator).clamp(0.01, 0.99)
            if isinstance(self.model, BernoulliRBM):
                rows = torch.cat([rows, self.model.hidden_probs(rows)], 1)
            self.chains = rows
        return self.chains

    def magnetisations(
        self, data: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Move the persistent magnetisations ``n_iter`` TAP iterations under the current
        parameters (starting them at rows of ``data`` on the first call) and return them.

        Args:
            generator: source of randomness, a ``torch.Generator`` on the data's device
                (``None``: the global one).
        """
        with torch.no_grad():
            fields, couplings = (t.detach() for t in self.potentials())
            start = self._start(data.flatten(1).to(fields.dtype), generator)
            m, _ = plefka_magnetisations(
                fields, couplings, self.edges, self.order, init=start,
                damping=self.damping, max_iter=self.n_iter, tol=0.0,
            )  # fmt: skip
        self.keep(m)
        return m

    def loss(self, data: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """mean F(data) + mean over the magnetisations of S(m) + U(m): the EMF estimate of
        the negative log-likelihood (up to the gap between the magnetisations and the
        exact maximiser), whose gradient is the EMF learning rule's.

        Args:
            generator: source of randomness, a ``torch.Generator`` on the data's device
                (``None``: the global one).
        """
        m = self.magnetisations(data, generator)
        fields, couplings = self.potentials()
        log_z = plefka_free_energy(m, fields, couplings, self.edges, self.order).mean()
        return self.model.energy(data.flatten(1)).mean() + log_z
