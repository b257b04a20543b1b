"""Sampling by diffusion recovery (Gao et al. 2021).

A noise schedule sigma_1, ..., sigma_T blurs data step by step,
x_k = alpha_k x_{k-1} + sigma_k eps with alpha_k = sqrt(1 - sigma_k^2). Given the
energies E(x, t) of the blurred marginals (a
:class:`~ebmlab.energies.NoiseConditionalEnergy`), the step back from x_{t+1} to x_t
has the conditional energy (Gao et al. 2021, eq. 6, written on x_t)

    E(x_t, t) + |x_{t+1} - alpha_{t+1} x_t|^2 / (2 sigma_{t+1}^2),

whose quadratic term makes it close to a Gaussian of width sigma / alpha: far
easier to sample than the marginal itself. :func:`recover` samples it by short-run
Langevin dynamics started at x_{t+1} / alpha_{t+1}, with a step of ``step_scale``
times the quadratic term's variance (at most ``step_scale`` itself, the scale of
standardised data, where the noise is so large that the energy dominates); with
``adjusted`` the steps are Metropolis-adjusted (MALA), so that a step too large for
a sharp well of the energy is refused rather than taken. At a noise
level wide enough to span several of the data's modes the conditional has several
modes too, which short-run Langevin does not draw; ``candidates = K > 1`` then starts
each chain from one of K draws of the quadratic term's Gaussian, picked with
probability proportional to exp(-E(x_t, t)) (sampling-importance-resampling, Rubin
1988): exact as K grows, and effective where the energy varies over the Gaussian's
width in few dimensions.
:class:`RecoverySampler` chains the levels: from noise at level T down to the data
level 0, each level's samples starting the next.
"""

from __future__ import annotations

import math

import torch

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.devices import wide_dtype
from ebmlab.samplers.base import categorical, frozen_parameters, per_chain
from ebmlab.samplers.integrators import gaussian_noise
from ebmlab.samplers.langevin import Langevin
from ebmlab.samplers.mala import MALA


def check_schedule(sigmas) -> torch.Tensor:
    """The noise levels ``sigmas`` as a float64 tensor (T,), each strictly between 0
    and 1; anything else is an error naming them."""
    sigmas = torch.as_tensor(sigmas, dtype=torch.float64)
    if sigmas.ndim != 1 or len(sigmas) == 0 or not ((sigmas > 0) & (sigmas < 1)).all():
        raise ArgumentError(
            "sigmas must be a non-empty sequence of noise levels, each in (0, 1) (the "
            f"standard deviation added at each step), got {sigmas.tolist()}"
        )
    return sigmas


def noise_schedule(n_levels: int = 8, first: float = 0.05, last: float = 0.99) -> torch.Tensor:
    """``n_levels`` noise levels rising geometrically from ``first`` to ``last``; the
    defaults leave 9 % of the signal at the last level, so that sampling can start there
    from N(0, I) for standardised data."""
    _checks.positive_int("n_levels", n_levels)
    for name, value in (("first", first), ("last", last)):
        if not 0 < value < 1:
            raise ArgumentError(f"{name} must be in (0, 1), got {value}")
    return check_schedule(torch.logspace(math.log10(first), math.log10(last), n_levels))


def blur(
    x: torch.Tensor, sigmas: torch.Tensor, level: torch.Tensor, generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x_t, x_{t+1}) for data ``x`` (B, ...) and per-row levels t (``level``, (B,)):
    x_t = abar_t x + sqrt(1 - abar_t^2) eps with abar_t the product of the first t
    alphas, alpha_t = sqrt(1 - sigma_t^2) for the schedule ``sigmas``, then one more step.

    Args:
        generator: source of randomness, a ``torch.Generator`` on the data's device
            (``None``: the global one).
    """
    sigmas = sigmas.to(x.device, wide_dtype(x.device))
    alphas = (1 - sigmas**2).sqrt()
    abar = per_chain(torch.cat([alphas.new_ones(1), alphas.cumprod(0)])[level], x)
    noise = gaussian_noise(x, generator)
    x_t = abar * x + (1 - abar**2).sqrt() * noise
    a, s = per_chain(alphas[level], x), per_chain(sigmas[level], x)
    noise = gaussian_noise(x, generator)
    return x_t, a * x_t + s * noise


def recover(
    model,
    x_next: torch.Tensor,
    level: torch.Tensor,
    sigmas: torch.Tensor,
    steps: int,
    step_scale: float,
    generator,
    clamp: tuple[float, float] | None = None,
    candidates: int = 1,
    adjusted: bool = False,
) -> torch.Tensor:
    """Draws of x_t given x_{t+1} = ``x_next`` at per-row levels t (short-run Langevin on
    the conditional energy), detached.

    Args:
        model: a noise-conditional energy with ``energy_at(x, level)``.
        x_next: the noisier draws x_{t+1}, (B, ...).
        level: each row's level t, (B,) integers.
        sigmas: the noise schedule (T,), from :func:`check_schedule`.
        steps: Langevin steps.
        step_scale: the Langevin step as a fraction of each level's conditional
            variance (sigma_t / alpha_t)^2.
        generator: source of randomness, a ``torch.Generator`` on the data's device
            (``None``: the global one).
        clamp: (low, high) the chains are projected onto after every step (data in a
            box, such as images), or ``None``.
        candidates: K; above 1 each chain starts from the importance-resampled pick
            of K Gaussian draws (:func:`resampled_start`), else from x_{t+1} / alpha.
        adjusted: Metropolis-adjusted steps (MALA) in place of unadjusted ones, which
            keep the conditional exact whatever the step (no ``clamp`` then).
    """
    _checks.positive_int("candidates", candidates)
    if adjusted and clamp is not None:
        raise ArgumentError(
            "adjusted=True takes no clamp: a projection would break the Metropolis "
            "correction (draw unclamped, or leave adjusted=False)"
        )
    sigmas = sigmas.to(x_next.device, wide_dtype(x_next.device))
    a, s = (1 - sigmas[level] ** 2).sqrt(), sigmas[level]
    a_rows = per_chain(a, x_next)
    width = (s / a).to(x_next.dtype)
    start = x_next / a_rows
    if candidates > 1:
        start = resampled_start(model, start, level, width, candidates, generator)
        if clamp is not None:
            start = start.clamp(*clamp)

    def conditional(x: torch.Tensor) -> torch.Tensor:
        squared = ((x_next - a_rows * x) ** 2).flatten(1).sum(1)
        return model.energy_at(x, level) + squared / (2 * s.to(x.dtype) ** 2)

    variance = width**2
    kernel = MALA(1.0) if adjusted else Langevin(1.0, clamp=clamp)
    sampler = kernel._with(step_size=step_scale * variance.clamp(max=1.0))
    with frozen_parameters(model):
        return sampler.sample(conditional, start, steps, generator=generator)


def resampled_start(
    model,
    centre: torch.Tensor,
    level: torch.Tensor,
    width: torch.Tensor,
    candidates: int,
    generator,
) -> torch.Tensor:
    """One point per row of ``centre`` (B, ...): of ``candidates`` draws from
    N(centre, width^2), the one picked with probability proportional to
    exp(-E(x, level)) (no host synchronisation). Exactly a draw
    of exp(-E(x)) N(x; centre, width^2) as ``candidates`` grows (Rubin 1988).

    Args:
        model: a noise-conditional energy with ``energy_at(x, level)``.
        level: each row's level, (B,) integers.
        width: each row's standard deviation, (B,).
        generator: source of randomness, a ``torch.Generator`` on the data's device
            (``None``: the global one).
    """
    rows = centre.shape[0]
    spread = per_chain(width.repeat_interleave(candidates), centre)
    centres = centre.repeat_interleave(candidates, 0)
    draws = centres + spread * gaussian_noise(centres, generator)
    with torch.no_grad():
        energy = model.energy_at(draws, level.repeat_interleave(candidates)).view(rows, -1)
    pick = categorical(torch.log_softmax(-energy, 1), 1, generator)[:, 0]
    return draws.view(rows, candidates, *centre.shape[1:])[torch.arange(rows), pick]


class OneLevel(torch.nn.Module):
    """An unconditional energy read as a noise-conditional one with a single level, so
    that :func:`recover` samples its recovery conditional: recovery likelihood from one
    noise level, whose maximiser is still a consistent estimate of the data's own energy
    (Gao et al. 2021). ``energy_at(x, level)`` ignores the level.

    Args:
        model: the energy, an ``nn.Module`` with ``energy(x)``.
    """

    n_levels = 1

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def energy_at(self, x: torch.Tensor, level: torch.Tensor) -> torch.Tensor:
        """E(x), the model's energy, whatever ``level``.

        Args:
            level: each row's level (all 0).
        """
        return self.model.energy(x)


class RecoverySampler:
    """Samples of a trained noise-conditional energy, level by level from noise.

    Args:
        sigmas: the noise schedule the model was trained with.
        steps: Langevin steps per level.
        step_scale: Langevin step as a fraction of each level's conditional variance.
        candidates: importance-resampled starts per recovery (:func:`recover`).
        adjusted: Metropolis-adjusted steps (:func:`recover`).
    """

    def __init__(
        self,
        sigmas,
        steps: int = 30,
        step_scale: float = 0.1,
        candidates: int = 1,
        adjusted: bool = False,
    ) -> None:
        self.sigmas = check_schedule(sigmas)
        self.steps = _checks.positive_int("steps", steps)
        self.step_scale = _checks.positive("step_scale", step_scale)
        self.candidates = _checks.positive_int("candidates", candidates)
        self.adjusted = bool(adjusted)

    def sample(
        self,
        model,
        n: int,
        *,
        generator: torch.Generator | int | None = None,
        return_levels: bool = False,
    ) -> torch.Tensor:
        """``n`` draws at the data level (or, with ``return_levels``, the draws of every
        level, (T + 1, n, dim), level T first), starting from N(0, I) at level T.

        Args:
            model: the noise-conditional energy, with ``energy_at(x, level)``.
            n: the number of draws.
            generator: source of randomness, a ``torch.Generator`` on the data's device
                (``None``: the global one).
            return_levels: also return every level's draws.
        """
        _checks.positive_int("n", n)
        if getattr(model, "n_levels", None) != len(self.sigmas):
            raise ArgumentError(f"model must have {len(self.sigmas)} noise levels, one per sigma")
        device = next(model.parameters()).device
        gen = _checks.generator("generator", generator, device)
        x = torch.randn(n, model.dim, generator=gen, device=device)
        levels = [x]
        for t in reversed(range(len(self.sigmas))):
            level = torch.full((n,), t, device=device, dtype=torch.long)
            x = recover(
                model, x, level, self.sigmas, self.steps, self.step_scale, gen,
                candidates=self.candidates, adjusted=self.adjusted,
            )  # fmt: skip
            levels.append(x)
        return torch.stack(levels) if return_levels else x
