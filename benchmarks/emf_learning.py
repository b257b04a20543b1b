"""Extended mean-field (TAP) learning against persistent CD on the digits RBM.

A 64 x 16 Bernoulli RBM (visible biases at the data's base rates, weights N(0, 0.01^2))
trains 60 epochs on the 1000 binarised training digits, batches of 50, SGD at 0.05 with
momentum 0.5, by each rule: ``EMFLearning`` of order 1 (naive mean field), 2 (TAP) and
3 (Gabrié et al. 2015's EMF), each with 100 persistent magnetisations moved by 10 TAP
iterations per update, and ``ContrastiveDivergence`` with persistent chains (PCD-1).
The test log-likelihood per digit (447 digits) is exact, enumerating the 2^16 hidden
states, every 20 epochs. ``python -m benchmarks.emf_learning`` prints the table.
"""

from __future__ import annotations

import time
from functools import cache

import torch

from benchmarks.harness import MetricCase
from ebmlab.data import load_dataset
from ebmlab.energies import BernoulliRBM
from ebmlab.energies.boltzmann import base_rate_logits
from ebmlab.evaluation import log_likelihood
from ebmlab.learning import ContrastiveDivergence, EMFLearning
from ebmlab.partition import log_partition

EPOCHS, REPORT, BATCH, LR, MOMENTUM, ITERATIONS = 60, 20, 50, 0.05, 0.5, 10
RULES = {"PCD-1": 0, "mean field (order 1)": 1, "TAP (order 2)": 2, "EMF (order 3)": 3}


@cache
def train(order: int) -> tuple[list[float], float]:
    """Test log-likelihoods every REPORT epochs, and seconds per epoch, of one rule
    (order 0: PCD-1)."""
    train_x = load_dataset("digits", "train", transform="binary").x
    test_x = load_dataset("digits", "test", transform="binary").x
    torch.manual_seed(0)
    model = BernoulliRBM(64, 16)
    with torch.no_grad():
        model.b.copy_(base_rate_logits(train_x))
    if order:
        rule = EMFLearning(model, order, n_particles=100, n_iter=ITERATIONS)
    else:
        rule = ContrastiveDivergence(model, 1, persistent=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    generator = torch.Generator().manual_seed(0)
    scores, seconds = [], 0.0
    for epoch in range(1, EPOCHS + 1):
        start = time.perf_counter()
        for idx in torch.randperm(len(train_x), generator=generator).split(BATCH):
            optimizer.zero_grad()
            if order:
                rule.loss(train_x[idx], generator).backward()
            else:
                rule.accumulate(train_x[idx], generator)
            optimizer.step()
        seconds += time.perf_counter() - start
        if epoch % REPORT == 0:
            with torch.no_grad():
                log_z = log_partition(model, "exact")
                scores.append(log_likelihood(model, test_x, log_z).mean)
    return scores, seconds / EPOCHS


def cases() -> list[MetricCase]:
    return [
        MetricCase(
            what="digits 64x16 RBM, exact test log-likelihood after 60 epochs: TAP learning",
            run=lambda: (train(2)[0][-1], train(0)[0][-1]),
            anchor_name="persistent CD-1, same schedule",
            unit="nats per digit",
        )
    ]


def main() -> None:
    torch.set_num_threads(1)
    epochs = " | ".join(f"epoch {e}" for e in range(REPORT, EPOCHS + 1, REPORT))
    print(f"| rule | {epochs} | seconds per epoch |")
    print("|---|" + "---:|" * (EPOCHS // REPORT + 1))
    for name, order in RULES.items():
        scores, seconds = train(order)
        print(f"| {name} | " + " | ".join(f"{s:.2f}" for s in scores) + f" | {seconds:.3f} |")


if __name__ == "__main__":
    main()
