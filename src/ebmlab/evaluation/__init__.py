"""Evaluation: likelihoods, sample quality, diagnostics and plots."""

from ebmlab.evaluation.metrics import median_bandwidth, mmd2

__all__ = ["median_bandwidth", "mmd2"]
