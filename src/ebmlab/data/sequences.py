"""Sequences from a known hidden Markov model: the ground truth of structured prediction.

Hidden labels y_t follow a Markov chain with initial distribution pi and transition
matrix A; each observation x_t ~ N(mu_{y_t}, s^2 I). Because the model is known, the
Bayes-optimal per-position decision (the max of the exact posterior marginals) and
its error rate are computable, a floor no learned labeller can beat on average.
"""

from __future__ import annotations

import math

import torch

from ebmlab import _checks


class HiddenMarkovModel:
    """A random HMM with ``n_states`` labels and Gaussian emissions in ``dim`` dimensions.

    Args:
        seed: seed of the randomness (int).
    """

    def __init__(
        self,
        n_states: int = 4,
        dim: int = 2,
        noise: float = 1.0,
        stickiness: float = 0.8,
        seed: int = 0,
    ):
        self.n_states = _checks.positive_int("n_states", n_states)
        self.dim = _checks.positive_int("dim", dim)
        self.noise = _checks.positive("noise", noise)
        _checks.probability("stickiness", stickiness)
        gen = torch.Generator().manual_seed(seed)
        off = torch.rand(n_states, n_states, generator=gen) + 0.1
        off.fill_diagonal_(0)
        off = off / off.sum(1, keepdim=True) * (1 - stickiness)
        self.transition = off + torch.eye(n_states) * stickiness
        self.initial = torch.full((n_states,), 1.0 / n_states)
        self.means = 2.0 * torch.randn(n_states, dim, generator=gen)

    def sample(self, n: int, length: int, generator: torch.Generator | None = None):
        """Observations (n, length, dim) and labels (n, length).

        Args:
            generator: source of randomness, a ``torch.Generator`` on the data's device
                (``None``: the global one).
        """
        _checks.positive_int("n", n)
        _checks.positive_int("length", length)
        y = torch.empty(n, length, dtype=torch.long)
        y[:, 0] = torch.multinomial(self.initial, n, replacement=True, generator=generator)
        for t in range(1, length):
            y[:, t] = torch.multinomial(
                self.transition[y[:, t - 1]], 1, generator=generator
            ).squeeze(1)
        x = self.means[y] + self.noise * torch.randn(n, length, self.dim, generator=generator)
        return x, y

    def energies(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The true model as a chain energy: unary -log p(x_t | k) (with -log pi at t = 0)
        and transition -log A, so that exp(-E(y)) = p(x, y) up to a constant."""
        means, initial, transition = (t.to(x) for t in (self.means, self.initial, self.transition))
        sq = ((x[:, :, None, :] - means[None, None]) ** 2).sum(-1)
        unary = sq / (2 * self.noise**2) + 0.5 * self.dim * math.log(2 * math.pi * self.noise**2)
        unary[:, 0] = unary[:, 0] - torch.log(initial)
        return unary, -torch.log(transition)
