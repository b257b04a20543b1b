"""Timing harness: warm-up, interleaved repeats, medians, one table.

Each benchmark module defines ``cases()`` returning :class:`Case` objects. A case
times ebmlab's way of doing something against an anchor (a hand-written PyTorch
loop, scikit-learn, ...) doing the same work; the two are run alternately so
that both see the same machine state, and the ratio of medians is reported as
``anchor / ebmlab`` (above 1: ebmlab is faster). A :class:`MetricCase` compares a
quality number instead (e.g. effective samples per gradient), ratio ebmlab / anchor.
A timed row also gives its roofline (:mod:`benchmarks.roofline`): the FLOPs of
ebmlab's call, its rate and the fraction of the CPU's peak in the row's dtype
(``Case.dtype``) measured by a product probe on the same threads; a row without
products, the bytes its operations move and the fraction of a copy's bandwidth.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from benchmarks.roofline import bandwidth_roofline, count_bytes, count_flops, roofline


@dataclass
class Case:
    what: str
    ebmlab: Callable[[], object]
    anchor: Callable[[], object]
    anchor_name: str
    repeats: int = 5
    warmup: int = 1
    dtype: torch.dtype = torch.float32  # of ebmlab's products, for the roofline's peak


@dataclass
class MetricCase:
    """A quality comparison: ``run()`` returns (ebmlab value, anchor value)."""

    what: str
    run: Callable[[], tuple[float, float]]
    anchor_name: str
    unit: str
    higher_is_better: bool = True


@dataclass
class Result:
    what: str
    anchor_name: str
    ebmlab: float
    anchor: float
    unit: str = "s"
    higher_is_better: bool = False
    flops: int = 0  # ebmlab's call's products (timed rows)
    bytes: int = 0  # what ebmlab's call reads and writes (timed rows without products)
    fraction_of_peak: float | None = None  # of the product probe, or of the copy's bandwidth

    @property
    def ratio(self) -> float:
        """Speed-up (times) or improvement (metrics): above 1 means ebmlab does better."""
        return self.ebmlab / self.anchor if self.higher_is_better else self.anchor / self.ebmlab


def _time(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(case: Case | MetricCase) -> Result:
    """Median seconds of ebmlab and anchor over interleaved repeats after warm-up,
    or the two values of a metric case."""
    if isinstance(case, MetricCase):
        ours_value, theirs_value = case.run()
        return Result(
            case.what, case.anchor_name, ours_value, theirs_value, case.unit, case.higher_is_better
        )
    for _ in range(case.warmup):
        case.ebmlab()
        case.anchor()
    ours, theirs = [], []
    for i in range(case.repeats):
        pair = [(ours, case.ebmlab), (theirs, case.anchor)]
        for store, fn in pair if i % 2 == 0 else pair[::-1]:
            store.append(_time(fn))
    seconds = statistics.median(ours)
    result = Result(case.what, case.anchor_name, seconds, statistics.median(theirs))
    cpu = torch.device("cpu")
    result.flops = count_flops(case.ebmlab)
    if result.flops:
        result.fraction_of_peak = roofline(result.flops, seconds, cpu, case.dtype)[
            "fraction_of_peak"
        ]
    else:
        result.bytes = count_bytes(case.ebmlab)
        result.fraction_of_peak = bandwidth_roofline(result.bytes, seconds, cpu)["fraction_of_peak"]
    return result


def markdown_table(results: list[Result]) -> str:
    lines = [
        "| what | unit | ebmlab | anchor | anchor value | ratio | rate | of peak |",
        "|---|---|---:|---|---:|---:|---:|---:|",
    ]
    for r in results:
        rate, share = "-", "-"
        if r.flops:
            rate = f"{r.flops / r.ebmlab / 1e9:.3g} GFLOP/s"
            share = f"{100 * r.fraction_of_peak:.1f} % matmul"
        elif r.bytes:
            rate = f"{r.bytes / r.ebmlab / 1e9:.3g} GB/s"
            share = f"{100 * r.fraction_of_peak:.1f} % copy"
        lines.append(
            f"| {r.what} | {r.unit} | {r.ebmlab:.4g} | {r.anchor_name} | {r.anchor:.4g} | "
            f"{r.ratio:.2f} | {rate} | {share} |"
        )
    return "\n".join(lines)


def write_json(results: list[Result], path: Path, machine: dict) -> None:
    """The rows with the ``machine`` they ran on (CPU, flags, threads, peak)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{**asdict(r), "ratio": r.ratio} for r in results]
    path.write_text(json.dumps({"machine": machine, "rows": rows}, indent=2) + "\n")
