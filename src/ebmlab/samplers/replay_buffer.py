"""A replay buffer of persistent chains (Tieleman 2008; Du & Mordatch 2019; JEM).

Each training step draws chain starts from the buffer; with probability
``reinit_prob`` a start is replaced by a fresh draw from ``init_fn`` (JEM uses
0.05), which keeps the buffer from collapsing onto a few modes. After the
sampler has moved them, the chains are written back to their slots. With
``n_classes`` the buffer is split into equal per-class segments, so that
class-conditional chains (x ~ p(x | y)) persist separately.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_map

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.devices import move_to, wide_dtype, widen
from ebmlab.samplers.base import diverged_rows, where_rows

InitFn = Callable[[int, torch.Generator | None], torch.Tensor]


def uniform_init(
    shape: tuple[int, ...],
    low: float | Sequence[float] | torch.Tensor = -1.0,
    high: float | Sequence[float] | torch.Tensor = 1.0,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> InitFn:
    """Chains started uniformly in the box [low, high]^shape (Tomczak 2024, eq. 6.28),
    on ``device`` (by default the generator's, else the CPU) in ``dtype`` (default
    float32). ``low`` and ``high`` are numbers, or per-coordinate bounds that broadcast
    to ``shape``."""
    if isinstance(low, float | int) and isinstance(high, float | int):
        box = None
    else:
        lo, hi = (torch.as_tensor(v, dtype=torch.float64) for v in (low, high))
        if not bool((hi > lo).all()):
            raise ArgumentError("uniform_init needs high > low in every coordinate")
        # the width in float64 first, as for numbers
        box = _PerDevice(((hi - lo).to(dtype or torch.float32), lo.to(dtype or torch.float32)))

    def init(n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        where = device if device is not None else generator.device if generator else None
        u = torch.rand(n, *shape, generator=generator, device=where, dtype=dtype)
        if box is None:
            return u.mul_(high - low).add_(low)
        width, start = box.on(u.device)
        return u.mul_(width).add_(start)

    return init


def _draw_components(
    weights: torch.Tensor, n: int, generator: torch.Generator | None
) -> torch.Tensor:
    """n mixture-component indices drawn with ``weights`` (none for n = 0)."""
    if n == 0:
        return torch.zeros(0, dtype=torch.long, device=weights.device)
    return torch.multinomial(weights, n, replacement=True, generator=generator)


class _PerDevice:
    """Tensors (any nesting of tuples and lists) copied once to each device asked for,
    so that an init function draws wherever its generator lives without copying its
    constants on every call; float64 ones become float32 on a device without float64."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.copies: dict[torch.device, Any] = {}

    def on(self, device: torch.device) -> Any:
        if device not in self.copies:
            wide = wide_dtype(device)
            narrowed = tree_map(
                lambda t: (
                    t.to(wide) if isinstance(t, torch.Tensor) and t.dtype == torch.float64 else t
                ),
                self.value,
            )
            self.copies[device] = move_to(narrowed, device)
        return self.copies[device]


def _select(which: torch.Tensor, parts: list[torch.Tensor]) -> torch.Tensor:
    """Row i of ``parts[which[i]]``, without reading ``which`` on the host."""
    out = parts[0]
    mask_shape = (-1, *([1] * (out.ndim - 1)))
    for k, part in enumerate(parts[1:], start=1):
        out = torch.where((which == k).view(mask_shape), part, out)
    return out


def gaussian_init(
    data: torch.Tensor,
    labels: torch.Tensor | None = None,
    ridge: float = 0.01,
    clamp: tuple[float, float] | None = None,
) -> InitFn:
    """Chains started from a Gaussian fitted to ``data`` (mean and full covariance plus
    ``ridge`` times the identity), or, given ``labels``, from the mixture of one such
    Gaussian per class weighted by the classes' frequencies: the informative
    initialisation of JEM++ (Yang & Ji 2021). Fresh chains then start near the data
    rather than in noise, so that short runs explore the data's neighbourhood and the
    model learns to tell data from blurred, digit-like look-alikes; such chains never
    meet noise, so combine them with :func:`uniform_init` through :func:`mixture_init`
    where the model must also rank noise low early on. ``clamp`` projects the draws onto
    a box (images live in one). The draws are made on ``data``'s device."""
    if data.ndim < 2 or not data.is_floating_point():
        raise ArgumentError(
            f"data must be a float tensor (N, ...), got {data.dtype} {tuple(data.shape)}"
        )
    _checks.positive("ridge", ridge)
    shape, flat = data.shape[1:], widen(data.detach().flatten(1))
    if labels is None:
        labels = torch.zeros(len(flat), dtype=torch.long, device=flat.device)
    elif labels.shape != (len(flat),) or labels.is_floating_point():
        raise ArgumentError(
            f"labels must be ({len(flat)},) class indices, got {tuple(labels.shape)}"
        )
    labels = labels.to(flat.device)
    classes, counts = torch.unique(labels, return_counts=True)
    if int(counts.min()) < 2:
        raise ArgumentError("every class needs at least two rows of data to fit a covariance")
    means, factors = [], []
    for k in classes:
        rows = flat[labels == k]
        cov = torch.cov(rows.T, correction=0).reshape(flat.shape[1], -1)
        cov += ridge * torch.eye(flat.shape[1], dtype=cov.dtype, device=cov.device)
        means.append(rows.mean(0).float())
        factors.append(torch.linalg.cholesky(cov).T.float())
    fitted = _PerDevice((widen(counts) / counts.sum(), means, factors))

    def init(n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        device = generator.device if generator is not None else flat.device
        weights, means_here, factors_here = fitted.on(device)
        which = _draw_components(weights, n, generator)
        x = torch.randn(n, flat.shape[1], generator=generator, device=device)
        parts = [torch.addmm(m, x, f) for m, f in zip(means_here, factors_here, strict=True)]
        x = _select(which, parts)
        if clamp is not None:
            x.clamp_(*clamp)
        return x.reshape(n, *shape)

    return init


def mixture_init(inits: list[InitFn], weights: list[float] | None = None) -> InitFn:
    """Chains started from a mixture: each start comes from ``inits[k]`` with probability
    ``weights[k]`` (equal by default), e.g. noise and data-like starts together, so that
    the model meets negatives both far from and near the data. Every component draws
    all n starts and each row keeps one, so no count is read back from the device."""
    if not inits:
        raise ArgumentError("inits must name at least one init function")
    for fn in inits:
        _checks.callable_("each of inits", fn)
    w = torch.ones(len(inits)) if weights is None else torch.tensor(weights, dtype=torch.float64)
    if w.shape != (len(inits),) or not bool((w >= 0).all()) or float(w.sum()) <= 0:
        raise ArgumentError(f"weights must be {len(inits)} numbers >= 0, not all 0, got {weights}")

    weights = _PerDevice(w.double())

    def init(n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        parts = [fn(n, generator) for fn in inits]
        which = _draw_components(weights.on(parts[0].device), n, generator)
        return _select(which, [p.to(parts[0].dtype) for p in parts])

    return init


class ReplayBuffer:
    """Fixed-capacity store of persistent chain states (Du & Mordatch 2019; Tomczak
    2024, §6.3), filled from ``init_fn`` at creation.

    Args:
        capacity: the number of stored chains.
        init_fn: ``(n, generator) -> (n, ...)`` fresh chain starts, e.g.
            :func:`uniform_init`.
        reinit_prob: the chance that a drawn chain is replaced by a fresh start.
        generator: source of the initial fill.
        n_classes: split the buffer into this many equal per-class segments.
    """

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
            raise ArgumentError(
                f"capacity ({capacity}) must be a multiple of n_classes ({n_classes})"
            )
        self.buffer = init_fn(capacity, generator)
        if self.buffer.shape[0] != capacity:
            raise ArgumentError(
                f"init_fn(n) must return n states, got shape {tuple(self.buffer.shape)}"
            )

    def sample(
        self, n: int, generator: torch.Generator | None = None, y: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(starts, slots)``: n chain starts and the buffer slots they came from.

        Each start is fresh from ``init_fn`` with probability ``reinit_prob``, drawn
        with ``generator``. With per-class segments, ``y`` (n,) names the class of each
        requested chain.
        """
        _checks.positive_int("n", n)
        if (y is None) != (self.n_classes is None):
            raise ArgumentError("y must be given exactly when the buffer has n_classes")
        device = self.buffer.device
        if y is None:
            slots = torch.randint(self.capacity, (n,), generator=generator, device=device)
        else:
            if y.shape != (n,) or int(y.min()) < 0 or int(y.max()) >= self.n_classes:
                raise ArgumentError(f"y must be ({n},) class indices in [0, {self.n_classes})")
            per_class = self.capacity // self.n_classes
            slots = torch.randint(per_class, (n,), generator=generator, device=device)
            slots += y.long() * per_class
        starts = self.buffer[slots]
        if self.reinit_prob > 0:  # every row gets a fresh draw; the reinitialised keep it
            fresh = torch.rand(n, generator=generator, device=device) < self.reinit_prob
            draws = self.init_fn(n, generator).to(starts.dtype)
            starts = torch.where(fresh.view(-1, *([1] * (starts.ndim - 1))), draws, starts)
        return starts, slots

    def distinct(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Return min(n, capacity) distinct stored chains, drawn uniformly without
        replacement with ``generator``, as a copy: the buffer is left as it was and no
        chain is replaced by a fresh start. For drawing evaluation samples, where a
        repeated chain would count twice."""
        _checks.positive_int("n", n)
        slots = torch.randperm(self.capacity, generator=generator, device=self.buffer.device)
        return self.buffer[slots[:n]]

    def push(self, x: torch.Tensor, slots: torch.Tensor) -> None:
        """Write moved chains ``x`` (n, ...) back into their ``slots`` (n,).

        A slot drawn more than once keeps the last chain drawn for it. Every duplicate
        writes that same chain: parallel writes to one row (CPU threads, GPU blocks)
        land in any order and would otherwise leave a mix of elements of several
        chains, different from run to run.
        """
        order = torch.arange(len(slots), device=slots.device)
        last = torch.full((self.capacity,), -1, dtype=torch.long, device=slots.device)
        last.scatter_reduce_(0, slots, order, "amax")
        self.buffer[slots] = x.detach()[last[slots]].to(self.buffer.dtype)

    def reset_diverged(
        self, generator: torch.Generator | None = None, bound: float | None = None
    ) -> int:
        """Redraw from ``init_fn`` (with ``generator``) every chain with a non-finite
        entry or, given ``bound``, an entry beyond +-bound, and return how many were
        redrawn. Meant for recovery
        after a divergence, between steps: it reads the count back from the device."""
        if bound is not None:
            _checks.positive("bound", bound)
        bad = diverged_rows(self.buffer, bound)
        draws = self.init_fn(self.capacity, generator).to(self.buffer.device, self.buffer.dtype)
        self.buffer = where_rows(bad, draws, self.buffer)
        return int(bad.sum())

    def state_dict(self) -> dict[str, Any]:
        """The chains, for a checkpoint."""
        return {"buffer": self.buffer.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the chains of :meth:`state_dict` (``state``), keeping this buffer's
        device."""
        buf = state["buffer"]
        if buf.shape != self.buffer.shape:
            raise ArgumentError(
                f"replay buffer state has shape {tuple(buf.shape)}, "
                f"expected {tuple(self.buffer.shape)}"
            )
        self.buffer = buf.to(self.buffer.device, copy=True)

    def to(self, device: torch.device | str) -> ReplayBuffer:
        """Move the stored chains to ``device`` (in place; returns the buffer). Fresh
        starts are drawn where the generator passed to :meth:`sample` lives."""
        self.buffer = self.buffer.to(device)
        return self
