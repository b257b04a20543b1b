"""A replay buffer of persistent chains (Tieleman 2008; Du & Mordatch 2019; JEM).

Each training step draws chain starts from the buffer; with probability
``reinit_prob`` a start is replaced by a fresh draw from ``init_fn`` (JEM uses
0.05), which keeps the buffer from collapsing onto a few modes. After the
sampler has moved them, the chains are written back to their slots. With
``n_classes`` the buffer is split into equal per-class segments, so that
class-conditional chains (x ~ p(x | y)) persist separately.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ebmlab import _checks

InitFn = Callable[[int, torch.Generator | None], torch.Tensor]


def uniform_init(shape: tuple[int, ...], low: float = -1.0, high: float = 1.0) -> InitFn:
    """Chains started uniformly in the box [low, high]^shape (the seed's eq. 6.28 start)."""

    def init(n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        return low + (high - low) * torch.rand(n, *shape, generator=generator)

    return init


class ReplayBuffer:
    """Fixed-capacity store of chain states, filled from ``init_fn`` at creation."""

    def __init__(
        self,
        capacity: int,
        init_fn: InitFn,
        reinit_prob: float = 0.05,
        generator: torch.Generator | None = None,
        n_classes: int | None = None,
    ) -> None:
        self.capacity = _checks.positive_int("capacity", capacity)
        self.init_fn = _checks.callable_("init_fn", init_fn)
        self.reinit_prob = _checks.probability("reinit_prob", reinit_prob)
        self.n_classes = None if n_classes is None else _checks.positive_int("n_classes", n_classes)
        if n_classes is not None and capacity % n_classes:
            raise ValueError(f"capacity ({capacity}) must be a multiple of n_classes ({n_classes})")
        self.buffer = init_fn(capacity, generator)
        if self.buffer.shape[0] != capacity:
            raise ValueError(
                f"init_fn(n) must return n states, got shape {tuple(self.buffer.shape)}"
            )

    def sample(
        self, n: int, generator: torch.Generator | None = None, y: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(starts, slots)``: n chain starts and the buffer slots they came from.

        With per-class segments, ``y`` (n,) names the class of each requested chain.
        """
        _checks.positive_int("n", n)
        if (y is None) != (self.n_classes is None):
            raise ValueError("y must be given exactly when the buffer has n_classes")
        if y is None:
            slots = torch.randint(self.capacity, (n,), generator=generator)
        else:
            if y.shape != (n,) or int(y.min()) < 0 or int(y.max()) >= self.n_classes:
                raise ValueError(f"y must be ({n},) class indices in [0, {self.n_classes})")
            per_class = self.capacity // self.n_classes
            slots = y.long() * per_class + torch.randint(per_class, (n,), generator=generator)
        starts = self.buffer[slots].clone()
        fresh = torch.rand(n, generator=generator) < self.reinit_prob
        if fresh.any():
            starts[fresh] = self.init_fn(int(fresh.sum()), generator).to(starts.dtype)
        return starts, slots

    def push(self, x: torch.Tensor, slots: torch.Tensor) -> None:
        """Write moved chains back into their slots."""
        self.buffer[slots] = x.detach().to(self.buffer.dtype)

    def state_dict(self) -> dict[str, Any]:
        return {"buffer": self.buffer.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        buf = state["buffer"]
        if buf.shape != self.buffer.shape:
            raise ValueError(
                f"replay buffer state has shape {tuple(buf.shape)}, "
                f"expected {tuple(self.buffer.shape)}"
            )
        self.buffer = buf.clone()
