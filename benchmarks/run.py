"""Run the benchmarks: ``python -m benchmarks.run [module ...] [--threads N]``.

ebmlab and its anchors run on the same number of threads (PyTorch's and the BLAS and
OpenMP pools of NumPy and scikit-learn), one by default.

Prints a Markdown table and writes ``benchmarks/results/results.json``.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import platform
from pathlib import Path

import torch
from threadpoolctl import threadpool_limits

import benchmarks
from benchmarks.harness import markdown_table, measure, write_json

SKIP = {"harness", "run", "gpu", "posteriors", "posterior_models", "blackjax_runner",
        "fashion_rbm", "energy_matching"}
# each runs on its own: python -m benchmarks.gpu, python -m benchmarks.posteriors, ...


def main() -> None:
    available = sorted(
        m.name for m in pkgutil.iter_modules(benchmarks.__path__) if m.name not in SKIP
    )
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("modules", nargs="*", help=f"any of {', '.join(available)} (default: all)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    unknown = set(args.modules) - set(available)
    if unknown:
        parser.error(f"unknown benchmark module(s) {sorted(unknown)}; available: {available}")
    torch.set_num_threads(args.threads)
    results = []
    # the anchors' BLAS and OpenMP pools (NumPy, scikit-learn) get the same threads
    with threadpool_limits(args.threads):
        for name in args.modules or available:
            module = importlib.import_module(f"benchmarks.{name}")
            for case in module.cases():
                results.append(measure(case))
                print(f"measured: {case.what}", flush=True)
    machine = platform.processor() or platform.machine()
    print(f"\ntorch {torch.__version__}, {args.threads} thread(s), {machine}\n")
    print(markdown_table(results))
    write_json(results, Path(__file__).parent / "results" / "results.json")


if __name__ == "__main__":
    main()
