"""Energy-based learning over a finite answer set in one call (LeCun et al. 2006).

:class:`EnergyLearner` binds a model that scores every answer, E(W, Y, X) as a
(B, K) table, an inference rule (argmin; the most offending incorrect answer at
distance > eps) and a loss from :mod:`ebmlab.losses`, so that a training step is
``loss, metrics = learner.step_loss(x, y)``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ebmlab import _checks, losses
from ebmlab._checks import ArgumentError
from ebmlab.devices import widen
from ebmlab.inference import most_offending

TABLE_LOSSES = {"perceptron", "nll", "mee"}
MARGIN_LOSSES = {"hinge", "log", "lvq2", "mce", "square_square", "square_exponential"}
LOSSES = ("energy", *sorted(TABLE_LOSSES), *sorted(MARGIN_LOSSES))


class EnergyLearner:
    """Model + inference + loss.

    Args:
        model: maps x (B, ...) to energies of all K answers (B, K).
        loss: one of ``LOSSES``.
        margin: the margin of the margin losses.
        beta: the inverse temperature of the NLL and MEE losses.
        gamma: the scale of the square-exponential loss.
        delta: the smoothing of the LVQ2 loss.
        distances: distances between answers (K, K) that define the most offending
            one (see :func:`ebmlab.inference.most_offending`).
        eps: answers farther than this from the correct one can be offending.
    """

    def __init__(
        self,
        model: nn.Module | Callable[[torch.Tensor], torch.Tensor],
        loss: str,
        *,
        margin: float = 1.0,
        beta: float = 1.0,
        gamma: float = 1.0,
        delta: float = 0.1,
        distances: torch.Tensor | None = None,
        eps: float = 0.0,
    ) -> None:
        self.model = _checks.callable_("model", model)
        self.loss_name = _checks.one_of("loss", loss, LOSSES)
        self.options = {"margin": margin, "beta": beta, "gamma": gamma, "delta": delta}
        self.distances = distances
        self.eps = eps

    def energies(self, x: torch.Tensor) -> torch.Tensor:
        """The energies of every answer, (B, ...) -> (B, K), checked for that shape.

        Args:
            x: inputs (B, ...).
        """
        table = self.model(x)
        if table.ndim != 2 or table.shape[0] != x.shape[0]:
            raise ArgumentError(
                f"model must return energies of shape (B, K), got {tuple(table.shape)}"
            )
        return table

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Inference: the lowest-energy answer.

        Args:
            x: inputs (B, ...).
        """
        with torch.no_grad():
            return self.energies(x).argmin(1)

    def loss_from_table(
        self, table: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss for energies ``table`` (B, K) and correct answers ``y``, with metrics."""
        e_correct = table.gather(1, y.long().view(-1, 1)).squeeze(1)
        offending = most_offending(table.detach(), y, distances=self.distances, eps=self.eps)
        e_offending = table.gather(1, offending.view(-1, 1)).squeeze(1)
        name, opts = self.loss_name, self.options
        if name == "energy":
            loss = losses.energy_loss(e_correct)
        elif name == "perceptron":
            loss = losses.perceptron_loss(table, y)
        elif name == "nll":
            loss = losses.nll_loss(table, y, beta=opts["beta"])
        elif name == "mee":
            loss = losses.mee_loss(table, y, beta=opts["beta"])
        elif name in ("hinge", "square_square"):
            loss = getattr(losses, f"{name}_loss")(e_correct, e_offending, margin=opts["margin"])
        elif name == "square_exponential":
            loss = losses.square_exponential_loss(e_correct, e_offending, gamma=opts["gamma"])
        elif name == "lvq2":
            loss = losses.lvq2_loss(e_correct, e_offending, delta=opts["delta"])
        else:
            loss = getattr(losses, f"{name}_loss")(e_correct, e_offending)
        metrics = {
            "energy_gap": float((e_offending - e_correct).detach().mean()),
            "acc": float(widen(table.detach().argmin(1) == y).mean()),
        }
        return loss, metrics

    def step_loss(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """Energies of every answer, the most offending one, and the loss, in one call.

        Args:
            x: inputs (B, ...).
            y: the correct answers' indices (B,).
        """
        return self.loss_from_table(self.energies(x), y)
