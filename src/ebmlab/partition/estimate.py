"""The record every partition-function method returns."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from ebmlab._checks import ArgumentError


@dataclass(frozen=True)
class LogZEstimate:
    """An estimate of log Z with its uncertainty.

    ``log_z`` is the estimate; ``stderr`` is a standard error (stochastic methods) or a
    numerical error bound (quadrature); ``lower`` / ``upper`` are bounds where the
    method gives them; ``method`` names the method.
    ``cost`` records what the estimate took (energy evaluations, seconds, ...).
    ``dof`` is the standard error's degrees of freedom: n - 1 where it is the spread of
    n independent replicates (runs, chains, samples), infinite where it is known or
    asymptotic.
    """

    log_z: float
    stderr: float = 0.0
    lower: float = -math.inf
    upper: float = math.inf
    method: str = ""
    cost: dict[str, Any] = field(default_factory=dict)
    dof: float = math.inf

    def __post_init__(self) -> None:
        """No silent NaN: an estimate that came out NaN is refused where it is made."""
        if math.isnan(self.log_z):
            raise ArgumentError(
                f"log Z by {self.method or 'this method'} came out NaN: the energy gives NaN "
                "on some states (check its parameters and inputs)"
            )

    def interval(self, k: float = 3.0) -> tuple[float, float]:
        """The interval with the coverage of a normal estimate's log_z +/- k stderr (k = 3:
        99.73 %), intersected with the bounds.

        A standard error from few replicates is itself uncertain, so the half-width is
        Student's t quantile at that coverage with ``dof`` degrees of freedom times the
        stderr (Student 1908); with infinite ``dof`` it is k stderr exactly.
        """
        half = k * self.stderr
        if math.isfinite(self.dof):
            from scipy.stats import t as student_t

            coverage = math.erf(k / math.sqrt(2))
            half = float(student_t.ppf((1 + coverage) / 2, self.dof)) * self.stderr
        return max(self.lower, self.log_z - half), min(self.upper, self.log_z + half)

    def to_dict(self) -> dict[str, Any]:
        """The estimate as a JSON-serialisable dict."""
        return asdict(self)


def log_sum(parts: list[LogZEstimate], offsets: list[float], method: str) -> LogZEstimate:
    """log sum_k exp(offsets_k + log Z_k) for independent estimates of log Z_k.

    The standard error follows by the delta method, sqrt(sum_k w_k^2 stderr_k^2) with
    w = softmax(offsets + log Z), with the fewest degrees of freedom among the parts;
    the bounds combine term by term.
    """
    f64 = torch.float64
    shift = torch.tensor(offsets, dtype=f64)
    values = shift + torch.tensor([p.log_z for p in parts], dtype=f64)
    weights = torch.softmax(values, 0)
    stderr = float(torch.tensor([p.stderr for p in parts], dtype=f64).mul(weights).norm())

    def combine(bounds: list[float]) -> float:
        return float(torch.logsumexp(torch.tensor(bounds, dtype=f64) + shift, 0))

    seconds = sum(p.cost.get("seconds", 0.0) for p in parts)
    return LogZEstimate(
        log_z=float(torch.logsumexp(values, 0)),
        stderr=stderr,
        lower=combine([p.lower for p in parts]),
        upper=combine([p.upper for p in parts]),
        method=method,
        cost={"parts": len(parts), "seconds": seconds},
        dof=min(p.dof for p in parts),
    )
