"""Samplers against hand-written PyTorch loops doing the same updates, and sampling
efficiency (effective samples per gradient and per second) against plain MALA."""

from __future__ import annotations

import math
import time

import torch
from torch import nn

from benchmarks.harness import Case, MetricCase
from ebmlab.data.toys import EightGaussians
from ebmlab.energies import BoltzmannMachine, DiagonalGaussian, Gaussian, MLPEnergy
from ebmlab.samplers import (
    HMC,
    MALA,
    NUTS,
    AdaptiveHMC,
    Gibbs,
    Langevin,
    MetropolisHastings,
    ParallelTempering,
)
from ebmlab.samplers.diagnostics import effective_sample_size

LANGEVIN_STEPS = 20
HMC_STEPS, LEAPFROG = 50, 10
GIBBS_SWEEPS = 10
MH_STEPS = 200
PT_STEPS = 100


def hand_written_langevin(
    net: nn.Module, x: torch.Tensor, steps: int, h: float, gen
) -> torch.Tensor:
    """The loop users write: autograd gradient of the energy, then the ULA update."""
    noise_scale = math.sqrt(2 * h)
    for _ in range(steps):
        x = x.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(net(x).sum(), x)
        x = x - h * g + noise_scale * torch.randn(x.shape, generator=gen)
    return x.detach()


def hand_written_hmc(
    energy, x: torch.Tensor, steps: int, eps: float, n_leapfrog: int, gen
) -> torch.Tensor:
    """Textbook HMC with autograd gradients (one gradient per leapfrog step, cached)."""

    def value_and_grad(z):
        z = z.detach().requires_grad_(True)
        e = energy(z)
        (g,) = torch.autograd.grad(e.sum(), z)
        return e.detach(), g

    e, g = value_and_grad(x)
    for _ in range(steps):
        p = torch.randn(x.shape, generator=gen)
        h0 = e + 0.5 * (p * p).sum(1)
        x1, g1 = x, g
        p1 = p - 0.5 * eps * g1
        for i in range(n_leapfrog):
            x1 = x1 + eps * p1
            e1, g1 = value_and_grad(x1)
            p1 = p1 - (eps if i < n_leapfrog - 1 else 0.5 * eps) * g1
        h1 = e1 + 0.5 * (p1 * p1).sum(1)
        ok = torch.rand(x.shape[0], generator=gen).log() < h0 - h1
        x = torch.where(ok[:, None], x1, x)
        e = torch.where(ok, e1, e)
        g = torch.where(ok[:, None], g1, g)
    return x


def hand_written_tempering(
    energy, x0: torch.Tensor, betas: torch.Tensor, steps: int, h: float, gen
) -> torch.Tensor:
    """Replica exchange with a MALA kernel (step h / beta) and even-odd neighbour swaps,
    as users write it: one batch of all replicas, autograd gradients, a loop over pairs."""
    k, n = len(betas), len(x0)
    beta = betas.repeat_interleave(n)[:, None]
    hs = h / beta

    def value_and_grad(z):
        z = z.detach().requires_grad_(True)
        e = beta[:, 0] * energy(z)
        (g,) = torch.autograd.grad(e.sum(), z)
        return e.detach(), g

    x = x0.repeat(k, 1)
    e, g = value_and_grad(x)
    for t in range(steps):
        prop = x - hs * g + (2 * hs).sqrt() * torch.randn(x.shape, generator=gen)
        e1, g1 = value_and_grad(prop)
        log_q_forward = -((prop - x + hs * g) ** 2).sum(1) / (4 * hs[:, 0])
        log_q_backward = -((x - prop + hs * g1) ** 2).sum(1) / (4 * hs[:, 0])
        log_ratio = e - e1 + log_q_backward - log_q_forward
        ok = torch.rand(len(x), generator=gen).log() < log_ratio
        x = torch.where(ok[:, None], prop, x)
        e, g = torch.where(ok, e1, e), torch.where(ok[:, None], g1, g)
        raw_e, raw_g = (e / beta[:, 0]).view(k, n), (g / beta).view(k, n, -1)
        xs = x.view(k, n, -1)
        for lo in range(t % 2, k - 1, 2):
            swap = torch.rand(n, generator=gen).log() < (betas[lo] - betas[lo + 1]) * (
                raw_e[lo] - raw_e[lo + 1]
            )
            for a in (xs, raw_g, raw_e):
                low, high = a[lo].clone(), a[lo + 1].clone()
                mask = swap.view(-1, *([1] * (low.ndim - 1)))
                a[lo], a[lo + 1] = torch.where(mask, high, low), torch.where(mask, low, high)
        e, g = raw_e.reshape(-1) * beta[:, 0], raw_g.reshape(g.shape) * beta
    return x[:n]


def hand_written_metropolis(energy, x: torch.Tensor, steps: int, scale: float, gen) -> torch.Tensor:
    """Gaussian random-walk Metropolis as users write it."""
    e = energy(x)
    for _ in range(steps):
        proposal = x + scale * torch.randn(x.shape, generator=gen)
        e_new = energy(proposal)
        ok = torch.rand(x.shape[0], generator=gen).log() < e - e_new
        x = torch.where(ok[:, None], proposal, x)
        e = torch.where(ok, e_new, e)
    return x


def hand_written_gibbs(
    w: torch.Tensor, b: torch.Tensor, x: torch.Tensor, sweeps: int, gen
) -> torch.Tensor:
    """Sequential-scan Gibbs on E(x) = -x^T W x - b^T x as users write it (W built once)."""
    x = x.clone()
    for _ in range(sweeps):
        for i in range(x.shape[1]):
            p = torch.sigmoid(2 * (x @ w[:, i]) + b[i])
            x[:, i] = (torch.rand(x.shape[0], generator=gen) < p).float()
    return x


def ess_efficiency(
    sampler, target, n_chains: int, burn_in: int, n_steps: int
) -> tuple[float, float]:
    """(min bulk ESS per 1000 gradient evaluations, min bulk ESS per second), whole run counted."""
    x0 = torch.randn(n_chains, target.dim, generator=torch.Generator().manual_seed(1))
    start = time.perf_counter()
    run = sampler.run(target, x0, n_steps, burn_in=burn_in, thin=1, generator=0)
    seconds = time.perf_counter() - start
    min_ess = float(effective_sample_size(run.samples).min())
    return 1000 * min_ess / run.info["n_grad_evals"], min_ess / seconds


def cases() -> list[Case | MetricCase]:
    torch.manual_seed(0)
    bm = BoltzmannMachine(64, init_std=0.1)
    x_bm = (torch.rand(1024, 64) < 0.5).float()
    gibbs = Gibbs(model=bm)
    ring = EightGaussians(std=0.1)

    def ring_energy(x):
        return -ring.log_prob(x)

    ladder = torch.tensor(ParallelTempering.geometric_ladder(8, 0.005))
    tempering = ParallelTempering(MALA(0.01), ladder.tolist())
    x_ring = torch.tensor([2.0, 0.0]).repeat(256, 1)
    metropolis = MetropolisHastings(0.5)
    mlp = MLPEnergy(64, hidden=(256, 256))
    mlp_bf16 = MLPEnergy(64, hidden=(256, 256))
    mlp_bf16.load_state_dict(mlp.state_dict())
    mlp_bf16.grad_dtype = torch.bfloat16
    x_mlp = torch.randn(1024, 64)
    gauss = Gaussian(torch.zeros(10), torch.eye(10) * 0.5 + 0.5)
    x_gauss = torch.randn(1024, 10)
    langevin, hmc = Langevin(0.01), HMC(0.2, LEAPFROG, jitter=0.0)
    gen = torch.Generator().manual_seed(0)
    ill = DiagonalGaussian(torch.zeros(100), torch.logspace(-2, 0, 100))

    def beside_mala(sampler, chains: int) -> tuple:
        # plain MALA needs a step below the smallest scale (0.01^2) to accept at all
        ours = ess_efficiency(sampler, ill, chains, 300, 300)
        return ours, ess_efficiency(MALA(1.5e-4), ill, chains, 300, 300), chains

    # NUTS runs 100 chains, whose trees of up to 2^7 steps take a minute on one core
    adaptive, nuts = beside_mala(AdaptiveHMC(), 1000), beside_mala(NUTS(), 100)
    return [
        Case(
            what=f"Langevin, MLP 64-256-256-1 SiLU, 1024 chains, {LANGEVIN_STEPS} steps",
            ebmlab=lambda: langevin.sample(mlp, x_mlp, LANGEVIN_STEPS, generator=gen),
            anchor=lambda: hand_written_langevin(mlp, x_mlp, LANGEVIN_STEPS, 0.01, gen),
            anchor_name="hand-written autograd loop",
        ),
        Case(
            what="Langevin as above, gradients in bfloat16 (grad_dtype)",
            ebmlab=lambda: langevin.sample(mlp_bf16, x_mlp, LANGEVIN_STEPS, generator=gen),
            anchor=lambda: hand_written_langevin(mlp, x_mlp, LANGEVIN_STEPS, 0.01, gen),
            anchor_name="hand-written autograd loop (float32)",
            dtype=torch.bfloat16,
        ),
        Case(
            what=f"HMC, 10-d Gaussian, 1024 chains, {HMC_STEPS} x {LEAPFROG} leapfrog",
            ebmlab=lambda: hmc.sample(gauss, x_gauss, HMC_STEPS, generator=gen),
            anchor=lambda: hand_written_hmc(gauss, x_gauss, HMC_STEPS, 0.2, LEAPFROG, gen),
            anchor_name="hand-written autograd HMC",
        ),
        Case(
            what=f"Metropolis-Hastings, 10-d Gaussian, 1024 chains, {MH_STEPS} steps",
            ebmlab=lambda: metropolis.sample(gauss, x_gauss, MH_STEPS, generator=gen),
            anchor=lambda: hand_written_metropolis(gauss, x_gauss, MH_STEPS, 0.5, gen),
            anchor_name="hand-written random walk",
        ),
        Case(
            what=f"Parallel tempering, MALA on 8 temperatures x 256 chains, 8-Gaussian ring, "
            f"{PT_STEPS} steps",
            ebmlab=lambda: tempering.sample(ring_energy, x_ring, PT_STEPS, generator=gen),
            anchor=lambda: hand_written_tempering(ring_energy, x_ring, ladder, PT_STEPS, 0.01, gen),
            anchor_name="hand-written replica exchange",
        ),
        Case(
            what=f"Gibbs, Boltzmann machine on 64 units, 1024 chains, {GIBBS_SWEEPS} sweeps",
            ebmlab=lambda: gibbs.sample(bm, x_bm, GIBBS_SWEEPS, generator=gen),
            anchor=lambda: hand_written_gibbs(*bm.couplings(), x_bm, GIBBS_SWEEPS, gen),
            anchor_name="hand-written sequential scan",
        ),
        *[
            MetricCase(
                what=f"100-d Gaussian, sd 0.01..1, {chains} chains: min {measure} ({name})",
                run=lambda ours=ours, mala=mala, i=i: (ours[i], mala[i]),
                anchor_name="MALA (step 1.5e-4)",
                unit=unit,
            )
            for name, (ours, mala, chains) in (("AdaptiveHMC", adaptive), ("NUTS", nuts))
            for i, (measure, unit) in enumerate(
                [("ESS / 1000 gradients", "ESS/1k grads"), ("ESS / second", "ESS/s")]
            )
        ],
    ]
