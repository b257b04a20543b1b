"""Evaluation: likelihoods, classifier, OOD and sample-quality metrics, and diagnostics."""

from ebmlab.evaluation.classification import (
    accuracy,
    calibration_bins,
    expected_calibration_error,
    nll,
    reliability_diagram,
)
from ebmlab.evaluation.inception import (
    InceptionV3,
    inception_outputs,
    inception_score,
    load_inception,
)
from ebmlab.evaluation.likelihood import LogLikelihood, log_likelihood, mixture_log_likelihood
from ebmlab.evaluation.metrics import median_bandwidth, mmd2, mmd_permutation_test
from ebmlab.evaluation.ood import (
    auroc,
    load_ood_file,
    load_ood_images,
    shifted_images,
    uniform_noise,
)
from ebmlab.evaluation.sample_quality import (
    frechet_distance,
    kernel_distance,
    penultimate_features,
    precision_recall,
    sample_quality,
)
from ebmlab.evaluation.stein import SteinDiscrepancy, kernel_stein_discrepancy

__all__ = [
    "InceptionV3",
    "LogLikelihood",
    "SteinDiscrepancy",
    "accuracy",
    "auroc",
    "calibration_bins",
    "expected_calibration_error",
    "frechet_distance",
    "inception_outputs",
    "inception_score",
    "kernel_distance",
    "kernel_stein_discrepancy",
    "load_inception",
    "load_ood_file",
    "load_ood_images",
    "log_likelihood",
    "median_bandwidth",
    "mixture_log_likelihood",
    "mmd2",
    "mmd_permutation_test",
    "nll",
    "penultimate_features",
    "precision_recall",
    "reliability_diagram",
    "sample_quality",
    "shifted_images",
    "uniform_noise",
]
