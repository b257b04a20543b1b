"""Evaluation: likelihoods, classifier, OOD and sample-quality metrics, and diagnostics."""

from ebmlab.evaluation.classification import (
    accuracy,
    calibration_bins,
    expected_calibration_error,
    nll,
    reliability_diagram,
)
from ebmlab.evaluation.likelihood import LogLikelihood, log_likelihood
from ebmlab.evaluation.metrics import median_bandwidth, mmd2, mmd_permutation_test
from ebmlab.evaluation.ood import auroc, load_ood_file, shifted_images, uniform_noise

__all__ = [
    "LogLikelihood",
    "accuracy",
    "auroc",
    "calibration_bins",
    "expected_calibration_error",
    "load_ood_file",
    "log_likelihood",
    "median_bandwidth",
    "mmd2",
    "mmd_permutation_test",
    "nll",
    "reliability_diagram",
    "shifted_images",
    "uniform_noise",
]
