"""Average log-likelihood of data under an energy model, given an estimate of log Z.

log p(x) = -E(x) - log Z (Song & Kingma 2021: the energy alone ranks configurations; only Z turns
it into a probability). The uncertainty has two parts that are reported apart: the
error of log Z, which shifts every row alike, and the spread of -E(x) over the rows,
the sampling error of the data set's mean.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
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


def _data_rows(data: torch.Tensor | np.ndarray) -> torch.Tensor:
    """``data`` as a tensor of at least one row, else a clear error."""
    x = torch.as_tensor(np.asarray(data) if not isinstance(data, torch.Tensor) else data)
    if x.dim() < 1 or len(x) == 0:
        raise ArgumentError(f"data must hold at least one row, got shape {tuple(x.shape)}")
    return x


def _negative_energies(model: EnergyLike, x: torch.Tensor, chunk: int) -> torch.Tensor:
    """-E(x) per row (N,), widened, evaluated in chunks without gradients on the model's
    device and in its parameters' dtype; a non-finite value is refused."""
    fn = as_energy_fn(model)
    dtype = next((p.dtype for p in getattr(model, "parameters", list)()), torch.float32)
    device = energy_device(fn, x.device)
    with torch.no_grad():
        neg = torch.cat([-widen(fn(part.to(device, dtype))) for part in x.split(chunk)])
    if not torch.isfinite(neg).all():
        raise ArgumentError("the model's energy is not finite on some rows of data")
    return neg


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
    x = _data_rows(data)
    neg = _negative_energies(model, x, chunk)
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


def mixture_log_likelihood(
    models: Sequence[EnergyLike],
    data: torch.Tensor | np.ndarray,
    log_zs: Sequence[LogZEstimate],
    *,
    chunk: int = 4096,
) -> LogLikelihood:
    """Mean log p(x) under the equal mixture p(x) = (1 / K) sum_k exp(-E_k(x)) / Z_k of K
    energies, each normalised by its own log Z: a class-conditional model's marginal,
    p(x) = sum_y p(y) p(x | y) with p(y) = 1 / K.

    Each log Z_k's error moves the mean by the mean responsibility of component k,
    r_k = mean over rows of p(k | x), so ``stderr`` is sqrt(sum_k (r_k stderr_k)^2);
    ``lower``/``upper`` take every log Z_k at its upper/lower bound. One component is
    :func:`log_likelihood`.

    Args:
        models: the K energies.
        data: the rows (N, ...).
        log_zs: their K estimates of log Z.
        chunk: rows evaluated at once, which bounds the memory used.
    """
    if len(models) != len(log_zs) or len(models) == 0:
        raise ArgumentError(
            f"models and log_zs must be two non-empty lists of one length, got {len(models)} "
            f"and {len(log_zs)}"
        )
    for z in log_zs:
        if not isinstance(z, LogZEstimate):
            raise ArgumentError(f"log_zs must hold LogZEstimates, got {type(z).__name__}")
    if len(models) == 1:
        return log_likelihood(models[0], data, log_zs[0], chunk=chunk)
    x = _data_rows(data)
    neg = torch.stack([_negative_energies(m, x, chunk) for m in models], 1)  # (N, K)
    log_k = math.log(len(models))

    def mean_at(at: list[float]) -> float:
        return float((torch.logsumexp(neg - neg.new_tensor(at), 1) - log_k).mean())

    shifted = neg - neg.new_tensor([z.log_z for z in log_zs])  # log p(x | k), (N, K)
    per_row = torch.logsumexp(shifted, 1) - log_k
    mean, spread = mean_and_stderr(per_row)
    responsibility = torch.softmax(shifted, 1).mean(0)
    errors = neg.new_tensor([z.stderr for z in log_zs])
    stderr = float((responsibility * errors).norm())
    bounded_above = all(math.isfinite(z.upper) for z in log_zs)
    bounded_below = all(math.isfinite(z.lower) for z in log_zs)
    method = "+".join(sorted({z.method for z in log_zs}))
    return LogLikelihood(
        mean=mean,
        stderr=stderr,
        lower=mean_at([z.upper for z in log_zs]) if bounded_above else -math.inf,
        upper=mean_at([z.lower for z in log_zs]) if bounded_below else math.inf,
        data_stderr=spread,
        n=len(per_row),
        log_z_method=f"{method}, per component",
    )
