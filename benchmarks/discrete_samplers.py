"""Discrete samplers: effective samples of the energy per second.

Gibbs-with-Gradients (one flip per step, and a path of several flips per gradient:
``n_flips``) and discrete Langevin (DMALA) against the single-site Gibbs sampler users
have for any binary energy, and against ebmkit's Gibbs-with-Gradients
(``pip install ebmkit``; its row is left out when it is absent), on

- a 784 x 500 Bernoulli RBM trained by ten epochs of CD-1 on mnist10k (binarised;
  the digits when MNIST is absent), chains started from test images;
- a 20 x 20 Ising model (coupling J = 0.35 between neighbours, no field, on {0, 1} as a
  Boltzmann machine), where single-site Gibbs takes its fast path (coupling rows); the
  generic path (energy differences, what any other binary energy gets) is timed too.

Each sampler runs 64 chains; after a burn-in, the time of its steps is measured and
the rank-normalised ESS of the energy trace across chains (Vehtari et al. 2021)
divided by it. ``python -m benchmarks.discrete_samplers`` prints every sampler's
figures, block Gibbs included for the RBM.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import cache

import torch

from benchmarks.harness import MetricCase
from benchmarks.partition import trained_rbm
from benchmarks.rbm import mnist_binary
from ebmlab.energies import BoltzmannMachine
from ebmlab.energies.base import as_energy_fn
from ebmlab.samplers import BlockGibbs, DiscreteLangevin, Gibbs, GibbsWithGradients
from ebmlab.samplers.base import frozen_parameters
from ebmlab.samplers.diagnostics import effective_sample_size

CHAINS = 64
Stepper = Callable[[torch.Tensor], torch.Tensor]


def ising(side: int = 20, coupling: float = 0.35) -> BoltzmannMachine:
    """-J sum_<ij> s_i s_j with s = 2x - 1 on a side x side grid with free boundaries,
    written on x in {0, 1}: W_ij = 2J for neighbours and b_i = -2J deg(i)."""
    n = side * side
    w = torch.zeros(n, n)
    idx = torch.arange(n).view(side, side)
    for a, b in ((idx[:, :-1], idx[:, 1:]), (idx[:-1, :], idx[1:, :])):
        w[a.flatten(), b.flatten()] = 2 * coupling
    model = BoltzmannMachine(n, init_std=0.0)
    with torch.no_grad():
        model.weight.copy_(w)  # the strict upper triangle holds every pair once
        model.b.copy_(-(w + w.T).sum(1))
    return model


def ebmlab_stepper(sampler, energy, seed: int = 0) -> Stepper:
    fn = as_energy_fn(energy)
    gen = torch.Generator().manual_seed(seed)
    state = None

    def step(x: torch.Tensor) -> torch.Tensor:
        nonlocal state
        if state is None:
            state = sampler.init(x, fn)
        state = sampler.step(state, fn, gen)
        return state.x

    return step


def ebmkit_stepper(energy) -> Stepper | None:
    try:
        from ebm.samplers import GibbsWithGradients as TheirGWG
    except ImportError:
        return None
    sampler = TheirGWG(steps=1)
    torch.manual_seed(0)

    def step(x: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            return sampler.step(energy, x).detach()

    return step


def ess_per_second(step: Stepper, energy, x0: torch.Tensor, burn_in: int, steps: int) -> dict:
    """Burn in, then time ``steps`` steps; ESS of the energy trace per second and per step."""
    with frozen_parameters(energy):
        x = x0.clone()
        for _ in range(burn_in):
            x = step(x)
        kept = []
        start = time.perf_counter()
        for _ in range(steps):
            x = step(x)
            kept.append(x.to(torch.bool))
        seconds = time.perf_counter() - start
        with torch.no_grad():
            trace = torch.stack([energy(k.float()) for k in kept])  # (T, chains)
    ess = float(effective_sample_size(trace.unsqueeze(-1)))
    return {"ess": ess, "seconds": seconds, "ess_per_s": ess / seconds, "steps": steps}


@cache
def rbm_figures() -> dict[str, dict]:
    rbm = trained_rbm(500)
    data = mnist_binary()
    x0 = (
        torch.as_tensor(data[-CHAINS:], dtype=torch.float32)
        if data is not None
        else (torch.rand(CHAINS, rbm.W.shape[0]) < 0.5).float()
    )
    figures = {
        "gwg": ess_per_second(ebmlab_stepper(GibbsWithGradients(), rbm), rbm, x0, 1000, 3000),
        "gwg_8_flips": ess_per_second(
            ebmlab_stepper(GibbsWithGradients(n_flips=8), rbm), rbm, x0, 1000, 3000
        ),
        "dmala": ess_per_second(ebmlab_stepper(DiscreteLangevin(0.2), rbm), rbm, x0, 300, 1000),
        "gibbs": ess_per_second(ebmlab_stepper(Gibbs(), rbm), rbm, x0, 2, 12),
        "block_gibbs": ess_per_second(ebmlab_stepper(BlockGibbs(rbm), rbm), rbm, x0, 100, 1000),
    }
    theirs = ebmkit_stepper(rbm)
    if theirs is not None:
        figures["ebmkit_gwg"] = ess_per_second(theirs, rbm, x0, 1000, 3000)
    return figures


@cache
def ising_figures() -> dict[str, dict]:
    model = ising()
    x0 = (torch.rand(CHAINS, 400, generator=torch.Generator().manual_seed(0)) < 0.5).float()
    figures = {
        "gwg": ess_per_second(ebmlab_stepper(GibbsWithGradients(), model), model, x0, 2000, 8000),
        "gwg_16_flips": ess_per_second(
            ebmlab_stepper(GibbsWithGradients(n_flips=16), model), model, x0, 2000, 8000
        ),
        "dmala": ess_per_second(ebmlab_stepper(DiscreteLangevin(0.2), model), model, x0, 500, 2000),
        "gibbs": ess_per_second(ebmlab_stepper(Gibbs(model=model), model), model, x0, 50, 300),
        "gibbs_generic": ess_per_second(ebmlab_stepper(Gibbs(), model), model, x0, 3, 12),
    }
    theirs = ebmkit_stepper(model)
    if theirs is not None:
        figures["ebmkit_gwg"] = ess_per_second(theirs, model, x0, 2000, 8000)
    return figures


def _case(what: str, figures: Callable[[], dict], ours: str, anchor: str, name: str):
    def run() -> tuple[float, float]:
        f = figures()
        return f[ours]["ess_per_s"], f[anchor]["ess_per_s"] if anchor in f else float("nan")

    return MetricCase(what=what, run=run, anchor_name=name, unit="ESS/s")


def cases() -> list[MetricCase]:
    rows = []
    for label, figures, flips in (
        ("RBM 784 x 500 (CD-1 on mnist10k)", rbm_figures, 8),
        ("Ising 20 x 20, J = 0.35", ising_figures, 16),
    ):
        rows += [
            _case(
                f"Gibbs-with-Gradients, {label}, 64 chains: ESS of the energy per second",
                figures,
                "gwg",
                "gibbs",
                "single-site Gibbs (ebmlab)",
            ),
            _case(
                f"Gibbs-with-Gradients, {flips} flips per step, {label}",
                figures,
                f"gwg_{flips}_flips",
                "gibbs",
                "single-site Gibbs (ebmlab)",
            ),
            _case(
                f"same, against ebmkit 0.16's Gibbs-with-Gradients ({label})",
                figures,
                "gwg",
                "ebmkit_gwg",
                "ebmkit GibbsWithGradients",
            ),
            _case(
                f"DMALA (step 0.2), {label}: ESS of the energy per second",
                figures,
                "dmala",
                "gibbs",
                "single-site Gibbs (ebmlab)",
            ),
        ]
    rows.append(
        _case(
            "Gibbs-with-Gradients, 16 flips per step, Ising 20 x 20: against single-site "
            "Gibbs from energy differences",
            ising_figures,
            "gwg_16_flips",
            "gibbs_generic",
            "single-site Gibbs, generic path (ebmlab)",
        )
    )
    return rows


def main() -> None:
    torch.set_num_threads(1)
    for label, figures in (("RBM 784 x 500", rbm_figures), ("Ising 20 x 20", ising_figures)):
        print(f"\n{label}: sampler, ESS of the energy, seconds, ESS/s, ESS per 1000 steps")
        for name, f in figures().items():
            per_k = 1000 * f["ess"] / f["steps"]
            figures_line = f"{f['ess']:9.1f} {f['seconds']:8.2f} {f['ess_per_s']:9.2f}"
            print(f"  {name:12s} {figures_line} {per_k:8.1f}")


if __name__ == "__main__":
    main()
