"""Average log-likelihood of data under an energy model, given an estimate of log Z.

log p(x) = -E(x) - log Z (Song & Kingma 2021: the energy alone ranks configurations; only Z turns
it into a probability). The uncertainty has two parts that are reported apart: the
error of log Z, which shifts every row alike, and the spread of -E(x) over the rows,
the sampling error of the data set's mean.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from ebmlab._checks import ArgumentError
from ebmlab.devices import widen
from ebmlab.energies.base import EnergyLike, as_energy_fn, energy_device
from ebmlab.partition.estimate import LogZEstimate


def mean_and_stderr(values: torch.Tensor) -> tuple[float, float]:
    """The mean of per-row ``values`` (N,) and its standard error sd / sqrt(N) (0 for
    one row)."""
    n = len(values)
    return float(values.mean()), float(values.std() / math.sqrt(n)) if n > 1 else 0.0


@dataclass(frozen=True)
class LogLikelihood:
    """Mean log p(x) over ``n`` rows with its uncertainty.

    ``stderr`` is log Z's standard error; ``lower``/``upper`` follow from log Z's upper
    and lower bounds where the method has them; ``data_stderr`` is the standard error of
    the mean over rows. ``log_z_method`` names how log Z was obtained.
    """

    mean: float
    stderr: float
    lower: float
    upper: float
    data_stderr: float
    n: int
    log_z_method: str

    @property
    def total_stderr(self) -> float:
        """The standard error of ``mean`` from both sources, independent of each other."""
        return math.hypot(self.stderr, self.data_stderr)

    def to_dict(self) -> dict[str, Any]:
        """The result as a JSON-serialisable dict."""
        return asdict(self)


def log_likelihood(
    model: EnergyLike,
    data: torch.Tensor | np.ndarray,
    log_z: LogZEstimate,
    *,
    chunk: int = 4096,
) -> LogLikelihood:
    """Mean log p(x) = -E(x) - log Z over the rows of ``data`` (free energies of RBMs and
    DBMs, as their ``energy`` returns), evaluated in chunks without gradients.

    Args:
        model: the energy (an RBM's free energy for the Boltzmann family).
        log_z: the estimate of log Z, whose uncertainty joins the data's.
        chunk: rows evaluated at once, which bounds the memory used.
    """
    if not isinstance(log_z, LogZEstimate):
        raise ArgumentError(f"log_z must be a LogZEstimate, got {type(log_z).__name__}")
    x = torch.as_tensor(np.asarray(data) if not isinstance(data, torch.Tensor) else data)
    if x.dim() < 1 or len(x) == 0:
        raise ArgumentError(f"data must hold at least one row, got shape {tuple(x.shape)}")
    fn = as_energy_fn(model)
    dtype = next((p.dtype for p in getattr(model, "parameters", list)()), torch.float32)
    device = energy_device(fn, x.device)
    with torch.no_grad():
        neg = torch.cat([-widen(fn(part.to(device, dtype))) for part in x.split(chunk)])
    if not torch.isfinite(neg).all():
        raise ArgumentError("the model's energy is not finite on some rows of data")
    mean, spread = mean_and_stderr(neg)
    return LogLikelihood(
        mean=mean - log_z.log_z,
        stderr=log_z.stderr,
        lower=mean - log_z.upper,
        upper=mean - log_z.lower,
        data_stderr=spread,
        n=len(neg),
        log_z_method=log_z.method,
    )
