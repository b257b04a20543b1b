"""Recipe ``structured``: energy-based learning with the loss family of LeCun et al. (2006).

``task="digits"`` classifies digits by inference, Y* = argmin_Y E(W, Y, X), over two
architectures (§2 and §3 of the tutorial):

- ``logits``: E(W, Y, X) = -NN(X)[Y]; the energies of the answers are tied only
  through the shared network;
- ``distance``: E(W, Y, X) = ||G(X) - e_Y||^2 with learned answer embeddings e_Y,
  initialised close together (``embed_init`` is their standard deviation) as a fresh
  network's outputs are. A loss that only pulls energies down (the energy loss)
  collapses it: G(X) and every e_Y move to one point and all energies reach zero.
  Losses with a contrastive term push the e_Y apart instead.

The evaluation reports test accuracy and the mean energy gap E(Ybar) - E(Y^i).

``task="chain"`` (sequence labelling, exact inference) and ``task="completion"``
(bottom half of digits, approximate inference) are described in
:mod:`ebmlab.training.structured_outputs`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from ebmlab import _checks
from ebmlab.data import load_dataset
from ebmlab.energies import FeedForward
from ebmlab.training.recipes import Recipe, Setup, register
from ebmlab.training.run_dir import RunDirectory
from ebmlab.training.structured import LOSSES, EnergyLearner
from ebmlab.training.structured_outputs import (
    CHAIN_LOSSES,
    COMPLETION_LOSSES,
    INFERENCE,
    ChainTask,
    CompletionTask,
)
from ebmlab.training.trainer import StepResult, Task, TrainerConfig

TASK_LOSSES = {"digits": LOSSES, "chain": CHAIN_LOSSES, "completion": COMPLETION_LOSSES}


@dataclass
class StructuredConfig:
    """Settings of the ``structured`` recipe.

    Attributes:
        task: digits classification, sequence labelling on a chain, or completing the
            bottom half of binarised digits.
        arch: logits E = -NN(x)[y] or distance E = ||G(x) - e_y||^2 (digits).
        loss: one of LeCun et al.'s (2006) losses (chain and completion take a subset).
        hidden: hidden widths of the network.
        embed_dim: dimension of the distance architecture's embeddings.
        embed_init: standard deviation of the answer embeddings at initialisation.
        gibbs_sweeps: annealed Gibbs sweeps of approximate inference (completion).
        margin: margin of the hinge and square-square losses.
        beta: inverse temperature of the NLL and MEE losses.
        gamma: scale of the square-exponential loss.
        delta: LVQ2's margin.
        n_states: labels of the chain task's hidden Markov model.
        seq_length: length of each sequence (chain).
        n_sequences: training sequences (chain).
    """

    CHOICES: ClassVar[dict[str, Sequence[str]]] = {
        "task": tuple(TASK_LOSSES),
        "arch": ("logits", "distance"),
        "loss": LOSSES,
    }

    task: str = "digits"
    arch: str = "logits"
    loss: str = "hinge"
    hidden: tuple[int, ...] = (128,)
    embed_dim: int = 16
    embed_init: float = 0.01
    gibbs_sweeps: int = 20
    margin: float = 1.0
    beta: float = 1.0
    gamma: float = 1.0
    delta: float = 0.1
    n_states: int = 4
    seq_length: int = 20
    n_sequences: int = 500

    def __post_init__(self) -> None:
        _checks.choices(self)
        _checks.one_of(f"loss (for task {self.task})", self.loss, TASK_LOSSES[self.task])
        _checks.positive_int("n_states", self.n_states)
        _checks.positive_int("seq_length", self.seq_length)
        _checks.positive_int("n_sequences", self.n_sequences)
        _checks.positive("embed_init", self.embed_init, allow_zero=True)
        _checks.positive_int("gibbs_sweeps", self.gibbs_sweeps)
        for width in self.hidden:
            _checks.positive_int("hidden", width)
        _checks.positive_int("embed_dim", self.embed_dim)
        _checks.positive("margin", self.margin, allow_zero=True)
        _checks.positive("beta", self.beta)
        _checks.positive("gamma", self.gamma)
        _checks.positive("delta", self.delta)


class DistanceEnergy(nn.Module):
    """E(X, Y) = ||G(X) - e_Y||^2 for every answer Y: (B, K)."""

    def __init__(
        self,
        dim: int,
        hidden: tuple[int, ...],
        embed_dim: int,
        num_classes: int,
        embed_init: float = 0.01,
    ) -> None:
        super().__init__()
        self.encoder = FeedForward([dim, *hidden, embed_dim], "silu")
        self.embeddings = nn.Parameter(embed_init * torch.randn(num_classes, embed_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cdist(self.encoder(x), self.embeddings).pow(2)


class LogitEnergy(nn.Module):
    """E(X, Y) = -NN(X)[Y] for every answer Y: (B, K)."""

    def __init__(self, dim: int, hidden: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        self.net = FeedForward([dim, *hidden, num_classes], "silu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return -self.net(x)


class StructuredTask(Task):
    def __init__(self, config: StructuredConfig, seed: int) -> None:
        self.config = config
        self.train = load_dataset("digits", "train")
        self.val = load_dataset("digits", "val")
        self.test = load_dataset("digits", "test")
        torch.manual_seed(seed)
        dim = self.train.x.shape[1]
        if config.arch == "logits":
            self.model = LogitEnergy(dim, config.hidden, 10)
        else:
            self.model = DistanceEnergy(dim, config.hidden, config.embed_dim, 10, config.embed_init)
        self.learner = EnergyLearner(
            self.model,
            config.loss,
            margin=config.margin,
            beta=config.beta,
            gamma=config.gamma,
            delta=config.delta,
        )

    def training_step(
        self, batch: tuple[torch.Tensor, ...], generator: torch.Generator
    ) -> StepResult:
        loss, metrics = self.learner.step_loss(*batch)
        return StepResult(loss, metrics)

    def scores(self, split) -> dict[str, float]:
        with torch.no_grad():
            _, metrics = self.learner.step_loss(split.x, split.y)
        return {"error": 1 - metrics["acc"], "energy_gap": metrics["energy_gap"]}

    def validate(self, generator: torch.Generator) -> dict[str, float]:
        return {f"val_{k}": v for k, v in self.scores(self.val).items()}


def build(config: StructuredConfig, trainer: TrainerConfig) -> Setup:
    if config.task == "chain":
        chain = ChainTask(config, trainer.seed)
        return Setup(chain, chain.train)
    if config.task == "completion":
        completion = CompletionTask(config, trainer.seed)
        return Setup(completion, (completion.train.x,))
    task = StructuredTask(config, trainer.seed)
    return Setup(task, (task.train.x, task.train.y))


def evaluate(setup: Setup, run: RunDirectory) -> dict[str, Any]:
    """Digits: test accuracy and energy gap E(Ybar) - E(Y^i) (positive: correct answers
    lower). Chain: per-position test error for exact and approximate inference beside the
    Bayes-optimal error. Completion: pixel error per inference method beside per-pixel
    logistic regression."""
    if isinstance(setup.task, ChainTask):
        chain = setup.task
        return {
            "task": "chain",
            "loss": chain.config.loss,
            "test_error": chain.error(*chain.test),
            "test_error_by_inference": {i: chain.error(*chain.test, i) for i in INFERENCE},
            "bayes_error": chain.bayes_error(*chain.test),
        }
    if isinstance(setup.task, CompletionTask):
        completion = setup.task
        by_inference = {i: completion.pixel_error(completion.test.x, i) for i in INFERENCE[1:]}
        return {
            "task": "completion",
            "loss": completion.config.loss,
            "test_pixel_error": by_inference["annealed_gibbs"],
            "test_pixel_error_by_inference": by_inference,
            "logistic_regression_pixel_error": completion.baseline_pixel_error(),
        }
    task: StructuredTask = setup.task  # type: ignore[assignment]
    scores = task.scores(task.test)
    return {
        "arch": task.config.arch,
        "loss": task.config.loss,
        "test_accuracy": 1 - scores["error"],
        "test_energy_gap": scores["energy_gap"],
    }


register(
    Recipe(
        name="structured",
        help="classification as energy-based learning with any loss of LeCun et al. (2006)",
        config_cls=StructuredConfig,
        build=build,
        evaluate=evaluate,
        trainer_defaults={"epochs": 30, "batch_size": 32, "lr": 1e-3, "monitor": "val_error"},
    )
)
