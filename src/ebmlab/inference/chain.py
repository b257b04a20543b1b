"""Exact inference on chain-structured energies by dynamic programming.

A sequence y = (y_1, ..., y_T) of K-valued labels has energy

    E(y) = sum_t U[t, y_t] + sum_{t > 1} P[y_{t-1}, y_t],

with unary energies U (B, T, K) and a transition matrix P (K, K). Min-sum
dynamic programming (Viterbi) finds argmin_y E(y) in O(T K^2); the forward
algorithm in log space gives the free energy
F_beta = -(1/beta) log sum_y exp(-beta E(y)), which the NLL loss needs
(LeCun et al. 2006, §2.2.4 and §6 on structured outputs).
"""

from __future__ import annotations

import torch

from ebmlab import _checks


def _check(unary: torch.Tensor, transition: torch.Tensor) -> None:
    _checks.tensor("unary", unary, ndim=3, floating=True)
    k = unary.shape[2]
    _checks.tensor("transition", transition, ndim=2, last_dims=(k, k), floating=True)


def chain_energy(
    unary: torch.Tensor, transition: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """E(y) for label sequences ``labels`` (B, T).

    Args:
        unary: U, the energy of each state at each position, (B, T, K).
        transition: P, the energy of each pair of consecutive states, (K, K).
    """
    _check(unary, transition)
    e = unary.gather(2, labels.long().unsqueeze(2)).squeeze(2).sum(1)
    return e + transition[labels[:, :-1].long(), labels[:, 1:].long()].sum(1)


def viterbi(unary: torch.Tensor, transition: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """argmin_y E(y) and its energy: ((B, T) labels, (B,) energies).

    Args:
        unary: U, the energy of each state at each position, (B, T, K).
        transition: P, the energy of each pair of consecutive states, (K, K).
    """
    _check(unary, transition)
    t = unary.shape[1]
    cost = unary[:, 0]
    back = []
    for i in range(1, t):
        total = cost[:, :, None] + transition[None]  # (B, prev, next)
        cost, arg = total.min(1)
        cost = cost + unary[:, i]
        back.append(arg)
    best_e, last = cost.min(1)
    labels = [last]
    for arg in reversed(back):
        last = arg.gather(1, last[:, None]).squeeze(1)
        labels.append(last)
    return torch.stack(labels[::-1], 1), best_e


def chain_free_energy(
    unary: torch.Tensor, transition: torch.Tensor, beta: float = 1.0
) -> torch.Tensor:
    """F_beta = -(1/beta) log sum_y exp(-beta E(y)) by the forward algorithm, (B,).

    Args:
        unary: U, the energy of each state at each position, (B, T, K).
        transition: P, the energy of each pair of consecutive states, (K, K).
    """
    _check(unary, transition)
    _checks.positive("beta", beta)
    alpha = -beta * unary[:, 0]
    for i in range(1, unary.shape[1]):
        alpha = torch.logsumexp(alpha[:, :, None] - beta * transition[None], 1) - beta * unary[:, i]
    return -torch.logsumexp(alpha, 1) / beta


def chain_marginals(
    unary: torch.Tensor, transition: torch.Tensor, beta: float = 1.0
) -> torch.Tensor:
    """Per-position marginals p(y_t = k) of p(y) proportional to exp(-beta E(y)), (B, T, K),
    by the forward-backward algorithm in log space.

    Args:
        unary: U, the energy of each state at each position, (B, T, K).
        transition: P, the energy of each pair of consecutive states, (K, K).
    """
    _check(unary, transition)
    _checks.positive("beta", beta)
    t = unary.shape[1]
    log_u, log_p = -beta * unary, -beta * transition
    alphas = [log_u[:, 0]]
    for i in range(1, t):
        alphas.append(torch.logsumexp(alphas[-1][:, :, None] + log_p[None], 1) + log_u[:, i])
    betas = [torch.zeros_like(alphas[0])]
    for i in range(t - 1, 0, -1):
        betas.append(torch.logsumexp(log_p[None] + (log_u[:, i] + betas[-1])[:, None, :], 2))
    log_marg = torch.stack(alphas, 1) + torch.stack(betas[::-1], 1)
    return torch.softmax(log_marg, 2)
