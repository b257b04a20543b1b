"""Mean field, TAP (second and third order) and Bethe against exact log Z.

Random Boltzmann machines (20 units, W ~ N(0, 0.2^2), b ~ N(0, 1)), random RBMs (20 x 12,
W ~ N(0, 0.3^2)) and the 64 x 16 RBM of the RBM tutorial (40 epochs of centred PCD-1 on
the binarised digits), each small enough for exact log Z. ``python -m
benchmarks.plefka`` prints each method's error as a Markdown table; the cases compare
TAP's absolute error with mean field's.
"""

from __future__ import annotations

from functools import cache

import torch

from benchmarks.harness import MetricCase
from ebmlab.data import load_dataset
from ebmlab.energies import BernoulliRBM, BoltzmannMachine
from ebmlab.partition import bethe_log_partition, exact_log_partition, plefka_log_partition
from ebmlab.sklearn import BernoulliRBM as SkBernoulliRBM


def models() -> dict[str, torch.nn.Module]:
    out = {}
    for seed in range(2):
        torch.manual_seed(seed)
        bm = BoltzmannMachine(20).double()
        rbm = BernoulliRBM(20, 12).double()
        with torch.no_grad():
            bm.weight.normal_(0, 0.2)
            bm.b.normal_(0, 1)
            rbm.W.normal_(0, 0.3)
            rbm.b.normal_(0, 1)
            rbm.c.normal_(0, 1)
        out[f"BM 20 units, seed {seed}"] = bm
        out[f"RBM 20 x 12, seed {seed}"] = rbm
    train = load_dataset("digits", "train", transform="binary").x.numpy()
    settings = {"n_iter": 40, "k": 1, "n_chains": 100, "centering": True, "momentum": 0.9}
    trained = SkBernoulliRBM(16, learning_rate=0.05, lr_decay=True, random_state=0, **settings)
    trained.fit(train)
    out["RBM 64 x 16 trained on digits"] = trained.rbm_.double()
    return out


@cache
def errors() -> dict[str, dict[str, float | None]]:
    """Each method's error (estimate - exact) per model; None where it does not apply."""
    table = {}
    for name, model in models().items():
        exact = exact_log_partition(model).log_z
        row: dict[str, float | None] = {}
        for order, method in ((1, "mean field"), (2, "TAP"), (3, "TAP3")):
            try:
                row[method] = plefka_log_partition(model, order).log_z - exact
            except ValueError:  # third order on a graph with triangles
                row[method] = None
        bethe = bethe_log_partition(model, damping=0.9, max_iter=5000)
        row["Bethe"] = bethe.log_z - exact
        row["Bethe converged"] = float(bethe.cost["converged"])
        table[name] = row
    return table


def cases() -> list[MetricCase]:
    return [
        MetricCase(
            what=f"|log Z error| of TAP, {name}",
            run=lambda name=name: (abs(errors()[name]["TAP"]), abs(errors()[name]["mean field"])),
            anchor_name="naive mean field",
            unit="nats",
            higher_is_better=False,
        )
        for name in errors()
    ]


def main() -> None:
    torch.set_num_threads(1)
    print("| model | mean field | TAP | TAP3 | Bethe |")
    print("|---|---:|---:|---:|---:|")
    for name, row in errors().items():
        cells = [
            "n/a" if row[m] is None else f"{row[m]:+.4f}" for m in ("mean field", "TAP", "TAP3")
        ]
        bethe = f"{row['Bethe']:+.4f}" + ("" if row["Bethe converged"] else " (not converged)")
        print(f"| {name} | {' | '.join(cells)} | {bethe} |")


if __name__ == "__main__":
    main()
