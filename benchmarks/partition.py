"""AIS for RBMs trained on mnist10k (binarised; the digits when MNIST is absent).

``cases()`` (for ``python -m benchmarks.run partition``) times AIS on a 784 x 500 RBM
with the Salakhutdinov & Murray (2008) schedule (14,500 temperatures, 100 chains)
against a plain PyTorch implementation of the same algorithm. ``python -m
benchmarks.partition`` also prints both estimates with their standard errors (same
accuracy) and the accuracy-versus-cost curve on a 784 x 20 RBM whose log Z is exact by
enumerating its 2^20 hidden states.
"""

from __future__ import annotations

import math
import statistics
import time
from functools import cache
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from benchmarks.harness import Case
from benchmarks.rbm import mnist_binary
from ebmlab.energies import BernoulliRBM
from ebmlab.energies.boltzmann import base_rate_logits
from ebmlab.partition import (
    LogZEstimate,
    rbm_ais,
    rbm_log_partition,
    salakhutdinov_schedule,
)
from ebmlab.partition.ais import BASE_RATE_SMOOTHING
from ebmlab.sklearn import BernoulliRBM as RBMEstimator

CURVE_TEMPERATURES = (100, 300, 1000, 3000, 10_000)
CURVE_SEEDS = 5


@cache
def training_data() -> np.ndarray:
    x = mnist_binary()
    if x is None:
        from sklearn.datasets import load_digits

        x = (load_digits().data >= 8).astype(np.float64)
    return x


@cache
def trained_rbm(n_hidden: int) -> BernoulliRBM:
    """Ten epochs of CD-1 on the training images."""
    estimator = RBMEstimator(n_hidden, learning_rate=0.1, batch_size=100, n_iter=10)
    return estimator.set_params(random_state=0).fit(training_data()).rbm_


def plain_ais(rbm: BernoulliRBM, betas: torch.Tensor, n_chains: int, seed: int) -> LogZEstimate:
    """The textbook loop: float64, log p* evaluated from scratch at both temperatures."""
    gen = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    W, b, c = rbm.W.detach().double(), rbm.b.detach().double(), rbm.c.detach().double()
    b_a = base_rate_logits(torch.as_tensor(training_data()), BASE_RATE_SMOOTHING)

    def log_p_star(v, beta):
        return (1 - beta) * v @ b_a + beta * v @ b + F.softplus(beta * (v @ W + c)).sum(1)

    v = torch.rand(n_chains, len(b), generator=gen, dtype=torch.float64) < torch.sigmoid(b_a)
    v = v.double()
    log_w = torch.zeros(n_chains, dtype=torch.float64)
    for k in range(1, len(betas)):
        beta = float(betas[k])
        log_w += log_p_star(v, beta) - log_p_star(v, float(betas[k - 1]))
        p_h = torch.sigmoid(beta * (v @ W + c))
        h = (torch.rand(p_h.shape, generator=gen, dtype=torch.float64) < p_h).double()
        p_v = torch.sigmoid((1 - beta) * b_a + beta * (b + h @ W.T))
        v = (torch.rand(p_v.shape, generator=gen, dtype=torch.float64) < p_v).double()
    log_z0 = float(F.softplus(b_a).sum()) + W.shape[1] * math.log(2)
    w = torch.exp(log_w - log_w.max())
    return LogZEstimate(
        log_z=log_z0 + float(torch.logsumexp(log_w, 0) - math.log(n_chains)),
        stderr=float((w / w.mean()).std() / math.sqrt(n_chains)),
        method="plain ais",
        cost={"seconds": time.perf_counter() - start},
    )


def ebmlab_ais(rbm: BernoulliRBM, schedule: torch.Tensor, seed: int) -> LogZEstimate:
    return rbm_ais(rbm, n_chains=100, schedule=schedule, data=training_data(), generator=seed)


def cases() -> list[Case]:
    rbm, betas = trained_rbm(500), salakhutdinov_schedule()
    return [
        Case(
            what="AIS log Z, RBM 784 x 500 (10 epochs CD-1 on mnist10k), 14,500 temperatures, "
            "100 chains",
            ebmlab=lambda: ebmlab_ais(rbm, betas, 0),
            anchor=lambda: plain_ais(rbm, betas, 100, 0),
            anchor_name="plain PyTorch AIS (float64)",
            repeats=1,
            warmup=0,
        )
    ]


def curve() -> list[dict[str, float]]:
    """|AIS - exact| and the reported standard error against the number of temperatures."""
    rbm = trained_rbm(20)
    exact = rbm_log_partition(rbm).log_z
    rows = []
    for n in (*CURVE_TEMPERATURES, 14_500):
        schedule = salakhutdinov_schedule() if n == 14_500 else torch.linspace(0, 1, n + 1)
        runs = [ebmlab_ais(rbm, schedule, seed) for seed in range(CURVE_SEEDS)]
        rows.append(
            {
                "temperatures": n,
                "mean |error|": statistics.mean(abs(r.log_z - exact) for r in runs),
                "mean error": statistics.mean(r.log_z - exact for r in runs),
                "mean stderr": statistics.mean(r.stderr for r in runs),
                "seconds": statistics.mean(r.cost["seconds"] for r in runs),
            }
        )
    return rows


def main() -> None:
    torch.set_num_threads(1)
    rbm, betas = trained_rbm(500), salakhutdinov_schedule()
    lines = [
        "| 784 x 500, 14,500 temperatures | log Z | stderr | seconds |",
        "|---|---:|---:|---:|",
    ]
    for name, run in (
        ("ebmlab rbm_ais", lambda: ebmlab_ais(rbm, betas, 0)),
        ("plain PyTorch (float64)", lambda: plain_ais(rbm, betas, 100, 0)),
    ):
        est = run()
        lines.append(f"| {name} | {est.log_z:.3f} | {est.stderr:.3f} | {est.cost['seconds']:.1f} |")
    lines += [
        "",
        "| 784 x 20: temperatures | mean abs error | mean error | mean stderr | seconds |",
        "|---:|---:|---:|---:|---:|",
    ]
    for row in curve():
        name = "14,500 (Salakhutdinov)" if row["temperatures"] == 14_500 else row["temperatures"]
        lines.append(
            f"| {name} | {row['mean |error|']:.4f} | {row['mean error']:+.4f} "
            f"| {row['mean stderr']:.4f} | {row['seconds']:.2f} |"
        )
    text = "\n".join(lines)
    print(text)
    (Path(__file__).parent / "results" / "partition.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
