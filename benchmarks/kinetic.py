"""Underdamped Langevin (BAOAB) and SGHMC against MALA, overdamped Langevin and ebmkit's
underdamped Langevin, on a 50-d Gaussian with standard deviations 0.1 ... 1.

Every sampler gets the same 1000 chains, 300 warm-up and 1000 kept steps, one gradient
per step. Reported per sampler: the minimum over coordinates of the bulk ESS of x^2
per 1000 gradients (the slowest-mixing scale sets the cost), and the worst relative
error of the variances (the discretisation bias: zero for BAOAB on a Gaussian and for
MALA, not for first-order schemes). ``python -m benchmarks.kinetic`` prints the table;
ebmkit (``pip install ebmkit``) is left out when absent.
"""

from __future__ import annotations

from functools import cache

import torch

from benchmarks.harness import MetricCase
from ebmlab.energies import DiagonalGaussian
from ebmlab.samplers import MALA, SGHMC, Langevin, UnderdampedLangevin
from ebmlab.samplers.base import frozen_parameters
from ebmlab.samplers.diagnostics import effective_sample_size

DIM, CHAINS, BURN_IN, STEPS = 50, 1000, 300, 1000
STD = torch.logspace(-1, 0, DIM)
OURS = "underdamped (BAOAB, h 0.15, friction 1)"
EBMKIT = "ebmkit UnderdampedLangevin (eps 0.15, friction 1)"


def summarise(traj: torch.Tensor) -> dict[str, float]:
    """(T, chains, D) draws -> min ESS of x^2 per 1000 gradients and worst variance error."""
    ess = effective_sample_size(traj**2)
    variance = traj.double().pow(2).mean((0, 1))
    error = (variance / STD.double() ** 2 - 1).abs().max()
    return {"ess_per_1k": 1000 * float(ess.min()) / (STEPS * CHAINS), "var_error": float(error)}


def ebmlab_trajectory(sampler) -> torch.Tensor:
    target = DiagonalGaussian(torch.zeros(DIM), STD)
    x0 = torch.randn(CHAINS, DIM, generator=torch.Generator().manual_seed(1))
    return sampler.sample(target, x0, STEPS, burn_in=BURN_IN, thin=1, generator=0)


def ebmkit_trajectory(step_size: float, friction: float) -> torch.Tensor | None:
    try:
        from ebm.samplers import UnderdampedLangevin as TheirUnderdamped
    except ImportError:
        return None
    target = DiagonalGaussian(torch.zeros(DIM), STD)
    sampler = TheirUnderdamped(step_size=step_size, friction=friction)
    torch.manual_seed(0)
    x = torch.randn(CHAINS, DIM, generator=torch.Generator().manual_seed(1))
    kept = []
    with frozen_parameters(target), torch.enable_grad():
        for t in range(BURN_IN + STEPS):
            x = sampler.step(target, x).detach()
            if t >= BURN_IN:
                kept.append(x)
    return torch.stack(kept)


@cache
def figures() -> dict[str, dict[str, float]]:
    # the smallest scale (0.1) bounds every step: h = 0.15 is BAOAB's stable choice,
    # MALA's step gives ~60 % acceptance, friction 1 / (largest scale)
    out = {
        OURS: summarise(ebmlab_trajectory(UnderdampedLangevin(0.15, friction=1.0))),
        "SGHMC (eta 0.0225, momentum decay 0.15)": summarise(
            ebmlab_trajectory(SGHMC(0.0225, momentum_decay=0.15))
        ),
        "MALA (h 0.004)": summarise(ebmlab_trajectory(MALA(0.004))),
        "overdamped Langevin (h 0.004)": summarise(ebmlab_trajectory(Langevin(0.004))),
    }
    theirs = ebmkit_trajectory(0.15, 1.0)
    if theirs is not None:
        out[EBMKIT] = summarise(theirs)
    return out


def _case(anchor: str, metric: str, what: str, unit: str, higher_is_better: bool) -> MetricCase:
    def run() -> tuple[float, float]:
        f = figures()
        return f[OURS][metric], f[anchor][metric] if anchor in f else float("nan")

    return MetricCase(
        what=f"underdamped Langevin (BAOAB), 50-d Gaussian with sd 0.1..1, 1000 chains: {what}",
        run=run,
        anchor_name=anchor,
        unit=unit,
        higher_is_better=higher_is_better,
    )


def cases() -> list[MetricCase]:
    return [
        _case("MALA (h 0.004)", "ess_per_1k", "min ESS of x^2 per 1000 gradients", "ESS/1k", True),
        _case(EBMKIT, "var_error", "worst relative variance error, same step", "error", False),
    ]


def main() -> None:
    torch.set_num_threads(1)
    print("sampler | min ESS of x^2 per 1000 gradients | worst relative variance error")
    for name, f in figures().items():
        print(f"{name} | {f['ess_per_1k']:.2f} | {f['var_error']:.3f}")


if __name__ == "__main__":
    main()
