"""Recipe ``structured``: energy-based learning with the loss family of LeCun et al. (2006).

``task="digits"`` classifies by inference, Y* = argmin_Y E(W, Y, X), the digits or the
labelled data set ``data`` names (its classes read from the data), over two
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
(bottom half of grayscale images, approximate inference) are described in
:mod:`ebmlab.training.recipes.structured.tasks`.
"""

from __future__ import annotations

from typing import Any

import torch

from ebmlab._checks import ArgumentError
from ebmlab.devices import widen
from ebmlab.energies.base import in_chunks
from ebmlab.energies.structured import DistanceEnergy, LogitEnergy
from ebmlab.evaluation.likelihood import mean_and_stderr
from ebmlab.learning.structured import EnergyLearner
from ebmlab.training.recipes import Recipe, Setup, data_splits, register
from ebmlab.training.recipes.structured.config import StructuredConfig
from ebmlab.training.recipes.structured.tasks import (
    INFERENCE,
    ChainTask,
    CompletionTask,
)
from ebmlab.training.run_dir import RunDirectory
from ebmlab.training.trainer import StepResult, Task, TrainerConfig


class StructuredTask(Task):
    def __init__(self, config: StructuredConfig, seed: int) -> None:
        self.config = config
        self.train, self.val, self.test = data_splits(config, in_memory=True)
        k = self.train.num_classes
        if self.train.y is None or k is None or k < 2:
            raise ArgumentError(f"data {config.data!r} needs labels of at least two classes")
        torch.manual_seed(seed)
        dim = self.train.x.shape[1]
        if config.arch == "logits":
            self.model = LogitEnergy(dim, config.hidden, k)
        else:
            self.model = DistanceEnergy(dim, config.hidden, config.embed_dim, k, config.embed_init)
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
            _, metrics = self.learner.loss_from_table(
                in_chunks(self.learner.energies, split.x), split.y
            )
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
    logistic regression. Each error or accuracy comes with its standard error
    (``_stderr``), over test rows: the sequences and images are independent, the
    positions and pixels within one are not."""
    if isinstance(setup.task, ChainTask):
        chain = setup.task
        by_inference = {
            i: mean_and_stderr(chain.sequence_errors(*chain.test, i)) for i in INFERENCE
        }
        return {
            "task": "chain",
            "loss": chain.config.loss,
            "test_error": by_inference["viterbi"][0],
            "test_error_stderr": by_inference["viterbi"][1],
            "test_error_by_inference": {i: e for i, (e, _) in by_inference.items()},
            **_with_stderr("bayes_error", chain.bayes_errors(*chain.test)),
        }
    if isinstance(setup.task, CompletionTask):
        completion = setup.task
        by_inference = {
            i: mean_and_stderr(completion.pixel_errors(completion.test.x, i)) for i in INFERENCE[1:]
        }
        return {
            "task": "completion",
            "loss": completion.config.loss,
            "test_pixel_error": by_inference["annealed_gibbs"][0],
            "test_pixel_error_stderr": by_inference["annealed_gibbs"][1],
            "test_pixel_error_by_inference": {i: e for i, (e, _) in by_inference.items()},
            **_with_stderr("logistic_regression_pixel_error", completion.baseline_pixel_errors()),
        }
    task: StructuredTask = setup.task  # type: ignore[assignment]
    x, y = task.test.x, task.test.y
    with torch.no_grad():
        table = in_chunks(task.learner.energies, x)
        _, metrics = task.learner.loss_from_table(table, y)
    return {
        "arch": task.config.arch,
        "loss": task.config.loss,
        **_with_stderr("test_accuracy", widen(table.argmin(1) == y)),
        "test_energy_gap": metrics["energy_gap"],
    }


def _with_stderr(name: str, per_row: torch.Tensor) -> dict[str, float]:
    """``name`` and ``name_stderr``: the mean of per-row values and its standard error."""
    mean, stderr = mean_and_stderr(per_row)
    return {name: mean, f"{name}_stderr": stderr}


register(
    Recipe[StructuredConfig, Task](
        name="structured",
        help="classification as energy-based learning with any loss of LeCun et al. (2006)",
        config_cls=StructuredConfig,
        build=build,
        evaluate=evaluate,
        trainer_defaults={"epochs": 30, "batch_size": 32, "lr": 1e-3, "monitor": "val_error"},
    )
)
