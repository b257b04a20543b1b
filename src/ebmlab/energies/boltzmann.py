"""Boltzmann machines and restricted Boltzmann machines (Tomczak 2024, section 6.5).

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

import math

import torch
from torch import nn
from torch.nn import functional as F

from ebmlab import _checks, hardware
from ebmlab._checks import ArgumentError
from ebmlab.devices import widen
from ebmlab.energies.analytic import DiagonalGaussian
from ebmlab.energies.base import EnergyModel


def base_rate_logits(x: torch.Tensor, smoothing: float = 0.0) -> torch.Tensor:
    """Visible biases of the independent-unit model fitted to binary (or [0, 1]) rows
    ``x`` (N, D), in float64 (float32 on a device without it): the log-odds of the
    column means (summed in x's dtype, exact for 0/1 float32 rows). Without ``smoothing``
    the means are clamped to [1e-3, 1 - 1e-3] (the usual starting biases of an RBM,
    Hinton 2012, §8); with it,
    ``smoothing`` pseudo-counts join each unit's on and off counts (AIS's base-rate
    model, Salakhutdinov & Murray 2008)."""
    mean = widen(x.mean(0))
    if smoothing:
        return torch.logit((mean * len(x) + smoothing) / (len(x) + 2 * smoothing))
    return torch.logit(mean.clamp(1e-3, 1 - 1e-3))


def bernoulli_draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """0/1 draws with the given probabilities, in their dtype.

    Float32 and float64 probabilities are compared with float32 (or float64) uniforms.
    For 16-bit probabilities (bfloat16 products) the uniforms are (k + 1/2) / 2^16, four
    cut from each 64-bit random word, a quarter of the generator's work: a draw's
    probability is then p rounded to a multiple of 2^-16, an error of at most 2^-17,
    below bfloat16's own rounding of any p above 2^-9.

    Args:
        probs: predicted class probabilities, (N, K).
    """
    out = torch.empty_like(probs)  # comparing into the output dtype skips a bool copy
    if probs.dtype.itemsize == 2:
        words = torch.empty((probs.numel() + 3) // 4, dtype=torch.int64, device=probs.device)
        words.random_(-(2**63), None, generator=generator)
        k = words.view(torch.int16)[: probs.numel()].view(probs.shape)  # k - 2^15, uniform
        return torch.lt(k, probs.float().mul_(2.0**16).sub_(2.0**15 + 0.5), out=out)
    u = torch.rand(probs.shape, generator=generator, dtype=probs.dtype, device=probs.device)
    return torch.lt(u, probs, out=out)


def gaussian_draw(
    mean: torch.Tensor, std: torch.Tensor, generator: torch.Generator | None
) -> torch.Tensor:
    """A draw of N(mean, std^2) per entry, in mean's dtype and on its device.

    Args:
        generator: source of randomness, a ``torch.Generator`` on the data's device
            (``None``: the global one).
    """
    noise = torch.randn(mean.shape, generator=generator, dtype=mean.dtype, device=mean.device)
    return mean + std * noise


def register_log_sigma(module: nn.Module, n_units: int, sigma: float, learn: bool) -> None:
    """Give ``module`` a ``log_sigma`` of ``n_units`` entries at log(sigma) for Gaussian
    units: a parameter when ``learn``, else a buffer (saved with the model, not trained)."""
    _checks.positive("sigma", sigma)
    log_sigma = torch.full((n_units,), math.log(sigma))
    if learn:
        module.log_sigma = nn.Parameter(log_sigma)
    else:
        module.register_buffer("log_sigma", log_sigma)


# The most units whose 2^n states are enumerated where a sum or a maximum is wanted
# without being asked (log Z under method="auto", exact MAP, exact DBM quantities):
# about a second on a CPU.
ENUMERATION_LIMIT = 20


def bernoulli_entropy(m: torch.Tensor) -> torch.Tensor:
    """S(m) = -sum_i [m_i log m_i + (1 - m_i) log(1 - m_i)] of independent Bernoulli units
    with means m (..., n): (...). The means are kept a machine epsilon inside (0, 1),
    which 1 - eps still resolves in float32, so that the gradient stays finite."""
    eps = torch.finfo(m.dtype).eps
    m = m.clamp(eps, 1 - eps)
    return -(m * m.log() + (1 - m) * (1 - m).log()).sum(-1)


def binary_states(
    n_bits: int,
    start: int = 0,
    stop: int | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Rows ``start..stop`` of all 2^n_bits binary vectors, as float (N, n_bits), bit 0
    first, on ``device``."""
    _checks.positive_int("n_bits", n_bits)
    stop = 2**n_bits if stop is None else stop
    codes = torch.arange(start, stop, dtype=torch.long, device=device)
    return ((codes[:, None] >> torch.arange(n_bits, device=device)) & 1).float()


class BoltzmannMachine(EnergyModel):
    """Fully visible Boltzmann machine on {0, 1}^D (eq. 6.32).

    The free parameter ``weight`` is a D x D matrix whose strict upper triangle
    defines the symmetric, zero-diagonal coupling matrix ``W``.

    Args:
        n_visible: number of visible units.
        init_std: standard deviation of the Gaussian initial weights.
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
        """E(x) = -x^T W x - b^T x of binary rows ``x`` (B, D) -> (B,) (Tomczak 2024, eq.
        6.32)."""
        x = x.flatten(1)
        return -((x @ self.W) * x).sum(1) - x @ self.b

    def energy_and_grad(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """E(x) and grad E(x) = -(2 W x + b) from one product x W (autograd takes two).
        On binary x the gradient's entries give the exact energy change of flipping each
        unit, (1 - 2 x_i) grad_i, as E is linear in every unit (W has a zero diagonal)."""
        flat = x.flatten(1)
        with torch.no_grad():
            field = hardware.matmul(flat, self.W)
            energy = -(field * flat).sum(1) - flat @ self.b
            return energy, (-2 * field - self.b).view_as(x)

    def couplings(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(W, b) of E(x) = -x^T W x - b^T x, detached: what single-site Gibbs needs
        (the log-odds of x_i = 1 given the other units are 2 W_i . x + b_i)."""
        return self.W.detach(), self.b.detach()


class _RBM(EnergyModel):
    """What every two-layer RBM with binary hidden units shares.

    Subclasses define ``hidden_logits(v)``, ``joint_energy(v, h)``, the free energy
    given the hidden logits, ``visible_mean(h)`` = E[v | h] and ``sample_visible(h)``;
    ``energy(v)`` is the free energy F(v) and ``energy(v, h)`` the joint energy. The
    parameters are a dense weight matrix W (D x M) and biases b (D) and c (M) unless a
    subclass lays them out otherwise in ``init_parameters``.
    """

    def __init__(self, n_visible: int, n_hidden: int, init_std: float) -> None:
        super().__init__()
        self.n_visible = _checks.positive_int("n_visible", n_visible)
        self.n_hidden = _checks.positive_int("n_hidden", n_hidden)
        self.init_parameters(_checks.positive("init_std", init_std, allow_zero=True))

    def init_parameters(self, init_std: float) -> None:
        """Create W (D x M) with N(0, init_std^2) entries, and zero biases b and c."""
        self.W = nn.Parameter(torch.randn(self.n_visible, self.n_hidden) * init_std)
        self.b = nn.Parameter(torch.zeros(self.n_visible))
        self.c = nn.Parameter(torch.zeros(self.n_hidden))

    @classmethod
    def from_parameters(cls, W: torch.Tensor, b: torch.Tensor, c: torch.Tensor):
        """An RBM of this class built as ``cls(D, M)`` (a Bernoulli RBM, or a
        Gaussian-Bernoulli one with sigma = 1) holding copies of W (D x M), b and c,
        detached, on W's device and in its dtype."""
        rbm = cls(*W.shape).to(W)
        with torch.no_grad():
            for param, value in ((rbm.W, W), (rbm.b, b), (rbm.c, c)):
                param.copy_(value)
        return rbm

    def energy(self, v: torch.Tensor, h: torch.Tensor | None = None) -> torch.Tensor:
        if h is not None:
            return self.joint_energy(v, h)
        return self.free_energy(v)

    def free_energy(self, v: torch.Tensor) -> torch.Tensor:
        return self.free_energy_from_logits(v, self.hidden_logits(v))

    def hidden_probs(self, v: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.hidden_logits(v))

    def reconstruction(self, v: torch.Tensor) -> torch.Tensor:
        """Mean-field reconstruction E[v' | h = p(h | v)]."""
        return self.visible_mean(self.hidden_probs(v))

    def sample_hidden(
        self, v: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        return bernoulli_draw(torch.sigmoid(self.hidden_logits(v)), generator)

    def gibbs(
        self, v: torch.Tensor, k: int = 1, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """k steps of block Gibbs sampling v -> h -> v (k = 0 returns v)."""
        _checks.positive_int("k", k, allow_zero=True)
        with torch.no_grad():
            for _ in range(k):
                v = self.sample_visible(self.sample_hidden(v, generator), generator)
        return v


class BernoulliRBM(_RBM):
    """Restricted Boltzmann machine with binary visible and hidden units (eqs. 6.33-6.39).

    ``energy(v)`` is the free energy F(v) (eq. 6.37); ``energy(v, h)`` the joint energy.

    Args:
        n_visible: number of visible units.
        n_hidden: number of hidden units.
        init_std: standard deviation of the Gaussian initial weights.
    """

    def __init__(self, n_visible: int, n_hidden: int, init_std: float = 0.01) -> None:
        super().__init__(n_visible, n_hidden, init_std)

    def joint_energy(self, v: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """E(v, h) = -v^T W h - b^T v - c^T h (eq. 6.33)."""
        v = v.flatten(1)
        return -((v @ self.W) * h).sum(1) - v @ self.b - h @ self.c

    def hidden_logits(self, v: torch.Tensor) -> torch.Tensor:
        """c + v^T W, the log-odds of p(h = 1 | v) (eq. 6.38)."""
        return hardware.matmul(_checks.rows_of("v", v, self.W.shape[0]).flatten(1), self.W, self.c)

    def visible_logits(self, h: torch.Tensor) -> torch.Tensor:
        """b + W h, the log-odds of p(v = 1 | h) (eq. 6.39)."""
        return hardware.matmul(h, self.W.T, self.b)

    def free_energy_from_logits(self, v: torch.Tensor, hidden_logits: torch.Tensor) -> torch.Tensor:
        """F(v) = -b^T v - sum_j softplus(c_j + v^T W_.j) (eq. 6.37), given c + v^T W.

        Args:
            hidden_logits: the hidden units' total inputs c + W^T v (B, n_hidden), already
                computed.
        """
        return -(v.flatten(1) @ self.b) - F.softplus(hidden_logits).sum(1)

    def energy_and_grad(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """F(x) and grad F(x) = -b - W sigmoid(c + W^T x) from two products, one for the
        hidden logits and one back through W (autograd takes three); with ``grad_dtype``
        set, autograd in that precision. What the gradient samplers (Gibbs-with-Gradients,
        DMALA) call at every step."""
        if self.grad_dtype is not None:
            return super().energy_and_grad(x)
        flat = x.flatten(1)
        with torch.no_grad():
            logits = self.hidden_logits(flat)
            energy = self.free_energy_from_logits(flat, logits)
            grad = -self.b - hardware.matmul(torch.sigmoid(logits), self.W.T)
        return energy, grad.view_as(x)

    def visible_probs(self, h: torch.Tensor) -> torch.Tensor:
        """p(v_i = 1 | h) = sigmoid(b + W h) for hidden states ``h`` (B, M) -> (B, D)."""
        return torch.sigmoid(self.visible_logits(h))

    def visible_mean(self, h: torch.Tensor) -> torch.Tensor:
        """E[v | h]: the visible probabilities (per softmax group for categorical units)."""
        return self.visible_probs(h)

    def sample_visible(
        self, h: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """A draw of v ~ p(v | h) for hidden states ``h`` (B, M) -> (B, D).

        Args:
            generator: source of randomness, a ``torch.Generator`` on the data's device
                (``None``: the global one).
        """
        return self.sample_visible_from_logits(self.visible_logits(h), generator)

    def sample_visible_from_logits(
        self, logits: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """v ~ p(v | h) given the visible logits b + W h.

        Args:
            generator: source of randomness, a ``torch.Generator`` on the data's device
                (``None``: the global one).
        """
        return bernoulli_draw(torch.sigmoid(logits), generator)


class CategoricalRBM(BernoulliRBM):
    """RBM whose visible layer is ``n_groups`` softmax units of ``n_categories`` states each
    (Salakhutdinov, Mnih & Hinton 2007), one-hot encoded as v of length G * C.

    The energy and free energy are the Bernoulli RBM's over valid one-hot vectors; the
    visible conditional is a softmax within each group: p(v_g = k | h) = softmax_k(b + W h)_g.

    Args:
        n_hidden: number of hidden units.
        init_std: standard deviation of the Gaussian initial weights.
    """

    def __init__(self, n_groups: int, n_categories: int, n_hidden: int, init_std: float = 0.01):
        self.n_groups = _checks.positive_int("n_groups", n_groups)
        self.n_categories = _checks.positive_int("n_categories", n_categories)
        super().__init__(n_groups * n_categories, n_hidden, init_std)

    def _grouped(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.view(-1, self.n_groups, self.n_categories)

    def visible_probs(self, h: torch.Tensor) -> torch.Tensor:
        """Per-group softmax probabilities of the visible categories given ``h`` (B, M) -> (B,
        D)."""
        return torch.softmax(self._grouped(self.visible_logits(h)), 2).flatten(1)

    def sample_visible_from_logits(
        self, logits: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        wide = logits.to(torch.promote_types(logits.dtype, torch.float32))
        probs = torch.softmax(self._grouped(wide), 2).reshape(-1, self.n_categories)
        idx = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        return F.one_hot(idx, self.n_categories).to(logits.dtype).view(logits.shape[0], -1)


class GaussianBernoulliRBM(_RBM):
    """RBM with real-valued visible units (Hinton & Salakhutdinov 2006; Cho et al. 2011).

    E(v, h) = sum_i (v_i - b_i)^2 / (2 sigma_i^2) - c^T h - sum_ij (v_i / sigma_i) W_ij h_j, so
    p(h_j = 1 | v) = sigmoid(c_j + (v / sigma)^T W_.j) and
    p(v | h) = N(b + sigma * (W h), diag(sigma^2)); summing h out gives the free energy
    F(v) = sum_i (v_i - b_i)^2 / (2 sigma_i^2) - sum_j softplus(c_j + (v / sigma)^T W_.j).
    ``learn_sigma`` makes log sigma a parameter; otherwise sigma stays at ``sigma``.

    Args:
        n_visible: number of visible units.
        n_hidden: number of hidden units.
        init_std: standard deviation of the Gaussian initial weights.
    """

    def __init__(
        self,
        n_visible: int,
        n_hidden: int,
        sigma: float = 1.0,
        learn_sigma: bool = False,
        init_std: float = 0.01,
    ) -> None:
        super().__init__(n_visible, n_hidden, init_std)
        register_log_sigma(self, n_visible, sigma, learn_sigma)

    @property
    def sigma(self) -> torch.Tensor:
        return self.log_sigma.exp()

    def _quadratic(self, v: torch.Tensor) -> torch.Tensor:
        return (((v.flatten(1) - self.b) / self.sigma) ** 2).sum(1) / 2

    def hidden_logits(self, v: torch.Tensor) -> torch.Tensor:
        """c + W^T (v / sigma), the log-odds of p(h = 1 | v): (B, D) -> (B, M)."""
        return hardware.matmul(v.flatten(1) / self.sigma, self.W, self.c)

    def joint_energy(self, v: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """E(v, h) = |v - b|^2 / (2 sigma^2) - c^T h - (v / sigma)^T W h: (B, D), (B, M) -> (B,)."""
        scaled = v.flatten(1) / self.sigma
        return self._quadratic(v) - h @ self.c - (scaled @ self.W * h).sum(1)

    def free_energy_from_logits(self, v: torch.Tensor, hidden_logits: torch.Tensor) -> torch.Tensor:
        """F(v) given the hidden logits already computed for v: (B, D), (B, M) -> (B,).

        Args:
            hidden_logits: the hidden units' total inputs c + W^T v (B, n_hidden), already
                computed.
        """
        return self._quadratic(v) - F.softplus(hidden_logits).sum(1)

    def visible_mean(self, h: torch.Tensor) -> torch.Tensor:
        """E[v | h] = b + sigma * (W h)."""
        return self.b + self.sigma * hardware.matmul(h, self.W.T)

    def sample_visible(
        self, h: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """A draw of v ~ N(b + sigma W h, diag(sigma^2)) for hidden states ``h`` (B, M) -> (B,
        D).

        Args:
            generator: source of randomness, a ``torch.Generator`` on the data's device
                (``None``: the global one).
        """
        return gaussian_draw(self.visible_mean(h), self.sigma, generator)

    def base_density(self) -> DiagonalGaussian:
        """N(b, diag(sigma^2)), detached: the model without weights, which annealed
        importance sampling starts from."""
        return DiagonalGaussian(self.b.detach().clone(), self.sigma.detach().clone())


class SubspaceRBM(EnergyModel):
    """Subspace RBM (Tomczak & Gonczarek 2017; Tomczak 2024, eqs. 6.44-6.47).

    Binary visible x (D), gate units h (M) and subspace units S (M x K) with energy
    E(x, h, S) = -sum_ijk W_ijk x_i h_j s_jk - b^T x - c^T h - sum_j h_j sum_k D_jk s_jk.
    A closed gate (h_j = 0) leaves its K subspace units free (factor 2^K); an open one
    contributes exp(c_j) prod_k (1 + exp(a_jk)), a_jk = sum_i W_ijk x_i + D_jk. Hence

        F(x) = -b^T x - sum_j [K log 2 + softplus(c_j - K log 2 + sum_k softplus(a_jk))],
        p(h_j = 1 | x) = sigmoid(-K log 2 + c_j + sum_k softplus(a_jk))      (6.47)
        p(s_jk = 1 | x, h_j) = sigmoid(h_j (sum_i W_ijk x_i + D_jk))         (6.46)
        p(x_i = 1 | h, S) = sigmoid(sum_jk W_ijk h_j s_jk + b_i)             (6.45)

    The -K log 2 term penalises opening a gate in proportion to its subspace size.

    Args:
        n_visible: number of visible units.
        n_gates: M, the gate units.
        n_subspace: K, the subspace units per gate.
        init_std: standard deviation of the Gaussian initial weights.
    """

    def __init__(
        self, n_visible: int, n_gates: int, n_subspace: int, init_std: float = 0.01
    ) -> None:
        super().__init__()
        self.n_visible = _checks.positive_int("n_visible", n_visible)
        self.n_gates = _checks.positive_int("n_gates", n_gates)
        self.n_subspace = _checks.positive_int("n_subspace", n_subspace)
        _checks.positive("init_std", init_std, allow_zero=True)
        self.W = nn.Parameter(torch.randn(n_visible, n_gates, n_subspace) * init_std)
        self.b = nn.Parameter(torch.zeros(n_visible))
        self.c = nn.Parameter(torch.zeros(n_gates))
        self.D = nn.Parameter(torch.zeros(n_gates, n_subspace))

    def subspace_inputs(self, x: torch.Tensor) -> torch.Tensor:
        """a_jk = sum_i W_ijk x_i + D_jk, shape (B, M, K).

        Args:
            x: visible rows (B, D).
        """
        return torch.einsum("bi,ijk->bjk", x.flatten(1), self.W) + self.D

    def gate_logits(self, x: torch.Tensor) -> torch.Tensor:
        """log-odds of p(h_j = 1 | x) (6.47)."""
        k_log2 = self.n_subspace * math.log(2.0)
        return -k_log2 + self.c + F.softplus(self.subspace_inputs(x)).sum(2)

    def hidden_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The gates' log-odds, as for the other RBMs: the gates are the hidden units that
        switch their subspaces on, (B, D) -> (B, n_gates).

        Args:
            x: visible rows (B, D).
        """
        return self.gate_logits(x)

    def free_energy(self, x: torch.Tensor) -> torch.Tensor:
        """F(x) with gates and subspace units summed out (Tomczak 2024, eq. 6.45): (B, D) ->
        (B,)."""
        k_log2 = self.n_subspace * math.log(2.0)
        return -(x.flatten(1) @ self.b) - (k_log2 + F.softplus(self.gate_logits(x))).sum(1)

    def joint_energy(self, x: torch.Tensor, h: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """E(x, h, S) (6.44) for h (B, M) and S (B, M, K).

        Args:
            s: the subspace units S (B, M, K).
        """
        x = x.flatten(1)
        hs = h[:, :, None] * s
        return (
            -torch.einsum("bi,ijk,bjk->b", x, self.W, hs)
            - x @ self.b
            - h @ self.c
            - (hs * self.D).sum((1, 2))
        )

    def energy(
        self, x: torch.Tensor, h: torch.Tensor | None = None, s: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The free energy F(x): (B, D) -> (B,).

        Args:
            h: not used: the gates are summed out.
            s: not used: the subspace units are summed out.
        """
        if h is None:
            return self.free_energy(x)
        return self.joint_energy(x, h, s)

    def gate_probs(self, x: torch.Tensor) -> torch.Tensor:
        """p(h_j = 1 | x) of the gates (Tomczak 2024, eq. 6.46): (B, D) -> (B, n_gates)."""
        return torch.sigmoid(self.gate_logits(x))

    def subspace_logits(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """log-odds of p(s_jk = 1 | x, h_j) = h_j a_jk (6.46), shape (B, M, K).

        Args:
            h: the gates (B, M).
        """
        return h[:, :, None] * self.subspace_inputs(x)

    def visible_logits(self, h: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """log-odds of p(x_i = 1 | h, S) = sum_jk W_ijk h_j s_jk + b_i (6.45).

        Args:
            s: the subspace units (B, M, K).
        """
        return torch.einsum("ijk,bjk->bi", self.W, h[:, :, None] * s) + self.b

    def reconstruction(self, x: torch.Tensor) -> torch.Tensor:
        """Mean-field reconstruction p(x' = 1 | E[h_j s_jk | x]), with
        E[h_j s_jk | x] = p(h_j = 1 | x) sigmoid(a_jk) from (6.46)-(6.47)."""
        on = self.gate_probs(x)[:, :, None] * torch.sigmoid(self.subspace_inputs(x))
        return torch.sigmoid(torch.einsum("ijk,bjk->bi", self.W, on) + self.b)

    def gibbs(
        self, x: torch.Tensor, k: int = 1, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """k sweeps h ~ p(h | x), S ~ p(S | x, h), x ~ p(x | h, S).

        Args:
            generator: source of randomness, a ``torch.Generator`` on the data's device
                (``None``: the global one).
        """
        _checks.positive_int("k", k, allow_zero=True)
        with torch.no_grad():
            for _ in range(k):
                h = bernoulli_draw(torch.sigmoid(self.gate_logits(x)), generator)
                s = bernoulli_draw(torch.sigmoid(self.subspace_logits(x, h)), generator)
                x = bernoulli_draw(torch.sigmoid(self.visible_logits(h, s)), generator)
        return x


class ClassificationRBM(EnergyModel):
    """RBM over inputs x and a one-hot label y (Larochelle & Bengio 2008).

    E(x, y, h) = -b^T x - c^T h - d_y - x^T W h - U_y. h with U (K x M). Summing h
    out gives F(x, y) = -b^T x - d_y - sum_j softplus(c_j + x^T W_.j + U_yj), and the
    label posterior is exact: p(y | x) = softmax_y(-F(x, y)). ``energy(x, y)`` is
    F(x, y); ``energy(x)`` the marginal -log sum_y exp(-F(x, y)).

    Args:
        n_visible: number of visible units.
        n_hidden: number of hidden units.
        num_classes: number of classes.
        init_std: standard deviation of the Gaussian initial weights.
    """

    def __init__(self, n_visible: int, n_hidden: int, num_classes: int, init_std: float = 0.01):
        super().__init__()
        self.n_visible = _checks.positive_int("n_visible", n_visible)
        self.n_hidden = _checks.positive_int("n_hidden", n_hidden)
        self.num_classes = _checks.positive_int("num_classes", num_classes)
        self.W = nn.Parameter(torch.randn(n_visible, n_hidden) * init_std)
        self.U = nn.Parameter(torch.randn(num_classes, n_hidden) * init_std)
        self.b = nn.Parameter(torch.zeros(n_visible))
        self.c = nn.Parameter(torch.zeros(n_hidden))
        self.d = nn.Parameter(torch.zeros(num_classes))

    def class_scores(self, x: torch.Tensor) -> torch.Tensor:
        """-F(x, y) + b^T x for every label: d_y + sum_j softplus(c_j + x W_.j + U_yj), (B, K)."""
        a = F.linear(x.flatten(1), self.W.T, self.c)  # (B, M)
        return self.d + F.softplus(a[:, None, :] + self.U[None]).sum(2)

    def free_energy(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """F(x, y) with the hidden units summed out, (B, D) and (B,) -> (B,); without ``y`` the free
        energy of x alone, -log sum_y exp(-F(x, y))."""
        scores = self.class_scores(x).gather(1, y.long().view(-1, 1)).squeeze(1)
        return -(x.flatten(1) @ self.b) - scores

    def energy(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """The free energy of the inputs, -log sum_y exp(-F(x, y)): (B, D) -> (B,)."""
        if y is not None:
            return self.free_energy(x, y)
        return -(x.flatten(1) @ self.b) - torch.logsumexp(self.class_scores(x), 1)

    def label_rbm(self, y: int) -> BernoulliRBM:
        """The Bernoulli RBM over x with the label clamped to ``y`` (hidden biases
        c + U_y); its free energy is F(x, y) + d_y. A detached copy."""
        return BernoulliRBM.from_parameters(self.W, self.b, self.c + self.U[y])

    def predict_proba(self, x: torch.Tensor) -> torch.Tensor:
        """Exact p(y | x) = softmax_y(-F(x, y))."""
        return torch.softmax(self.class_scores(x), 1)

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """The most probable label argmax_y p(y | x) of each row, (B, D) -> (B,)."""
        return self.class_scores(x).argmax(1)

    def gibbs(
        self, x: torch.Tensor, y: torch.Tensor, k: int = 1, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """k steps of h ~ p(h | x, y), then x ~ p(x | h) and y ~ p(y | h).

        Args:
            generator: source of randomness, a ``torch.Generator`` on the data's device
                (``None``: the global one).
        """
        _checks.positive_int("k", k, allow_zero=True)
        with torch.no_grad():
            for _ in range(k):
                h = bernoulli_draw(
                    torch.sigmoid(F.linear(x.flatten(1), self.W.T, self.c) + self.U[y.long()]),
                    generator,
                )
                x = bernoulli_draw(torch.sigmoid(F.linear(h, self.W, self.b)), generator).view_as(x)
                y = torch.multinomial(
                    torch.softmax(F.linear(h, self.U, self.d), 1), 1, generator=generator
                ).squeeze(1)
        return x, y


class DeepBoltzmannMachine(EnergyModel):
    """Two-hidden-layer Boltzmann machine (Salakhutdinov & Hinton 2009).

    E(v, h1, h2) = -v^T W1 h1 - h1^T W2 h2 - b^T v - c1^T h1 - c2^T h2. Given h1, the
    visible and top layers are independent, so summing them out leaves an enumeration
    over h1 alone: the exact free energy and log Z are available while h1 has at most
    20 units. Inference uses the mean-field fixed point of q(h1) q(h2) given v.

    Args:
        n_visible: number of visible units.
        n_hidden1: units of the first hidden layer.
        n_hidden2: units of the second hidden layer.
        init_std: standard deviation of the Gaussian initial weights.
    """

    def __init__(self, n_visible: int, n_hidden1: int, n_hidden2: int, init_std: float = 0.01):
        super().__init__()
        self.n_visible = _checks.positive_int("n_visible", n_visible)
        self.n_hidden1 = _checks.positive_int("n_hidden1", n_hidden1)
        self.n_hidden2 = _checks.positive_int("n_hidden2", n_hidden2)
        self.W1 = nn.Parameter(torch.randn(n_visible, n_hidden1) * init_std)
        self.W2 = nn.Parameter(torch.randn(n_hidden1, n_hidden2) * init_std)
        self.b = nn.Parameter(torch.zeros(n_visible))
        self.c1 = nn.Parameter(torch.zeros(n_hidden1))
        self.c2 = nn.Parameter(torch.zeros(n_hidden2))

    def joint_energy(self, v: torch.Tensor, h1: torch.Tensor, h2: torch.Tensor) -> torch.Tensor:
        """E(v, h1, h2) of full configurations, each (B, layer width) -> (B,)."""
        v = v.flatten(1)
        return (
            -((v @ self.W1) * h1).sum(1)
            - ((h1 @ self.W2) * h2).sum(1)
            - v @ self.b
            - h1 @ self.c1
            - h2 @ self.c2
        )

    def _h1_states(self) -> torch.Tensor:
        if not self.enumerable:
            raise ArgumentError(
                f"exact DBM quantities enumerate h1; it must have <= {ENUMERATION_LIMIT} units, "
                f"got {self.n_hidden1}"
            )
        return binary_states(self.n_hidden1, device=self.W1.device).to(self.W1.dtype)

    def free_energy(self, v: torch.Tensor) -> torch.Tensor:
        """F(v) = -log sum_{h1, h2} exp(-E(v, h1, h2)), exact by enumerating h1."""
        h1 = self._h1_states()
        v = v.flatten(1)
        terms = (
            v @ self.W1 @ h1.T
            + (h1 @ self.c1)[None]
            + F.softplus(h1 @ self.W2 + self.c2).sum(1)[None]
        )
        return -(v @ self.b) - torch.logsumexp(terms, 1)

    def energy(self, v: torch.Tensor) -> torch.Tensor:
        """The free energy of v with h1 summed out exactly and h2 enumerated: (B, D) -> (B,)."""
        return self.free_energy(v)

    @property
    def enumerable(self) -> bool:
        """Whether h1 is small enough for the exact free energy and log Z."""
        return self.n_hidden1 <= ENUMERATION_LIMIT

    def free_energy_bound(self, v: torch.Tensor, n_iter: int = 10) -> torch.Tensor:
        """The mean-field upper bound on the free energy, F(v) <= E_q[E(v, h1, h2)] - H(q)
        with q(h1) q(h2) the factorised posterior of :meth:`mean_field` (Salakhutdinov &
        Hinton 2009, the bound behind their DBM likelihoods), so that -bound - log Z is
        a lower bound on log p(v) for any number of hidden units; (B, D) -> (B,).

        Args:
            n_iter: fixed-point iterations of the mean field.
        """
        v = v.flatten(1)
        mu1, mu2 = self.mean_field(v, n_iter)
        expected = self.joint_energy(v, mu1, mu2)  # E is linear in each layer's mean
        return expected - bernoulli_entropy(mu1) - bernoulli_entropy(mu2)

    def log_partition(self) -> torch.Tensor:
        """Exact log Z by enumerating h1 (v and h2 summed out analytically)."""
        h1, c1, W1, b, W2, c2 = map(
            widen, (self._h1_states(), self.c1, self.W1, self.b, self.W2, self.c2)
        )
        terms = h1 @ c1 + F.softplus(h1 @ W1.T + b).sum(1) + F.softplus(h1 @ W2 + c2).sum(1)
        return torch.logsumexp(terms, 0)

    def as_rbm(self) -> BernoulliRBM:
        """The same energy as a Bernoulli RBM between h1 and the stacked layer (v, h2).

        The graph v - h1 - h2 is bipartite with h1 on one side, so E(v, h1, h2) is the
        energy of an RBM with visible units (v, h2), hidden units h1, weights
        [W1; W2^T] and biases (b, c2) and c1: same log Z, and every RBM method (exact
        enumeration of the smaller side, AIS, RAISE, Bethe, TRW) applies. The copy is
        detached from this model's parameters.
        """
        return BernoulliRBM.from_parameters(
            torch.cat([self.W1, self.W2.T], 0), torch.cat([self.b, self.c2]), self.c1
        )

    def mean_field(self, v: torch.Tensor, n_iter: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
        """Fixed point of mu1 = sigmoid(c1 + v W1 + W2 mu2), mu2 = sigmoid(c2 + mu1 W2).

        Args:
            n_iter: fixed-point iterations.
        """
        v = v.flatten(1)
        bottom = v @ self.W1 + self.c1
        mu1 = torch.sigmoid(2 * bottom)  # the doubled bottom-up input of a fresh start
        mu2 = torch.sigmoid(mu1 @ self.W2 + self.c2)
        for _ in range(n_iter):
            mu1 = torch.sigmoid(bottom + mu2 @ self.W2.T)
            mu2 = torch.sigmoid(mu1 @ self.W2 + self.c2)
        return mu1, mu2

    def gibbs(
        self,
        v: torch.Tensor,
        h2: torch.Tensor,
        k: int = 1,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """k sweeps: h1 ~ p(h1 | v, h2), then v ~ p(v | h1) and h2 ~ p(h2 | h1).

        Args:
            generator: source of randomness, a ``torch.Generator`` on the data's device
                (``None``: the global one).
        """
        _checks.positive_int("k", k, allow_zero=True)
        h1 = None
        with torch.no_grad():
            for _ in range(k):
                h1 = bernoulli_draw(
                    torch.sigmoid(v.flatten(1) @ self.W1 + h2 @ self.W2.T + self.c1), generator
                )
                v = bernoulli_draw(torch.sigmoid(h1 @ self.W1.T + self.b), generator)
                h2 = bernoulli_draw(torch.sigmoid(h1 @ self.W2 + self.c2), generator)
        return v, h1, h2
