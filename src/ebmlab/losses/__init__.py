"""Losses: what learning minimises."""

from ebmlab.losses.contrastive import contrastive_divergence_loss

__all__ = ["contrastive_divergence_loss"]
