"""Bernoulli RBM training against scikit-learn's BernoulliRBM.

Speed: one epoch of CD-1 on mnist10k's 8000 training images (binarised), 784 x 500,
batch 100, and the held-out log-likelihood of those one-epoch fits, both scored by the
same AIS; one epoch and a transform of a sparse 10,000 x 5,000 matrix of 1 % density.
Quality: exact average training log-likelihood of a 64 x 16 RBM on the binarised
digits after 100 epochs (log Z by enumerating the 16 hidden units).
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


def mnist_binary(split: str = "train") -> np.ndarray | None:
    root = os.environ.get("EBMLAB_DATA") or (MNIST_DIR if MNIST_DIR.is_dir() else None)
    try:
        return (
            load_dataset("mnist10k", split, root=root, transform="binary")
            .x.numpy()
            .astype(np.float64)
        )
    except DataNotFoundError:
        return None


def sklearn_epoch(x: np.ndarray, n_components: int = 500):
    from sklearn.neural_network import BernoulliRBM as SkRBM

    return SkRBM(
        n_components=n_components, learning_rate=0.1, batch_size=100, n_iter=1, random_state=0
    ).fit(x)


def ebmlab_epoch(
    x: np.ndarray, matmul_dtype: str | None = None, n_components: int = 500
) -> BernoulliRBM:
    return BernoulliRBM(
        n_components,
        learning_rate=0.1,
        batch_size=100,
        n_iter=1,
        persistent=False,
        random_state=0,
        matmul_dtype=matmul_dtype,
    ).fit(x)


def scored_as_ours(theirs, x: np.ndarray) -> BernoulliRBM:
    """scikit-learn's fitted parameters in an ebmlab estimator (its log Z anneals from
    the base rates of ``x``), so that both are scored by the same exact sum or AIS."""
    mirror = BernoulliRBM(len(theirs.components_), n_iter=1, random_state=0,
                          dtype="float64").fit(x)  # fmt: skip
    with torch.no_grad():
        mirror.rbm_.W.copy_(torch.as_tensor(theirs.components_.T))
        mirror.rbm_.b.copy_(torch.as_tensor(theirs.intercept_visible_))
        mirror.rbm_.c.copy_(torch.as_tensor(theirs.intercept_hidden_))
    return mirror


def held_out_log_likelihood(train: np.ndarray, test: np.ndarray) -> tuple[float, float]:
    """Mean log-likelihood of the test images under the speed row's one-epoch fits,
    log Z of each by the same AIS (1000 temperatures, 100 chains, from the training
    data's base rates)."""
    ours = ebmlab_epoch(train)
    theirs = scored_as_ours(sklearn_epoch(train), train)
    return float(ours.score_samples(test).mean()), float(theirs.score_samples(test).mean())


def digits_log_likelihood() -> tuple[float, float]:
    from sklearn.datasets import load_digits
    from sklearn.neural_network import BernoulliRBM as SkRBM

    x = (load_digits().data >= 8).astype(np.float64)
    ours = BernoulliRBM(16, n_iter=100, random_state=0, **RECOMMENDED).fit(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = SkRBM(n_components=16, n_iter=100, random_state=0).fit(x)
    mirror = scored_as_ours(theirs, x)  # exact: 16 hidden units enumerated
    return float(ours.score_samples(x).mean()), float(mirror.score_samples(x).mean())


def sparse_rows():
    """10,000 x 5,000 binary rows of 1 % density, CSR (a bag-of-words-like matrix)."""
    from scipy import sparse

    return sparse.random(10_000, 5_000, density=0.01, format="csr", random_state=0,
                         data_rvs=np.ones)  # fmt: skip


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
                dtype=torch.bfloat16,
            )
        )
        test = mnist_binary("test")
        held_out = held_out_log_likelihood(x, test)
        out.append(
            MetricCase(
                what="the one-epoch fits above: mean NLL of mnist10k's 2000 test images, "
                "log Z of both by the same AIS",
                run=lambda: (-held_out[0], -held_out[1]),
                anchor_name="sklearn BernoulliRBM (PCD-1)",
                unit="NLL nats",
                higher_is_better=False,
            )
        )
    rows = sparse_rows()
    out.append(
        Case(
            what="RBM 5000 x 256, CD-1, batch 100, one epoch of a sparse CSR 10,000 x 5,000 "
            "matrix (1 % density)",
            ebmlab=lambda: ebmlab_epoch(rows, n_components=256),
            anchor=lambda: sklearn_epoch(rows, n_components=256),
            anchor_name="sklearn BernoulliRBM on the same CSR matrix",
            repeats=3,
        )
    )
    ours, theirs = ebmlab_epoch(rows, n_components=256), sklearn_epoch(rows, n_components=256)
    out.append(
        Case(
            what="transform of that CSR matrix (sparse products)",
            ebmlab=lambda: ours.transform(rows),
            anchor=lambda: theirs.transform(rows),
            anchor_name="sklearn BernoulliRBM.transform",
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
