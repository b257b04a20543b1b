"""Energy-based learning with LeCun et al.'s (2006) losses: the three demonstrations.

``cases()`` (for ``python -m benchmarks.run structured``) compares the headline numbers
with what a user would use otherwise; ``python -m benchmarks.structured`` prints the full
tables:

1. digits, every loss on the logit and the distance architecture: test accuracy and the
   energy gap E(Ybar) - E(Y^i) (the energy loss collapses the distance architecture);
2. sequence labelling on a known hidden Markov model: per-position error of perceptron,
   hinge and NLL training next to the Bayes-optimal error;
3. completing the bottom half of binarised digits (2^32 answers) with annealed-Gibbs
   contrastive answers, against per-pixel logistic regression.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from benchmarks.harness import MetricCase
from ebmlab.training import Trainer, TrainerConfig
from ebmlab.training.recipes import get_recipe
from ebmlab.training.recipes.structured import CHAIN_LOSSES, LOSSES, StructuredConfig

DIGITS = {"epochs": 30, "batch_size": 32, "lr": 0.01}
CHAIN = {"epochs": 40, "batch_size": 32, "lr": 0.01}
COMPLETION = {"epochs": 40, "batch_size": 32, "lr": 0.01}


def train_and_evaluate(settings: dict[str, Any], trainer: dict[str, Any]) -> dict[str, Any]:
    """Train one ``structured`` configuration without a run directory and evaluate it."""
    import torch

    torch.set_num_threads(1)
    recipe = get_recipe("structured")
    setup = recipe.build(StructuredConfig(**settings), TrainerConfig(**trainer))
    Trainer(setup.task, setup.train_data, TrainerConfig(**trainer, progress=False)).fit()
    setup.task.model.eval()
    return recipe.evaluate(setup, None)


def _runs() -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    runs = {
        f"digits/{arch}/{loss}": ({"arch": arch, "loss": loss}, DIGITS)
        for arch in ("logits", "distance")
        for loss in LOSSES
    }
    for loss in CHAIN_LOSSES:
        runs[f"chain/{loss}"] = ({"task": "chain", "loss": loss, "hidden": (32,)}, CHAIN)
    for loss in ("hinge", "cd"):
        runs[f"completion/{loss}"] = ({"task": "completion", "loss": loss}, COMPLETION)
    return runs


def run_all(workers: int = 2) -> dict[str, dict[str, Any]]:
    runs = _runs()
    with ProcessPoolExecutor(workers) as pool:
        futures = {name: pool.submit(train_and_evaluate, *args) for name, args in runs.items()}
        return {name: f.result() for name, f in futures.items()}


def tables(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| loss | logits: accuracy | logits: gap | distance: accuracy | distance: gap |",
        "|---|---:|---:|---:|---:|",
    ]
    for loss in LOSSES:
        a, b = results[f"digits/logits/{loss}"], results[f"digits/distance/{loss}"]
        lines.append(
            f"| {loss} | {a['test_accuracy']:.1%} | {a['test_energy_gap']:.3g} | "
            f"{b['test_accuracy']:.1%} | {b['test_energy_gap']:.3g} |"
        )
    lines += [
        "",
        "| chain loss | Viterbi | annealed Gibbs | ICM | mean field | Bayes-optimal |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for loss in CHAIN_LOSSES:
        r = results[f"chain/{loss}"]
        by = r["test_error_by_inference"]
        lines.append(
            f"| {loss} | {by['viterbi']:.1%} | {by['annealed_gibbs']:.1%} | {by['icm']:.1%} | "
            f"{by['mean_field']:.1%} | {r['bayes_error']:.1%} |"
        )
    lines += [
        "",
        "| completion loss | annealed Gibbs | ICM | mean field | per-pixel logistic regression |",
        "|---|---:|---:|---:|---:|",
    ]
    for loss in ("hinge", "cd"):
        r = results[f"completion/{loss}"]
        by = r["test_pixel_error_by_inference"]
        lines.append(
            f"| {loss} | {by['annealed_gibbs']:.1%} | {by['icm']:.1%} | {by['mean_field']:.1%} | "
            f"{r['logistic_regression_pixel_error']:.1%} |"
        )
    return "\n".join(lines)


def cases() -> list[MetricCase]:
    chain = train_and_evaluate(*_runs()["chain/nll"])
    completion = train_and_evaluate(*_runs()["completion/hinge"])
    return [
        MetricCase(
            what="HMM sequence labelling, chain energy trained by NLL: per-position test error",
            run=lambda: (chain["test_error"], chain["bayes_error"]),
            anchor_name="Bayes-optimal error of the true HMM",
            unit="error",
            higher_is_better=False,
        ),
        MetricCase(
            what="bottom half of binarised digits, hinge + annealed Gibbs: pixel error",
            run=lambda: (
                completion["test_pixel_error_by_inference"]["mean_field"],
                completion["logistic_regression_pixel_error"],
            ),
            anchor_name="per-pixel logistic regression (scikit-learn)",
            unit="error",
            higher_is_better=False,
        ),
    ]


if __name__ == "__main__":
    print(tables(run_all(int(os.environ.get("BENCH_WORKERS", "2")))))
