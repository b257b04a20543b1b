"""MCMC diagnostics: split R-hat, bulk effective sample size and Monte Carlo errors.

Both follow Vehtari, Gelman, Simpson, Carpenter & Buerkner (2021): chains are
split in halves, draws are rank-normalised (z = Phi^{-1}((rank - 3/8) / (S + 1/4)),
ties at their average rank), autocorrelations are pooled across chains, and the sum of
autocorrelations is truncated by Geyer's initial monotone positive sequence. ESS is
clamped to [1, S log10 S] (S = all draws) so near-antithetic chains do not report
absurd values. On the same draws R-hat, bulk ESS and both Monte Carlo errors agree
with ArviZ's to rounding (``tests/samplers/test_diagnostics.py``).
Samples are laid out as returned by ``sampler.sample(..., thin=k)``: (T, C, *event).

:func:`summarize` warns (:class:`SamplingWarning`) when a run fails the checks Vehtari
et al. recommend before its draws are used: R-hat above 1.01, a bulk ESS below 100 per
chain (at most 400 in all), or more than 1 % of the kept transitions divergent; and
when strongly correlated draws suggest a dense mass.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.devices import widen

if TYPE_CHECKING:
    from ebmlab.samplers.base import SampleRun


RHAT_LIMIT = 1.01
ESS_PER_CHAIN = 100
ESS_ENOUGH = 400
DIVERGENT_LIMIT = 0.01
# a diagonal mass leaves a Gaussian posterior with this condition number (that of its
# correlation matrix): HMC then needs about its square root more steps per draw
CORRELATED = 100.0
DENSE_UP_TO = 1000  # coordinates: a dense mass costs D^2 per chain and leapfrog step


class SamplingWarning(UserWarning):
    """Chains that are stuck or mix poorly (named with their step size and acceptance),
    or a run that fails a convergence check."""


def rarely_moving(moved: torch.Tensor, n_steps: int) -> torch.Tensor:
    """Which chains moved on fewer than a tenth of the steps the median chain moved on,
    given the fraction of ``n_steps`` each moved on (B,); none unless the median chain
    moved on at least 30 steps, so that chance alone never flags a chain."""
    expected = float(moved.median()) * n_steps
    if expected < 30:
        return torch.zeros_like(moved, dtype=torch.bool)
    return moved * n_steps < 0.1 * expected


def _split(x: torch.Tensor) -> torch.Tensor:
    """(T, C, D) -> (T // 2, 2C, D): each chain's halves become two chains."""
    half = x.shape[0] // 2
    return torch.cat([x[:half], x[x.shape[0] - half :]], dim=1)


def _rank_normalise(x: torch.Tensor) -> torch.Tensor:
    """Normal scores of the draws' ranks over all chains, per coordinate, with tied draws
    (a rejected proposal repeats its state; discrete states repeat always) at their
    average rank, as Vehtari et al. (2021) and ArviZ rank them. Ranking ties by
    their position instead would give earlier chains the lower ranks of a tie."""
    t, c, d = x.shape
    columns = x.reshape(t * c, d).T.contiguous()  # (D, S)
    ordered = columns.sort(1).values
    below = torch.searchsorted(ordered, columns)  # draws smaller than each
    up_to = torch.searchsorted(ordered, columns, right=True)  # ... or equal
    ranks = widen(below + up_to + 1) / 2
    z = torch.special.ndtri((ranks - 0.375) / (t * c + 0.25))
    return z.T.reshape(t, c, d)


def _autocovariance(x: torch.Tensor) -> torch.Tensor:
    """Per-chain autocovariance over lags, (T, C, D), by FFT."""
    t = x.shape[0]
    centred = x - x.mean(0)
    n = 1 << (2 * t - 1).bit_length()
    f = torch.fft.rfft(centred, n=n, dim=0)
    return torch.fft.irfft(f * f.conj(), n=n, dim=0)[:t] / t


def _ess(x: torch.Tensor) -> torch.Tensor:
    """ESS per coordinate of already split chains (T, C, D), as Stan and ArviZ compute it
    (Vehtari et al. 2021, section 3.2): autocorrelations pooled over chains, summed in
    pairs of lags (2k, 2k + 1) up to the first pair that is not positive (pairs up to
    lag T - 3 at most), made monotone, plus the autocorrelation at the lag where the sum
    stopped when it is positive. Draws that do not vary count as S independent ones."""
    t, c, _ = x.shape
    total = t * c
    acov = _autocovariance(x)
    w = acov[0].mean(0) * t / (t - 1)
    var_plus = w * (t - 1) / t + (x.mean(0).var(0) if c > 1 else 0)
    rho = 1 - (w - acov.mean(1)) / var_plus  # (T, D)
    rho[0] = 1.0
    n_pairs = max((t - 1) // 2, 1)  # pairs 0 .. n_pairs - 1 can be summed, lags < T - 2
    pairs = rho[: 2 * n_pairs].reshape(n_pairs, 2, -1).sum(1)  # (n_pairs, D)
    # the sum stops at the first pair k >= 1 that is not positive, else at the last one
    ends = torch.cat([torch.zeros_like(pairs[:1]), widen(pairs[1:] <= 0)])
    ends[-1] = 1.0
    stop = ends.argmax(0)  # (D,)
    kept = torch.arange(n_pairs, device=x.device)[:, None] < stop
    monotone = torch.cummin(pairs, 0).values
    tail = rho[(2 * stop).clamp(max=t - 1), torch.arange(rho.shape[1], device=x.device)]
    tau = -1 + 2 * torch.where(kept, monotone, 0.0).sum(0) + tail.clamp(min=0.0)
    tau = tau.clamp(min=1 / math.log10(max(total, 10)))
    ess = (total / tau).clamp(min=1.0)
    return torch.where(var_plus > 0, ess, float(total))


def _check(samples: torch.Tensor) -> torch.Tensor:
    _checks.tensor("samples", samples, min_ndim=2, floating=True)
    if samples.shape[0] < 4:
        raise ArgumentError(
            f"samples needs at least 4 draws per chain (T >= 4), got T={samples.shape[0]}"
        )
    return widen(samples.reshape(samples.shape[0], samples.shape[1], -1))


def _quantiles(x: torch.Tensor, *probs: float) -> list[torch.Tensor]:
    """The ``probs`` quantiles of each coordinate over all draws of (T, C, D), from one
    sort, interpolated linearly between order statistics (R's type 7, numpy's default):
    at 0.5, numpy's median."""
    ordered = x.flatten(0, 1).sort(0).values
    last = len(ordered) - 1
    quantiles = []
    for prob in probs:
        low = math.floor(last * prob)
        high = min(low + 1, last)
        quantiles.append(ordered[low] + (last * prob - low) * (ordered[high] - ordered[low]))
    return quantiles


def effective_sample_size(samples: torch.Tensor) -> torch.Tensor:
    """Bulk ESS (rank-normalised, split chains) per coordinate; samples (T, C, *event)."""
    x = _check(samples)
    return _ess(_rank_normalise(_split(x))).reshape(samples.shape[2:])


def tail_effective_sample_size(samples: torch.Tensor) -> torch.Tensor:
    """Tail ESS per coordinate: the smaller ESS of the indicators of the draws below
    their 5 % and their 95 % quantile, split chains (Vehtari et al. 2021;
    Stan's and ArviZ's ``ess_tail``). It says how well the chains pin down the tails,
    hence intervals and sds, where the bulk ESS speaks for means and medians.

    Args:
        samples: kept states (T, B, ...): T draws of B chains.
    """
    x = _check(samples)
    low, high = (_ess(_split(widen(x <= q))) for q in _quantiles(x, 0.05, 0.95))
    return torch.minimum(low, high).reshape(samples.shape[2:])


def monte_carlo_errors(samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Monte Carlo standard errors of the posterior mean and sd per coordinate, as the
    ``posterior`` R package's ``mcse_mean`` and ``mcse_sd`` compute them (Vehtari et al.
    2021): sd / sqrt(ESS) for the mean, with the ESS of the draws themselves (split
    chains, not rank-normalised); for the sd, the delta method on the mean squared
    deviation, whose error uses the ESS of the squared deviations and the draws' fourth
    moment. A heavy-tailed marginal (the log scale of a funnel) gets a larger error than
    the Gaussian sd / sqrt(2 ESS), a light-tailed one a smaller.

    Args:
        samples: kept states (T, B, ...): T draws of B chains.

    Returns:
        The errors of the mean and of the sd, each of shape ``samples.shape[2:]``.
    """
    x = _check(samples)
    flat = x.reshape(-1, x.shape[-1])
    squared = (x - flat.mean(0)) ** 2
    var = squared.mean((0, 1))
    n = len(flat)
    of_mean = (var * n / (n - 1) / _ess(_split(x))).sqrt()  # the sd with n - 1
    var_of_var = (squared**2).mean((0, 1)) - var**2
    of_sd = (
        var_of_var / _ess(_split(squared)) / (4 * var.clamp(min=torch.finfo(var.dtype).tiny))
    ).sqrt()
    return of_mean.reshape(samples.shape[2:]), of_sd.reshape(samples.shape[2:])


def split_rhat(samples: torch.Tensor) -> torch.Tensor:
    """Rank-normalised split R-hat per coordinate (max of bulk and folded); ~1 at convergence.

    Args:
        samples: kept states (T, B, ...): T draws of B chains.
    """
    x = _check(samples)

    def rhat(z: torch.Tensor) -> torch.Tensor:
        t = z.shape[0]
        w = z.var(0).mean(0)
        var_plus = w * (t - 1) / t + z.mean(0).var(0)
        return (var_plus / w).sqrt()

    split = _split(x)
    (median,) = _quantiles(split, 0.5)
    folded = (split - median).abs()  # about each coordinate's median
    return torch.maximum(rhat(_rank_normalise(split)), rhat(_rank_normalise(folded))).reshape(
        samples.shape[2:]
    )


@dataclass
class Diagnostics:
    """Summary of a sampling run: acceptance, divergences, worst bulk and tail ESS and
    R-hat, and the checks it fails (``problems``, empty for a run whose draws can be
    used)."""

    acceptance_rate: float
    n_divergent: int
    min_ess: float
    median_ess: float
    max_rhat: float
    n_grad_evals: int
    min_tail_ess: float = math.nan  # last, so the fields before keep their positions
    problems: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        line = (
            f"acceptance {self.acceptance_rate:.3f} | divergent {self.n_divergent} | "
            f"ESS min {self.min_ess:.0f} median {self.median_ess:.0f} "
            f"tail min {self.min_tail_ess:.0f} | "
            f"R-hat max {self.max_rhat:.3f} | gradient evaluations {self.n_grad_evals}"
        )
        return line + "".join(f"\nwarning: {p}" for p in self.problems)


def correlation_condition(samples: torch.Tensor) -> float:
    """The condition number of the correlation matrix of draws (T, C, D) pooled over
    chains, over the coordinates that vary: 1 for uncorrelated ones. With a diagonal
    mass, HMC on a Gaussian posterior sees this condition number (Neal 2011, sec. 4:
    the step size follows the narrowest direction, the trajectory length the widest)."""
    flat = widen(samples.reshape(-1, samples.shape[-1]))
    flat = flat[:, flat.std(0) > 0]
    if flat.shape[1] < 2:
        return 1.0
    return condition_number(torch.corrcoef(flat.T))


def condition_number(matrix: torch.Tensor) -> float:
    """The ratio of the largest to the smallest eigenvalue of a symmetric positive
    semi-definite matrix (read from its lower triangle); the dtype's largest finite
    ratios where it is singular."""
    eig = torch.linalg.eigvalsh(matrix)
    return float(eig[-1] / eig[0].clamp(min=torch.finfo(eig.dtype).tiny))


def _dense_mass_may_help(run: SampleRun) -> bool:
    """Whether ``run`` tuned a diagonal mass for chains of flat rows (T, C, D) for which a
    dense one is practical: D at most :data:`DENSE_UP_TO`, and draws enough (ten per
    coordinate) to estimate their correlations."""
    mass = getattr(run.final, "inv_mass", None)
    if run.samples.ndim != 3 or not (isinstance(mass, torch.Tensor) and mass.ndim == 1):
        return False
    t, c, d = run.samples.shape
    return 1 < d <= DENSE_UP_TO and t * c >= 10 * d


def summarize(run: SampleRun, warn: bool = True) -> Diagnostics:
    """Diagnostics of a :class:`~ebmlab.samplers.SampleRun` made with ``thin``, with the
    checks of Vehtari et al. (2021): R-hat at most 1.01, bulk ESS at least 100 per chain
    (400 in all suffice), at most 1 % of the kept transitions divergent; with ``warn``
    the failed ones are also raised as one :class:`SamplingWarning`. R-hat and the ESS
    are tied, R-hat ~ sqrt(1 + M / ESS) over M half-chains (Vats & Knudson 2021),
    so R-hat <= 1.01 takes about 50 effective draws per half-chain: many short chains
    that have mixed still fail it, and the warning says how far each half-chain is.
    When R-hat or the ESS fails after a diagonal mass was tuned and the draws are
    strongly correlated (:func:`correlation_condition` above :data:`CORRELATED`; at
    most :data:`DENSE_UP_TO` coordinates, ten draws or more per coordinate), it says
    that a dense mass may mix faster; where the warm-up refused the dense mass because
    the posterior changes shape (``refused_spread`` of the final state), it says so and
    points to samplers that follow the shape instead.

    Args:
        run: a :class:`~ebmlab.samplers.SampleRun` made with ``thin``.
        warn: issue the warning (the problems are in ``Diagnostics.problems`` either way).
    """
    ess = effective_sample_size(run.samples)
    rhat = split_rhat(run.samples)
    rhat = rhat[~rhat.isnan()]  # coordinates whose draws never vary have none
    n_chains = run.samples.shape[1]
    diagnostics = Diagnostics(
        acceptance_rate=run.info["acceptance_rate"],
        n_divergent=run.info["n_divergent"],
        min_ess=float(ess.min()),
        median_ess=float(ess.median()),
        min_tail_ess=float(tail_effective_sample_size(run.samples).min()),
        max_rhat=float(rhat.max()) if len(rhat) else math.nan,
        n_grad_evals=run.info["n_grad_evals"],
    )
    needed = min(ESS_PER_CHAIN * n_chains, ESS_ENOUGH)
    transitions = run.info.get("n_kept_steps", 0) * n_chains
    if diagnostics.max_rhat > RHAT_LIMIT:
        halves = 2 * n_chains
        diagnostics.problems.append(
            f"R-hat {diagnostics.max_rhat:.4f} > {RHAT_LIMIT}: the chains are too short or "
            f"disagree. Over {halves} half-chains R-hat is about sqrt(1 + {halves} / bulk ESS), "
            f"so it reaches {RHAT_LIMIT} at {1 / (RHAT_LIMIT**2 - 1):.0f} effective draws per "
            f"half-chain, and this run has {diagnostics.min_ess / halves:.1f}: run the chains "
            "longer (or fewer, longer chains for the same draws), and look for stuck chains"
        )
    if diagnostics.min_ess < needed:
        diagnostics.problems.append(
            f"bulk ESS {diagnostics.min_ess:.0f} < {needed} ({ESS_PER_CHAIN} per chain, "
            f"{ESS_ENOUGH} in all suffice): too few effective draws for reliable estimates"
        )
    refused = getattr(run.final, "refused_spread", None)
    if diagnostics.problems and refused is not None:
        diagnostics.problems.append(
            f"the warm-up kept the mass diagonal: the posterior changes shape across its "
            f"draws (the two halves of the last mass window want dense masses {refused:.0f} "
            "apart, as a condition number), so no one mass fits it and a dense one would "
            "mix worse, not better; run the chains longer, or use a sampler whose metric "
            "follows the position (SoftAbsHMC; ebmlab mcmc --sampler softabs-hmc) or a "
            "learned change of variables (NeuTra; --sampler neutra)"
        )
    elif diagnostics.problems and _dense_mass_may_help(run):
        kappa = correlation_condition(run.samples)
        if kappa > CORRELATED:
            diagnostics.problems.append(
                f"the draws are strongly correlated (their correlation matrix has condition "
                f"number {kappa:.0f} > {CORRELATED:.0f}), which a diagonal mass cannot undo: "
                "NUTS or AdaptiveHMC with a dense mass (dense_mass=True; ebmlab mcmc "
                "--mass dense) may mix much faster"
            )
    if transitions and diagnostics.n_divergent > DIVERGENT_LIMIT * transitions:
        diagnostics.problems.append(
            f"{diagnostics.n_divergent} of {transitions} kept transitions divergent "
            f"(> {DIVERGENT_LIMIT:.0%}): the draws may be biased; raise target_accept, "
            "reparametrise (non-centre a hierarchical model), or use WALNUTS (ebmlab mcmc "
            "--sampler walnuts), whose steps halve where the curvature needs it"
        )
    if warn and diagnostics.problems:
        warnings.warn("; ".join(diagnostics.problems), SamplingWarning, stacklevel=2)
    return diagnostics
