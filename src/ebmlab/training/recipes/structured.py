"""Recipe ``structured``: classification as energy-based learning with any loss of the family.

Digits are classified by inference, Y* = argmin_Y E(W, Y, X), over two architectures
(LeCun et al. 2006, §2 and §3):

- ``logits``: E(W, Y, X) = -NN(X)[Y]; the energies of the answers are tied only
  through the shared network;
- ``distance``: E(W, Y, X) = ||G(X) - e_Y||^2 with learned answer embeddings e_Y. A
  loss that only pulls energies down (the energy loss) can collapse it: G(X) and
  every e_Y move to one point and all energies reach zero.

The evaluation reports test accuracy and the mean energy gap E(Ybar) - E(Y^i).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ebmlab import _checks
from ebmlab.data import load_dataset
from ebmlab.energies import FeedForward
from ebmlab.training.recipes import Recipe, Setup, register
from ebmlab.training.run_dir import RunDirectory
from ebmlab.training.structured import LOSSES, EnergyLearner
from ebmlab.training.trainer import StepResult, Task, TrainerConfig


@dataclass
class StructuredConfig:
    """Settings of the ``structured`` recipe."""

    task: str = "digits"
    arch: str = "logits"
    loss: str = "hinge"
    hidden: tuple[int, ...] = (128,)
    embed_dim: int = 16
    margin: float = 1.0
    beta: float = 1.0
    gamma: float = 1.0
    delta: float = 0.1

    def __post_init__(self) -> None:
        _checks.one_of("task", self.task, ["digits"])
        _checks.one_of("arch", self.arch, ["logits", "distance"])
        _checks.one_of("loss", self.loss, LOSSES)
        for width in self.hidden:
            _checks.positive_int("hidden", width)
        _checks.positive_int("embed_dim", self.embed_dim)
        _checks.positive("margin", self.margin, allow_zero=True)
        _checks.positive("beta", self.beta)
        _checks.positive("gamma", self.gamma)
        _checks.positive("delta", self.delta)


class DistanceEnergy(nn.Module):
    """E(X, Y) = ||G(X) - e_Y||^2 for every answer Y: (B, K)."""

    def __init__(self, dim: int, hidden: tuple[int, ...], embed_dim: int, num_classes: int) -> None:
        super().__init__()
        self.encoder = FeedForward([dim, *hidden, embed_dim], "silu")
        self.embeddings = nn.Parameter(torch.randn(num_classes, embed_dim))

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
            self.model = DistanceEnergy(dim, config.hidden, config.embed_dim, 10)
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
    task = StructuredTask(config, trainer.seed)
    return Setup(task, (task.train.x, task.train.y))


def evaluate(setup: Setup, run: RunDirectory) -> dict[str, Any]:
    """Test accuracy and energy gap E(Ybar) - E(Y^i) (positive: correct answers lower)."""
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
