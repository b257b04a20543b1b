"""Annealed importance sampling (Neal 2001) for log Z, generic and RBM-specialised.

Chains start from a tractable base p_0 = exp(-E_0)/Z_0 and move through
p_k proportional to exp(-E_k), E_k = (1 - beta_k) E_0 + beta_k E_1, with
0 = beta_0 < ... < beta_K = 1. Each chain's log weight accumulates
log p*_k(x) - log p*_{k-1}(x) at the state it holds before the k-th transition,
which leaves p_k invariant. Then Z_1 / Z_0 = E[w] and

    log Z_1 = log Z_0 + log mean(w),

computed with log-mean-exp in float64. The standard error of log Z is the delta
method's sd(w) / (sqrt(n) mean(w)); the effective sample size of the weights,
(sum w)^2 / sum w^2, is reported in ``cost`` (a small ESS means the estimate is
unreliable). By Jensen's inequality the log estimate is biased low on average.

:func:`rbm_ais` is the version of Salakhutdinov & Murray (2008): the base is an
RBM with no weights and visible biases set to the data's base rates, the
intermediate models scale weights and hidden biases by beta_k, and the
transitions are exact block-Gibbs steps of each intermediate RBM.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np
import torch
from torch.nn import functional as F

from ebmlab import _checks
from ebmlab.energies.base import EnergyLike, as_energy_fn
from ebmlab.partition.estimate import LogZEstimate
from ebmlab.samplers.base import Sampler, frozen_parameters
from ebmlab.samplers.tempering import geometric_path


def salakhutdinov_schedule() -> torch.Tensor:
    """The 14,500-temperature schedule of Salakhutdinov & Murray (2008): steps of 1e-3 up
    to 0.5, 1e-4 up to 0.9 and 1e-5 up to 1."""
    return torch.cat(
        [
            torch.arange(0, 0.5, 1e-3, dtype=torch.float64),
            torch.arange(0.5, 0.9, 1e-4, dtype=torch.float64),
            torch.arange(0.9, 1.0, 1e-5, dtype=torch.float64),
            torch.ones(1, dtype=torch.float64),
        ]
    )


def _schedule(
    n_temperatures: int | None, schedule: Sequence[float] | torch.Tensor | None
) -> torch.Tensor:
    if schedule is not None:
        betas = torch.as_tensor(schedule, dtype=torch.float64)
    else:
        betas = torch.linspace(
            0,
            1,
            _checks.positive_int("n_temperatures", n_temperatures or 1000) + 1,
            dtype=torch.float64,
        )
    if (
        betas.ndim != 1
        or len(betas) < 2
        or betas[0] != 0
        or betas[-1] != 1
        or (betas.diff() <= 0).any()
    ):
        raise ValueError("schedule must rise strictly from 0 to 1")
    return betas


def _estimate(
    log_w: torch.Tensor,
    log_z0: float,
    method: str,
    betas: torch.Tensor,
    start: float,
    sign: int = 1,
) -> LogZEstimate:
    """log Z = log Z_0 + sign * log mean(w) with the delta-method standard error and the
    weights' effective sample size (sign -1: reverse AIS, whose weights estimate Z_0 / Z)."""
    n = log_w.shape[0]
    log_mean = float(torch.logsumexp(log_w, 0) - math.log(n))
    w = torch.exp(log_w - log_w.max())
    stderr = float((w / w.mean()).std() / math.sqrt(n)) if n > 1 else math.inf
    cost = {
        "n_chains": n,
        "n_temperatures": len(betas) - 1,
        "seconds": time.perf_counter() - start,
        "ess": float(w.sum() ** 2 / (w**2).sum()),
    }
    return LogZEstimate(log_z=log_z0 + sign * log_mean, stderr=stderr, method=method, cost=cost)


def ais(
    energy: EnergyLike,
    base=None,
    kernel: Sampler | None = None,
    *,
    n_chains: int = 100,
    n_temperatures: int | None = 1000,
    schedule: Sequence[float] | torch.Tensor | None = None,
    steps_per_temperature: int = 1,
    data: torch.Tensor | np.ndarray | None = None,
    generator: torch.Generator | int | None = None,
) -> LogZEstimate:
    """log Z of ``energy`` by AIS.

    A :class:`~ebmlab.energies.BernoulliRBM` without ``base``/``kernel`` uses
    :func:`rbm_ais` (base-rate model from ``data``, exact Gibbs transitions). Any other
    energy needs ``base`` (an analytic energy with ``sample`` and ``log_partition``,
    e.g. a Gaussian) and an MCMC ``kernel`` from ebmlab.samplers.
    """
    from ebmlab.energies.boltzmann import BernoulliRBM

    if isinstance(energy, BernoulliRBM) and base is None and kernel is None:
        return rbm_ais(
            energy,
            n_chains=n_chains,
            n_temperatures=n_temperatures,
            schedule=schedule,
            data=data,
            generator=generator,
        )
    if base is None or kernel is None:
        raise ValueError(
            "ais needs base (an analytic energy) and kernel (a sampler) for this energy"
        )
    _checks.positive_int("n_chains", n_chains)
    _checks.positive_int("steps_per_temperature", steps_per_temperature)
    gen = _checks.generator("generator", generator)
    betas = _schedule(n_temperatures, schedule)
    e1, e0 = as_energy_fn(energy), as_energy_fn(base)
    start = time.perf_counter()
    x = base.sample(n_chains, gen)
    log_w = torch.zeros(n_chains, dtype=torch.float64)
    with frozen_parameters(energy), torch.no_grad():
        diff = (e0(x) - e1(x)).double()
    for k in range(1, len(betas)):
        log_w += (betas[k] - betas[k - 1]) * diff
        if k == len(betas) - 1:
            break
        path = geometric_path(e0, e1, float(betas[k]))
        with frozen_parameters(energy):
            state = kernel.init(x, path)
            for _ in range(steps_per_temperature):
                state = kernel.step(state, path, gen)
        x = state.x
        with torch.no_grad():
            diff = (e0(x) - e1(x)).double()
    return _estimate(log_w, float(base.log_partition()), "ais", betas, start)


def base_rate_biases(
    data: torch.Tensor | np.ndarray | None, n_visible: int, smoothing: float = 0.05
) -> torch.Tensor:
    """Visible biases of the base-rate model: log-odds of the (smoothed) data means."""
    if data is None:
        return torch.zeros(n_visible, dtype=torch.float64)
    mean = torch.as_tensor(np.asarray(data), dtype=torch.float64).reshape(-1, n_visible).mean(0)
    mean = (mean * len(data) + smoothing) / (len(data) + 2 * smoothing)
    return torch.logit(mean)


def rbm_ais(
    rbm,
    *,
    n_chains: int = 100,
    n_temperatures: int | None = 1000,
    schedule: Sequence[float] | torch.Tensor | None = None,
    data: torch.Tensor | np.ndarray | None = None,
    base_biases: torch.Tensor | None = None,
    generator: torch.Generator | int | None = None,
) -> LogZEstimate:
    """log Z of a Bernoulli RBM by AIS from the base-rate model (Salakhutdinov & Murray 2008).

    ``data`` (optional) sets the base model's visible biases to the data's base rates,
    which makes the base close to the target and the estimate far more precise;
    ``base_biases`` gives those biases directly. Pass
    ``schedule=salakhutdinov_schedule()`` for the paper's 14,500 temperatures.
    """
    _checks.positive_int("n_chains", n_chains)
    gen = _checks.generator("generator", generator)
    betas = _schedule(n_temperatures, schedule)
    start = time.perf_counter()
    with torch.no_grad():
        W, b, c, b_a, log_z0 = _base_rate_model(rbm, data, base_biases)
        v = _bernoulli(torch.sigmoid(b_a).expand(n_chains, -1), gen)
        log_w = _anneal_rbm(v, betas, W, b, c, b_a, gen)
    return _estimate(log_w, log_z0, "ais", betas, start)


def _base_rate_model(rbm, data, base_biases):
    """The target's parameters, the base model's visible biases and its exact log Z_0.

    The base RBM has no weights and zero hidden biases: Z_0 = 2^M prod_i (1 + e^{b_a,i}).
    """
    W, b, c = rbm.W.detach(), rbm.b.detach(), rbm.c.detach()
    b_a = base_rate_biases(data, rbm.n_visible) if base_biases is None else base_biases.double()
    log_z0 = float(F.softplus(b_a).sum()) + rbm.n_hidden * math.log(2)
    return W, b, c, b_a.to(W.dtype), log_z0


def _bernoulli(p: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
    return (torch.rand(p.shape, generator=gen, dtype=p.dtype) < p).to(p.dtype)


def _anneal_rbm(v, betas, W, b, c, b_a, gen) -> torch.Tensor:
    """Run chains ``v`` along ``betas`` (either direction) through the intermediate RBMs,
    accumulating log p*_k(v) - log p*_{k-1}(v) before each transition.

    With the hidden units summed out, log p*_beta(v) = (1 - beta) b_a.v + beta b.v +
    sum_j softplus(beta a_j), a = c + v W; the product v W is computed once per
    temperature and shared by the weight update and the hidden-unit sampling, in the
    parameters' dtype, while the weights accumulate in float64.
    """
    log_w = torch.zeros(v.shape[0], dtype=torch.float64)
    v = v.to(W.dtype)
    a = v @ W + c
    bias_gap = v @ (b - b_a)
    for k in range(1, len(betas)):
        beta_prev, beta = float(betas[k - 1]), float(betas[k])
        step = (beta - beta_prev) * bias_gap + (
            F.softplus(beta * a) - F.softplus(beta_prev * a)
        ).sum(1)
        log_w += step.double()
        if k == len(betas) - 1:
            break
        h = _bernoulli(torch.sigmoid(beta * a), gen)
        v = _bernoulli(torch.sigmoid((1 - beta) * b_a + beta * (b + h @ W.T)), gen)
        a = v @ W + c
        bias_gap = v @ (b - b_a)
    return log_w


def rbm_exact_samples(rbm, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Exact samples of v from a small RBM: the smaller layer is drawn from its exact
    marginal by enumeration, the other given it."""
    from ebmlab.partition.exact import MAX_ENUMERATION_BITS, binary_states

    d, m = rbm.n_visible, rbm.n_hidden
    if min(d, m) > MAX_ENUMERATION_BITS:
        raise ValueError(
            f"exact sampling needs min(D, M) <= {MAX_ENUMERATION_BITS}, got {min(d, m)}"
        )
    with torch.no_grad():
        W, b, c = rbm.W.double(), rbm.b.double(), rbm.c.double()
        if d <= m:
            states = binary_states(d).double()
            logits = states @ b + F.softplus(states @ W + c).sum(1)
            idx = torch.multinomial(
                torch.softmax(logits, 0), n, replacement=True, generator=generator
            )
            return states[idx]
        states = binary_states(m).double()
        logits = states @ c + F.softplus(states @ W.T + b).sum(1)
        idx = torch.multinomial(torch.softmax(logits, 0), n, replacement=True, generator=generator)
        return _bernoulli(torch.sigmoid(b + states[idx] @ W.T), generator)


def raise_(
    rbm,
    *,
    samples: torch.Tensor | np.ndarray | None = None,
    n_chains: int = 100,
    n_temperatures: int | None = 1000,
    schedule: Sequence[float] | torch.Tensor | None = None,
    data: torch.Tensor | np.ndarray | None = None,
    base_biases: torch.Tensor | None = None,
    generator: torch.Generator | int | None = None,
) -> LogZEstimate:
    """Reverse AIS (RAISE, Burda, Grosse & Salakhutdinov 2015) for a Bernoulli RBM.

    Chains start at samples of the RBM (``samples``, or exact samples when the smaller
    layer can be enumerated) and anneal back to the base-rate model; the weights
    estimate Z_0 / Z without bias, so log Z = log Z_0 - log mean(w) is biased high on
    average: with AIS it sandwiches the truth.
    """
    _checks.positive_int("n_chains", n_chains)
    gen = _checks.generator("generator", generator)
    betas = _schedule(n_temperatures, schedule)
    start = time.perf_counter()
    with torch.no_grad():
        W, b, c, b_a, log_z0 = _base_rate_model(rbm, data, base_biases)
        if samples is None:
            v = rbm_exact_samples(rbm, n_chains, gen)
        else:
            v = torch.as_tensor(np.asarray(samples), dtype=torch.float64).reshape(-1, rbm.n_visible)
        log_w = _anneal_rbm(v, betas.flip(0), W, b, c, b_a, gen)
    return _estimate(log_w, log_z0, "raise", betas, start, sign=-1)
