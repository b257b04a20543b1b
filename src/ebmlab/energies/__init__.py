"""Energy functions: what assigns a scalar to a configuration (nn.Modules)."""

from ebmlab.energies.analytic import (
    AnalyticEnergy,
    Banana,
    DiagonalGaussian,
    DoubleWell,
    Funnel,
    Gaussian,
    GaussianMixture,
    IndependentBernoulli,
)
from ebmlab.energies.base import (
    EnergyFn,
    EnergyLike,
    EnergyModel,
    as_energy_fn,
    energy_and_grad,
    score,
)
from ebmlab.energies.belief import DeepBeliefNetwork
from ebmlab.energies.boltzmann import (
    BernoulliRBM,
    BoltzmannMachine,
    CategoricalRBM,
    ClassificationRBM,
    DeepBoltzmannMachine,
    GaussianBernoulliRBM,
    SubspaceRBM,
)
from ebmlab.energies.classifier import ClassConditionalEnergy, ClassifierEnergy
from ebmlab.energies.conv import ConvEnergy, ConvNet, ImageEnergy
from ebmlab.energies.conv_rbm import ConvolutionalRBM
from ebmlab.energies.gated import GatedRBM
from ebmlab.energies.mlp import FeedForward, MLPEnergy, NoiseConditionalEnergy
from ebmlab.energies.resnet import SNResNet, WideResNet
from ebmlab.energies.spike_slab import SpikeSlabRBM
from ebmlab.energies.structured import (
    ChainEnergy,
    ConditionalBoltzmann,
    DistanceEnergy,
    LogitEnergy,
)
from ebmlab.energies.tempered import TemperedEnergy
from ebmlab.energies.temporal import ConditionalRBM
from ebmlab.energies.unet import UNetDot, UNetViT

__all__ = [
    "AnalyticEnergy",
    "Banana",
    "BernoulliRBM",
    "BoltzmannMachine",
    "CategoricalRBM",
    "ChainEnergy",
    "ClassConditionalEnergy",
    "ClassificationRBM",
    "ClassifierEnergy",
    "ConditionalBoltzmann",
    "ConditionalRBM",
    "ConvEnergy",
    "ConvNet",
    "ConvolutionalRBM",
    "DeepBeliefNetwork",
    "DeepBoltzmannMachine",
    "DiagonalGaussian",
    "DistanceEnergy",
    "DoubleWell",
    "EnergyFn",
    "EnergyLike",
    "EnergyModel",
    "FeedForward",
    "Funnel",
    "GatedRBM",
    "Gaussian",
    "GaussianBernoulliRBM",
    "GaussianMixture",
    "ImageEnergy",
    "IndependentBernoulli",
    "LogitEnergy",
    "MLPEnergy",
    "NoiseConditionalEnergy",
    "SNResNet",
    "SpikeSlabRBM",
    "SubspaceRBM",
    "TemperedEnergy",
    "UNetDot",
    "UNetViT",
    "WideResNet",
    "as_energy_fn",
    "energy_and_grad",
    "score",
]
