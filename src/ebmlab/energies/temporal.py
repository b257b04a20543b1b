"""Conditional RBM for sequences (Taylor, Hinton & Roweis 2007).

A Gaussian-Bernoulli RBM over the frame v_t (D real units, M binary hidden units) whose
biases depend on the last n frames x = (v_{t-1}, ..., v_{t-n}), stacked most recent
first into an n D vector:

    b_t = b + A x,   c_t = c + B x,
    E(v_t, h | x) = sum_i (v_i - b_t,i)^2 / (2 sigma_i^2) - c_t^T h - (v / sigma)^T W h.

Given x this is the Gaussian-Bernoulli RBM of :mod:`ebmlab.energies.boltzmann` with
biases (b_t, c_t): p(h_j = 1 | v, x) = sigmoid(c_t,j + (v / sigma)^T W_.j),
p(v | h, x) = N(b_t + sigma * (W h), diag(sigma^2)), free energy
F(v | x) = |(v - b_t) / sigma|^2 / 2 - sum_j softplus(c_t,j + (v / sigma)^T W_.j), and,
integrating v for each h,

    log Z(x) = sum_i log(sigma_i sqrt(2 pi))
               + logsumexp_h [c_t^T h + (b_t / sigma)^T W h + |W h|^2 / 2],

exact by enumerating h while M is small, which gives the exact conditional likelihood
p(v_t | x) and the exact conditional mean E[v_t | x] = b_t + sigma * (W E[h | x]).
With W = 0 the model is the linear Gaussian autoregression v_t = b + A x + noise.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import nn
from torch.nn import functional as F

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.devices import widen
from ebmlab.energies.base import EnergyModel
from ebmlab.energies.boltzmann import (
    ENUMERATION_LIMIT,
    bernoulli_draw,
    binary_states,
    gaussian_draw,
    register_log_sigma,
)


class ConditionalRBM(EnergyModel):
    """Conditional RBM with Gaussian visible units and autoregressive biases (Taylor et
    al. 2007).

    Args:
        n_visible: units per frame D.
        n_hidden: binary hidden units M.
        order: frames of history n.
        learn_sigma: learn one standard deviation per visible unit (else sigma = 1,
            for standardised frames).
        init_std: standard deviation of the initial W, A and B.

    ``energy(v, history)`` is the free energy F(v | x) of frames ``v`` (B, D) given their
    histories (B, n D) from :meth:`windows`.
    """

    def __init__(
        self,
        n_visible: int,
        n_hidden: int,
        order: int,
        learn_sigma: bool = True,
        init_std: float = 0.01,
    ) -> None:
        super().__init__()
        self.n_visible = _checks.positive_int("n_visible", n_visible)
        self.n_hidden = _checks.positive_int("n_hidden", n_hidden)
        self.order = _checks.positive_int("order", order)
        _checks.positive("init_std", init_std, allow_zero=True)
        self.W = nn.Parameter(torch.randn(n_visible, n_hidden) * init_std)
        self.A = nn.Parameter(torch.randn(n_visible, order * n_visible) * init_std)
        self.B = nn.Parameter(torch.randn(n_hidden, order * n_visible) * init_std)
        self.b = nn.Parameter(torch.zeros(n_visible))
        self.c = nn.Parameter(torch.zeros(n_hidden))
        register_log_sigma(self, n_visible, 1.0, learn_sigma)

    @property
    def sigma(self) -> torch.Tensor:
        """The visible standard deviations (D,)."""
        return self.log_sigma.exp()

    def windows(self, frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every frame with a full history: targets (N, D) and histories (N, n D), the
        last n frames most recent first, from sequences ``frames`` (T, D) or (S, T, D)."""
        if frames.dim() == 2:
            frames = frames[None]
        if frames.dim() != 3 or frames.shape[2] != self.n_visible:
            raise ArgumentError(
                f"frames must be (T, {self.n_visible}) or (S, T, {self.n_visible}), "
                f"got shape {tuple(frames.shape)}"
            )
        length = frames.shape[1]
        if length <= self.order:
            raise ArgumentError(
                f"frames must be longer than the model's order {self.order}: "
                f"got sequences of {length} frames"
            )
        targets = frames[:, self.order :]
        history = torch.cat(
            [frames[:, self.order - k : length - k] for k in range(1, self.order + 1)], 2
        )
        return targets.reshape(-1, self.n_visible), history.reshape(-1, self.order * self.n_visible)

    def dynamic_biases(self, history: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """b_t = b + A x and c_t = c + B x for histories (B, n D): (B, D) and (B, M).

        Args:
            history: the ``order`` preceding frames, most recent first (as :meth:`windows`
                lays them out), (B, order * n_visible).
        """
        _checks.rows_of("history", history, self.A.shape[1])
        return F.linear(history, self.A, self.b), F.linear(history, self.B, self.c)

    def hidden_logits(self, v: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
        """c_t + (v / sigma)^T W, the log-odds of p(h = 1 | v, x): (B, D) -> (B, M).

        Args:
            history: the ``order`` preceding frames, most recent first (as :meth:`windows`
                lays them out), (B, order * n_visible).
        """
        return F.linear(history, self.B, self.c) + (v / self.sigma) @ self.W

    def free_energy(self, v: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
        """F(v | x) with the hidden units summed out: (B, D), (B, n D) -> (B,).

        Args:
            history: the ``order`` preceding frames, most recent first (as :meth:`windows`
                lays them out), (B, order * n_visible).
        """
        b_t, c_t = self.dynamic_biases(history)
        scaled = v / self.sigma
        quadratic = (((v - b_t) / self.sigma) ** 2).sum(1) / 2
        return quadratic - F.softplus(c_t + scaled @ self.W).sum(1)

    def energy(self, v: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
        """The free energy F(v | x): (B, D), (B, n D) -> (B,).

        Args:
            history: the ``order`` preceding frames, most recent first (as :meth:`windows`
                lays them out), (B, order * n_visible).
        """
        return self.free_energy(v, history)

    def gibbs(
        self,
        v: torch.Tensor,
        history: torch.Tensor,
        k: int = 1,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """k steps of block Gibbs sampling v -> h -> v with the history held fixed.

        Args:
            generator: source of randomness, a ``torch.Generator`` on the data's device
                (``None``: the global one).
        """
        _checks.positive_int("k", k, allow_zero=True)
        with torch.no_grad():
            b_t, c_t = self.dynamic_biases(history)
            sigma = self.sigma
            for _ in range(k):
                h = bernoulli_draw(torch.sigmoid(c_t + (v / sigma) @ self.W), generator)
                v = gaussian_draw(b_t + sigma * F.linear(h, self.W), sigma, generator)
        return v

    def _hidden_terms(
        self, history: torch.Tensor
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Blocks of histories with the log weights c_t^T h + (b_t / sigma)^T W h +
        |W h|^2 / 2 of every hidden state (rows, 2^M), the states (2^M, M) and the visible
        biases b_t (rows, D). A block's terms hold about 2^20 numbers, so the enumeration
        stays in cache; the states and W h are computed once."""
        if self.n_hidden > ENUMERATION_LIMIT:
            raise ArgumentError(
                f"exact conditional quantities enumerate the hidden units; use at most "
                f"{ENUMERATION_LIMIT}, got n_hidden={self.n_hidden}"
            )
        states = binary_states(self.n_hidden, device=history.device).to(history.dtype)
        wh = states @ self.W.T  # (2^M, D)
        basis = torch.cat([states, wh], 1).T  # (M + D, 2^M)
        quadratic = 0.5 * (wh**2).sum(1)
        for rows in history.split(max(1, (1 << 20) >> self.n_hidden)):
            b_t, c_t = self.dynamic_biases(rows)
            terms = torch.addmm(quadratic, torch.cat([c_t, b_t / self.sigma], 1), basis)
            yield terms, states, b_t

    def log_partition(self, history: torch.Tensor) -> torch.Tensor:
        """Exact log Z(x) of each history (B, n D) -> (B,), enumerating the hidden units."""
        normaliser = self.log_sigma.sum() + 0.5 * self.n_visible * math.log(2 * math.pi)
        parts = [torch.logsumexp(terms, 1) for terms, _, _ in self._hidden_terms(history)]
        return torch.cat(parts) + normaliser

    def log_likelihood(self, v: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
        """Exact log p(v | x) = -F(v | x) - log Z(x) of frames given histories: (B,).

        Args:
            history: the ``order`` preceding frames, most recent first (as :meth:`windows`
                lays them out), (B, order * n_visible).
        """
        return -self.free_energy(v, history) - self.log_partition(history)

    def predict(self, history: torch.Tensor) -> torch.Tensor:
        """The exact conditional mean E[v_t | x] = b_t + sigma * (W E[h | x]) of the next
        frame after each history (B, n D) -> (B, D)."""
        means = [
            b_t + self.sigma * F.linear(torch.softmax(terms, 1) @ states, self.W)
            for terms, states, b_t in self._hidden_terms(history)
        ]
        return torch.cat(means)

    def generate(
        self,
        start: torch.Tensor,
        n_frames: int,
        k: int = 30,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Continue sequences by iterated Gibbs sampling: each new frame runs ``k`` steps
        from the previous frame given the last n (Taylor et al. 2007, §2.3). ``start``
        (n, D) or (S, n, D) holds the first n frames, oldest first; returns (S, n_frames,
        D) (or (n_frames, D)).

        Args:
            generator: source of randomness, a ``torch.Generator`` on the data's device
                (``None``: the global one).
        """
        _checks.positive_int("n_frames", n_frames)
        single = start.dim() == 2
        frames = list((start[None] if single else start).unbind(1))
        if len(frames) < self.order:
            raise ArgumentError(
                f"start must hold at least order={self.order} frames, got {len(frames)}"
            )
        out = []
        for _ in range(n_frames):
            history = torch.cat(frames[::-1][: self.order], 1)
            frames.append(self.gibbs(frames[-1], history, k, generator))
            out.append(frames[-1])
        sequences = torch.stack(out, 1)
        return sequences[0] if single else sequences

    def fit_autoregression(self, v: torch.Tensor, history: torch.Tensor) -> None:
        """Set b and A to the least-squares linear autoregression of the frames on their
        histories (B, n D), and sigma (if learned) to its residual deviations: the
        maximum-likelihood model when W = 0, a start from which the hidden units learn
        what the linear model misses.

        Args:
            v: frames (B, n_visible).
            history: the ``order`` preceding frames, most recent first (as :meth:`windows`
                lays them out), (B, order * n_visible).
        """
        with torch.no_grad():
            design = widen(torch.cat([history, torch.ones_like(history[:, :1])], 1))
            coef = torch.linalg.lstsq(design, v.to(design.dtype)).solution
            self.A.copy_(coef[:-1].T)
            self.b.copy_(coef[-1])
            if isinstance(self.log_sigma, nn.Parameter):
                residual = v.to(design.dtype) - design @ coef
                self.log_sigma.copy_(residual.std(0).clamp_min(1e-6).log())
