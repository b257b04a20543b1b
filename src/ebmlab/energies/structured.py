"""Energies over structured answers E(W, Y, X) (LeCun et al. 2006, §2-3 and §6).

Each module maps inputs to the energies inference needs: a table of every answer's
energy for a small answer set, or the factors of a chain or a pairwise model whose
answers are too many to list.
"""

from __future__ import annotations

import torch
from torch import nn

from ebmlab.energies.mlp import FeedForward


class LogitEnergy(nn.Module):
    """E(X, Y) = -NN(X)[Y] for every answer Y: (B, D) -> (B, K). The answers' energies are
    tied only through the shared network (LeCun et al. 2006, §2).

    Args:
        dim: features of X.
        hidden: hidden widths of the network.
        num_classes: number of classes.
    """

    def __init__(self, dim: int, hidden: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        self.net = FeedForward([dim, *hidden, num_classes], "silu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return -self.net(x)


class DistanceEnergy(nn.Module):
    """E(X, Y) = ||G(X) - e_Y||^2 for every answer Y: (B, D) -> (B, K), with learned
    answer embeddings e_Y initialised close together (standard deviation
    ``embed_init``), as a fresh network's outputs are (LeCun et al. 2006, §3).

    Args:
        dim: features of X.
        hidden: hidden widths of the embedding network G.
        embed_dim: dimension of the embeddings G(X) and e_Y.
        num_classes: number of classes.
    """

    def __init__(
        self,
        dim: int,
        hidden: tuple[int, ...],
        embed_dim: int,
        num_classes: int,
        embed_init: float = 0.01,
    ) -> None:
        super().__init__()
        self.encoder = FeedForward([dim, *hidden, embed_dim], "silu")
        self.embeddings = nn.Parameter(embed_init * torch.randn(num_classes, embed_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cdist(self.encoder(x), self.embeddings).pow(2)


class ChainEnergy(nn.Module):
    """E(Y, X) = sum_t U_t[y_t] + sum_t P[y_{t-1}, y_t]: unary energies -NN(x_t) per
    position (B, T, D) -> (B, T, K) and a learned transition matrix P (K, K).

    Args:
        dim: features per position of X.
        hidden: hidden widths of the unary network.
        n_states: S, the states each position of Y takes.
    """

    def __init__(self, dim: int, hidden: tuple[int, ...], n_states: int) -> None:
        super().__init__()
        self.unary_net = FeedForward([dim, *hidden, n_states], "silu")
        self.transition = nn.Parameter(torch.zeros(n_states, n_states))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, t, d = x.shape
        return -self.unary_net(x.reshape(b * t, d)).view(b, t, -1), self.transition


class ConditionalBoltzmann(nn.Module):
    """E(Y, X) = -(Y^T W Y + b(X)^T Y) over binary Y: fields b(X) (B, D_y) from a network
    and a symmetric coupling W (D_y, D_y), the factors of a pairwise model
    (:meth:`ebmlab.inference.PairwiseMRF.from_binary`).

    Args:
        dim_x: features of X.
        dim_y: D_y, binary units of Y.
        hidden: hidden widths of the field network b(X).
    """

    def __init__(self, dim_x: int, dim_y: int, hidden: tuple[int, ...]) -> None:
        super().__init__()
        self.field = FeedForward([dim_x, *hidden, dim_y], "silu")
        self.coupling = nn.Parameter(torch.zeros(dim_y, dim_y))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.field(x), (self.coupling + self.coupling.T) / 2
