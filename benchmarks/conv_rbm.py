"""Convolutional RBMs on the binarised digits, against learnergy's ConvRBM and dense RBMs.

Every model trains 30 epochs on the 1000 training digits (batches of 50, SGD at 0.05
with momentum 0.5) and is scored by its test log-likelihood per digit (447 digits),
with log Z by AIS on the model's dense view (1000 temperatures, 100 chains, base rates
from the data; exact by enumeration for the 16-hidden dense RBM):

- learnergy 2.0's ``ConvRBM`` (8 filters 5 x 5, one visible bias, CD-1; ``pip install
  learnergy``, its row is left out when it is absent), scored by copying its filters
  and biases into an ebmlab model;
- ebmlab's ``ConvolutionalRBM`` with the same settings and the same start (filters
  N(0, 0.01^2), zero biases), trained by ``ContrastiveDivergence``;
- ebmlab's convolutional RBM with one visible bias per pixel (started at the data's
  base rates, filters at N(0, 0.1^2)) and persistent CD-1: 8
  filters 3 x 3, and 16 filters 5 x 5 with a sparsity target of 0.1;
- the dense ``BernoulliRBM`` with 16 hidden units, persistent CD-1.

Also reported: seconds per training epoch (one thread). ``python -m
benchmarks.conv_rbm [PNG]`` prints the table and draws the 16 filters of 5 x 5.
"""

from __future__ import annotations

import sys
import time
from functools import cache

import torch

from benchmarks.harness import MetricCase
from ebmlab.data import load_dataset
from ebmlab.energies import BernoulliRBM, ConvolutionalRBM
from ebmlab.energies.boltzmann import base_rate_logits
from ebmlab.evaluation import log_likelihood
from ebmlab.learning import ContrastiveDivergence
from ebmlab.partition import log_partition
from ebmlab.plotting import image_grid

EPOCHS, BATCH, LR, MOMENTUM = 30, 50, 0.05, 0.5


@cache
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    train = load_dataset("digits", "train", transform="binary").x
    return train, load_dataset("digits", "test", transform="binary").x


def score(model) -> float:
    """Test log-likelihood per digit, log Z exact when enumerable, else AIS."""
    train, test = digits()
    log_z = log_partition(model, "auto", data=train, generator=0)
    return log_likelihood(model, test, log_z).mean


def ours(model, persistent: bool, sparsity: float | None) -> tuple[float, float]:
    """Train ``model`` with ebmlab's CD; (test log-likelihood, seconds per epoch)."""
    train, _ = digits()
    cd = ContrastiveDivergence(
        model, 1, persistent=persistent, sparsity_target=sparsity, sparsity_cost=1.0
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    generator = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    for _ in range(EPOCHS):
        for idx in torch.randperm(len(train), generator=generator).split(BATCH):
            optimizer.zero_grad()
            cd.accumulate(train[idx], generator)
            optimizer.step()
    seconds = (time.perf_counter() - start) / EPOCHS
    with torch.no_grad():
        return score(model.requires_grad_(False)), seconds


def conv(filters: int, size: int) -> ConvolutionalRBM:
    """A convolutional RBM with pixel biases at the data's base rates."""
    train, _ = digits()
    torch.manual_seed(0)
    model = ConvolutionalRBM((8, 8), filters, size, visible_bias="pixel", init_std=0.1)
    with torch.no_grad():
        model.b.copy_(base_rate_logits(train).view(model.b.shape))
    return model


def learnergy_start() -> ConvolutionalRBM:
    """8 filters 5 x 5 started as learnergy starts them: N(0, 0.01^2), zero biases."""
    torch.manual_seed(0)
    return ConvolutionalRBM((8, 8), 8, 5, init_std=0.01)


def learnergy() -> tuple[float, float] | None:
    """learnergy's ConvRBM trained by its own ``fit``, scored as an ebmlab model."""
    try:
        from learnergy.models.bernoulli import ConvRBM
    except ImportError:
        return None
    train, _ = digits()
    torch.manual_seed(0)
    theirs = ConvRBM((8, 8), (5, 5), 8, 1, steps=1, learning_rate=LR, momentum=MOMENTUM)
    data = torch.utils.data.TensorDataset(train.view(-1, 1, 8, 8), torch.zeros(len(train)))
    start = time.perf_counter()
    theirs.fit(data, batch_size=BATCH, epochs=EPOCHS)
    seconds = (time.perf_counter() - start) / EPOCHS
    model = learnergy_start()
    with torch.no_grad():
        for param, value in ((model.W, theirs.W), (model.b, theirs.a), (model.c, theirs.b)):
            param.copy_(value)
        return score(model.requires_grad_(False)), seconds


@cache
def results() -> dict[str, tuple[float, float]]:
    train, _ = digits()
    torch.manual_seed(0)
    dense = BernoulliRBM(64, 16)
    with torch.no_grad():
        dense.b.copy_(base_rate_logits(train))
    out = {
        "ebmlab conv, 8 filters 5x5, shared bias, CD-1": ours(learnergy_start(), False, None),
        "ebmlab conv, 8 filters 3x3, pixel biases, PCD-1": ours(conv(8, 3), True, None),
        "ebmlab conv, 16 filters 5x5, pixel biases, PCD-1 + sparsity 0.1": ours(
            conv(16, 5), True, 0.1
        ),
        "dense BernoulliRBM, 16 hidden, PCD-1": ours(dense, True, None),
    }
    theirs = learnergy()
    if theirs is not None:
        out["learnergy 2.0 ConvRBM, 8 filters 5x5, shared bias, CD-1"] = theirs
    return out


def cases() -> list[MetricCase]:
    same = "ebmlab conv, 8 filters 5x5, shared bias, CD-1"
    peer = "learnergy 2.0 ConvRBM, 8 filters 5x5, shared bias, CD-1"
    if peer not in results():
        return []
    return [
        MetricCase(
            what="digits, convolutional RBM test log-likelihood (8 filters 5x5, CD-1)",
            run=lambda: (results()[same][0], results()[peer][0]),
            anchor_name="learnergy ConvRBM, same settings",
            unit="nats per digit",
        )
    ]


def draw(path: str) -> None:
    """The 16 filters of 5 x 5 learned with pixel biases and a sparsity target."""
    model = conv(16, 5)
    ours(model, True, 0.1)
    image_grid(
        model.filter_images(),
        path,
        image_shape=(5, 5),
        value_range=(float(model.W.min()), float(model.W.max())),
        ncol=8,
        title="convolutional RBM filters (digits)",
    )


def main() -> None:
    torch.set_num_threads(1)
    print("| model | test log-likelihood (nats) | seconds per epoch |")
    print("|---|---:|---:|")
    for name, (ll, seconds) in results().items():
        print(f"| {name} | {ll:.2f} | {seconds:.3f} |")
    if len(sys.argv) > 1:
        draw(sys.argv[1])


if __name__ == "__main__":
    main()
