"""Spike-and-slab RBM for real-valued data (Courville, Bergstra & Bengio 2011, the µ-ssRBM).

Each hidden unit i pairs a binary spike h_i with a real slab s_i; the visible vector v
(D) is real. With u = v - b (b is a visible offset, zero in the paper, which centres
the data instead) the energy is

    E(v, s, h) = -sum_i u^T W_i s_i h_i + 1/2 u^T (Lambda + sum_i Phi_i h_i) u
                 + 1/2 sum_i alpha_i s_i^2 - sum_i alpha_i mu_i s_i h_i
                 - sum_i c_i h_i + 1/2 sum_i alpha_i mu_i^2 h_i

with diagonal visible precision Lambda, slab precisions alpha_i > 0, slab means mu_i and
diagonal spike penalties Phi_i. Integrating each slab out (a Gaussian integral) leaves

    p(h_i = 1 | v) = sigmoid(a_i(v)),
    a_i(v) = (u^T W_i)^2 / (2 alpha_i) + mu_i u^T W_i - 1/2 u^T Phi_i u + c_i,
    p(s_i | v, h_i) = N(h_i (u^T W_i / alpha_i + mu_i), 1 / alpha_i),
    p(v | s, h) = N(b + C sum_i W_i s_i h_i, C),  C = (Lambda + sum_i Phi_i h_i)^-1,

and the free energy F(v) = 1/2 u^T Lambda u - sum_i softplus(a_i(v))
- 1/2 sum_i log(2 pi / alpha_i). Given h, v is Gaussian with precision
P_h = Lambda + sum_i h_i (Phi_i - W_i W_i^T / alpha_i); the model normalises only if every
P_h is positive definite. The paper restricts v to a ball for this. Here, since every
P_h is at least Lambda - G with G = sum_i W_i W_i^T / alpha_i (Phi_i >= 0), the visible
precision is kept above G's Gershgorin bound,

    Lambda_d = lambda_d + sum_e |G_de|,   lambda_d > 0,

so that Lambda - G is diagonally dominant, every P_h positive definite and log Z finite
by construction, while the slabs still widen v along W_i when their spikes are on (the
covariance the ssRBM models).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from ebmlab import _checks
from ebmlab.energies.analytic import DiagonalGaussian
from ebmlab.energies.boltzmann import _RBM, gaussian_draw


class SpikeSlabRBM(_RBM):
    """µ-ssRBM with real visible units, binary spikes and real slabs (Courville et al. 2011).

    Args:
        n_visible: visible units D.
        n_hidden: spike-and-slab pairs M.
        init_std: standard deviation of the initial weights W (D x M).
        slab_precision: initial alpha_i.
        visible_precision: initial lambda, the part of Lambda free of the weights (1 for
            standardised data).

    Parameters: ``W``, the visible offset ``b``, the spike biases ``c``, the slab means
    ``mu`` and the logarithms ``log_alpha``, ``log_lambda`` (of lambda, the free part of
    Lambda) and ``log_psi`` (of the diagonals of Phi_i, D x M) of the positive
    quantities. ``energy(v)`` is the free energy F(v); ``energy(v, h)`` the
    energy of (v, h) with the slabs integrated out.
    """

    def __init__(
        self,
        n_visible: int,
        n_hidden: int,
        init_std: float = 0.1,
        slab_precision: float = 1.0,
        visible_precision: float = 1.0,
    ) -> None:
        super().__init__(n_visible, n_hidden, init_std)
        _checks.positive("slab_precision", slab_precision)
        _checks.positive("visible_precision", visible_precision)
        self.mu = nn.Parameter(torch.zeros(n_hidden))
        self.log_alpha = nn.Parameter(torch.full((n_hidden,), math.log(slab_precision)))
        self.log_lambda = nn.Parameter(torch.full((n_visible,), math.log(visible_precision)))
        self.log_psi = nn.Parameter(torch.full((n_visible, n_hidden), math.log(1e-3)))

    @property
    def alpha(self) -> torch.Tensor:
        """Slab precisions alpha (M,)."""
        return self.log_alpha.exp()

    @property
    def visible_precision(self) -> torch.Tensor:
        """The diagonal of Lambda = lambda + the row sums of |W diag(1/alpha) W^T| (D,)."""
        slab_gram = (self.W / self.alpha) @ self.W.T
        return self.log_lambda.exp() + slab_gram.abs().sum(1)

    @property
    def spike_penalty(self) -> torch.Tensor:
        """The diagonals of Phi_i, one column per hidden unit (D x M)."""
        return self.log_psi.exp()

    def hidden_logits(self, v: torch.Tensor) -> torch.Tensor:
        """a_i(v), the log-odds of p(h_i = 1 | v) with the slab integrated out: (B, D) ->
        (B, M)."""
        u = v.flatten(1) - self.b
        proj = u @ self.W
        return (
            proj**2 / (2 * self.alpha) + self.mu * proj - (u**2) @ self.spike_penalty / 2 + self.c
        )

    def _slab_log_normaliser(self) -> torch.Tensor:
        """1/2 sum_i log(2 pi / alpha_i), what integrating the slabs contributes to -E."""
        return 0.5 * (math.log(2 * math.pi) - self.log_alpha).sum()

    def _spike_free_energy(self, v: torch.Tensor) -> torch.Tensor:
        """1/2 u^T Lambda u - 1/2 sum_i log(2 pi / alpha_i): the energy of v with the
        spikes off and the slabs integrated out, (B, D) -> (B,)."""
        u = v.flatten(1) - self.b
        return 0.5 * (u**2) @ self.visible_precision - self._slab_log_normaliser()

    def _precision_given(self, h: torch.Tensor, visible_precision: torch.Tensor) -> torch.Tensor:
        """The diagonal precision Lambda + Phi h of p(v | s, h) for spikes h (B, M), given
        Lambda's diagonal: (B, D)."""
        return visible_precision + h @ self.spike_penalty.T

    def free_energy_from_logits(self, v: torch.Tensor, hidden_logits: torch.Tensor) -> torch.Tensor:
        """F(v) = 1/2 u^T Lambda u - sum_i softplus(a_i) - 1/2 sum_i log(2 pi / alpha_i), given
        a(v): (B, D), (B, M) -> (B,).

        Args:
            hidden_logits: a(v) (B, M), the spikes' log-odds, already computed.
        """
        return self._spike_free_energy(v) - F.softplus(hidden_logits).sum(1)

    def slab_energy(self, v: torch.Tensor, s: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """E(v, s, h) of full configurations, the energy the others integrate: (B, D),
        (B, M), (B, M) -> (B,)."""
        u = v.flatten(1) - self.b
        precision = self._precision_given(h, self.visible_precision)
        alpha = self.alpha
        return (
            -((u @ self.W) * s * h).sum(1)
            + 0.5 * (precision * u**2).sum(1)
            + 0.5 * (alpha * s**2).sum(1)
            - (alpha * self.mu * s * h).sum(1)
            - h @ self.c
            + 0.5 * (h @ (alpha * self.mu**2))
        )

    def joint_energy(self, v: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """E(v, h) with the slabs integrated out: F(v) with each softplus(a_i) replaced by
        h_i a_i: (B, D), (B, M) -> (B,)."""
        return self._spike_free_energy(v) - (h * self.hidden_logits(v)).sum(1)

    def slab_mean(self, v: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """E[s | v, h] = h (u^T W / alpha + mu): (B, D), (B, M) -> (B, M)."""
        u = v.flatten(1) - self.b
        return h * ((u @ self.W) / self.alpha + self.mu)

    def sample_slab(
        self, v: torch.Tensor, h: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """s ~ p(s | v, h) = N(E[s | v, h], 1 / alpha): (B, D), (B, M) -> (B, M).

        Args:
            generator: source of randomness, a ``torch.Generator`` on the data's device
                (``None``: the global one).
        """
        return gaussian_draw(self.slab_mean(v, h), self.alpha.rsqrt(), generator)

    def visible_given(
        self, h: torch.Tensor, s: torch.Tensor, visible_precision: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and precision (diagonal) of p(v | s, h): b + C W (s h) and
        Lambda + Phi h, each (B, D). ``visible_precision`` passes Lambda's diagonal when
        already at hand (a Gibbs chain computes it once)."""
        if visible_precision is None:
            visible_precision = self.visible_precision
        precision = self._precision_given(h, visible_precision)
        return self.b + F.linear(s * h, self.W) / precision, precision

    def sample_visible(
        self,
        h: torch.Tensor,
        s: torch.Tensor,
        generator: torch.Generator | None = None,
        visible_precision: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """v ~ p(v | s, h): (B, M), (B, M) -> (B, D).

        Args:
            generator: source of randomness, a ``torch.Generator`` on the data's device
                (``None``: the global one).
            visible_precision: Lambda's diagonal (D,) (default: the model's).
        """
        mean, precision = self.visible_given(h, s, visible_precision)
        return gaussian_draw(mean, precision.rsqrt(), generator)

    def reconstruction(self, v: torch.Tensor) -> torch.Tensor:
        """The visible mean given the expected spikes and slab products E[h s | v]."""
        ph = self.hidden_probs(v)
        return self.visible_given(ph, self.slab_mean(v, torch.ones_like(ph)))[0]

    def gibbs(
        self, v: torch.Tensor, k: int = 1, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """k sweeps h ~ p(h | v), s ~ p(s | v, h), v ~ p(v | s, h) (k = 0 returns v);
        Lambda, which costs a D x D product, is computed once for the k sweeps.

        Args:
            generator: source of randomness, a ``torch.Generator`` on the data's device
                (``None``: the global one).
        """
        _checks.positive_int("k", k, allow_zero=True)
        with torch.no_grad():
            visible_precision = self.visible_precision
            for _ in range(k):
                h = self.sample_hidden(v, generator)
                s = self.sample_slab(v, h, generator)
                v = self.sample_visible(h, s, generator, visible_precision)
        return v

    def hidden_log_weights(self, h: torch.Tensor) -> torch.Tensor:
        """log of the integral of exp(-E(v, s, h)) over v and s for spike states ``h``
        (B, M) -> (B,), so that log Z = logsumexp_h of it.

        With d = diag(Lambda + Phi h), U = W diag(h / sqrt(alpha)) and m = W (mu h),
        P_h = diag(d) - U U^T and the Gaussian integral gives
        c^T h + D/2 log 2 pi - 1/2 log det P_h + 1/2 m^T P_h^-1 m
        + 1/2 sum_i log(2 pi / alpha_i). The determinant lemma and Woodbury's identity
        reduce both to the M x M matrix K = I - U^T diag(1/d) U (Cholesky-factored).
        """
        alpha = self.alpha
        d = self._precision_given(h, self.visible_precision)  # (B, D)
        u = self.W[None] * (h / alpha.sqrt())[:, None, :]  # (B, D, M)
        scaled = u / d[:, :, None]
        eye = torch.eye(self.n_hidden, dtype=h.dtype, device=h.device)
        chol = torch.linalg.cholesky(eye - u.transpose(1, 2) @ scaled)
        m = F.linear(self.mu * h, self.W)  # (B, D)
        r = (scaled * m[:, :, None]).sum(1)  # U^T diag(1/d) m, (B, M)
        w = torch.linalg.solve_triangular(chol, r[:, :, None], upper=False).squeeze(2)
        quadratic = (m**2 / d).sum(1) + (w**2).sum(1)
        log_det = d.log().sum(1) + 2 * chol.diagonal(dim1=1, dim2=2).log().sum(1)
        constant = 0.5 * self.n_visible * math.log(2 * math.pi) + self._slab_log_normaliser()
        return h @ self.c + constant + 0.5 * (quadratic - log_det)

    def base_density(self) -> DiagonalGaussian:
        """N(b, Lambda^-1), detached: the visible density with the spikes off and the
        slabs integrated out, the base annealed importance sampling starts from."""
        return DiagonalGaussian(self.b.detach().clone(), self.visible_precision.detach().rsqrt())
