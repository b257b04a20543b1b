"""Boltzmann machines and restricted Boltzmann machines (seed 002, section 6.5).

Boltzmann machine (eq. 6.32): E(x) = -(x^T W x + b^T x), x in {0, 1}^D, with W
symmetric and zero on the diagonal; each pair (i, j) therefore enters twice and
p(x_i = 1 | x_-i) = sigmoid(2 W_i. x + b_i).

Bernoulli RBM (eqs. 6.33-6.39): E(v, h) = -v^T W h - b^T v - c^T h with W (D x M),
visible bias b and hidden bias c; summing h out gives the free energy
F(v) = -b^T v - sum_j softplus(c_j + v^T W_.j) (eq. 6.37), which is the energy of
the visible marginal, and the conditionals factorise:
p(h_j = 1 | v) = sigmoid(c_j + v^T W_.j), p(v_i = 1 | h) = sigmoid(b_i + W_i. h).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ebmlab import _checks
from ebmlab.energies.base import EnergyModel


def _bernoulli(logits: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    u = torch.rand(logits.shape, generator=generator, dtype=logits.dtype)
    return (u < torch.sigmoid(logits)).to(logits.dtype)


class BoltzmannMachine(EnergyModel):
    """Fully visible Boltzmann machine on {0, 1}^D (eq. 6.32).

    The free parameter ``weight`` is a D x D matrix whose strict upper triangle
    defines the symmetric, zero-diagonal coupling matrix ``W``.
    """

    def __init__(self, n_visible: int, init_std: float = 0.01) -> None:
        super().__init__()
        self.n_visible = _checks.positive_int("n_visible", n_visible)
        _checks.positive("init_std", init_std, allow_zero=True)
        self.weight = nn.Parameter(torch.randn(n_visible, n_visible) * init_std)
        self.b = nn.Parameter(torch.zeros(n_visible))

    @property
    def W(self) -> torch.Tensor:
        upper = torch.triu(self.weight, diagonal=1)
        return upper + upper.T

    def energy(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        return -((x @ self.W) * x).sum(1) - x @ self.b

    def site_logits(self, x: torch.Tensor, i: int) -> torch.Tensor:
        """log-odds of x_i = 1 given the other units: 2 W_i. x + b_i (W_ii = 0)."""
        return 2 * (x.flatten(1) @ self.W[:, i]) + self.b[i]


class BernoulliRBM(EnergyModel):
    """Restricted Boltzmann machine with binary visible and hidden units (eqs. 6.33-6.39).

    ``energy(v)`` is the free energy F(v) (eq. 6.37); ``energy(v, h)`` the joint energy.
    """

    def __init__(self, n_visible: int, n_hidden: int, init_std: float = 0.01) -> None:
        super().__init__()
        self.n_visible = _checks.positive_int("n_visible", n_visible)
        self.n_hidden = _checks.positive_int("n_hidden", n_hidden)
        _checks.positive("init_std", init_std, allow_zero=True)
        self.W = nn.Parameter(torch.randn(n_visible, n_hidden) * init_std)
        self.b = nn.Parameter(torch.zeros(n_visible))
        self.c = nn.Parameter(torch.zeros(n_hidden))

    def joint_energy(self, v: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """E(v, h) = -v^T W h - b^T v - c^T h (eq. 6.33)."""
        v = v.flatten(1)
        return -((v @ self.W) * h).sum(1) - v @ self.b - h @ self.c

    def energy(self, v: torch.Tensor, h: torch.Tensor | None = None) -> torch.Tensor:
        if h is not None:
            return self.joint_energy(v, h)
        return self.free_energy(v)

    def forward(self, v: torch.Tensor, h: torch.Tensor | None = None) -> torch.Tensor:
        return self.energy(v, h)

    def hidden_logits(self, v: torch.Tensor) -> torch.Tensor:
        """c + v^T W, the log-odds of p(h = 1 | v) (eq. 6.38)."""
        return F.linear(v.flatten(1), self.W.T, self.c)

    def visible_logits(self, h: torch.Tensor) -> torch.Tensor:
        """b + W h, the log-odds of p(v = 1 | h) (eq. 6.39)."""
        return F.linear(h, self.W, self.b)

    def free_energy_from_logits(self, v: torch.Tensor, hidden_logits: torch.Tensor) -> torch.Tensor:
        """F(v) given the already computed hidden logits c + v^T W."""
        return -(v.flatten(1) @ self.b) - F.softplus(hidden_logits).sum(1)

    def free_energy(self, v: torch.Tensor) -> torch.Tensor:
        """F(v) = -b^T v - sum_j softplus(c_j + v^T W_.j) (eq. 6.37)."""
        return self.free_energy_from_logits(v, self.hidden_logits(v))

    def hidden_probs(self, v: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.hidden_logits(v))

    def visible_probs(self, h: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.visible_logits(h))

    def sample_hidden(
        self, v: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        return _bernoulli(self.hidden_logits(v), generator)

    def sample_visible(
        self, h: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        return _bernoulli(self.visible_logits(h), generator)

    def gibbs(
        self, v: torch.Tensor, k: int = 1, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """k steps of block Gibbs sampling v -> h -> v (k = 0 returns v)."""
        _checks.positive_int("k", k, allow_zero=True)
        with torch.no_grad():
            for _ in range(k):
                v = self.sample_visible(self.sample_hidden(v, generator), generator)
        return v
