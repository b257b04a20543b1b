"""Bernoulli RBM training against scikit-learn's BernoulliRBM.

Speed: one epoch of CD-1 on mnist10k's 8000 training images (binarised), 784 x 500,
batch 100. Quality: exact average training log-likelihood of a 64 x 16 RBM on the
binarised digits after 100 epochs (log Z by enumerating the 16 hidden units).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import torch

from benchmarks.harness import Case, MetricCase
from ebmlab.data import DataNotFoundError, load_dataset
from ebmlab.sklearn import BernoulliRBM

RECOMMENDED = {
    "k": 1,
    "n_chains": 100,
    "centering": True,
    "momentum": 0.9,
    "learning_rate": 0.05,
    "lr_decay": True,
    "batch_size": 10,
}
MNIST_DIR = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "mnist"


def mnist_binary() -> np.ndarray | None:
    root = os.environ.get("EBMLAB_DATA") or (MNIST_DIR if MNIST_DIR.is_dir() else None)
    try:
        return (
            load_dataset("mnist10k", "train", root=root, transform="binary")
            .x.numpy()
            .astype(np.float64)
        )
    except DataNotFoundError:
        return None


def sklearn_epoch(x: np.ndarray) -> None:
    from sklearn.neural_network import BernoulliRBM as SkRBM

    SkRBM(n_components=500, learning_rate=0.1, batch_size=100, n_iter=1, random_state=0).fit(x)


def ebmlab_epoch(x: np.ndarray, matmul_dtype: str | None = None) -> BernoulliRBM:
    return BernoulliRBM(
        500,
        learning_rate=0.1,
        batch_size=100,
        n_iter=1,
        persistent=False,
        random_state=0,
        matmul_dtype=matmul_dtype,
    ).fit(x)


def digits_log_likelihood() -> tuple[float, float]:
    from sklearn.datasets import load_digits
    from sklearn.neural_network import BernoulliRBM as SkRBM

    x = (load_digits().data >= 8).astype(np.float64)
    ours = BernoulliRBM(16, n_iter=100, random_state=0, **RECOMMENDED).fit(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = SkRBM(n_components=16, n_iter=100, random_state=0).fit(x)
    # score scikit-learn's parameters exactly with the same enumeration
    mirror = BernoulliRBM(16, n_iter=1, random_state=0, dtype="float64").fit(x[:10])
    with torch.no_grad():
        mirror.rbm_.W.copy_(torch.as_tensor(theirs.components_.T))
        mirror.rbm_.b.copy_(torch.as_tensor(theirs.intercept_visible_))
        mirror.rbm_.c.copy_(torch.as_tensor(theirs.intercept_hidden_))
    return float(ours.score_samples(x).mean()), float(mirror.score_samples(x).mean())


def cases() -> list[Case | MetricCase]:
    out: list[Case | MetricCase] = []
    x = mnist_binary()
    if x is not None:
        out.append(
            Case(
                what="RBM 784 x 500, CD-1, batch 100, one epoch of mnist10k (8000 images)",
                ebmlab=lambda: ebmlab_epoch(x),
                anchor=lambda: sklearn_epoch(x),
                anchor_name="sklearn BernoulliRBM (float64, PCD-1)",
                repeats=3,
            )
        )
        out.append(
            Case(
                what="as above, matrix products in bfloat16 (`matmul_dtype`)",
                ebmlab=lambda: ebmlab_epoch(x, "bfloat16"),
                anchor=lambda: sklearn_epoch(x),
                anchor_name="sklearn BernoulliRBM (float64, PCD-1)",
                repeats=3,
            )
        )
    ll = digits_log_likelihood()
    out.append(
        MetricCase(
            what="RBM 64 x 16 on binarised digits, 100 epochs: exact mean train log-likelihood",
            run=lambda: (-ll[0], -ll[1]),
            anchor_name="sklearn BernoulliRBM defaults",
            unit="NLL nats",
            higher_is_better=False,
        )
    )
    return out
