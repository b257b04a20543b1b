"""Exact log Z by enumeration for small binary models."""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.nn import functional as F

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.devices import wide_dtype, widen
from ebmlab.energies.base import EnergyLike, as_energy_fn, energy_device
from ebmlab.energies.boltzmann import binary_states
from ebmlab.partition.elimination import elimination_order, pairwise_log_partition
from ebmlab.partition.estimate import LogZEstimate, log_sum
from ebmlab.partition.variational import pairwise_potentials

if TYPE_CHECKING:
    from ebmlab.energies.boltzmann import BernoulliRBM, BoltzmannMachine

# the largest sum exact_log_partition takes on when asked explicitly (2^26 terms)
MAX_ENUMERATION_BITS = 26


def _enumerate(
    n_bits: int,
    log_terms: Callable[[torch.Tensor], torch.Tensor],
    *,
    chunk: int,
    dtype: torch.dtype | None = None,
    offset: float = 0.0,
    device: torch.device | None = None,
) -> LogZEstimate:
    """log sum over all 2^n_bits binary states of exp(log_terms(states)) + offset, in chunks,
    accumulated in float64 on ``device`` (float32 where it has no float64); states in
    ``dtype`` (default: that accumulation dtype); an exact estimate (lower = upper = value)."""
    start_time = time.perf_counter()
    wide = wide_dtype(torch.device(device or "cpu"))
    dtype = dtype or wide
    total = torch.tensor(-math.inf, dtype=wide, device=device)
    with torch.no_grad():
        for start in range(0, 2**n_bits, chunk):
            stop = min(start + chunk, 2**n_bits)
            states = binary_states(n_bits, start, stop, device).to(dtype)
            total = torch.logaddexp(total, torch.logsumexp(log_terms(states).to(wide), 0))
    value = float(total) + offset
    cost = {"terms": 2**n_bits, "seconds": time.perf_counter() - start_time}
    return LogZEstimate(log_z=value, lower=value, upper=value, method="enumeration", cost=cost)


def _check_bits(n_bits: int, what: str) -> None:
    if n_bits > MAX_ENUMERATION_BITS:
        raise ArgumentError(
            f"exact log Z enumerates {what}: 2^{n_bits} terms, at most 2^{MAX_ENUMERATION_BITS}"
        )


def enumerate_log_partition(
    energy: EnergyLike, n_bits: int, *, chunk: int = 1 << 16, dtype: torch.dtype = torch.float32
) -> LogZEstimate:
    """log Z = log sum_x exp(-E(x)) over x in {0, 1}^n_bits, in chunks, accumulated in float64.

    States are passed to the energy in ``dtype``.

    Args:
        chunk: rows evaluated at once, which bounds the memory used.
    """
    _checks.finite_parameters("energy", energy)
    _checks.positive_int("n_bits", n_bits)
    _check_bits(n_bits, "every state")
    fn = as_energy_fn(energy)
    return _enumerate(n_bits, lambda x: -fn(x), chunk=chunk, dtype=dtype, device=energy_device(fn))


def rbm_log_partition(rbm: BernoulliRBM, *, chunk: int = 1 << 14) -> LogZEstimate:
    """Exact log Z of a Bernoulli RBM, summing out the larger layer analytically.

    With h enumerated: log Z = logsumexp_h [c.h + sum_i softplus(b_i + W_i. h)];
    with v enumerated: log Z = logsumexp_v [-F(v)]. Costs 2^min(D, M) terms.

    Args:
        rbm: the Bernoulli RBM (the smaller layer at most 26 units).
        chunk: rows evaluated at once, which bounds the memory used.
    """
    _checks.finite_parameters("rbm", rbm)
    W, b, c = (widen(p.detach()) for p in (rbm.W, rbm.b, rbm.c))
    if rbm.n_hidden > rbm.n_visible:  # enumerate v instead: swap the layers' roles
        W, b, c = W.T, c, b
    _check_bits(W.shape[1], "the smaller layer")
    return _enumerate(
        W.shape[1],
        lambda h: h @ c + F.softplus(h @ W.T + b).sum(1),
        chunk=chunk,
        device=W.device,
    )


def exact_log_partition(
    model: EnergyLike, *, bounds: Sequence[tuple[float, float]] | None = None, n_points: int = 512
) -> LogZEstimate:
    """log Z computed exactly (up to numerical error) by the best method for ``model``.

    - :class:`~ebmlab.energies.BernoulliRBM`: enumeration of the smaller layer;
    - Gaussian-Bernoulli and categorical RBMs: enumeration of the hidden layer, the
      visible layer integrated (Gaussian) or summed per softmax group in closed form;
    - :class:`~ebmlab.energies.SpikeSlabRBM`: enumeration of the spikes, the slabs and
      the visible layer integrated in closed form;
    - :class:`~ebmlab.energies.BoltzmannMachine`: variable elimination over the graph of
      its non-zero couplings when that is narrower than the model, else enumeration of
      all 2^D states (:func:`boltzmann_log_partition`);
    - :class:`~ebmlab.energies.DeepBoltzmannMachine`: enumeration of the first hidden layer;
    - :class:`~ebmlab.energies.ConvolutionalRBM`: its dense RBM (``as_rbm``), as above;
    - :class:`~ebmlab.energies.SubspaceRBM`: enumeration of the products h_j s_jk (or of x
      when it is shorter);
    - :class:`~ebmlab.energies.ClassificationRBM`: a sum over labels of Bernoulli RBMs
      (:func:`label_sum_log_partition`);
    - analytic energies (Gaussians, mixtures, ...): their closed form;
    - any energy on R or R^2 given ``bounds``: quadrature with an error estimate.

    Args:
        n_points: grid points per axis for densities integrated by quadrature.
    """
    _checks.finite_parameters("model", model)
    from ebmlab.energies.analytic import AnalyticEnergy
    from ebmlab.energies.boltzmann import (
        BernoulliRBM,
        BoltzmannMachine,
        CategoricalRBM,
        ClassificationRBM,
        DeepBoltzmannMachine,
        GaussianBernoulliRBM,
        SubspaceRBM,
    )
    from ebmlab.energies.conv_rbm import ConvolutionalRBM
    from ebmlab.energies.spike_slab import SpikeSlabRBM
    from ebmlab.partition.quadrature import quadrature_log_partition

    if isinstance(model, ConvolutionalRBM):
        model = model.as_rbm()
    if isinstance(model, SpikeSlabRBM):
        return _spike_enumeration(model)
    if isinstance(model, GaussianBernoulliRBM | CategoricalRBM):
        return _hidden_enumeration(model)
    if isinstance(model, ClassificationRBM):
        return label_sum_log_partition(model)
    if isinstance(model, SubspaceRBM):
        return _subspace_enumeration(model)
    if isinstance(model, BernoulliRBM):
        return rbm_log_partition(model)
    if isinstance(model, BoltzmannMachine):
        return boltzmann_log_partition(model)
    if isinstance(model, DeepBoltzmannMachine):
        with torch.no_grad():
            value = float(model.log_partition())
        return LogZEstimate(
            log_z=value, lower=value, upper=value, method="exact (enumerating h1)",
            cost={"terms": 2**model.n_hidden1},
        )  # fmt: skip
    if bounds is not None:
        return quadrature_log_partition(model, bounds, n_points)
    if isinstance(model, AnalyticEnergy):
        value = float(model.log_partition())
        return LogZEstimate(log_z=value, lower=value, upper=value, method="closed form")
    raise ArgumentError(
        f"no exact method for {type(model).__name__}: pass bounds=[(low, high), ...] for "
        "quadrature of a 1-2 dimensional energy"
    )


def boltzmann_log_partition(bm: BoltzmannMachine) -> LogZEstimate:
    """Exact log Z of a Boltzmann machine by the cheaper of two exact methods: variable
    elimination on the graph of its non-zero couplings, costing about D 2^(w + 1) for an
    elimination width w (a chain: w = 1; an L x L grid: w = L), or enumeration of all
    2^D states.

    Args:
        bm: the Boltzmann machine.
    """
    _checks.finite_parameters("bm", bm)
    theta_i, theta_ij, edges = pairwise_potentials(bm, drop_zero=True)
    _, width = elimination_order(bm.n_visible, edges)
    if width + 1 >= bm.n_visible:
        return enumerate_log_partition(bm, bm.n_visible, dtype=bm.b.dtype)
    start_time = time.perf_counter()
    with torch.no_grad():
        value = float(pairwise_log_partition(theta_i, theta_ij, edges, max_width=width))
    cost = {"width": width, "seconds": time.perf_counter() - start_time}
    return LogZEstimate(log_z=value, lower=value, upper=value, method="elimination", cost=cost)


def _hidden_enumeration(rbm, chunk: int = 1 << 14) -> LogZEstimate:
    """log Z of a Gaussian-Bernoulli or categorical RBM, enumerating its hidden units.

    Given h, a Gaussian visible layer integrates to
    (2 pi)^{D/2} prod sigma exp(b.(W h) / sigma + |W h|^2 / 2) (completing the square),
    and a categorical one sums to prod_groups sum_k exp(b_gk + (W h)_gk).
    """
    from ebmlab.energies.boltzmann import GaussianBernoulliRBM

    _check_bits(rbm.n_hidden, "the hidden layer")
    W, b, c = (widen(p.detach()) for p in (rbm.W, rbm.b, rbm.c))
    offset = 0.0
    if isinstance(rbm, GaussianBernoulliRBM):
        sigma = widen(rbm.sigma.detach())
        offset = 0.5 * rbm.n_visible * math.log(2 * math.pi) + float(torch.log(sigma).sum())

        def visible(h: torch.Tensor) -> torch.Tensor:
            wh = h @ W.T
            return (wh * (b / sigma)).sum(1) + 0.5 * (wh**2).sum(1)

    else:

        def visible(h: torch.Tensor) -> torch.Tensor:
            logits = (h @ W.T + b).view(len(h), rbm.n_groups, rbm.n_categories)
            return torch.logsumexp(logits, 2).sum(1)

    return _enumerate(
        rbm.n_hidden, lambda h: h @ c + visible(h), chunk=chunk, offset=offset, device=W.device
    )


def _spike_enumeration(model, chunk: int = 1 << 12) -> LogZEstimate:
    """log Z of a spike-and-slab RBM: the spikes enumerated, each state weighted by its
    Gaussian integral over slabs and visibles
    (:meth:`~ebmlab.energies.SpikeSlabRBM.hidden_log_weights`), in float64."""
    _check_bits(model.n_hidden, "the spikes")
    model = copy.deepcopy(model).to(wide_dtype(model.W.device))
    return _enumerate(model.n_hidden, model.hidden_log_weights, chunk=chunk, device=model.W.device)


def _subspace_enumeration(model, chunk: int = 1 << 14) -> LogZEstimate:
    """log Z of a subspace RBM (Tomczak 2024, eq. 6.44).

    x sees the hidden units only through z_jk = h_j s_jk. Summing (h_j, s_j) for a fixed
    z_j leaves the weight exp(c_j + D_j. z_j), plus 2^K for a closed gate when z_j = 0,
    so log Z = logsumexp_z [sum_j (c_j + D_j. z_j + [z_j = 0] log(1 + 2^K e^{-c_j}))
    + sum_i softplus(b_i + sum_jk W_ijk z_jk)] over the M K bits of z; when x is
    shorter, log Z = logsumexp_x [-F(x)] instead.
    """
    m, k = model.n_gates, model.n_subspace
    if model.n_visible <= m * k:
        _check_bits(model.n_visible, "the visible layer")
        double = copy.deepcopy(model).to(wide_dtype(model.W.device))
        return _enumerate(
            model.n_visible, lambda x: -double.free_energy(x), chunk=chunk, device=model.W.device
        )
    _check_bits(m * k, "the gate-subspace products")
    W = widen(model.W.detach()).reshape(model.n_visible, m * k)
    b, c, D = (widen(p.detach()) for p in (model.b, model.c, model.D))
    closed = F.softplus(k * math.log(2.0) - c)  # log(1 + 2^K e^{-c_j})

    def log_terms(z: torch.Tensor) -> torch.Tensor:
        zs = z.view(len(z), m, k)
        off = (zs.sum(2) == 0).to(W.dtype)
        gates = (c + (zs * D).sum(2) + off * closed).sum(1)
        return gates + F.softplus(z @ W.T + b).sum(1)

    return _enumerate(m * k, log_terms, chunk=chunk, device=W.device)


def label_sum_log_partition(
    model, estimate: Callable[[Any, int], LogZEstimate] | None = None
) -> LogZEstimate:
    """log Z of a :class:`~ebmlab.energies.ClassificationRBM` as a sum over labels.

    Fixing the label y leaves a Bernoulli RBM over x with hidden biases c + U_y
    (:meth:`~ebmlab.energies.ClassificationRBM.label_rbm`), so
    Z = sum_y exp(d_y) Z_y. ``estimate(rbm, y)`` gives log Z_y (default: exact
    enumeration of the smaller layer; pass an AIS call for wide models).
    """
    estimate = estimate or (lambda rbm, y: rbm_log_partition(rbm))
    labels = range(model.num_classes)
    parts = [estimate(model.label_rbm(y), y) for y in labels]
    method = parts[0].method if len({p.method for p in parts}) == 1 else "mixed"
    return log_sum(parts, model.d.detach().cpu().double().tolist(), method)
