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
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch.nn import functional as F

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.devices import wide_dtype, widen
from ebmlab.energies.base import EnergyLike, as_energy_fn, energy_device
from ebmlab.energies.boltzmann import base_rate_logits, bernoulli_draw
from ebmlab.partition import annealing_graphs
from ebmlab.partition.binary_products import binary_products
from ebmlab.partition.estimate import LogZEstimate
from ebmlab.samplers.base import Sampler, frozen_parameters
from ebmlab.samplers.graphs import replayed_gradients
from ebmlab.samplers.tempering import geometric_path

if TYPE_CHECKING:
    from ebmlab.energies.analytic import AnalyticEnergy
    from ebmlab.energies.boltzmann import BernoulliRBM, DeepBoltzmannMachine


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
        raise ArgumentError("schedule must rise strictly from 0 to 1")
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
    return LogZEstimate(
        log_z=log_z0 + sign * log_mean,
        stderr=stderr,
        method=method,
        cost=cost,
        dof=n - 1 if n > 1 else math.inf,
    )


def ais(
    energy: EnergyLike,
    base: AnalyticEnergy | None = None,
    kernel: Sampler | None = None,
    *,
    n_chains: int = 100,
    n_temperatures: int | None = 1000,
    schedule: Sequence[float] | torch.Tensor | None = None,
    steps_per_temperature: int = 1,
    data: torch.Tensor | np.ndarray | None = None,
    generator: torch.Generator | int | None = None,
    graphs: bool = True,
) -> LogZEstimate:
    """log Z of ``energy`` by AIS.

    A :class:`~ebmlab.energies.BernoulliRBM` or
    :class:`~ebmlab.energies.DeepBoltzmannMachine` without ``base``/``kernel`` uses
    :func:`rbm_ais` (base-rate model from ``data``, exact Gibbs transitions). Any other
    energy needs ``base`` (an analytic energy with ``sample`` and ``log_partition``,
    e.g. a Gaussian) and an MCMC ``kernel`` from ebmlab.samplers.

    Args:
        n_chains: number of chains run side by side.
        n_temperatures: number of intermediate distributions.
        schedule: the inverse temperatures, 0 to 1 (default: ``n_temperatures`` of a
            sigmoidal path).
        steps_per_temperature: kernel steps at each temperature.
        generator: source of randomness, a ``torch.Generator`` on the data's device
            (``None``: the global one).
        graphs: on a CUDA device, replay the path's energy and gradient as a CUDA graph
            at every temperature (the inverse temperature is read from the device;
            :class:`~ebmlab.samplers.graphs.ReplayedGradient`: the same values).
    """
    _checks.finite_parameters("energy", energy)
    from ebmlab.energies.boltzmann import BernoulliRBM, DeepBoltzmannMachine

    if isinstance(energy, BernoulliRBM | DeepBoltzmannMachine) and base is None and kernel is None:
        return rbm_ais(
            energy,
            n_chains=n_chains,
            n_temperatures=n_temperatures,
            schedule=schedule,
            data=data,
            generator=generator,
        )
    if base is None or kernel is None:
        raise ArgumentError(
            "ais needs base (an analytic energy) and kernel (a sampler) for this energy"
        )
    _checks.positive_int("n_chains", n_chains)
    _checks.positive_int("steps_per_temperature", steps_per_temperature)
    gen = _checks.generator("generator", generator, energy_device(base))
    betas = _schedule(n_temperatures, schedule)
    e1, e0 = as_energy_fn(energy), as_energy_fn(base)
    start = time.perf_counter()
    x = base.sample(n_chains, gen)
    wide = wide_dtype(x.device)
    log_w = torch.zeros(n_chains, dtype=wide, device=x.device)
    beta = torch.zeros((), dtype=wide, device=x.device)  # the path reads it at each step
    path = geometric_path(e0, e1, beta)
    path = replayed_gradients(path, x.device) if graphs else path
    with frozen_parameters(energy):
        with torch.no_grad():
            diff = (e0(x) - e1(x)).to(wide)
        for k in range(1, len(betas)):
            log_w += (betas[k] - betas[k - 1]) * diff
            if k == len(betas) - 1:
                break
            beta.fill_(float(betas[k]))
            state = kernel.init(x, path)
            for _ in range(steps_per_temperature):
                state = kernel.step(state, path, gen)
            x = state.x
            with torch.no_grad():
                diff = (e0(x) - e1(x)).to(wide)
    return _estimate(log_w, float(base.log_partition()), "ais", betas, start)


# pseudo-counts added to each unit's on and off counts in the base-rate model of AIS
BASE_RATE_SMOOTHING = 0.05


def _base_model_biases(data: torch.Tensor | np.ndarray | None, n_visible: int) -> torch.Tensor:
    """Visible biases of the base-rate model (Salakhutdinov & Murray 2008): the smoothed
    log-odds of the data's unit means; zeros (p = 1/2) without data."""
    if data is None or len(data) == 0:
        return torch.zeros(n_visible, dtype=torch.float64)
    return base_rate_logits(_as_rows(data, n_visible), smoothing=BASE_RATE_SMOOTHING)


def _as_rows(
    data: torch.Tensor | np.ndarray, width: int, device: torch.device | None = None
) -> torch.Tensor:
    """``data`` as rows of ``width`` on ``device`` (a tensor's own by default), in the
    device's :func:`~ebmlab.devices.wide_dtype`."""
    if isinstance(data, torch.Tensor):
        rows = data.detach().to(device or data.device)
    else:
        rows = torch.as_tensor(np.asarray(data), device=device)
    return widen(rows).reshape(-1, width)


def rbm_ais(
    rbm: BernoulliRBM | DeepBoltzmannMachine,
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

    A two-layer :class:`~ebmlab.energies.DeepBoltzmannMachine` is annealed as its
    bipartite view (:meth:`~ebmlab.energies.DeepBoltzmannMachine.as_rbm`): the chains
    hold (v, h2) with h1 summed out, as in Salakhutdinov & Hinton (2009); the base rates
    of h2 are those of the mean-field posteriors of ``data``.

    Args:
        rbm: the Bernoulli RBM.
        n_chains: number of chains run side by side.
        n_temperatures: number of intermediate distributions.
        generator: source of randomness, a ``torch.Generator`` on the data's device
            (``None``: the global one).
    """
    _checks.finite_parameters("rbm", rbm)
    _checks.positive_int("n_chains", n_chains)
    gen = _checks.generator("generator", generator, energy_device(rbm))
    betas = _schedule(n_temperatures, schedule)
    start = time.perf_counter()
    with torch.no_grad():
        _, (W, b, c, b_a, log_z0) = _base_rate_model(rbm, data, base_biases)
        v = bernoulli_draw(torch.sigmoid(b_a).expand(n_chains, -1), gen)
        log_w = _anneal_rbm(v, betas, W, b, c, b_a, gen)
    return _estimate(log_w, log_z0, "ais", betas, start)


def _bipartite(model, data):
    """A Bernoulli RBM with the model's log Z and ``data`` on its visible layer: a DBM
    becomes its (v, h2) - h1 RBM, with each datum's mean-field h2 beside v."""
    from ebmlab.energies.boltzmann import DeepBoltzmannMachine

    if not isinstance(model, DeepBoltzmannMachine):
        return model, data
    if data is not None:
        v = _as_rows(data, model.n_visible, model.W1.device).to(model.W1.dtype)
        with torch.no_grad():
            data = torch.cat([v, model.mean_field(v)[1]], 1)
    return model.as_rbm(), data


def _base_rate_model(model, data, base_biases):
    """The RBM to anneal (a DBM's bipartite view) and its parameters, the base model's
    visible biases and its exact log Z_0.

    The base RBM has no weights and zero hidden biases: Z_0 = 2^M prod_i (1 + e^{b_a,i}).
    """
    rbm, data = _bipartite(model, data)
    W, b, c = rbm.W.detach(), rbm.b.detach(), rbm.c.detach()
    b_a = _base_model_biases(data, rbm.n_visible) if base_biases is None else base_biases
    b_a = b_a.to(W.device, wide_dtype(W.device))
    log_z0 = float(F.softplus(b_a).sum()) + rbm.n_hidden * math.log(2)
    return rbm, (W, b, c, b_a.to(W.dtype), log_z0)


def _tanh(y: torch.Tensor, ratio: float, out: torch.Tensor) -> torch.Tensor:
    return torch.tanh(y, out=out) if ratio == 1 else torch.mul(y, ratio, out=out).tanh_()


def _anneal_rbm(v, betas, W, b, c, b_a, gen) -> torch.Tensor:
    """Run chains ``v`` along ``betas`` (either direction) through the intermediate RBMs,
    accumulating log p*_k(v) - log p*_{k-1}(v) before each transition.

    With the hidden units summed out, log p*_beta(v) = b_a.v + beta (b - b_a).v +
    sum_j softplus(beta a_j) + const, a = c + v W. Writing softplus(x) = relu(x) + log 2
    - log(1 + |tanh(x / 2)|), the weight increment needs tanh(beta_k a / 2), which is also
    what drawing h at beta_k needs (h_j = 1[u_j < tanh(beta_k a_j / 2)], u uniform on
    [-1, 1)), plus one more tanh at beta_{k-1}: no softplus in the loop. The products run
    on :mod:`~ebmlab.partition.binary_products` with weights W_q; a last step from W_q
    to W at beta = 1 makes the weights refer to W. Uniforms come from 32-bit words of an
    SFC64 stream seeded by ``gen`` on the CPU, and of ``gen`` itself on other devices;
    per-temperature sums are kept and combined in float64 (float32 on a device without
    it). On a CUDA GPU the same steps run as replayed CUDA graphs
    (:mod:`~ebmlab.partition.annealing_graphs`).
    """
    if annealing_graphs.replaces_loop(W.device):  # W_q = W in float32: no requantization
        return _log_weights(
            annealing_graphs.anneal_rbm_in_chunks(v, betas, W, b, c, b_a, gen), betas
        )
    n, d = v.shape
    m = W.shape[1]
    device = W.device
    down, up = binary_products(W, n)
    draw_words = _random_words(n * (m + d), gen, device)
    c32, gap, half_base = c.float(), (b - b_a).float(), b_a.float() / 2
    bits = v.to(torch.bool)
    down.load(bits)
    v_now = v.float()
    t, t_prev, ratio = (torch.empty(n, m, device=device) for _ in range(3))
    h_bias, v_bias = torch.empty(m, device=device), torch.empty(d, device=device)
    steps = len(betas) - 1
    sums = torch.empty(3, steps, n, device=device)  # log-ratio of (1 + |t|), relu(y), gap . v
    beta_list = betas.tolist()
    for k in range(steps):
        prev, beta = beta_list[k], beta_list[k + 1]
        top = max(prev, beta)
        y = down(top / 2, torch.mul(c32, top / 2, out=h_bias))  # top * a / 2
        _tanh(y, beta / top, t)
        _tanh(y, prev / top, t_prev).abs_().add_(1)
        torch.abs(t, out=ratio).add_(1).div_(t_prev).log_()
        torch.sum(ratio, 1, out=sums[0, k])
        torch.sum(y.clamp_(min=0), 1, out=sums[1, k])
        torch.mv(v_now, gap, out=sums[2, k])
        if k == steps - 1:
            break
        u = draw_words()
        up.sample(u[: n * m].view(n, m), t.mul_(2.0**31))
        x = up(beta / 2, torch.add(half_base, gap, alpha=beta / 2, out=v_bias))
        bits = down.sample(u[n * m : n * (m + d)].view(n, d), x.tanh_().mul_(2.0**31))
        v_now.copy_(bits.view(torch.uint8))
    log_w = _log_weights(sums, betas)
    if beta_list[-1] == 1:
        return log_w + _requantization_gap(bits, W, down.Wq, c)
    return log_w - _requantization_gap(v, W, down.Wq, c)


def _log_weights(sums: torch.Tensor, betas: torch.Tensor) -> torch.Tensor:
    """Each chain's log weight from the per-temperature sums of :func:`_anneal_rbm`,
    combined in the widest dtype the device has."""
    sums = widen(sums)
    betas = betas.to(sums.device, sums.dtype)
    top = torch.maximum(betas[1:], betas[:-1])[:, None]
    return (betas.diff()[:, None] * (sums[2] + 2 / top * sums[1]) - sums[0]).sum(0)


def _random_words(count: int, gen: torch.Generator | None, device: torch.device):
    """A function returning ``count`` uniform int32 words per call: on the CPU from a
    NumPy SFC64 stream seeded once by ``gen`` (several times faster than torch's
    generator for this volume), elsewhere from ``gen`` on the device."""
    if device.type == "cpu":
        words = np.random.SFC64(int(torch.randint(0, 2**62, (1,), generator=gen)))
        n_words = (count + 1) // 2
        return lambda: torch.from_numpy(words.random_raw(n_words).view(np.int32))
    low, high = -(2**31), 2**31
    return lambda: torch.randint(
        low, high, (count,), generator=gen, dtype=torch.int32, device=device
    )


def _requantization_gap(v, W, Wq, c) -> torch.Tensor:
    """log p*(v) under weights W minus under W_q, at beta = 1."""
    v, c, W = widen(v), widen(c), widen(W)
    return (F.softplus(v @ W + c) - F.softplus(v @ Wq.to(W.dtype) + c)).sum(1)


def rbm_exact_samples(
    rbm: BernoulliRBM, n: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Exact samples of v from a small RBM: the smaller layer is drawn from its exact
    marginal by enumeration, the other given it.

    Args:
        rbm: a Bernoulli RBM with at most 20 units in its smaller layer.
        n: the number of samples.
        generator: source of randomness, a ``torch.Generator`` on the data's device
            (``None``: the global one).
    """
    from ebmlab.partition.exact import MAX_ENUMERATION_BITS, binary_states

    d, m = rbm.n_visible, rbm.n_hidden
    if min(d, m) > MAX_ENUMERATION_BITS:
        raise ArgumentError(
            f"exact sampling needs min(D, M) <= {MAX_ENUMERATION_BITS}, got {min(d, m)}"
        )
    with torch.no_grad():
        W, b, c = widen(rbm.W), widen(rbm.b), widen(rbm.c)
        if d <= m:
            states = binary_states(d, device=W.device).to(W.dtype)
            logits = states @ b + F.softplus(states @ W + c).sum(1)
            idx = torch.multinomial(
                torch.softmax(logits, 0), n, replacement=True, generator=generator
            )
            return states[idx]
        states = binary_states(m, device=W.device).to(W.dtype)
        logits = states @ c + F.softplus(states @ W.T + b).sum(1)
        idx = torch.multinomial(torch.softmax(logits, 0), n, replacement=True, generator=generator)
        return bernoulli_draw(torch.sigmoid(b + states[idx] @ W.T), generator)


def raise_(
    rbm: BernoulliRBM,
    *,
    samples: torch.Tensor | np.ndarray | None = None,
    n_chains: int = 100,
    n_temperatures: int | None = 1000,
    schedule: Sequence[float] | torch.Tensor | None = None,
    data: torch.Tensor | np.ndarray | None = None,
    base_biases: torch.Tensor | None = None,
    generator: torch.Generator | int | None = None,
) -> LogZEstimate:
    """Reverse AIS (RAISE, Burda, Grosse & Salakhutdinov 2015) for a Bernoulli RBM or DBM.

    Chains start at samples of the RBM (``samples``, or exact samples when the smaller
    layer can be enumerated) and anneal back to the base-rate model; the weights
    estimate Z_0 / Z without bias, so log Z = log Z_0 - log mean(w) is biased high on
    average: with AIS it sandwiches the truth. A DBM runs as in :func:`rbm_ais`; its
    ``samples`` are the stacked states (v, h2).

    Args:
        rbm: a Bernoulli RBM or two-layer DBM.
        n_chains: number of chains run side by side.
        n_temperatures: number of intermediate distributions.
        schedule: the inverse temperatures, 0 to 1 (default: ``n_temperatures`` of a
            sigmoidal path).
        base_biases: visible biases of the base-rate model (default: from ``data``).
        generator: source of randomness, a ``torch.Generator`` on the data's device
            (``None``: the global one).
    """
    _checks.finite_parameters("rbm", rbm)
    _checks.positive_int("n_chains", n_chains)
    gen = _checks.generator("generator", generator, energy_device(rbm))
    betas = _schedule(n_temperatures, schedule)
    start = time.perf_counter()
    with torch.no_grad():
        rbm, (W, b, c, b_a, log_z0) = _base_rate_model(rbm, data, base_biases)
        if samples is None:
            v = rbm_exact_samples(rbm, n_chains, gen)
        else:
            v = _as_rows(samples, rbm.n_visible, W.device)
        log_w = _anneal_rbm(v, betas.flip(0), W, b, c, b_a, gen)
    return _estimate(log_w, log_z0, "raise", betas, start, sign=-1)
