"""The loss family of energy-based learning (LeCun, Chopra, Hadsell, Ranzato & Huang 2006).

Learning shapes E(W, Y, X) so that the correct answer Y^i has lower energy than
the others (LeCun et al. 2006). Every loss is a function of energies only:

- losses that need every answer's energy take ``energies`` (B, K) and ``target`` (B,):
  :func:`perceptron_loss`, :func:`nll_loss`, :func:`mee_loss`;
- the generalized margin losses take the energy of the correct answer
  ``e_correct`` (B,) and that of the most offending incorrect answer
  ``e_offending`` (B,), Ybar^i = argmin_{||Y - Y^i|| > eps} E(W, Y, X^i)
  (see :func:`ebmlab.inference.most_offending`);
- :func:`energy_loss` takes ``e_correct`` alone.

``reduction`` is ``"mean"`` (default), ``"sum"`` or ``"none"`` (per example), as in
``torch.nn.functional``. Section numbers refer to the 2006 tutorial.
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from ebmlab import _checks
from ebmlab._checks import ArgumentError

REDUCTIONS = ("mean", "sum", "none")


def _reduce(loss: torch.Tensor, reduction: str) -> torch.Tensor:
    _checks.one_of("reduction", reduction, REDUCTIONS)
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss


def _pair(e_correct: torch.Tensor, e_offending: torch.Tensor) -> None:
    _checks.tensor("e_correct", e_correct, ndim=1, floating=True, finite=True)
    _checks.tensor("e_offending", e_offending, ndim=1, floating=True, finite=True)
    if e_correct.shape != e_offending.shape:
        raise ArgumentError(
            f"e_correct and e_offending must have the same shape, got {tuple(e_correct.shape)} "
            f"and {tuple(e_offending.shape)}"
        )


def _table(energies: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Check (B, K) energies and (B,) targets; return the energies of the targets."""
    _checks.tensor("energies", energies, ndim=2, floating=True, finite=True)
    _checks.tensor("target", target, ndim=1)
    if target.shape[0] != energies.shape[0]:
        raise ArgumentError(f"target must have {energies.shape[0]} entries, got {target.shape[0]}")
    if (
        target.dtype.is_floating_point
        or int(target.min()) < 0
        or int(target.max()) >= energies.shape[1]
    ):
        raise ArgumentError(f"target must hold integer class indices in [0, {energies.shape[1]})")
    return energies.gather(1, target.long().view(-1, 1)).squeeze(1)


def energy_loss(e_correct: torch.Tensor, *, reduction: str = "mean") -> torch.Tensor:
    """L = E(W, Y^i, X^i) (§2.2.1). Pulls down the correct answer only; it can collapse
    to a flat energy surface unless the architecture makes other energies rise.

    Args:
        e_correct: E(W, Y^i, X^i), the energies of the correct answers, (B,).
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
    """
    _checks.tensor("e_correct", e_correct, ndim=1, floating=True, finite=True)
    return _reduce(e_correct, reduction)


def perceptron_loss(
    energies: torch.Tensor, target: torch.Tensor, *, reduction: str = "mean"
) -> torch.Tensor:
    """L = E(W, Y^i, X^i) - min_Y E(W, Y, X^i) (§2.2.2, generalized perceptron).

    Zero whenever the correct answer has the lowest energy: no margin.

    Args:
        energies: E(W, Y, X^i) of every answer, (B, K).
        target: the correct answers' indices, (B,).
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
    """
    e_correct = _table(energies, target)
    return _reduce(e_correct - energies.min(1).values, reduction)


def hinge_loss(
    e_correct: torch.Tensor,
    e_offending: torch.Tensor,
    *,
    margin: float = 1.0,
    reduction: str = "mean",
) -> torch.Tensor:
    """L = max(0, m + E(W, Y^i, X^i) - E(W, Ybar^i, X^i)) (§2.2.3).

    Args:
        e_correct: E(W, Y^i, X^i), (B,).
        e_offending: E(W, Ybar^i, X^i), (B,).
        margin: m, the margin the correct answer's energy must keep below the offending
            one's.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
    """
    _pair(e_correct, e_offending)
    _checks.positive("margin", margin, allow_zero=True)
    return _reduce(F.relu(margin + e_correct - e_offending), reduction)


def log_loss(
    e_correct: torch.Tensor, e_offending: torch.Tensor, *, reduction: str = "mean"
) -> torch.Tensor:
    """L = log(1 + exp(E(W, Y^i, X^i) - E(W, Ybar^i, X^i))) (§2.2.3): a soft hinge.

    The hinge with an infinite margin, smoothed: the gradient never vanishes, so the
    answers keep being pushed apart however wide the gap between them already is.

    Args:
        e_correct: E(W, Y^i, X^i), (B,).
        e_offending: E(W, Ybar^i, X^i), (B,).
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
    """
    _pair(e_correct, e_offending)
    return _reduce(F.softplus(e_correct - e_offending), reduction)


def lvq2_loss(
    e_correct: torch.Tensor,
    e_offending: torch.Tensor,
    *,
    delta: float = 0.1,
    reduction: str = "mean",
) -> torch.Tensor:
    """LVQ2 (§2.2.3): L = min(1, max(0, (E(Y^i) - E(Ybar^i)) / (delta E(Ybar^i)))).

    Energies are E(W, ., X^i). A zero-margin loss that saturates once E(Y^i) exceeds
    (1 + delta) E(Ybar^i); it assumes positive energies. This is the 2006 paper's
    definition, not the hinge formula it resembles.

    Args:
        e_correct: E(W, Y^i, X^i), (B,).
        e_offending: E(W, Ybar^i, X^i), (B,).
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
    """
    _pair(e_correct, e_offending)
    _checks.positive("delta", delta)
    ratio = (e_correct - e_offending) / (delta * e_offending)
    return _reduce(ratio.clamp(0.0, 1.0), reduction)


def mce_loss(
    e_correct: torch.Tensor, e_offending: torch.Tensor, *, reduction: str = "mean"
) -> torch.Tensor:
    """L = sigmoid(E(W, Y^i, X^i) - E(W, Ybar^i, X^i)) (§2.2.3, minimum classification error).

    A smooth count of mistakes (Juang et al. 1997): it saturates at both ends, so
    neither samples far on the right side nor gross errors move the parameters much,
    and the loss is not convex in the energy difference.

    Args:
        e_correct: E(W, Y^i, X^i), (B,).
        e_offending: E(W, Ybar^i, X^i), (B,).
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
    """
    _pair(e_correct, e_offending)
    return _reduce(torch.sigmoid(e_correct - e_offending), reduction)


def square_square_loss(
    e_correct: torch.Tensor,
    e_offending: torch.Tensor,
    *,
    margin: float = 1.0,
    reduction: str = "mean",
) -> torch.Tensor:
    """L = E(W, Y^i, X^i)^2 + (max(0, m - E(W, Ybar^i, X^i)))^2 (§2.2.3).

    Both terms are squared, as in the 2006 paper. Meant for non-negative energies.

    Args:
        e_correct: E(W, Y^i, X^i), (B,).
        e_offending: E(W, Ybar^i, X^i), (B,).
        margin: m, the margin the correct answer's energy must keep below the offending
            one's.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
    """
    _pair(e_correct, e_offending)
    _checks.positive("margin", margin, allow_zero=True)
    return _reduce(e_correct.pow(2) + F.relu(margin - e_offending).pow(2), reduction)


def square_exponential_loss(
    e_correct: torch.Tensor,
    e_offending: torch.Tensor,
    *,
    gamma: float = 1.0,
    reduction: str = "mean",
) -> torch.Tensor:
    """L = E(W, Y^i, X^i)^2 + gamma exp(-E(W, Ybar^i, X^i)) (§2.2.3).

    Args:
        e_correct: E(W, Y^i, X^i), (B,).
        e_offending: E(W, Ybar^i, X^i), (B,).
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
    """
    _pair(e_correct, e_offending)
    _checks.positive("gamma", gamma)
    return _reduce(e_correct.pow(2) + gamma * torch.exp(-e_offending), reduction)


def nll_loss(
    energies: torch.Tensor, target: torch.Tensor, *, beta: float = 1.0, reduction: str = "mean"
) -> torch.Tensor:
    """L = E(W, Y^i, X^i) + (1 / beta) log sum_y exp(-beta E(W, y, X^i)) (§2.2.4).

    The negative log-likelihood of the Gibbs distribution P(Y | X) at inverse temperature
    beta, times 1/beta: the cross-entropy of softmax(-beta E) divided by beta. As beta
    grows it tends to the perceptron loss.

    Args:
        energies: E(W, Y, X^i) of every answer, (B, K).
        target: the correct answers' indices, (B,).
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
    """
    e_correct = _table(energies, target)
    _checks.positive("beta", beta)
    if math.log(energies.shape[1]) / beta > torch.finfo(energies.dtype).max:
        raise ArgumentError(
            f"beta ({beta!r}) is too small: the free energy's (1/beta) log K term "
            f"overflows {energies.dtype}"
        )
    free_energy = -torch.logsumexp(-beta * energies, 1) / beta
    return _reduce(e_correct - free_energy, reduction)


def mee_loss(
    energies: torch.Tensor, target: torch.Tensor, *, beta: float = 1.0, reduction: str = "mean"
) -> torch.Tensor:
    """L = 1 - P(Y^i | X^i, W) with P = softmax(-beta E) (§2.2.4, minimum empirical error).

    Args:
        energies: E(W, Y, X^i) of every answer, (B, K).
        target: the correct answers' indices, (B,).
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
    """
    _table(energies, target)
    _checks.positive("beta", beta)
    p = torch.softmax(-beta * energies, 1).gather(1, target.long().view(-1, 1)).squeeze(1)
    return _reduce(1 - p, reduction)


def contrastive_update_loss(
    e_correct: torch.Tensor, e_contrastive: torch.Tensor, *, reduction: str = "mean"
) -> torch.Tensor:
    """L = E(W, Y^i, X^i) - E(W, Ybar^i, X^i), with Ybar^i from approximate inference.

    Its gradient is the contrastive-divergence update of LeCun et al. (2006): pull down
    the data, pull up the contrastive answer the (approximate) inference found. Hold
    ``e_contrastive``'s answer fixed (detach the answer, not the energy) when
    differentiating.

    Args:
        e_correct: E(W, Y^i, X^i), the energies of the correct answers, (B,).
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
    """
    _pair(e_correct, e_contrastive)
    return _reduce(e_correct - e_contrastive, reduction)
