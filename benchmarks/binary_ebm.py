"""A neural energy of binarised digits trained with Gibbs-with-Gradients negatives
against the same network trained with single-site Gibbs negatives.

The energy is an MLP 64-128-128-1 (SiLU) on the 64 binarised pixels of the digits'
training split (1000 images). Both runs use persistent contrastive divergence with
256 chains, Adam (learning rate 1e-3), batch 100, energy L2 0.01, 1500 updates and
the same seed; per update the chains take 64 Gibbs-with-Gradients steps (64 energy
and gradient evaluations), 16 steps of 4-flip paths (16 evaluations) or one sweep of
single-site Gibbs (64 sites, 128 energy evaluations). The test log-likelihood of the
447 test digits uses log Z by tempered SMC from the data's base-rate model with
Gibbs-with-Gradients moves (8 runs x 512 particles), reported with its standard error.
``python -m benchmarks.binary_ebm``.
"""

from __future__ import annotations

import time
from functools import cache

import torch

from benchmarks.harness import MetricCase
from ebmlab.data import load_dataset
from ebmlab.energies import IndependentBernoulli, MLPEnergy
from ebmlab.energies.boltzmann import base_rate_logits
from ebmlab.losses import contrastive_divergence_loss
from ebmlab.partition import smc
from ebmlab.partition.ais import BASE_RATE_SMOOTHING
from ebmlab.samplers import Gibbs, GibbsWithGradients

UPDATES, CHAINS, BATCH = 1500, 256, 100


def binary_digits(split: str) -> torch.Tensor:
    return (load_dataset("digits", split).x > 0).float()


def train(sampler, steps_per_update: int, seed: int = 0) -> tuple[MLPEnergy, float]:
    torch.manual_seed(seed)
    data = binary_digits("train")
    model = MLPEnergy(64, hidden=(128, 128))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(seed)
    chains = (torch.rand(CHAINS, 64, generator=gen) < 0.5).float()
    start = time.perf_counter()
    for _ in range(UPDATES):
        batch = data[torch.randint(len(data), (BATCH,), generator=gen)]
        chains = sampler.sample(model, chains, steps_per_update, generator=gen)
        loss, _ = contrastive_divergence_loss(model, batch, chains[:BATCH], l2=0.01)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model, time.perf_counter() - start


def test_log_likelihood(model: MLPEnergy) -> tuple[float, float]:
    data = binary_digits("train")
    base = IndependentBernoulli(
        base_rate_logits(torch.as_tensor(data), BASE_RATE_SMOOTHING).float()
    )
    estimate = smc(
        model, base, GibbsWithGradients(), n_particles=512, steps_per_stage=20, generator=0
    )
    test = binary_digits("test")
    with torch.no_grad():
        mean_neg_energy = float(-model(test).mean())
    return mean_neg_energy - estimate.log_z, estimate.stderr


@cache
def figures() -> dict[str, dict[str, float]]:
    out = {}
    for name, sampler, steps in (
        ("Gibbs-with-Gradients, 64 steps", GibbsWithGradients(), 64),
        ("Gibbs-with-Gradients, 16 steps of 4 flips", GibbsWithGradients(n_flips=4), 16),
        ("single-site Gibbs, 1 sweep", Gibbs(), 1),
    ):
        model, seconds = train(sampler, steps)
        ll, stderr = test_log_likelihood(model)
        out[name] = {"test_ll": ll, "stderr": stderr, "train_seconds": seconds}
    return out


def cases() -> list[MetricCase]:
    def run() -> tuple[float, float]:
        f = figures()
        return (
            -f["Gibbs-with-Gradients, 64 steps"]["test_ll"],
            -f["single-site Gibbs, 1 sweep"]["test_ll"],
        )

    return [
        MetricCase(
            what="MLP energy of binarised digits, PCD with GWG negatives: test NLL "
            "(log Z by tempered SMC)",
            run=run,
            anchor_name="same network, PCD with single-site Gibbs negatives",
            unit="nats",
            higher_is_better=False,
        )
    ]


def main() -> None:
    torch.set_num_threads(1)
    print("negatives | test log-likelihood (nats) | log Z stderr | training seconds")
    for name, f in figures().items():
        print(f"{name} | {f['test_ll']:.3f} | {f['stderr']:.3f} | {f['train_seconds']:.1f}")


if __name__ == "__main__":
    main()
