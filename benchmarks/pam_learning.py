"""Perturb-and-MAP learning against contrastive divergence on the digits RBM.

A 64 x 16 Bernoulli RBM on the 1000 binarised training digits, 20 epochs of batches of
100, Adam at learning rate 0.01, visible biases started at the data's base rates, the
same seed; negatives from perturb-and-MAP (exact MAP states of Gumbel-perturbed copies,
Papandreou & Yuille 2011, each enumerating the 2^16 hidden states: noise on every hidden
configuration, 100 or 20 states per update, or first-order noise on every unit, 20)
or from persistent CD-1 (100 chains). Each is scored by the exact mean log-likelihood
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
RULES = {  # name -> (perturbation, MAP states per update); None: persistent CD-1
    "pam-joint-100": ("joint", 100),
    "pam-joint-20": ("joint", 20),
    "pam-unit-20": ("unit", 20),
    "pcd": None,
}


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
    if RULES[rule] is None:
        cd = ContrastiveDivergence(rbm, 1, persistent=True, n_chains=BATCH)
    else:
        perturbation, n_samples = RULES[rule]
        pam = PerturbAndMAP(rbm, n_samples, perturbation=perturbation)
    start = time.perf_counter()
    for _ in range(EPOCHS):
        order = torch.randperm(len(train_x), generator=generator)
        for batch in train_x[order].split(BATCH):
            optimizer.zero_grad()
            if RULES[rule] is None:
                cd.accumulate(batch, generator)
            else:
                pam.loss(batch, generator).backward()
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
            "perturb-and-MAP negatives (joint noise, 100 per update)",
            run=lambda: (train("pam-joint-100")["train"], train("pcd")["train"]),
            anchor_name="persistent CD-1",
            unit="nats",
        )
    ]


def main() -> None:
    torch.set_num_threads(1)
    for rule in RULES:
        r = train(rule)
        print(f"{rule}: train {r['train']:.3f}, test {r['test']:.3f} nats, {r['seconds']:.1f} s")


if __name__ == "__main__":
    main()
