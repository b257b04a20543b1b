"""Losses: what learning minimises.

LeCun et al. (2006)'s family (energy, perceptron, hinge, log, LVQ2, MCE,
square-square, square-exponential, NLL, MEE); for densities, contrastive
divergence, score matching (exact, sliced, denoising), noise-contrastive
estimation, energy discrepancy and diffusion recovery likelihood; for fields and
potentials, conditional flow matching, Energy Matching and Equilibrium Matching; for
binary models,
pseudo-likelihood, minimum probability flow, the exact NLL of a Boltzmann machine
and the classification RBM's objectives.
"""

from ebmlab.losses.binary import minimum_probability_flow_loss, pseudo_likelihood_loss
from ebmlab.losses.boltzmann import classification_rbm_loss, conditional_cd_loss, exact_nll
from ebmlab.losses.contrastive import contrastive_divergence_loss
from ebmlab.losses.discrepancy import energy_discrepancy_loss
from ebmlab.losses.energy_matching import energy_matching_loss
from ebmlab.losses.flow_matching import equilibrium_matching_loss, flow_matching_loss
from ebmlab.losses.lecun import (
    contrastive_update_loss,
    energy_loss,
    hinge_loss,
    log_loss,
    lvq2_loss,
    mce_loss,
    mee_loss,
    nll_loss,
    perceptron_loss,
    square_exponential_loss,
    square_square_loss,
)
from ebmlab.losses.nce import nce_loss
from ebmlab.losses.recovery import diffusion_recovery_likelihood_loss
from ebmlab.losses.score_matching import (
    denoising_score_matching_loss,
    score_matching_loss,
    sliced_score_matching_loss,
)

__all__ = [
    "classification_rbm_loss",
    "conditional_cd_loss",
    "contrastive_divergence_loss",
    "contrastive_update_loss",
    "denoising_score_matching_loss",
    "diffusion_recovery_likelihood_loss",
    "energy_discrepancy_loss",
    "energy_loss",
    "energy_matching_loss",
    "equilibrium_matching_loss",
    "exact_nll",
    "flow_matching_loss",
    "hinge_loss",
    "log_loss",
    "lvq2_loss",
    "mce_loss",
    "mee_loss",
    "minimum_probability_flow_loss",
    "nce_loss",
    "nll_loss",
    "perceptron_loss",
    "pseudo_likelihood_loss",
    "score_matching_loss",
    "sliced_score_matching_loss",
    "square_exponential_loss",
    "square_square_loss",
]
