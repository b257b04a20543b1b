"""Inference: argmin over y of E(x, y), and the most offending incorrect answer.

Exhaustive search over finite candidate sets, gradient descent with restarts for
continuous answers, and exact dynamic programming on chains (LeCun et al. 2006).
"""

from ebmlab.inference.chain import chain_energy, chain_free_energy, chain_marginals, viterbi
from ebmlab.inference.continuous import gradient_argmin, most_offending_continuous
from ebmlab.inference.discrete import argmin_answer, candidate_energies, most_offending

__all__ = [
    "argmin_answer",
    "candidate_energies",
    "chain_energy",
    "chain_free_energy",
    "chain_marginals",
    "gradient_argmin",
    "most_offending",
    "most_offending_continuous",
    "viterbi",
]
