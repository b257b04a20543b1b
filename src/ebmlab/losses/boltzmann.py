"""Losses of the Boltzmann family whose gradients are exact or closed-form surrogates.

:func:`exact_nll` is the negative log-likelihood of a fully visible Boltzmann machine
with log Z summed over all 2^D states (Tomczak 2024, eqs. 6.32 and 6.41), so autograd
gives the exact gradient. :func:`classification_rbm_loss` trains a classification RBM
discriminatively, generatively or by their hybrid (Larochelle & Bengio 2008), and
:func:`conditional_cd_loss` the RBMs of one variable given another: the conditional RBM
on sequences (Taylor et al. 2007) and the gated RBM on image pairs (Memisevic & Hinton
2010).
"""

from __future__ import annotations

import torch

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.energies.boltzmann import BoltzmannMachine, ClassificationRBM, binary_states
from ebmlab.energies.gated import GatedRBM
from ebmlab.energies.temporal import ConditionalRBM
from ebmlab.partition.exact import MAX_ENUMERATION_BITS


def exact_nll(bm: BoltzmannMachine, data: torch.Tensor) -> torch.Tensor:
    """mean E(data) + log Z, differentiable in the parameters (2^D states enumerated).

    Args:
        bm: a fully visible Boltzmann machine with at most 20 units.
    """
    if bm.n_visible > MAX_ENUMERATION_BITS:
        raise ArgumentError(f"exact_nll enumerates 2^D states; D must be <= {MAX_ENUMERATION_BITS}")
    _checks.tensor("data", data, min_ndim=2, floating=True, finite=True)
    _checks.rows_of("data", data, bm.n_visible)
    states = binary_states(bm.n_visible, device=bm.b.device).to(bm.b.dtype)
    return bm.energy(data).mean() + torch.logsumexp(-bm.energy(states), 0)


def classification_rbm_loss(
    model: ClassificationRBM,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    mode: str = "hybrid",
    alpha: float = 0.01,
    k: int = 1,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Training loss of a classification RBM (Larochelle & Bengio 2008).

    ``discriminative``: -log p(y | x), exact. ``generative``: the CD-k surrogate
    F(x, y) - F(x~, y~) of -log p(x, y), negatives by Gibbs from the data.
    ``hybrid``: discriminative + ``alpha`` * generative.

    Args:
        model: the classification RBM.
        mode: ``"discriminative"``, ``"generative"`` or ``"hybrid"``.
        generator: source of randomness, a ``torch.Generator`` on the data's device
            (``None``: the global one).
    """
    _checks.one_of("mode", mode, ["discriminative", "generative", "hybrid"])
    _checks.positive("alpha", alpha, allow_zero=True)
    _checks.positive_int("k", k)
    _checks.tensor("x", x, min_ndim=2, floating=True, finite=True)
    _checks.rows_of("x", x, model.n_visible)
    _checks.class_indices("y", y, x.shape[0], model.num_classes)
    loss = model.W.new_zeros(())
    if mode != "generative":
        loss = loss + torch.nn.functional.cross_entropy(model.class_scores(x), y)
    if mode != "discriminative":
        x_neg, y_neg = model.gibbs(x, y, k, generator)
        gen = model.free_energy(x, y).mean() - model.free_energy(x_neg, y_neg).mean()
        loss = loss + (gen if mode == "generative" else alpha * gen)
    return loss


def conditional_cd_loss(
    model: ConditionalRBM | GatedRBM,
    v: torch.Tensor,
    condition: torch.Tensor,
    *,
    k: int = 1,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """CD-k surrogate of -log p(v | condition) for a conditional RBM (Taylor et al. 2007,
    eq. 4) given its histories, or a gated RBM (Memisevic & Hinton 2010) given its
    inputs: mean F(v | condition) - mean F(v' | condition), where v' runs k Gibbs steps
    from v with the condition held fixed, so its gradient is CD's estimate of the
    conditional likelihood's.

    Args:
        model: a conditional or gated RBM.
        generator: source of randomness, a ``torch.Generator`` on the data's device
            (``None``: the global one).
    """
    _checks.tensor("v", v, ndim=2, floating=True, finite=True)
    _checks.tensor("condition", condition, min_ndim=2, floating=True, finite=True)
    _checks.positive_int("k", k)
    if condition.shape[0] != v.shape[0]:
        raise ArgumentError(
            f"condition must have one row per row of v ({v.shape[0]}), got {condition.shape[0]}"
        )
    negatives = model.gibbs(v, condition, k, generator)
    return (model.free_energy(v, condition) - model.free_energy(negatives, condition)).mean()
