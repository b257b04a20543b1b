"""Deep belief network: a stack of RBMs trained greedily (Hinton, Osindero & Teh 2006).

Tomczak (2024, §6.6, 'Deep Boltzmann Machines') describes the greedy recipe: each pair of
consecutive layers is an RBM trained with the lower layer treated as observed. The
resulting generative model keeps the top RBM as an undirected prior p(h_{L-1}) and
turns every lower RBM into a directed layer p(h_{l-1} | h_l). Its likelihood is
intractable, but the recognition distribution q(h | v) = prod_l p_l(h_l | h_{l-1})
gives the variational bound (Hinton et al. 2006, eq. 8)

    log p(v) >= E_q [ sum_l log p(h_{l-1} | h_l) + log p_top(h_{L-1}) - log q(h | v) ],

which :meth:`DeepBeliefNetwork.log_likelihood_bound` estimates by sampling from q.
"""

from __future__ import annotations

import itertools

import torch
from torch import nn
from torch.nn import functional as F

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.devices import wide_dtype
from ebmlab.energies.boltzmann import BernoulliRBM, bernoulli_draw


def _log_bernoulli(x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """sum_i log Bernoulli(x_i; sigmoid(logits_i)) per row."""
    return (x * logits - F.softplus(logits)).sum(1)


class DeepBeliefNetwork(nn.Module):
    """Bernoulli RBMs ``layers[0]`` (visible - h1), ``layers[1]`` (h1 - h2), ...

    Args:
        n_visible: input width.
        hidden_layers: widths of the hidden layers, bottom first.
    """

    def __init__(self, n_visible: int, hidden_layers: tuple[int, ...] | list[int]) -> None:
        super().__init__()
        _checks.positive_int("n_visible", n_visible)
        if not hidden_layers:
            raise ArgumentError("hidden_layers must name at least one layer width")
        widths = [n_visible, *(_checks.positive_int("hidden layer", w) for w in hidden_layers)]
        self.layers = nn.ModuleList(
            BernoulliRBM(lower, upper) for lower, upper in itertools.pairwise(widths)
        )

    @property
    def top(self) -> BernoulliRBM:
        """The undirected top-level RBM."""
        return self.layers[-1]

    def up(self, v: torch.Tensor, n_layers: int | None = None) -> torch.Tensor:
        """Mean-field codes: p(h | input) propagated through the first ``n_layers`` layers
        (default all); the input each higher RBM is trained on.

        Args:
            v: visible rows (B, n_visible).
        """
        x = v.flatten(1)
        for rbm in self.layers[: len(self.layers) if n_layers is None else n_layers]:
            x = rbm.hidden_probs(x)
        return x

    def sample(
        self, n: int, k: int = 200, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """``n`` visible samples: ``k`` block-Gibbs steps in the top RBM from random
        states, then one ancestral pass down the directed layers.

        Args:
            generator: source of randomness, a ``torch.Generator`` on the data's device
                (``None``: the global one).
        """
        _checks.positive_int("n", n)
        top = self.top
        with torch.no_grad():
            start = torch.rand(
                n, top.n_visible, generator=generator, dtype=top.W.dtype, device=top.W.device
            )
            h = top.gibbs((start < 0.5).to(top.W.dtype), k, generator)
            for rbm in reversed(self.layers[:-1]):
                h = rbm.sample_visible(h, generator)
        return h

    def log_likelihood_bound(
        self,
        v: torch.Tensor,
        top_log_z: float,
        n_samples: int = 10,
        generator: torch.Generator | None = None,
    ) -> tuple[float, float]:
        """The variational lower bound on the mean log p(v) over the rows of ``v`` (eq. 8
        of Hinton et al. 2006), by ``n_samples`` draws from q(h | v) per row, given the
        top RBM's log partition function. Returns the estimate and its Monte Carlo standard
        error (the rows are fixed; only the draws from q vary).

        Args:
            top_log_z: log Z of the top RBM.
            generator: source of randomness, a ``torch.Generator`` on the data's device
                (``None``: the global one).
        """
        _checks.positive_int("n_samples", n_samples)
        with torch.no_grad():
            x = v.flatten(1).to(self.top.W.dtype).repeat(n_samples, 1)
            total = torch.zeros(len(x), dtype=wide_dtype(x.device), device=x.device)
            for rbm in self.layers[:-1]:
                logits = rbm.hidden_logits(x)
                h = bernoulli_draw(torch.sigmoid(logits), generator)
                total += (_log_bernoulli(x, rbm.visible_logits(h)) - _log_bernoulli(h, logits)).to(
                    total.dtype
                )
                x = h
            total += -self.top.free_energy(x).to(total.dtype) - top_log_z
        draws = total.view(n_samples, -1)  # (samples, rows)
        spread = draws.var(0).sum() / n_samples if n_samples > 1 else draws.new_zeros(())
        return float(draws.mean()), float(spread.sqrt() / draws.shape[1])
