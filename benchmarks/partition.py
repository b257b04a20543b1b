"""AIS for a 784 x 500 RBM with the Salakhutdinov & Murray (2008) schedule (14,500
temperatures, 100 chains) against a plain PyTorch implementation of the same algorithm."""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from benchmarks.harness import Case
from ebmlab.energies import BernoulliRBM
from ebmlab.partition import rbm_ais, salakhutdinov_schedule


def plain_ais(rbm: BernoulliRBM, betas: torch.Tensor, n_chains: int, gen: torch.Generator) -> float:
    """The textbook loop: float64, log p* evaluated from scratch at both temperatures."""
    W, b, c = rbm.W.detach().double(), rbm.b.detach().double(), rbm.c.detach().double()
    b_a = torch.zeros_like(b)

    def log_p_star(v, beta):
        return (1 - beta) * v @ b_a + beta * v @ b + F.softplus(beta * (v @ W + c)).sum(1)

    v = (torch.rand(n_chains, len(b), generator=gen, dtype=torch.float64) < 0.5).double()
    log_w = torch.zeros(n_chains, dtype=torch.float64)
    for k in range(1, len(betas)):
        log_w += log_p_star(v, float(betas[k])) - log_p_star(v, float(betas[k - 1]))
        h = (
            torch.rand(n_chains, W.shape[1], generator=gen, dtype=torch.float64)
            < torch.sigmoid(float(betas[k]) * (v @ W + c))
        ).double()
        pv = torch.sigmoid((1 - float(betas[k])) * b_a + float(betas[k]) * (b + h @ W.T))
        v = (torch.rand(pv.shape, generator=gen, dtype=torch.float64) < pv).double()
    log_z0 = len(b) * math.log(2) + W.shape[1] * math.log(2)
    return log_z0 + float(torch.logsumexp(log_w, 0) - math.log(n_chains))


def cases() -> list[Case]:
    torch.manual_seed(0)
    rbm = BernoulliRBM(784, 500, init_std=0.01)
    betas = salakhutdinov_schedule()
    return [
        Case(
            what="AIS log Z, RBM 784 x 500, 14,500 temperatures, 100 chains",
            ebmlab=lambda: rbm_ais(rbm, n_chains=100, schedule=betas, generator=0),
            anchor=lambda: plain_ais(rbm, betas, 100, torch.Generator().manual_seed(0)),
            anchor_name="plain PyTorch AIS (float64)",
            repeats=1,
            warmup=0,
        )
    ]
