"""Tempered sequential Monte Carlo for log Z (Del Moral, Doucet & Jasra 2006).

Particles start from a tractable base p_0 = exp(-E_0)/Z_0 and move along the same
path as AIS, E_beta = (1 - beta) E_0 + beta E_1. Each stage

1. picks the next temperature so that the incremental weights
   w = exp((beta' - beta)(E_0 - E_1)) keep an effective sample size of
   ``ess_fraction`` times the particles (bisection; Jasra et al. 2011);
2. multiplies the running estimate by the mean weight,
   Z_{beta'} / Z_beta ~ mean(w);
3. resamples the particles by their weights (systematic resampling; multinomial for
   ``variance="genealogy"``) and
4. moves them with ``steps_per_stage`` steps of any MCMC kernel at beta'.

With ``chain_length = P > 1`` the stage resamples only n / P particles and runs each
for P rounds of ``steps_per_stage`` steps, keeping the state after every round: n
particles again, for the same number of kernel steps (waste-free SMC, Dau & Chopin
2022). A particle's lineage then moves P times as far per stage, which is what regions
that only open late on the path (the neck of a funnel) need.

Unlike AIS, resampling drops the particles that annealing has made irrelevant, and
the adaptive schedule spends temperatures where the path changes fastest. The
product of mean weights is an unbiased estimate of Z_1 / Z_0.

``n_runs`` independent populations run side by side, each with its own adaptive
schedule; log Z is the log of their mean Z estimate. The standard error comes from
one of two places (``variance``):

- ``"runs"``: the spread of the runs, the delta method's
  sd(Z_r) / (sqrt(n_runs) mean(Z_r)). It reflects every source of variance,
  resampling included, and needs at least two runs.
- ``"genealogy"``: each population's own ancestry (Lee & Whiteley 2018).
  Every particle carries the index of its ancestor among the first stage's particles
  (its Eve); with S_e the final normalised weight of the particles descended from Eve
  e, m the number of stages and N the particles,
  V = 1 - (N / (N - 1))^m (1 - sum_e S_e^2)
  estimates Var(Z_hat) / Z^2 without bias when resampling is multinomial, so this
  setting resamples multinomially. (Systematic resampling, the default otherwise,
  spreads the offspring so evenly that the genealogy looks more diverse than the
  estimate's variance is, and V comes out too small.) One population of all the
  particles then gives its own error bar, and adapts its temperatures and resamples
  over all of them. Waste-free chains have no such genealogy, so it needs
  ``chain_length = 1``. When resampling has left every particle with one Eve the
  estimate is 1 (a relative error of 100 %): use more particles or fewer stages.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import TYPE_CHECKING, Any

import torch
from torch.nn import functional as F
from tqdm.auto import tqdm

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.devices import wide_dtype
from ebmlab.energies.base import EnergyLike, as_energy_fn, energy_device
from ebmlab.partition.estimate import LogZEstimate
from ebmlab.samplers.base import Sampler, frozen_parameters
from ebmlab.samplers.graphs import replayed_gradients
from ebmlab.samplers.tempering import geometric_path

if TYPE_CHECKING:
    from ebmlab.energies.analytic import AnalyticEnergy

_BISECTION_STEPS = 40  # halvings of the temperature increment: ~1e-12 resolution


def _log_ess(log_w: torch.Tensor) -> torch.Tensor:
    """log of (sum w)^2 / sum w^2 over the last dimension, in log space."""
    return 2 * torch.logsumexp(log_w, -1) - torch.logsumexp(2 * log_w, -1)


def _next_increment(diff: torch.Tensor, room: torch.Tensor, log_target: float) -> torch.Tensor:
    """Per run, the largest increment in (0, room] whose weights exp(inc * diff) keep
    an ESS of at least exp(log_target); ``diff`` is (runs, particles)."""
    full = _log_ess(room[:, None] * diff) >= log_target
    lo, hi = torch.zeros_like(room), room.clone()
    for _ in range(_BISECTION_STEPS):
        mid = (lo + hi) / 2
        ok = _log_ess(mid[:, None] * diff) >= log_target
        lo, hi = torch.where(ok, mid, lo), torch.where(ok, hi, mid)
    # at least a sliver of progress, so that a stage never stalls
    return torch.where(full, room, lo.clamp_min(room.clamp_max(1e-12)))


def _systematic(log_w: torch.Tensor, draws: int, generator: torch.Generator | None) -> torch.Tensor:
    """Indices (runs, draws) drawn by systematic resampling within each run."""
    runs, n = log_w.shape
    cdf = torch.softmax(log_w, -1).cumsum(-1)
    u = torch.rand(runs, 1, generator=generator, dtype=cdf.dtype, device=cdf.device)
    positions = (u + torch.arange(draws, dtype=cdf.dtype, device=cdf.device)) / draws
    return torch.searchsorted(cdf, positions).clamp_max(n - 1)


def _multinomial(
    log_w: torch.Tensor, draws: int, generator: torch.Generator | None
) -> torch.Tensor:
    """Indices (runs, draws) drawn independently by weight within each run."""
    return torch.multinomial(torch.softmax(log_w, -1), draws, True, generator=generator)


def _eve_concentration(log_w: torch.Tensor, eve: torch.Tensor) -> torch.Tensor:
    """Per run, sum_e S_e^2: S_e the normalised weight of the particles whose first-stage
    ancestor is e (``eve`` (runs, particles), ``log_w`` the same shape). The particles
    are sorted by eve and each S_e read off the running sum of their weights, in a fixed
    order (CUDA's ``scatter_add_`` adds by atomics, in an order that changes between
    runs, and with it a seeded run's standard error)."""
    order = eve.argsort(dim=-1, stable=True)
    eve = eve.gather(-1, order)
    running = torch.softmax(log_w, -1).gather(-1, order).cumsum(-1)
    last = torch.ones_like(eve, dtype=torch.bool)  # the last particle of each eve's group
    last[:, :-1] = eve[:, 1:] != eve[:, :-1]
    ends = torch.where(last, running, 0)
    # the running sum at the previous group's end (running sums only grow)
    before = F.pad(ends[:, :-1], (1, 0)).cummax(-1).values
    return torch.where(last, running - before, 0).square().sum(-1)


def smc(
    energy: EnergyLike,
    base: AnalyticEnergy,
    kernel: Sampler,
    *,
    n_particles: int = 256,
    n_runs: int = 8,
    variance: str = "runs",
    ess_fraction: float = 0.5,
    steps_per_stage: int = 2,
    chain_length: int = 1,
    max_stages: int = 10_000,
    generator: torch.Generator | int | None = None,
    graphs: bool = True,
    progress: bool | str = False,
) -> LogZEstimate:
    """log Z of ``energy`` by tempered SMC from ``base``, with its standard error.

    Args:
        energy: the target's energy E_1, continuous or binary.
        base: an analytic energy with ``sample`` and ``log_partition`` (e.g.
            :class:`~ebmlab.energies.Gaussian`, or
            :class:`~ebmlab.energies.IndependentBernoulli` for binary targets).
        kernel: the MCMC move, any ebmlab sampler (e.g. ``MALA`` or ``HMC`` for
            continuous targets, ``GibbsWithGradients`` or ``Gibbs`` for binary ones).
        n_particles: particles per run.
        n_runs: independent runs (at least 2 with ``variance="runs"``).
        variance: where the standard error comes from: ``"runs"``, the spread of the
            independent runs, or ``"genealogy"``, each run's ancestry (Lee & Whiteley
            2018), which also serves a single run (``chain_length`` 1 only).
        ess_fraction: the effective sample size kept at each stage, in (0, 1).
        steps_per_stage: kernel steps after each resampling (between kept states
            with ``chain_length`` > 1).
        chain_length: particles each resampled particle's chain contributes per stage;
            1 is resample-move, more is waste-free SMC (``n_particles`` must be a
            multiple, with at least two chains per run).
        max_stages: a stage limit per run; exceeding it is an error.
        generator: randomness, on the base's device.
        graphs: on a CUDA device, replay the moves' energy and gradient as a CUDA graph
            (each chain's inverse temperature is read from the device;
            :class:`~ebmlab.samplers.graphs.ReplayedGradient`: the same values).
        progress: show a bar on stderr of the way to beta = 1 of the slowest run, in
            per cent, with the stages so far (a string is its label); it reads the
            temperatures from the device once per stage.
    """
    _check_population(energy, base, kernel, n_particles, ess_fraction, steps_per_stage, max_stages)
    _checks.positive_int("n_runs", n_runs)
    _checks.one_of("variance", variance, ("runs", "genealogy"))
    if variance == "runs" and n_runs < 2:
        raise ArgumentError(
            f"n_runs must be at least 2 for variance='runs' (the standard error needs them), "
            f"got {n_runs}; a single run takes variance='genealogy'"
        )
    _checks.positive_int("chain_length", chain_length)
    if n_particles % chain_length or n_particles // chain_length < 2:
        raise ArgumentError(
            f"chain_length must divide n_particles into at least two chains, got "
            f"chain_length={chain_length} for n_particles={n_particles}"
        )
    if variance == "genealogy" and chain_length != 1:
        raise ArgumentError(
            f"variance='genealogy' needs chain_length=1 (waste-free chains have no "
            f"genealogy), got chain_length={chain_length}; use variance='runs'"
        )
    gen = _checks.generator("generator", generator, energy_device(base))
    start = time.perf_counter()
    pop = _anneal(energy, base, kernel, n_particles, n_runs, variance == "genealogy",
                  ess_fraction, steps_per_stage, chain_length, max_stages, gen,
                  graphs, progress)  # fmt: skip
    f64 = pop.log_ratio.dtype
    log_z0 = float(base.log_partition())
    per_run = pop.log_ratio + log_z0
    log_z = float(torch.logsumexp(per_run, 0) - math.log(n_runs))
    z = torch.exp(per_run - per_run.max())
    if variance == "runs":
        stderr = float(z.std() / (math.sqrt(n_runs) * z.mean()))
    else:
        # Lee & Whiteley (2018) per run, pooled over the runs' mean by the delta method
        inflation = torch.exp(pop.stages.to(f64) * math.log1p(1 / (n_particles - 1)))
        relative = 1 - inflation * (1 - pop.concentration)
        pooled = (relative * z.square()).sum() / z.sum().square()
        stderr = float(pooled.clamp_min(0).sqrt())
    cost = {
        "n_particles": n_particles,
        "n_runs": n_runs,
        "variance": variance,
        "n_stages": pop.stages.tolist(),
        "kernel_steps_per_particle": int(pop.stages.max() - 1) * steps_per_stage,
        "seconds": time.perf_counter() - start,
    }
    dof = n_runs - 1 if variance == "runs" else math.inf
    return LogZEstimate(log_z=log_z, stderr=stderr, method="smc", cost=cost, dof=dof)


def smc_sample(
    energy: EnergyLike,
    base: AnalyticEnergy,
    kernel: Sampler,
    n: int,
    *,
    ess_fraction: float = 0.5,
    steps_per_stage: int = 2,
    max_stages: int = 10_000,
    generator: torch.Generator | int | None = None,
) -> torch.Tensor:
    """``n`` draws of exp(-``energy``) by the tempered SMC of :func:`smc` (one run of
    ``n`` particles), resampled by their final weights, detached.

    Unlike chains started near the data, the population carries mass between the
    target's modes in proportion to their weights, because the base covers them all
    and each stage's weights move the mass (Del Moral, Doucet & Jasra 2006).
    The draws are consistent as ``n`` grows, not exact for a finite ``n``.

    Args:
        energy: the target's energy.
        base: an analytic energy with ``sample`` and ``log_partition``.
        kernel: the MCMC move, any ebmlab sampler.
        n: draws (and particles).
        ess_fraction: the effective sample size kept at each stage, in (0, 1).
        steps_per_stage: kernel steps after each resampling.
        max_stages: a stage limit; exceeding it is an error.
        generator: randomness, on the base's device.
    """
    _check_population(energy, base, kernel, n, ess_fraction, steps_per_stage, max_stages, "n")
    gen = _checks.generator("generator", generator, energy_device(base))
    pop = _anneal(energy, base, kernel, n, 1, False, ess_fraction, steps_per_stage, 1,
                  max_stages, gen)  # fmt: skip
    return pop.x.index_select(0, _systematic(pop.log_w, n, gen).view(-1)).detach()


def _check_population(
    energy: EnergyLike,
    base: AnalyticEnergy,
    kernel: Sampler,
    n_particles: int,
    ess_fraction: float,
    steps_per_stage: int,
    max_stages: int,
    count: str = "n_particles",
) -> None:
    """The checks :func:`smc` and :func:`smc_sample` share; ``count`` names the
    argument that holds ``n_particles``."""
    _checks.finite_parameters("energy", energy)
    _checks.positive_int(count, n_particles)
    if n_particles < 2:
        raise ArgumentError(f"{count} must be at least 2, got {n_particles}")
    if not 0 < ess_fraction < 1:
        raise ArgumentError(f"ess_fraction must be in (0, 1), got {ess_fraction}")
    _checks.positive_int("steps_per_stage", steps_per_stage)
    _checks.positive_int("max_stages", max_stages)
    _checks.instance("kernel", kernel, Sampler, "an ebmlab Sampler")
    for method in ("sample", "log_partition"):
        if not hasattr(base, method):
            raise ArgumentError(f"base must provide {method}() (an analytic energy), got {base!r}")


@dataclasses.dataclass(frozen=True)
class _Population:
    """Where :func:`_anneal` ends: the particles (runs * particles, ...), the last
    stage's log weights (runs, particles), each run's log Z_1 / Z_0 and stage count, and
    the concentration sum_e S_e^2 of its genealogy (1 unless tracked)."""

    x: torch.Tensor
    log_w: torch.Tensor
    log_ratio: torch.Tensor
    stages: torch.Tensor
    concentration: torch.Tensor


def _anneal(
    energy: EnergyLike,
    base: AnalyticEnergy,
    kernel: Sampler,
    n_particles: int,
    n_runs: int,
    genealogy: bool,
    ess_fraction: float,
    steps_per_stage: int,
    chain_length: int,
    max_stages: int,
    gen: torch.Generator | None,
    graphs: bool = True,
    progress: bool | str = False,
) -> _Population:
    """Move ``n_runs`` populations from ``base`` to ``energy`` (the stages of :func:`smc`),
    resampling systematically, or multinomially while tracking each run's
    ``genealogy``; with ``graphs``, the moves' energy and gradient replayed on CUDA;
    ``progress`` as in :func:`smc`."""
    e1, e0 = as_energy_fn(energy), as_energy_fn(base)
    x = base.sample(n_runs * n_particles, gen)
    device = x.device
    f64 = wide_dtype(device)
    beta = torch.zeros(n_runs, dtype=f64, device=device)
    log_ratio = torch.zeros(n_runs, dtype=f64, device=device)
    log_target = math.log(ess_fraction * n_particles)
    offsets = (torch.arange(n_runs, device=device) * n_particles)[:, None]
    n_chains = n_particles // chain_length  # per run
    stages = torch.zeros(n_runs, dtype=torch.long, device=device)
    resample = _multinomial if genealogy else _systematic
    eve = torch.arange(n_particles, device=device).expand(n_runs, -1)
    concentration = torch.ones(n_runs, dtype=f64, device=device)  # sum_e S_e^2 at the end
    chain_beta = x.new_zeros(n_runs * n_chains)  # each chain's stage, read by the path
    path = geometric_path(e0, e1, chain_beta)
    path = replayed_gradients(path, x.device) if graphs else path
    label = progress if isinstance(progress, str) else "SMC"
    bar = tqdm(total=100, desc=label, leave=False, disable=not progress,
               bar_format="{l_bar}{bar}| {elapsed}{postfix}")  # fmt: skip
    with frozen_parameters(energy), bar:
        for stage in range(max_stages):
            with torch.no_grad():
                diff = (e0(x) - e1(x)).to(f64).view(n_runs, n_particles)
            if not torch.isfinite(diff).all():
                raise ArgumentError(
                    "energy is NaN or infinite at some particles; check the energy and the "
                    "base's support"
                )
            room = 1 - beta
            active = room > 0
            inc = torch.where(active, _next_increment(diff, room, log_target), 0.0)
            log_w = inc[:, None] * diff
            log_ratio += torch.logsumexp(log_w, -1) - math.log(n_particles)
            finished = active & (inc >= room)
            if genealogy:
                concentration = torch.where(finished, _eve_concentration(log_w, eve), concentration)
            beta = torch.where(finished, torch.ones_like(beta), beta + inc)
            stages += active.long()
            if progress:  # the slowest run's way to beta = 1
                bar.update(int(100 * float(beta.min())) - bar.n)
                bar.set_postfix(stages=stage + 1)  # a stage takes long: shown at once
            if not bool((beta < 1).any()):
                break
            picks = resample(log_w, n_chains, gen)
            if genealogy:
                eve = eve.gather(1, picks)
            rows = (picks + offsets).view(-1)
            chain_beta.copy_(beta.repeat_interleave(n_chains))
            state = kernel.init(x.index_select(0, rows), path)
            kept = []
            for _ in range(chain_length):
                for _ in range(steps_per_stage):
                    state = kernel.step(state, path, gen)
                kept.append(state.x)
            # (runs * chains, length, ...) -> run-major particles
            x = torch.stack(kept, 1).flatten(0, 1)
        else:
            raise ArgumentError(
                f"smc did not reach beta = 1 within max_stages={max_stages}: raise max_stages "
                "or lower ess_fraction"
            )
    return _Population(x, log_w, log_ratio, stages, concentration)


# the standard logistic law, the image of the uniform one under the logit map: its
# standard deviation pi / sqrt(3), and a step and path of HMC moves that mix on it
LOGISTIC_STD = math.pi / math.sqrt(3)
BOX_STEP, BOX_LEAPFROG = 0.1, 10


def box_smc(
    energy: EnergyLike,
    low: float,
    high: float,
    event_shape: tuple[int, ...],
    *,
    kernel: Sampler | None = None,
    steps_per_stage: int = 5,
    generator: torch.Generator | int | None = None,
    **options: Any,
) -> LogZEstimate:
    """log Z = log of the integral of exp(-E(x)) over the box [low, high]^D, by
    tempered SMC (:func:`smc`) in logit coordinates.

    An image model's energy is defined on its pixel box (a network's exp(-E) need not
    be integrable on all of R^D). With x = low + (high - low) sigmoid(u) the box
    becomes R^D and Z = int exp(-E(x(u))) |dx/du| du, the energy in u gaining
    -sum_i log((high - low) sigmoid(u_i) sigmoid(-u_i)). A uniform density on the box
    is the standard logistic one in u, which the Gaussian base of the same spread
    (pi / sqrt(3)) approximates.

    Args:
        energy: E on (B, *event_shape) inputs in [low, high].
        low: the box's lower end in every coordinate.
        high: its upper end (> low).
        event_shape: the shape of one input.
        kernel: the SMC moves in u (default: HMC with step ``BOX_STEP`` and
            ``BOX_LEAPFROG`` leapfrog steps).
        steps_per_stage: kernel steps after each resampling.
        generator: source of randomness, a ``torch.Generator`` on the model's device
            (``None``: the global one).
        options: further arguments of :func:`smc` (``n_particles``, ``n_runs``, ...).
    """
    from ebmlab.energies.analytic import DiagonalGaussian
    from ebmlab.samplers.hmc import HMC

    if not (math.isfinite(low) and math.isfinite(high) and high > low):
        raise ArgumentError(f"the box must have finite low < high, got [{low}, {high}]")
    shape = _checks.positive_ints("event_shape", event_shape)
    e1 = as_energy_fn(energy)
    width = high - low

    def in_logits(u: torch.Tensor) -> torch.Tensor:
        x = low + width * torch.sigmoid(u)
        log_jacobian = (F.logsigmoid(u) + F.logsigmoid(-u)).sum(1) + u.shape[1] * math.log(width)
        return e1(x.view(len(u), *shape)) - log_jacobian

    device = energy_device(energy)
    dim = math.prod(shape)
    params = list(energy.parameters()) if isinstance(energy, torch.nn.Module) else []
    dtype = params[0].dtype if params else torch.get_default_dtype()  # the particles'
    spread = torch.full((dim,), LOGISTIC_STD, device=device, dtype=dtype)
    base = DiagonalGaussian(torch.zeros_like(spread), spread)
    with frozen_parameters(energy):
        kernel = kernel or HMC(BOX_STEP, BOX_LEAPFROG)
        estimate = smc(in_logits, base, kernel, steps_per_stage=steps_per_stage,
                       generator=generator, **options)  # fmt: skip
    return dataclasses.replace(
        estimate, method="smc_box", cost={**estimate.cost, "box": [low, high]}
    )
