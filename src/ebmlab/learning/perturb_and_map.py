"""Learning by moment matching with perturb-and-MAP samples (Papandreou & Yuille 2011).

The log-likelihood gradient of a Boltzmann machine or RBM is the difference between the
data's and the model's sufficient statistics. Perturb-and-MAP replaces the model's by
those of MAP states of randomly perturbed copies, the exact maximisers of -E(x) + noise
(:func:`ebmlab.partition.perturbed_map`). They need no Markov chain, so they cannot mix
slowly. Noise on every configuration of the enumerated units (``perturbation="joint"``)
makes them exact samples, and the updates the exact log-likelihood gradient's
unbiased estimate; first-order noise on each unit's two states (``"unit"``, the
low-order perturbation of Papandreou & Yuille 2011) reaches models too wide to
enumerate when their couplings are attractive, by graph cuts, but its states
over-represent the model's modes, so the moments it matches are not the model's.
"""

from __future__ import annotations

import torch

from ebmlab import _checks
from ebmlab.energies.boltzmann import BernoulliRBM, BoltzmannMachine
from ebmlab.partition.variational import check_perturbation, perturbed_map


class PerturbAndMAP:
    """Negatives by perturb-and-MAP for a Boltzmann machine or Bernoulli RBM.

    Args:
        model: a :class:`~ebmlab.energies.BoltzmannMachine` (at most
            ``ENUMERATION_LIMIT`` units) or :class:`~ebmlab.energies.BernoulliRBM`
            (smaller layer at most ``ENUMERATION_LIMIT`` units).
        n_samples: perturbed MAP states per update (default: the batch's size).
        perturbation: ``"joint"`` (exact samples; at most ``ENUMERATION_LIMIT`` units,
            the smaller layer of an RBM) or ``"unit"`` (first order; also attractive
            models too wide to enumerate).
    """

    def __init__(
        self,
        model: BernoulliRBM | BoltzmannMachine,
        n_samples: int | None = None,
        *,
        perturbation: str = "joint",
    ) -> None:
        if not isinstance(model, BernoulliRBM | BoltzmannMachine):
            raise _checks.ArgumentError(
                f"model must be a BoltzmannMachine or BernoulliRBM, got {type(model).__name__}"
            )
        self.model = model
        self.n_samples = None if n_samples is None else _checks.positive_int("n_samples", n_samples)
        self.perturbation = check_perturbation(model, perturbation)

    def negatives(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``n`` perturbed MAP states (n, D), or (n, D + M) for an RBM, in the model's dtype.

        Args:
            generator: source of randomness, a ``torch.Generator`` on the data's device
                (``None``: the global one).
        """
        _, states = perturbed_map(self.model, n, generator, self.perturbation)
        return states.to(self.model.b.dtype)

    def loss(self, data: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """A surrogate whose gradient is the moment-matching estimate of the negative
        log-likelihood gradient: mean F(data) - mean E(negatives) (free energy of the
        data, joint energy of the MAP states).

        Args:
            generator: source of randomness, a ``torch.Generator`` on the data's device
                (``None``: the global one).
        """
        data = data.flatten(1).to(self.model.b.dtype)
        states = self.negatives(self.n_samples or data.shape[0], generator)
        if isinstance(self.model, BoltzmannMachine):
            return self.model.energy(data).mean() - self.model.energy(states).mean()
        d = self.model.n_visible
        joint = self.model.energy(states[:, :d], states[:, d:])
        return self.model.free_energy(data).mean() - joint.mean()
