"""Recipe ``structured``: classification as energy-based learning with any loss of the family.

Digits are classified by inference, Y* = argmin_Y E(W, Y, X), over two architectures
(LeCun et al. 2006, §2 and §3):

- ``logits``: E(W, Y, X) = -NN(X)[Y]; the energies of the answers are tied only
  through the shared network;
- ``distance``: E(W, Y, X) = ||G(X) - e_Y||^2 with learned answer embeddings e_Y. A
  loss that only pulls energies down (the energy loss) can collapse it: G(X) and
  every e_Y move to one point and all energies reach zero.

The evaluation reports test accuracy and the mean energy gap E(Ybar) - E(Y^i).

``task="chain"`` labels sequences drawn from a known hidden Markov model with a
chain energy E(Y, X) = sum_t U_t[y_t] + sum_t P[y_{t-1}, y_t] (unary terms from a
small network, a learned transition matrix) and exact inference by dynamic
programming. Losses: ``perceptron`` (E(Y^i) - min_Y E(Y)), ``hinge`` (margin
rescaled by the Hamming distance, found by Viterbi on the augmented energy) and
``nll`` (E(Y^i) - F, the forward algorithm). The evaluation reports the per-position
error next to the Bayes-optimal error of the true model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ebmlab import _checks
from ebmlab.data import load_dataset
from ebmlab.data.sequences import HiddenMarkovModel
from ebmlab.energies import FeedForward
from ebmlab.inference import chain_energy, chain_free_energy, chain_marginals, viterbi
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
    n_states: int = 4
    seq_length: int = 20
    n_sequences: int = 500

    def __post_init__(self) -> None:
        _checks.one_of("task", self.task, ["digits", "chain"])
        if self.task == "chain":
            _checks.one_of("loss (for task chain)", self.loss, list(CHAIN_LOSSES))
        _checks.positive_int("n_states", self.n_states)
        _checks.positive_int("seq_length", self.seq_length)
        _checks.positive_int("n_sequences", self.n_sequences)
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


CHAIN_LOSSES = ("perceptron", "hinge", "nll")


class ChainEnergy(nn.Module):
    """Unary energies -NN(x_t) per position and a learned transition matrix."""

    def __init__(self, dim: int, hidden: tuple[int, ...], n_states: int) -> None:
        super().__init__()
        self.unary_net = FeedForward([dim, *hidden, n_states], "silu")
        self.transition = nn.Parameter(torch.zeros(n_states, n_states))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, t, d = x.shape
        return -self.unary_net(x.reshape(b * t, d)).view(b, t, -1), self.transition


class ChainTask(Task):
    """Sequence labelling with exact inference on a chain."""

    def __init__(self, config: StructuredConfig, seed: int) -> None:
        self.config = config
        self.hmm = HiddenMarkovModel(config.n_states, seed=seed)
        data_gen = torch.Generator().manual_seed(seed + 1)
        self.train = self.hmm.sample(config.n_sequences, config.seq_length, data_gen)
        self.val = self.hmm.sample(config.n_sequences // 2, config.seq_length, data_gen)
        self.test = self.hmm.sample(config.n_sequences, config.seq_length, data_gen)
        torch.manual_seed(seed)
        self.model = ChainEnergy(self.hmm.dim, config.hidden, config.n_states)

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        unary, transition = self.model(x)
        e_correct = chain_energy(unary, transition, y)
        if self.config.loss == "nll":
            return (e_correct - chain_free_energy(unary, transition, self.config.beta)).mean()
        if self.config.loss == "perceptron":
            return (e_correct - viterbi(unary, transition)[1]).mean()
        hamming = self.config.margin * (1 - F.one_hot(y, unary.shape[2]).to(unary.dtype))
        return (e_correct - viterbi(unary - hamming, transition)[1]).clamp_min(0).mean()

    def training_step(
        self, batch: tuple[torch.Tensor, ...], generator: torch.Generator
    ) -> StepResult:
        return StepResult(self.loss(*batch))

    def error(self, x: torch.Tensor, y: torch.Tensor) -> float:
        with torch.no_grad():
            labels, _ = viterbi(*self.model(x))
        return float((labels != y).double().mean())

    def bayes_error(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Per-position error of the max posterior marginals under the true HMM."""
        marginals = chain_marginals(*self.hmm.energies(x))
        return float((marginals.argmax(2) != y).double().mean())

    def validate(self, generator: torch.Generator) -> dict[str, float]:
        return {"val_error": self.error(*self.val)}


def build(config: StructuredConfig, trainer: TrainerConfig) -> Setup:
    if config.task == "chain":
        chain = ChainTask(config, trainer.seed)
        return Setup(chain, chain.train)
    task = StructuredTask(config, trainer.seed)
    return Setup(task, (task.train.x, task.train.y))


def evaluate(setup: Setup, run: RunDirectory) -> dict[str, Any]:
    """Digits: test accuracy and energy gap E(Ybar) - E(Y^i) (positive: correct answers
    lower). Chain: per-position test error beside the Bayes-optimal error."""
    if isinstance(setup.task, ChainTask):
        chain = setup.task
        return {
            "task": "chain",
            "loss": chain.config.loss,
            "test_error": chain.error(*chain.test),
            "bayes_error": chain.bayes_error(*chain.test),
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
