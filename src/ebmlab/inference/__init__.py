"""Inference: argmin over y of E(x, y), and the most offending incorrect answer.

Exhaustive search over finite candidate sets, gradient descent with restarts for
continuous answers, exact dynamic programming on chains (LeCun et al. 2006), and
annealed Gibbs, ICM and mean field for pairwise energies too large to enumerate.
"""

from ebmlab.inference.chain import chain_energy, chain_free_energy, chain_marginals, viterbi
from ebmlab.inference.continuous import gradient_argmin, most_offending_continuous
from ebmlab.inference.discrete import argmin_answer, candidate_energies, most_offending
from ebmlab.inference.pairwise import (
    PairwiseMRF,
    annealed_gibbs,
    icm,
    mean_field,
    mean_field_free_energy,
)

__all__ = [
    "PairwiseMRF",
    "annealed_gibbs",
    "argmin_answer",
    "candidate_energies",
    "chain_energy",
    "chain_free_energy",
    "chain_marginals",
    "gradient_argmin",
    "icm",
    "mean_field",
    "mean_field_free_energy",
    "most_offending",
    "most_offending_continuous",
    "viterbi",
]
