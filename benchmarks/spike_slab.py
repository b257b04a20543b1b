"""The spike-and-slab RBM against the Gaussian-Bernoulli RBM on standardised digits.

Both models see the 1000 training digits standardised as the ``rbm`` recipe does (zero
mean, unit variance per pixel), train 40 epochs of persistent CD-1 (100 chains, batches
of 20, Adam at learning rate 0.003, the same seed); the Gaussian-Bernoulli RBM learns
its visible standard deviations, as the ssRBM learns its precisions. With 16 hidden
units both are scored by their exact test log-likelihood (the hidden states
enumerated, the rest integrated in closed form), and AIS (1000 temperatures, 100
chains, HMC moves from the Gaussian base density) is checked against the exact log Z.
With 64 hidden units enumeration is out of reach and AIS gives log Z, with its standard
error. ``python -m benchmarks.spike_slab`` prints the table.
"""

from __future__ import annotations

import time
from functools import cache

import torch

from benchmarks.harness import MetricCase
from ebmlab.data import load_dataset
from ebmlab.energies import GaussianBernoulliRBM, SpikeSlabRBM
from ebmlab.evaluation import log_likelihood
from ebmlab.learning import ContrastiveDivergence
from ebmlab.partition import log_partition
from ebmlab.training.recipes.rbm import standardised

EPOCHS, BATCH, LR, CHAINS = 40, 20, 0.003, 100


@cache
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    parts = standardised([load_dataset("digits", s) for s in ("train", "test")])
    return parts[0].x.double(), parts[1].x.double()


@cache
def train(kind: str, n_hidden: int) -> dict[str, float]:
    train_x, test_x = digits()
    torch.manual_seed(0)
    if kind == "spike_slab":
        model = SpikeSlabRBM(64, n_hidden).double()
    else:
        model = GaussianBernoulliRBM(64, n_hidden, learn_sigma=True, init_std=0.1).double()
    with torch.no_grad():
        model.b.copy_(train_x.mean(0))
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    cd = ContrastiveDivergence(model, 1, persistent=True, n_chains=CHAINS)
    generator = torch.Generator().manual_seed(1)
    start = time.perf_counter()
    for _ in range(EPOCHS):
        for batch in train_x[torch.randperm(len(train_x), generator=generator)].split(BATCH):
            optimizer.zero_grad()
            cd.accumulate(batch, generator)
            optimizer.step()
    seconds = time.perf_counter() - start
    model.requires_grad_(False)
    ais = log_partition(model, "ais", generator=0)
    out = {"seconds": seconds, "ais": ais.log_z, "ais_stderr": ais.stderr}
    log_z = ais
    if n_hidden <= 20:
        log_z = log_partition(model, "exact")
        out["exact"] = log_z.log_z
    out["train"] = log_likelihood(model, train_x, log_z).mean
    out["test"] = log_likelihood(model, test_x, log_z).mean
    return out


def cases() -> list[MetricCase]:
    return [
        MetricCase(
            what="standardised digits, 16 hidden units: exact test log-likelihood, "
            "spike-and-slab RBM",
            run=lambda: (train("spike_slab", 16)["test"], train("gaussian", 16)["test"]),
            anchor_name="Gaussian-Bernoulli RBM (learned sigma)",
            unit="nats",
        )
    ]


def main() -> None:
    torch.set_num_threads(1)
    print("| model | hidden | train log p | test log p | log Z (AIS) | exact log Z | train s |")
    print("|---|---|---|---|---|---|---|")
    for n_hidden in (16, 64):
        for kind in ("spike_slab", "gaussian"):
            r = train(kind, n_hidden)
            exact = f"{r['exact']:.3f}" if "exact" in r else "-"
            print(
                f"| {kind} | {n_hidden} | {r['train']:.2f} | {r['test']:.2f} | "
                f"{r['ais']:.3f} ± {r['ais_stderr']:.3f} | {exact} | {r['seconds']:.0f} |"
            )


if __name__ == "__main__":
    main()
