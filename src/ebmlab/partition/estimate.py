"""The record every partition-function method returns."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class LogZEstimate:
    """An estimate of log Z with its uncertainty.

    ``stderr`` is a standard error (stochastic methods) or a numerical error bound
    (quadrature); ``lower`` / ``upper`` are bounds where the method gives them.
    ``cost`` records what the estimate took (energy evaluations, seconds, ...).
    """

    log_z: float
    stderr: float = 0.0
    lower: float = -math.inf
    upper: float = math.inf
    method: str = ""
    cost: dict[str, Any] = field(default_factory=dict)

    def interval(self, k: float = 3.0) -> tuple[float, float]:
        """log_z +/- k stderr, intersected with the bounds."""
        return max(self.lower, self.log_z - k * self.stderr), min(
            self.upper, self.log_z + k * self.stderr
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
