"""Factored gated (three-way) RBM for pairs of images (Memisevic & Hinton 2010).

An input x (D_x), a binary output y (D_y) and binary mapping units h (K) interact
through F factors, each the product of three linear filters (Memisevic & Hinton 2010,
§3, the factored three-way energy), with x' = x - m the input less a fixed offset m
(the training inputs' mean, see :meth:`GatedRBM.fit_biases`):

    E(y, h | x) = -sum_f (x'^T U_.f) (y^T V_.f) (h^T W_.f) - b^T y - c^T h.

With x fixed the model is a Bernoulli RBM between y and h whose weights
V diag(x'^T U) W^T are gated by the input, so the mapping units code how y follows
from x (a shift, a rotation) rather than what either image shows:

    p(h_k = 1 | y, x) = sigmoid(c_k + sum_f W_kf (x'^T U_.f) (y^T V_.f)),
    p(y_i = 1 | h, x) = sigmoid(b_i + sum_f V_if (x'^T U_.f) (h^T W_.f)),
    F(y | x) = -b^T y - sum_k softplus(c_k + sum_f W_kf (x'^T U_.f) (y^T V_.f)).

The conditional log Z(x) is that RBM's, exact by enumerating the mapping units while
K is small. Inferring h from one pair and generating y for a new input with it
transfers the transformation (an analogy).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.energies.base import EnergyModel
from ebmlab.energies.boltzmann import (
    ENUMERATION_LIMIT,
    BernoulliRBM,
    base_rate_logits,
    bernoulli_draw,
    binary_states,
)


class GatedRBM(EnergyModel):
    """Factored three-way RBM modelling p(y | x) with binary outputs and mapping units
    (Memisevic & Hinton 2010).

    Args:
        n_input: input units D_x (pixels of x).
        n_output: binary output units D_y (pixels of y).
        n_hidden: binary mapping units K.
        n_factors: factors F.
        init_std: standard deviation of the initial filters U, V and W.

    Every method takes the modelled output first and the input it is conditioned on
    last: ``energy(y, x)`` is the free energy F(y | x) of outputs (B, D_y) given inputs
    (B, D_x); images are flattened.
    """

    def __init__(
        self,
        n_input: int,
        n_output: int,
        n_hidden: int,
        n_factors: int,
        init_std: float = 0.01,
    ) -> None:
        super().__init__()
        self.n_input = _checks.positive_int("n_input", n_input)
        self.n_output = _checks.positive_int("n_output", n_output)
        self.n_hidden = _checks.positive_int("n_hidden", n_hidden)
        self.n_factors = _checks.positive_int("n_factors", n_factors)
        _checks.positive("init_std", init_std, allow_zero=True)
        self.U = nn.Parameter(torch.randn(n_input, n_factors) * init_std)
        self.V = nn.Parameter(torch.randn(n_output, n_factors) * init_std)
        self.W = nn.Parameter(torch.randn(n_hidden, n_factors) * init_std)
        self.b = nn.Parameter(torch.zeros(n_output))
        self.c = nn.Parameter(torch.zeros(n_hidden))
        self.register_buffer("input_offset", torch.zeros(n_input))

    def fit_biases(self, y: torch.Tensor, x: torch.Tensor) -> None:
        """Start from the data: the output biases b at the outputs' base rates, and the
        input offset at the inputs' mean, which the gates subtract so that the filters
        see centred inputs (without it CD barely moves the filters from a small start).

        Args:
            y: outputs (B, n_output).
            x: inputs (B, n_input).
        """
        y, x = self._pair(y, x)
        with torch.no_grad():
            self.b.copy_(base_rate_logits(y))
            self.input_offset.copy_(x.mean(0))

    def gate(self, x: torch.Tensor) -> torch.Tensor:
        """The input filters' responses (x - input_offset)^T U: (B, D_x) -> (B, F)."""
        return (self._input(x) - self.input_offset) @ self.U

    def _input(self, x: torch.Tensor) -> torch.Tensor:
        """Flattened inputs x, checked to be (B, D_x)."""
        x = x.flatten(1)
        if x.shape[1] != self.n_input:
            raise ArgumentError(
                f"inputs x must be (B, {self.n_input}) (images are flattened), got shape "
                f"{tuple(x.shape)}"
            )
        return x

    def _pair(self, y: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Flattened (y, x), checked to be matching batches of the model's widths."""
        y, x = y.flatten(1), x.flatten(1)
        if y.shape[1] != self.n_output or x.shape[1] != self.n_input or len(y) != len(x):
            raise ArgumentError(
                f"pairs must be outputs y (B, {self.n_output}) and inputs x (B, "
                f"{self.n_input}) of one batch size (images are flattened), got y of shape "
                f"{tuple(y.shape)} and x of shape {tuple(x.shape)}"
            )
        return y, x

    def hidden_logits(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """c + W ((x'^T U) * (y^T V)), the log-odds of p(h = 1 | y, x): (B, K)."""
        y, x = self._pair(y, x)
        return F.linear(self.gate(x) * (y @ self.V), self.W, self.c)

    def hidden_probs(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """p(h = 1 | y, x): the mapping units' code of the transformation taking x to y."""
        return torch.sigmoid(self.hidden_logits(y, x))

    def output_logits(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """b + V ((x'^T U) * (h^T W)), the log-odds of p(y = 1 | h, x): (B, D_y)."""
        return F.linear(self.gate(x) * (h @ self.W), self.V, self.b)

    def output_probs(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """p(y = 1 | h, x): the input ``x`` transformed as the mapping units ``h`` say,
        for hidden states or probabilities (B, K) and inputs (B, D_x) -> (B, D_y)."""
        return torch.sigmoid(self.output_logits(h, x))

    def analogy(self, y: torch.Tensor, x: torch.Tensor, new_x: torch.Tensor) -> torch.Tensor:
        """p(y* = 1 | h, x*) with h = p(h | y, x): the transformation that takes each x to
        its y, applied to each new input x* (Memisevic & Hinton 2010, §5).

        Args:
            new_x: the inputs x* to transform, x's shape.
        """
        return self.output_probs(self.hidden_probs(y, x), new_x)

    def free_energy(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """F(y | x) with the mapping units summed out: (B, D_y), (B, D_x) -> (B,)."""
        return -(y.flatten(1) @ self.b) - F.softplus(self.hidden_logits(y, x)).sum(1)

    def joint_energy(self, y: torch.Tensor, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """E(y, h | x) = -sum_f (x'^T U_.f)(y^T V_.f)(h^T W_.f) - b^T y - c^T h: (B,)."""
        y, x = self._pair(y, x)
        three_way = (self.gate(x) * (y @ self.V) * (h @ self.W)).sum(1)
        return -three_way - y @ self.b - h @ self.c

    def energy(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The free energy F(y | x): (B, D_y), (B, D_x) -> (B,)."""
        return self.free_energy(y, x)

    def gibbs(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        k: int = 1,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """k steps of block Gibbs sampling y -> h -> y with the inputs held fixed.

        Args:
            x: the inputs (B, n_input), held fixed.
            generator: source of randomness, a ``torch.Generator`` on the data's device
                (``None``: the global one).
        """
        _checks.positive_int("k", k, allow_zero=True)
        y, x = self._pair(y, x)
        with torch.no_grad():
            gate = self.gate(x)
            for _ in range(k):
                h_logits = F.linear(gate * (y @ self.V), self.W, self.c)
                h = bernoulli_draw(torch.sigmoid(h_logits), generator)
                y_logits = F.linear(gate * (h @ self.W), self.V, self.b)
                y = bernoulli_draw(torch.sigmoid(y_logits), generator)
        return y

    def conditional(self, x: torch.Tensor) -> BernoulliRBM:
        """The Bernoulli RBM p(y, h | x) for one input ``x`` (D_x,), with weights
        V diag(x'^T U) W^T, detached: every RBM tool (exact log Z, AIS, samplers) applies."""
        weights = (self.V * self.gate(x.reshape(1, -1))) @ self.W.T
        return BernoulliRBM.from_parameters(weights.detach(), self.b.detach(), self.c.detach())

    def log_partition(self, x: torch.Tensor, chunk: int = 1 << 12) -> torch.Tensor:
        """Exact log Z(x) of each input (B, D_x) -> (B,), summing the outputs out in closed
        form and enumerating the 2^K mapping states ``chunk`` at a time:
        log Z(x) = logsumexp_h [c^T h + sum_i softplus(b_i + (V diag(x'^T U) W^T h)_i)]."""
        if self.n_hidden > ENUMERATION_LIMIT:
            raise ArgumentError(
                f"exact log Z(x) enumerates the mapping units; use at most {ENUMERATION_LIMIT}, "
                f"got n_hidden={self.n_hidden}"
            )
        gate = self.gate(x)  # (B, F)
        parts = []
        for start in range(0, 2**self.n_hidden, chunk):
            stop = min(start + chunk, 2**self.n_hidden)
            states = binary_states(self.n_hidden, start, stop, device=gate.device).to(gate.dtype)
            logits = F.linear(gate[:, None] * (states @ self.W), self.V, self.b)  # (B, S, D_y)
            parts.append(states @ self.c + F.softplus(logits).sum(2))
        return torch.logsumexp(torch.cat(parts, 1), 1)

    def log_likelihood(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Exact log p(y | x) = -F(y | x) - log Z(x) of each pair: (B,)."""
        return -self.free_energy(y, x) - self.log_partition(x)
