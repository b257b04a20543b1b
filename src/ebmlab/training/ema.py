"""Weight averaging: an exponential moving average (EMA) of a model's parameters.

After every optimizer step each parameter's average moves a fraction 1 - decay towards
its current value, w_ema <- decay w_ema + (1 - decay) w (Polyak & Juditsky 1992 for the
average; an exponential window as in most image generative models). Buffers (batch-norm
statistics, a classifier's fitted temperature) are not averaged: the model's own ones
serve both weight sets. The averaged weights are smoother than the last iterate, which
helps both the classifier and the sampler of an EBM; evaluation and sampling use them by
default. The update is one fused ``lerp`` over all parameters on their device, with no
host synchronisation.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ebmlab._checks import ArgumentError


class WeightAverage:
    """The EMA of ``model``'s parameters with ``decay`` in (0, 1)."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        if not 0 < decay < 1:
            raise ArgumentError(f"ema decay must lie in (0, 1), e.g. 0.999, got {decay!r}")
        self.decay = float(decay)
        self.names = [name for name, _ in model.named_parameters()]
        self.params = [p for _, p in model.named_parameters()]
        self.shadow = [p.detach().clone() for p in self.params]

    @torch.no_grad()
    def update(self) -> None:
        """Move the average towards the current parameters (after an optimizer step)."""
        torch._foreach_lerp_(self.shadow, self.params, 1 - self.decay)

    @contextmanager
    def applied(self) -> Iterator[None]:
        """The model holds the averaged parameters inside the block, its own after."""
        own = [p.detach().clone() for p in self.params]
        with torch.no_grad():
            torch._foreach_copy_(self.params, self.shadow)
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_(self.params, own)

    def state_dict(self) -> dict[str, Any]:
        """The averaged parameters by name (as in the model's ``state_dict``)."""
        return {"decay": self.decay, "average": dict(zip(self.names, self.shadow, strict=True))}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            for name, shadow in zip(self.names, self.shadow, strict=True):
                shadow.copy_(state["average"][name])
