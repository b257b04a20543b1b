"""Noise-contrastive estimation (Gutmann & Hyvarinen 2010).

The model log p(x) = -E(x) - c has a learnable log-normaliser c. A logistic
classifier with logit G(x) = log p(x) - log q(x) - log nu separates the data from
nu times as many samples of a known noise density q; at the optimum the model is the
data density and c its log partition function: NCE estimates log Z as a by-product.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch.nn import functional as F

from ebmlab import _checks
from ebmlab.devices import widen
from ebmlab.energies.base import EnergyLike, as_energy_fn


def nce_loss(
    energy: EnergyLike,
    log_normalizer: torch.Tensor,
    x_data: torch.Tensor,
    x_noise: torch.Tensor,
    noise_log_prob: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[torch.Tensor, dict[str, float]]:
    """-mean log sigmoid(G(data)) - nu mean log sigmoid(-G(noise)), nu = |noise| / |data|.

    ``noise_log_prob`` maps samples to log q(x) (e.g. a Gaussian's ``log_prob``);
    ``log_normalizer`` is the learnable scalar c.

    Args:
        energy: the unnormalised model E, (B, ...) -> (B,).
        x_data: training examples (B, ...).
        x_noise: samples of the noise distribution q, x_data's event shape.
    """
    _checks.tensor("x_data", x_data, min_ndim=2, floating=True, finite=True)
    _checks.tensor("x_noise", x_noise, min_ndim=2, floating=True, finite=True)
    _checks.tensor("log_normalizer", log_normalizer, ndim=0, floating=True, finite=True)
    _checks.callable_("noise_log_prob", noise_log_prob)
    fn = as_energy_fn(energy)
    nu = x_noise.shape[0] / x_data.shape[0]

    def logit(x: torch.Tensor) -> torch.Tensor:
        return -fn(x) - log_normalizer - noise_log_prob(x) - math.log(nu)

    g_data, g_noise = logit(x_data), logit(x_noise)
    loss = -F.logsigmoid(g_data).mean() - nu * F.logsigmoid(-g_noise).mean()
    accuracy = 0.5 * float(widen(g_data > 0).mean() + widen(g_noise < 0).mean())
    return loss, {"classifier_accuracy": accuracy, "log_z": float(log_normalizer.detach())}
