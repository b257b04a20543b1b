"""Classifier metrics: accuracy, negative log-likelihood, calibration.

Each is an estimate from a finite test set; with ``return_stderr=True`` it comes with
its standard error: the spread of the per-row values over sqrt(N) for the means
(accuracy, NLL), and a bootstrap over rows for the expected calibration error, which
is not a mean of per-row values.
"""

from __future__ import annotations

import os
from typing import Literal, overload

import torch

from ebmlab import _checks
from ebmlab.devices import widen
from ebmlab.evaluation.likelihood import mean_and_stderr

ECE_BOOTSTRAP = 200  # resamples of the test rows behind ECE's standard error


def _mean(values: torch.Tensor, return_stderr: bool) -> float | tuple[float, float]:
    """The mean of per-row ``values``, with its standard error when asked."""
    return mean_and_stderr(values) if return_stderr else float(values.mean())


@overload
def accuracy(
    probs: torch.Tensor, y: torch.Tensor, *, return_stderr: Literal[False] = False
) -> float: ...
@overload
def accuracy(
    probs: torch.Tensor, y: torch.Tensor, *, return_stderr: Literal[True]
) -> tuple[float, float]: ...
def accuracy(
    probs: torch.Tensor, y: torch.Tensor, *, return_stderr: bool = False
) -> float | tuple[float, float]:
    """Share of rows whose most probable class, ``probs`` (N, K), is the label ``y`` (N,),
    and with ``return_stderr`` its standard error sqrt(a (1 - a) / (N - 1)).

    Args:
        return_stderr: also return the standard error.
    """
    return _mean(widen(probs.argmax(1) == y), return_stderr)


@overload
def nll(
    probs: torch.Tensor, y: torch.Tensor, *, return_stderr: Literal[False] = False
) -> float: ...
@overload
def nll(
    probs: torch.Tensor, y: torch.Tensor, *, return_stderr: Literal[True]
) -> tuple[float, float]: ...
def nll(
    probs: torch.Tensor, y: torch.Tensor, *, return_stderr: bool = False
) -> float | tuple[float, float]:
    """Mean -log p(y | x) (probabilities clamped at 1e-12), and with ``return_stderr``
    its standard error.

    Args:
        probs: predicted class probabilities, (N, K).
        return_stderr: also return the standard error.
    """
    per_row = -widen(probs.gather(1, y.view(-1, 1)).squeeze(1).clamp_min(1e-12).log())
    return _mean(per_row, return_stderr)


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
    correct = widen(pred == y)
    idx = torch.clamp((conf * n_bins).long(), max=n_bins - 1)
    count = widen(torch.bincount(idx, minlength=n_bins))
    conf_sum = torch.bincount(idx, weights=widen(conf), minlength=n_bins)
    acc_sum = torch.bincount(idx, weights=correct, minlength=n_bins)
    safe = count.clamp_min(1)
    return conf_sum / safe, acc_sum / safe, count


def _ece(probs: torch.Tensor, y: torch.Tensor, n_bins: int) -> torch.Tensor:
    conf, acc, count = calibration_bins(probs, y, n_bins)
    return ((acc - conf).abs() * count).sum() / count.sum()


@overload
def expected_calibration_error(
    probs: torch.Tensor,
    y: torch.Tensor,
    n_bins: int = 15,
    *,
    return_stderr: Literal[False] = False,
    generator: torch.Generator | int | None = None,
) -> float: ...
@overload
def expected_calibration_error(
    probs: torch.Tensor,
    y: torch.Tensor,
    n_bins: int = 15,
    *,
    return_stderr: Literal[True],
    generator: torch.Generator | int | None = None,
) -> tuple[float, float]: ...
def expected_calibration_error(
    probs: torch.Tensor,
    y: torch.Tensor,
    n_bins: int = 15,
    *,
    return_stderr: bool = False,
    generator: torch.Generator | int | None = None,
) -> float | tuple[float, float]:
    """ECE = sum_b (n_b / n) |acc_b - conf_b| (Guo et al. 2017), 15 equal-width bins, and
    with ``return_stderr`` its standard error: the spread of the ECE over
    ``ECE_BOOTSTRAP`` resamples of the rows (Efron & Tibshirani 1993, ch. 6). It matches
    the spread over independent test sets of a miscalibrated predictor (0.020 against
    0.021 for ECE 0.10 on 400 rows) and overstates it by about a quarter for a calibrated
    one, whose ECE is mostly the bins' own noise (0.015 against 0.012 for ECE 0.04).

    Args:
        probs: predicted class probabilities, (N, K).
        y: true labels (N,).
        n_bins: number of equal-width confidence bins.
        return_stderr: also return the bootstrap standard error.
        generator: randomness of the resamples, on the data's device (or an int seed).
    """
    value = float(_ece(probs, y, n_bins))
    if not return_stderr:
        return value
    gen = _checks.generator("generator", generator, probs.device)
    n = len(y)
    rows = torch.randint(n, (ECE_BOOTSTRAP, n), generator=gen, device=probs.device)
    resampled = torch.stack([_ece(probs[r], y[r], n_bins) for r in rows])
    return value, float(resampled.std())


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
    from ebmlab.plotting import save_figure, subplots

    _, acc, count = calibration_bins(probs, y, n_bins)
    edges = torch.linspace(0, 1, n_bins + 1)
    centres = (edges[:-1] + edges[1:]) / 2
    fig, ax = subplots(figsize=(4, 4))
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
