"""Run the benchmarks: ``python -m benchmarks.run [module ...] [--threads N]``.

ebmlab and its anchors run on the same number of threads (PyTorch's and the BLAS and
OpenMP pools of NumPy and scikit-learn), one by default.

Prints a Markdown table and writes ``benchmarks/results/results.json``.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
from pathlib import Path

import torch
from threadpoolctl import threadpool_limits

import benchmarks
from benchmarks.harness import markdown_table, measure, write_json
from benchmarks.roofline import peak_bandwidth, peak_flops, peak_name
from ebmlab import hardware

SKIP = {
    "harness",
    "run",
    "gpu",
    "posteriors",
    "posterior_models",
    "blackjax_runner",
    "fashion_rbm",
    "energy_matching",
}
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
    cpu = torch.device("cpu")
    machine = {
        "cpu": hardware.cpu_name(),
        "flags": sorted(name for name, on in hardware.cpu_features().items() if on),
        "torch": torch.__version__,
        "threads": args.threads,
        "float32_gflop_per_s": peak_flops(cpu, torch.float32) / 1e9,
        "peak": peak_name(cpu, torch.float32),
        "copy_gb_per_s": peak_bandwidth(cpu) / 1e9,
    }
    print(f"\ntorch {torch.__version__}, {args.threads} thread(s), {machine['cpu']} "
          f"({', '.join(machine['flags'])}), float32 peak "
          f"{machine['float32_gflop_per_s']:.0f} GFLOP/s, copy "
          f"{machine['copy_gb_per_s']:.0f} GB/s\n")  # fmt: skip
    print(markdown_table(results))
    write_json(results, Path(__file__).parent / "results" / "results.json", machine)


if __name__ == "__main__":
    main()
