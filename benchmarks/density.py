"""Training principles on 2-D toy densities: accuracy against cost, every toy x method.

``python -m benchmarks.density [toy ...] [--methods m ...]`` trains the ``density``
recipe with each method on each toy and prints one table: training seconds, energy
evaluations (rows passed forward through the network, each followed by backward passes), the
exact test NLL (log Z by quadrature) beside the true density's NLL (its entropy, the
floor), KL(true || model) on the grid and the kernel MMD^2 against test data of exact
model samples (drawn on the quadrature grid) and of 500-step Langevin samples, beside
the MMD^2 of a second exact sample of the true density (the floor). ``cases()`` (for
``python -m benchmarks.run density``) reports the 8-Gaussians NLL of NCE against the floor.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from benchmarks.harness import MetricCase
from ebmlab.data import TOYS
from ebmlab.training import RunDirectory, Trainer
from ebmlab.training.recipes import get_recipe
from ebmlab.training.recipes.density import METHODS


def train_and_evaluate(
    data: str, method: str, overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Train one (toy, method) pair on one thread; evaluate; add seconds and evaluations.

    ``overrides`` replaces recipe or trainer settings (e.g. ``{"epochs": 100}``).
    """
    import torch

    torch.set_num_threads(1)
    recipe = get_recipe("density")
    config, trainer = recipe.configs(
        {**(overrides or {}), "data": data, "method": method, "progress": False}
    )
    setup = recipe.build(config, trainer)
    model = setup.task.model
    rows = [0]

    def count(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        rows[0] += args[0].shape[0]

    def counted_energy_and_grad(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows[0] += x.shape[0]
        return type(model).energy_and_grad(model, x)

    hook = model.net.register_forward_pre_hook(count)
    model.energy_and_grad = counted_energy_and_grad
    start = time.perf_counter()
    Trainer(setup.task, setup.train_data, trainer).fit()
    seconds = time.perf_counter() - start
    hook.remove()
    del model.energy_and_grad
    setup.task.model.eval()
    with tempfile.TemporaryDirectory() as tmp:
        result = recipe.evaluate(setup, RunDirectory(tmp))
    return {**result, "method": method, "seconds": seconds, "energy_evals": rows[0]}


def run_all(
    toys: list[str], methods: list[str], workers: int, overrides: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Every toy x method, ``workers`` at a time; prints each row to stderr as it finishes."""
    pairs = [(toy, method) for toy in toys for method in methods]
    with ProcessPoolExecutor(workers) as pool:
        futures = [pool.submit(train_and_evaluate, *pair, overrides) for pair in pairs]
        results = []
        for future in futures:
            results.append(future.result())
            print(table(results[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    return results


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| toy | method | seconds | energy evals (M) | test NLL | true NLL | gap | "
        "KL(true‖model) | MMD² model | MMD² Langevin | MMD² floor |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['data']} | {r['method']} | {r['seconds']:.0f} | {r['energy_evals'] / 1e6:.1f} | "
            f"{r['test_nll']:.3f} | {r['true_nll']:.3f} | {r['nll_gap']:.3f} | "
            f"{r['kl_true_model']:.3f} | {r['mmd2']:.5f} | {r['mmd2_langevin']:.5f} | "
            f"{r['mmd2_floor']:.5f} |"
        )
    return "\n".join(lines)


def cases() -> list[MetricCase]:
    best = train_and_evaluate("8gaussians", "nce")
    return [
        MetricCase(
            what="8 Gaussians, NCE (KDE noise): exact test NLL (nats)",
            run=lambda: (best["test_nll"], best["true_nll"]),
            anchor_name="true density's NLL (the floor)",
            unit="nats",
            higher_is_better=False,
        )
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("toys", nargs="*", help=f"any of {', '.join(TOYS)} (default: all)")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--workers", type=int, default=int(os.environ.get("BENCH_WORKERS", "2")))
    parser.add_argument(
        "--set",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="override a recipe or trainer setting for every run, e.g. epochs=100",
    )
    args = parser.parse_args()
    if set(args.toys) - set(TOYS):
        parser.error(f"unknown toy(s) {sorted(set(args.toys) - set(TOYS))}; available: {TOYS}")
    overrides = {}
    for item in args.set:
        key, _, value = item.partition("=")
        try:
            overrides[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            overrides[key] = value
    print(table(run_all(args.toys or list(TOYS), args.methods, args.workers, overrides)))
