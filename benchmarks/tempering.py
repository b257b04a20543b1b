"""Parallel tempering: a ladder tuned to equal swap rejection against a geometric one.

Two targets with high energy barriers: the 8-Gaussian ring (std 0.1 at radius 2, about
29 nats between modes) and a 1-d double well of depth 20. Both samplers run MALA on
the same number of temperatures between 1 and the same hottest beta, two MALA steps
per swap round, 100 chains, 1000 burn-in steps (the tuned ladder adapts during them)
and 2000 kept steps. Reported: round trips per 1000 swap rounds (all walkers), the
spread of the pairs' swap rates, the communication barrier and the cold chains' mode
weights, and the most round trips any ladder of that many temperatures can give on
the target, with the measured share of it: with K temperatures
and rejection rates r_k, non-reversible swaps make tau = 1 / (2 + 2 sum_k r_k / (1 - r_k))
round trips per swap round in a column of replicas when the local moves draw independent
states (Syed et al. 2022); for a barrier Lambda the sum is smallest when every
pair rejects Lambda / (K - 1) of its swaps.
``python -m benchmarks.tempering`` prints the table.
"""

from __future__ import annotations

from functools import cache

import torch

from benchmarks.harness import MetricCase
from ebmlab.data.toys import EightGaussians
from ebmlab.energies import DoubleWell
from ebmlab.samplers import MALA, ParallelTempering

BURN_IN, STEPS, CHAINS = 1000, 2000, 100
SWAP_EVERY = 2  # local steps per swap round: the bound assumes they decorrelate the energy


def problems() -> dict[str, dict]:
    ring = EightGaussians(std=0.1)
    well = DoubleWell(dim=1, depth=20.0)
    return {
        "8-Gaussian ring, 6 temperatures down to 0.005": {
            "energy": lambda x: -ring.log_prob(x),
            "x0": torch.tensor([2.0, 0.0]).repeat(CHAINS, 1),
            "k": 6,
            "min_beta": 0.005,
            "step": 0.005,
            "weights": lambda x: torch.bincount(ring.component(x), minlength=8).double() / len(x),
            "truth": torch.full((8,), 1 / 8, dtype=torch.float64),
        },
        "double well (depth 20), 5 temperatures down to 0.001": {
            "energy": well,
            "x0": torch.ones(CHAINS, 1),
            "k": 5,
            "min_beta": 0.001,
            "step": 0.005,
            "weights": lambda x: torch.stack(
                [(x[:, 0] < 0).double().mean(), (x[:, 0] > 0).double().mean()]
            ),
            "truth": torch.tensor([0.5, 0.5], dtype=torch.float64),
        },
    }


def round_trip_bound(barrier: float, n_temperatures: int) -> float:
    """Round trips per 1000 swap rounds of CHAINS columns for the best ladder of
    ``n_temperatures`` on a target with communication barrier ``barrier``: equal rejection
    rates, independent local moves (Syed et al. 2022)."""
    gaps = n_temperatures - 1
    if barrier >= gaps:
        return 0.0
    return 1000 * CHAINS / (2 + 2 * barrier * gaps / (gaps - barrier))


@cache
def figures() -> dict[str, dict[str, dict[str, float]]]:
    out = {}
    for name, p in problems().items():
        out[name] = {}
        for label, tune in (("geometric", False), ("tuned", True)):
            ladder = ParallelTempering.geometric_ladder(p["k"], p["min_beta"])
            pt = ParallelTempering(MALA(p["step"]), ladder, SWAP_EVERY, tune_ladder=tune)
            run = pt.run(p["energy"], p["x0"], STEPS, burn_in=BURN_IN, thin=1, generator=0)
            rates = pt.swap_rates(run.final)
            weights = p["weights"](run.samples.reshape(-1, run.samples.shape[-1]))
            trips = 1000 * float(run.final.round_trips) / (STEPS // SWAP_EVERY)
            bound = round_trip_bound(pt.barrier(run.final), p["k"])
            out[name][label] = {
                "round_trips_per_1000": trips,
                "rate_spread": float(rates.max() - rates.min()),
                "barrier": pt.barrier(run.final),
                "bound": bound,
                "share_of_bound": trips / bound if bound > 0 else 0.0,
                "worst_weight_error": float((weights - p["truth"]).abs().max()),
            }
    return out


def cases() -> list[MetricCase]:
    def case(name: str) -> MetricCase:
        def run() -> tuple[float, float]:
            f = figures()[name]
            return f["tuned"]["round_trips_per_1000"], f["geometric"]["round_trips_per_1000"]

        return MetricCase(
            what=f"parallel tempering, {name}: round trips per 1000 swap rounds, tuned ladder",
            run=run,
            anchor_name="geometric ladder, same temperatures",
            unit="round trips",
        )

    return [case(name) for name in problems()]


def main() -> None:
    torch.set_num_threads(1)
    print(
        "target | ladder | round trips / 1000 swap rounds | swap-rate spread | barrier | "
        "worst mode-weight error | best ladder of this size | share of it"
    )
    for name, by_ladder in figures().items():
        for label, f in by_ladder.items():
            print(
                f"{name} | {label} | {f['round_trips_per_1000']:.0f} | {f['rate_spread']:.3f} | "
                f"{f['barrier']:.2f} | {f['worst_weight_error']:.4f} | {f['bound']:.0f} | "
                f"{f['share_of_bound']:.0%}"
            )


if __name__ == "__main__":
    main()
