"""Energy discrepancy (Schröder et al. 2023): a loss that needs neither samples from
the model nor its score.

Perturb the data by a symmetric kernel q, y ~ q(. | x), and perturb y again M times,
x'_j ~ q(. | y). The energy discrepancy E_data[U(x)] - E_data E_y[U_q(y)], with
U_q(y) = -log E_{x' ~ q(. | y)} exp(-U(x')), is minimised by the data's energy; its
estimate (Schröder et al. 2023, eq. 9, with the w-stabilisation of §4)

    L = mean_i log( w / M + 1/M sum_j exp(U(x_i) - U(x'_ij)) )

stays bounded below through the w / M term, which counts the data point itself as
one of the contrasting samples. ``gaussian`` perturbs by N(0, sigma^2 I) twice
(continuous data); ``bernoulli`` flips each bit with probability ``scale`` twice
(binary data).
"""

from __future__ import annotations

import math

import torch

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.energies.base import EnergyLike, as_energy_fn
from ebmlab.samplers.integrators import gaussian_noise

PERTURBATIONS = ("gaussian", "bernoulli")


def _perturb(x: torch.Tensor, kind: str, scale: float, generator) -> torch.Tensor:
    if kind == "gaussian":
        return x + scale * gaussian_noise(x, generator)
    u = torch.rand(x.shape, generator=generator, dtype=x.dtype, device=x.device)
    return torch.where(u < scale, 1 - x, x)


def energy_discrepancy_loss(
    energy: EnergyLike,
    x: torch.Tensor,
    *,
    perturbation: str = "gaussian",
    scale: float = 0.1,
    n_negatives: int = 16,
    w: float = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The w-stabilised energy-discrepancy loss of data ``x`` (B, ...).

    Args:
        perturbation: ``"gaussian"`` (noise standard deviation ``scale``) or
            ``"bernoulli"`` (flip probability ``scale``, binary data).
        n_negatives: M, contrasting samples per data point.
        w: the stabiliser; 0 gives the plain estimate (unbounded below for small M).
        generator: source of randomness, a ``torch.Generator`` on the data's device
            (``None``: the global one).
    """
    _checks.tensor("x", x, min_ndim=2, floating=True, finite=True)
    kind = _checks.one_of("perturbation", perturbation, PERTURBATIONS)
    _checks.positive("scale", scale)
    if kind == "bernoulli" and not scale < 0.5:
        raise ArgumentError(f"scale must be a flip probability below 0.5, got {scale}")
    m = _checks.positive_int("n_negatives", n_negatives)
    _checks.positive("w", w, allow_zero=True)
    fn = as_energy_fn(energy)
    b = x.shape[0]
    y = _perturb(x, kind, scale, generator)
    negatives = _perturb(y.repeat_interleave(m, 0), kind, scale, generator)
    e_data = fn(x)
    e_neg = fn(negatives).view(b, m)
    diffs = e_data[:, None] - e_neg  # U(x_i) - U(x'_ij)
    terms = torch.cat(
        [diffs, torch.full_like(diffs[:, :1], math.log(w) if w > 0 else -math.inf)], 1
    )
    loss = (torch.logsumexp(terms, 1) - math.log(m)).mean()
    return loss, {"energy_gap": float((e_neg.mean() - e_data.mean()).detach())}
