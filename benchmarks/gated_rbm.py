"""The gated RBM inferring transformations of random-dot pairs, against supervised
classifiers of the raw pair.

Pairs: ``transformed_pairs(10000, seed=0)`` to train, ``seed=1`` (2000 pairs) to test:
13 x 13 random dots (density 0.1) moved by one of eight transformations (one-pixel
shifts in four directions, rotations by +-15 and +-30 degrees). The gated RBM
(Memisevic & Hinton 2010; 64 mapping units, 200 factors) learns from the pairs alone,
40 epochs of CD-1 with Adam at 0.01 on batches of 100; a scikit-learn
``LogisticRegression`` then reads the transformation off its mapping units. The
anchors see the labels from the start: ``LogisticRegression`` and ``MLPClassifier``
(one hidden layer of 256) on the 338 raw pixels of each pair. Reported: accuracy on
the held-out pairs with every training label, and with only the first 10 training
pairs of each transformation labelled (the gated RBM still learns from all pairs).
``python -m benchmarks.gated_rbm [PNG]`` prints the table and draws analogies: a
pair's inferred transformation applied to a digit.
"""

from __future__ import annotations

import sys
import time
from functools import cache

import torch
from sklearn.linear_model import LogisticRegression
from sklearn.neural_network import MLPClassifier

from benchmarks.harness import MetricCase
from ebmlab.data.pairs import TRANSFORMATIONS, transformed_pairs
from ebmlab.energies import GatedRBM
from ebmlab.losses import conditional_cd_loss
from ebmlab.training.recipes.conditional_rbm import analogy_picture

SIZE, HIDDEN, FACTORS, EPOCHS, LR, BATCH = 13, 64, 200, 40, 0.01, 100
FEW = 10  # labelled pairs per transformation in the few-label comparison


@cache
def data() -> tuple[torch.Tensor, ...]:
    return (*transformed_pairs(10000, SIZE, seed=0), *transformed_pairs(2000, SIZE, seed=1))


@cache
def train() -> tuple[GatedRBM, float]:
    x, y, _, _, _, _ = data()
    torch.manual_seed(0)
    model = GatedRBM(SIZE**2, SIZE**2, HIDDEN, FACTORS, init_std=0.3)
    model.fit_biases(y, x)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    generator = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    for _ in range(EPOCHS):
        for idx in torch.randperm(len(x), generator=generator).split(BATCH):
            optimizer.zero_grad()
            conditional_cd_loss(model, y[idx], x[idx], generator=generator).backward()
            optimizer.step()
    return model.requires_grad_(False), time.perf_counter() - start


def few_labels(labels: torch.Tensor) -> torch.Tensor:
    """Indices of the first FEW training pairs of each transformation."""
    return torch.cat([torch.nonzero(labels == k)[:FEW, 0] for k in range(len(TRANSFORMATIONS))])


@cache
def accuracies() -> dict[str, float]:
    """Held-out accuracy of each classifier, trained on every label and on FEW per class."""
    x, y, labels, xt, yt, labels_t = data()
    model, _ = train()
    features = {
        "gated": (model.hidden_probs(y, x).numpy(), model.hidden_probs(yt, xt).numpy()),
        "linear": (torch.cat([x, y], 1).numpy(), torch.cat([xt, yt], 1).numpy()),
    }
    features["mlp"] = features["linear"]
    classifiers = {
        "gated": lambda: LogisticRegression(max_iter=2000),
        "linear": lambda: LogisticRegression(max_iter=2000),
        "mlp": lambda: MLPClassifier((256,), max_iter=500, random_state=0),
    }
    subset = few_labels(labels).numpy()
    out = {}
    for name, (train_x, test_x) in features.items():
        full = classifiers[name]().fit(train_x, labels.numpy())
        few = classifiers[name]().fit(train_x[subset], labels.numpy()[subset])
        out[name] = full.score(test_x, labels_t.numpy())
        out[f"{name}_few"] = few.score(test_x, labels_t.numpy())
    return out


def cases() -> list[MetricCase]:
    return [
        MetricCase(
            what="random-dot pairs, transformation accuracy, 10 labels a class: gated RBM",
            run=lambda: (accuracies()["gated_few"], accuracies()["mlp_few"]),
            anchor_name="MLP on the raw pair (scikit-learn MLPClassifier), 10 labels a class",
            unit="accuracy",
        )
    ]


def draw(path: str) -> None:
    """The analogy grid: each transformation's first training pair applied to a digit."""
    x, y, labels, *_ = data()
    analogy_picture(train()[0], x, y, labels, path)


def main() -> None:
    torch.set_num_threads(1)
    r = accuracies()
    print(f"| classifier | all 10000 labels | {FEW} labels a class |")
    print("|---|---:|---:|")
    rows = {
        "gated": "gated RBM mapping units + LogisticRegression",
        "linear": "LogisticRegression on the raw pair",
        "mlp": "MLPClassifier (256) on the raw pair",
    }
    for key, name in rows.items():
        print(f"| {name} | {r[key]:.3f} | {r[key + '_few']:.3f} |")
    print(f"gated RBM training: {train()[1]:.1f} s")
    if len(sys.argv) > 1:
        draw(sys.argv[1])


if __name__ == "__main__":
    main()
