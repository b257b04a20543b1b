"""The kernel Stein discrepancy as a test: size, power, and time.

The model is an equal mixture of N(-2 e_1, I) and N(2 e_1, I) in 2-d. H0 samples come
from the model; the alternative's come from the model but are tested against the
mixture shifted by 0.5 along e_1 (and by 0.25, a harder case). 100 repetitions of 1000
samples each, 1000 wild-bootstrap replicates, level 5 %. The time row compares one
KSD^2 of 1000 samples in 10-d with ebmkit's ``kernel_stein_discrepancy`` (an RBF
kernel, no test; ``pip install ebmkit``, left out when absent).
``python -m benchmarks.stein`` prints the table.
"""

from __future__ import annotations

from functools import cache

import torch

from benchmarks.harness import Case, MetricCase
from ebmlab.energies import Gaussian, GaussianMixture
from ebmlab.evaluation import kernel_stein_discrepancy

REPEATS, N = 100, 1000
MEANS = torch.tensor([[-2.0, 0.0], [2.0, 0.0]])


@cache
def rejection_rates() -> dict[str, float]:
    model = GaussianMixture.isotropic(MEANS, 1.0)
    tested = {
        "size (H0 true)": model,
        "power, shift 0.5": GaussianMixture.isotropic(MEANS + torch.tensor([0.5, 0.0]), 1.0),
        "power, shift 0.25": GaussianMixture.isotropic(MEANS + torch.tensor([0.25, 0.0]), 1.0),
    }
    gen = torch.Generator().manual_seed(0)
    counts = dict.fromkeys(tested, 0)
    for r in range(REPEATS):
        x = model.sample(N, gen)
        for name, energy in tested.items():
            counts[name] += kernel_stein_discrepancy(x, energy, generator=r).reject(0.05)
    return {name: c / REPEATS for name, c in counts.items()}


def _rate_case(name: str, reference: float, reference_name: str) -> MetricCase:
    return MetricCase(
        what=f"KSD test at 5 %, 2-d mixture, {N} samples, {REPEATS} repeats: {name}",
        run=lambda: (rejection_rates()[name], reference),
        anchor_name=reference_name,
        unit="rejection rate",
        higher_is_better=name.startswith("power"),
    )


def cases() -> list[Case | MetricCase]:
    target = Gaussian(torch.zeros(10), torch.eye(10))
    x = torch.randn(N, 10, generator=torch.Generator().manual_seed(0))
    rows: list[Case | MetricCase] = [
        _rate_case("size (H0 true)", 0.05, "nominal level"),
        _rate_case("power, shift 0.5", 0.9, "target power"),
        _rate_case("power, shift 0.25", 0.9, "target power"),
    ]
    try:
        from ebm.eval import kernel_stein_discrepancy as theirs
    except ImportError:
        return rows
    rows.append(
        Case(
            what=f"KSD^2 of {N} samples in 10-d (ebmlab: with standard error and 1000-replicate "
            "bootstrap p-value)",
            ebmlab=lambda: kernel_stein_discrepancy(x, target, generator=0),
            anchor=lambda: theirs(target, x),
            anchor_name="ebmkit kernel_stein_discrepancy (statistic only)",
        )
    )
    return rows


def main() -> None:
    torch.set_num_threads(1)
    for name, rate in rejection_rates().items():
        print(f"{name}: rejection rate {rate:.2f}")


if __name__ == "__main__":
    main()
