"""Inference: argmin over y of E(x, y)."""
