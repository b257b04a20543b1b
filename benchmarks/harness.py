"""Timing harness: warm-up, interleaved repeats, medians, one table.

Each benchmark module defines ``cases()`` returning :class:`Case` objects. A case
times ebmlab's way of doing something against an anchor (a hand-written PyTorch
loop, scikit-learn, ...) doing the same work; the two are run alternately so
that both see the same machine state, and the ratio of medians is reported as
``anchor / ebmlab`` (above 1: ebmlab is faster). A :class:`MetricCase` compares a
quality number instead (e.g. effective samples per gradient), ratio ebmlab / anchor.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class Case:
    what: str
    ebmlab: Callable[[], object]
    anchor: Callable[[], object]
    anchor_name: str
    repeats: int = 5
    warmup: int = 1


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
    return Result(case.what, case.anchor_name, statistics.median(ours), statistics.median(theirs))


def markdown_table(results: list[Result]) -> str:
    lines = [
        "| what | unit | ebmlab | anchor | anchor value | ratio |",
        "|---|---|---:|---|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.what} | {r.unit} | {r.ebmlab:.4g} | {r.anchor_name} | {r.anchor:.4g} | "
            f"{r.ratio:.2f} |"
        )
    return "\n".join(lines)


def write_json(results: list[Result], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{**asdict(r), "ratio": r.ratio} for r in results]
    path.write_text(json.dumps(rows, indent=2) + "\n")
