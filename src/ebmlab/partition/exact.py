"""Exact log Z by enumeration for small binary models."""

from __future__ import annotations

import math
import time

import torch

from ebmlab import _checks
from ebmlab.energies.base import EnergyLike, as_energy_fn
from ebmlab.partition.estimate import LogZEstimate

MAX_ENUMERATION_BITS = 26


def binary_states(n_bits: int, start: int = 0, stop: int | None = None) -> torch.Tensor:
    """Rows ``start..stop`` of all 2^n_bits binary vectors, as float (N, n_bits), bit 0 first."""
    _checks.positive_int("n_bits", n_bits)
    stop = 2**n_bits if stop is None else stop
    codes = torch.arange(start, stop, dtype=torch.long)
    return ((codes[:, None] >> torch.arange(n_bits)) & 1).float()


def enumerate_log_partition(
    energy: EnergyLike, n_bits: int, *, chunk: int = 1 << 16, dtype: torch.dtype = torch.float32
) -> LogZEstimate:
    """log Z = log sum_x exp(-E(x)) over x in {0, 1}^n_bits, in chunks, accumulated in float64.

    States are passed to the energy in ``dtype``.
    """
    _checks.positive_int("n_bits", n_bits)
    if n_bits > MAX_ENUMERATION_BITS:
        raise ValueError(f"n_bits must be <= {MAX_ENUMERATION_BITS} for enumeration, got {n_bits}")
    fn = as_energy_fn(energy)
    start_time = time.perf_counter()
    total = torch.tensor(-math.inf, dtype=torch.float64)
    with torch.no_grad():
        for start in range(0, 2**n_bits, chunk):
            states = binary_states(n_bits, start, min(start + chunk, 2**n_bits)).to(dtype)
            total = torch.logaddexp(total, torch.logsumexp(-fn(states).double(), 0))
    cost = {"energy_evals": 2**n_bits, "seconds": time.perf_counter() - start_time}
    value = float(total)
    return LogZEstimate(log_z=value, lower=value, upper=value, method="enumeration", cost=cost)


def rbm_log_partition(rbm, *, chunk: int = 1 << 14) -> LogZEstimate:
    """Exact log Z of a Bernoulli RBM, summing out the larger layer analytically.

    With h enumerated: log Z = logsumexp_h [c.h + sum_i softplus(b_i + W_i. h)];
    with v enumerated: log Z = logsumexp_v [-F(v)]. Costs 2^min(D, M) terms.
    """
    d, m = rbm.n_visible, rbm.n_hidden
    bits = min(d, m)
    if bits > MAX_ENUMERATION_BITS:
        raise ValueError(
            f"exact log Z needs 2^min(D, M) = 2^{bits} terms; at most 2^{MAX_ENUMERATION_BITS}"
        )
    start_time = time.perf_counter()
    total = torch.tensor(-math.inf, dtype=torch.float64)
    with torch.no_grad():
        W, b, c = rbm.W.double(), rbm.b.double(), rbm.c.double()
        for start in range(0, 2**bits, chunk):
            states = binary_states(bits, start, min(start + chunk, 2**bits)).double()
            if m <= d:
                terms = states @ c + torch.nn.functional.softplus(states @ W.T + b).sum(1)
            else:
                terms = states @ b + torch.nn.functional.softplus(states @ W + c).sum(1)
            total = torch.logaddexp(total, torch.logsumexp(terms, 0))
    value = float(total)
    cost = {"terms": 2**bits, "seconds": time.perf_counter() - start_time}
    return LogZEstimate(log_z=value, lower=value, upper=value, method="enumeration", cost=cost)


def exact_log_partition(model, *, bounds=None, n_points: int = 512) -> LogZEstimate:
    """log Z computed exactly (up to numerical error) by the best method for ``model``.

    - :class:`~ebmlab.energies.BernoulliRBM`: enumeration of the smaller layer;
    - Gaussian-Bernoulli and categorical RBMs: enumeration of the hidden layer, the
      visible layer integrated (Gaussian) or summed per softmax group in closed form;
    - :class:`~ebmlab.energies.BoltzmannMachine`: enumeration of all 2^D states;
    - analytic energies (Gaussians, mixtures, ...): their closed form;
    - any energy on R or R^2 given ``bounds``: quadrature with an error estimate.
    """
    from ebmlab.energies.analytic import AnalyticEnergy
    from ebmlab.energies.boltzmann import (
        BernoulliRBM,
        BoltzmannMachine,
        CategoricalRBM,
        GaussianBernoulliRBM,
    )
    from ebmlab.partition.quadrature import quadrature_log_partition

    if isinstance(model, GaussianBernoulliRBM | CategoricalRBM):
        return _hidden_enumeration(model)
    if isinstance(model, BernoulliRBM):
        return rbm_log_partition(model)
    if isinstance(model, BoltzmannMachine):
        return enumerate_log_partition(model, model.n_visible, dtype=model.b.dtype)
    if bounds is not None:
        return quadrature_log_partition(model, bounds, n_points)
    if isinstance(model, AnalyticEnergy):
        value = float(model.log_partition())
        return LogZEstimate(log_z=value, lower=value, upper=value, method="closed form")
    raise ValueError(
        f"no exact method for {type(model).__name__}: pass bounds=[(low, high), ...] for "
        "quadrature of a 1-2 dimensional energy"
    )


def _hidden_enumeration(rbm, chunk: int = 1 << 14) -> LogZEstimate:
    """log Z of a Gaussian-Bernoulli or categorical RBM, enumerating its hidden units.

    Given h, a Gaussian visible layer integrates to
    (2 pi)^{D/2} prod sigma exp(b.(W h) / sigma + |W h|^2 / 2) (completing the square),
    and a categorical one sums to prod_groups sum_k exp(b_gk + (W h)_gk).
    """
    from ebmlab.energies.boltzmann import GaussianBernoulliRBM

    m = rbm.n_hidden
    if m > MAX_ENUMERATION_BITS:
        raise ValueError(
            f"exact log Z enumerates the hidden layer; at most {MAX_ENUMERATION_BITS} units"
        )
    start_time = time.perf_counter()
    total = torch.tensor(-math.inf, dtype=torch.float64)
    with torch.no_grad():
        W, b, c = rbm.W.double(), rbm.b.double(), rbm.c.double()
        gaussian = isinstance(rbm, GaussianBernoulliRBM)
        for lo in range(0, 2**m, chunk):
            h = binary_states(m, lo, min(lo + chunk, 2**m)).double()
            wh = h @ W.T  # (S, D)
            if gaussian:
                sigma = rbm.sigma.double()
                visible = (wh * (b / sigma)).sum(1) + 0.5 * (wh**2).sum(1)
            else:
                logits = (wh + b).view(len(h), rbm.n_groups, rbm.n_categories)
                visible = torch.logsumexp(logits, 2).sum(1)
            total = torch.logaddexp(total, torch.logsumexp(h @ c + visible, 0))
        if gaussian:
            total = (
                total
                + 0.5 * rbm.n_visible * math.log(2 * math.pi)
                + torch.log(rbm.sigma.double()).sum()
            )
    value = float(total)
    cost = {"terms": 2**m, "seconds": time.perf_counter() - start_time}
    return LogZEstimate(log_z=value, lower=value, upper=value, method="enumeration", cost=cost)
