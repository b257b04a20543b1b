"""Classifier metrics: accuracy, negative log-likelihood, calibration."""

from __future__ import annotations

import os

import torch

from ebmlab import _checks


def accuracy(probs: torch.Tensor, y: torch.Tensor) -> float:
    """Share of rows whose most probable class, ``probs`` (N, K), is the label ``y`` (N,)."""
    return float((probs.argmax(1) == y).double().mean())


def nll(probs: torch.Tensor, y: torch.Tensor) -> float:
    """Mean -log p(y | x); probabilities are clamped at 1e-12.

    Args:
        probs: predicted class probabilities, (N, K).
    """
    return float(-probs.gather(1, y.view(-1, 1)).clamp_min(1e-12).log().mean())


def calibration_bins(
    probs: torch.Tensor, y: torch.Tensor, n_bins: int = 15
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per confidence bin: mean confidence, accuracy and count (equal-width bins on [0, 1]).

    Args:
        probs: predicted class probabilities, (N, K).
        y: true labels (N,).
        n_bins: number of equal-width confidence bins.
    """
    _checks.positive_int("n_bins", n_bins)
    conf, pred = probs.max(1)
    correct = (pred == y).double()
    idx = torch.clamp((conf * n_bins).long(), max=n_bins - 1)
    count = torch.bincount(idx, minlength=n_bins).double()
    conf_sum = torch.bincount(idx, weights=conf.double(), minlength=n_bins)
    acc_sum = torch.bincount(idx, weights=correct, minlength=n_bins)
    safe = count.clamp_min(1)
    return conf_sum / safe, acc_sum / safe, count


def expected_calibration_error(probs: torch.Tensor, y: torch.Tensor, n_bins: int = 15) -> float:
    """ECE = sum_b (n_b / n) |acc_b - conf_b| (Guo et al. 2017), 15 equal-width bins.

    Args:
        probs: predicted class probabilities, (N, K).
        y: true labels (N,).
        n_bins: number of equal-width confidence bins.
    """
    conf, acc, count = calibration_bins(probs, y, n_bins)
    return float(((acc - conf).abs() * count).sum() / count.sum())


def reliability_diagram(
    probs: torch.Tensor, y: torch.Tensor, path: str | os.PathLike, n_bins: int = 15
) -> None:
    """Accuracy against confidence per bin, with the diagonal of perfect calibration.

    Args:
        probs: predicted class probabilities, (N, K).
        y: true labels (N,).
        path: the PNG written.
        n_bins: number of equal-width confidence bins.
    """
    from ebmlab.plotting import plt, save_figure

    _, acc, count = calibration_bins(probs, y, n_bins)
    edges = torch.linspace(0, 1, n_bins + 1)
    centres = (edges[:-1] + edges[1:]) / 2
    fig, ax = plt.subplots(figsize=(4, 4))
    keep = count > 0
    ax.bar(
        centres[keep.cpu()].numpy(),
        acc[keep].cpu().numpy(),
        width=1 / n_bins,
        edgecolor="black",
        alpha=0.7,
        label="accuracy",
    )
    ax.plot([0, 1], [0, 1], "k--", label="perfect calibration")
    ece = expected_calibration_error(probs, y, n_bins)
    ax.set_title(f"reliability (ECE {ece:.3f})")
    ax.set_xlabel("confidence")
    ax.set_ylabel("accuracy")
    ax.legend(loc="upper left")
    save_figure(fig, path)
