"""Diffusion recovery likelihood (Gao et al. 2021).

Rather than the data density itself, learn the energies E(x, t) of the data blurred
to noise levels t = 0, ..., T - 1, each by maximising the likelihood of recovering
x_t from its next blur x_{t+1}. That conditional density is nearly Gaussian, so
short Langevin runs sample it well, and its log-likelihood gradient is the
contrastive pair

    grad E(x_t, t) at the data  -  grad E(x_t, t) at draws from p(x_t | x_{t+1})

(Gao et al. 2021, eq. 8), estimated here for one random level per data point. Level 0
is the data's own energy.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.energies.mlp import NoiseConditionalEnergy
from ebmlab.samplers.recovery import blur, check_schedule, recover


def diffusion_recovery_likelihood_loss(
    model: NoiseConditionalEnergy,
    x: torch.Tensor,
    sigmas: Sequence[float] | torch.Tensor,
    *,
    langevin_steps: int = 30,
    step_scale: float = 0.1,
    candidates: int = 1,
    adjusted: bool = False,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The recovery-likelihood surrogate mean E(x_t, t) - mean E(x~_t, t) of data ``x``.

    Args:
        model: a :class:`~ebmlab.energies.NoiseConditionalEnergy` with one level per
            noise level.
        x: data (B, D).
        sigmas: the noise schedule sigma_1..sigma_T, each in (0, 1).
        langevin_steps: steps of the conditional sampler
            (:func:`~ebmlab.samplers.recovery.recover`).
        step_scale: its step as a fraction of the conditional variance.
        candidates: importance-resampled starts of the sampler's chains (1: none);
            see :func:`~ebmlab.samplers.recovery.recover`.
        adjusted: Metropolis-adjusted recovery steps (MALA), exact at any step.
        generator: randomness of the noise and of the sampler.

    Returns:
        The loss (a scalar tensor) and metrics.
    """
    _checks.tensor("x", x, ndim=2, floating=True, finite=True)
    sigmas = check_schedule(sigmas)
    if getattr(model, "n_levels", None) != len(sigmas):
        raise ArgumentError(
            f"model must be a NoiseConditionalEnergy with {len(sigmas)} levels (one per "
            f"noise level), got {type(model).__name__} with {getattr(model, 'n_levels', None)}"
        )
    _checks.positive_int("langevin_steps", langevin_steps)
    _checks.positive("step_scale", step_scale)
    _checks.positive_int("candidates", candidates)
    level = torch.randint(len(sigmas), (x.shape[0],), generator=generator, device=x.device)
    x_t, x_next = blur(x, sigmas, level, generator)
    negatives = recover(
        model,
        x_next,
        level,
        sigmas,
        langevin_steps,
        step_scale,
        generator,
        candidates=candidates,
        adjusted=adjusted,
    )
    e_data, e_neg = model.energy_at(x_t, level), model.energy_at(negatives, level)
    loss = e_data.mean() - e_neg.mean()
    return loss, {
        "energy_data": float(e_data.detach().mean()),
        "energy_sample": float(e_neg.detach().mean()),
    }
