"""Perturb-and-MAP learning against contrastive divergence on the digits RBM.

A 64 x 16 Bernoulli RBM on the 1000 binarised training digits, 20 epochs of batches of
100, Adam at learning rate 0.01, visible biases started at the data's base rates, the
same seed; negatives from perturb-and-MAP (20 exact MAP states of Gumbel-perturbed
copies per update, Papandreou & Yuille 2011; each enumerates the 2^16 hidden states)
or from persistent CD-1 (100 chains). Both are scored by the exact mean log-likelihood
of the training and test digits (log Z by enumerating the 2^16 hidden states).
``python -m benchmarks.pam_learning`` prints them.
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
from ebmlab.learning import ContrastiveDivergence, PerturbAndMAP
from ebmlab.partition import exact_log_partition

EPOCHS, BATCH, LR = 20, 100, 0.01
PAM_SAMPLES = 20  # MAP states per update


@cache
def train(rule: str) -> dict[str, float]:
    train_x = load_dataset("digits", "train", transform="binary").x.double()
    test_x = load_dataset("digits", "test", transform="binary").x.double()
    torch.manual_seed(0)
    rbm = BernoulliRBM(64, 16).double()
    with torch.no_grad():
        rbm.b.copy_(base_rate_logits(train_x))
    optimizer = torch.optim.Adam(rbm.parameters(), lr=LR)
    generator = torch.Generator().manual_seed(1)
    pam = PerturbAndMAP(rbm, n_samples=PAM_SAMPLES)
    cd = ContrastiveDivergence(rbm, 1, persistent=True, n_chains=BATCH)
    start = time.perf_counter()
    for _ in range(EPOCHS):
        order = torch.randperm(len(train_x), generator=generator)
        for batch in train_x[order].split(BATCH):
            optimizer.zero_grad()
            if rule == "pam":
                pam.loss(batch, generator).backward()
            else:
                cd.accumulate(batch, generator)
            optimizer.step()
    seconds = time.perf_counter() - start
    log_z = exact_log_partition(rbm)
    return {
        "train": log_likelihood(rbm, train_x, log_z).mean,
        "test": log_likelihood(rbm, test_x, log_z).mean,
        "seconds": seconds,
    }


def cases() -> list[MetricCase]:
    return [
        MetricCase(
            what=f"digits RBM 64 x 16, {EPOCHS} epochs: exact train log-likelihood, "
            "perturb-and-MAP negatives",
            run=lambda: (train("pam")["train"], train("pcd")["train"]),
            anchor_name="persistent CD-1",
            unit="nats",
        )
    ]


def main() -> None:
    torch.set_num_threads(1)
    for rule in ("pam", "pcd"):
        r = train(rule)
        print(f"{rule}: train {r['train']:.3f}, test {r['test']:.3f} nats, {r['seconds']:.1f} s")


if __name__ == "__main__":
    main()
