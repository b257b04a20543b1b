"""Learning rules: how the parameters of an energy move given data.

Contrastive divergence and persistent CD for the Boltzmann family with closed-form
gradients (:mod:`ebmlab.learning.rbm`, :mod:`ebmlab.learning.boltzmann`), DBM learning
and greedy pre-training, perturb-and-MAP and extended mean-field (TAP) learning, and
:class:`EnergyLearner`, which joins a model, inference and one of LeCun et al.'s (2006)
losses. The losses themselves live in :mod:`ebmlab.losses`; the loop that applies a
rule step after step is :class:`ebmlab.training.Trainer`.
"""

from ebmlab.learning.boltzmann import BMContrastiveDivergence
from ebmlab.learning.emf import EMFLearning
from ebmlab.learning.perturb_and_map import PerturbAndMAP
from ebmlab.learning.rbm import CDStats, ContrastiveDivergence, DBMLearning, pretrain_dbm
from ebmlab.learning.structured import LOSSES, EnergyLearner

__all__ = [
    "LOSSES",
    "BMContrastiveDivergence",
    "CDStats",
    "ContrastiveDivergence",
    "DBMLearning",
    "EMFLearning",
    "EnergyLearner",
    "PerturbAndMAP",
    "pretrain_dbm",
]
