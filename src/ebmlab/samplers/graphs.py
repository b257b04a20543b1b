"""Chunks of sampler steps replayed as CUDA graphs.

A sampler step launches a dozen small kernels or more. On a GPU with small or medium
chains the launches from Python, not the arithmetic, then set the pace. When a
kernel's steps do the same device work at every step (:meth:`Sampler.replayable`:
no step size that follows the step index, no host-side decision), the chains' state
is kept in fixed buffers and a chunk of steps is captured once as a CUDA graph, then
replayed with one launch per chunk. The random numbers are drawn inside the graph
from a generator of the chunks' own, seeded from the run's generator, whose Philox
offset each replay advances: a replayed run is reproducible from its seed and
statistically the eager run, and an energy that cannot be captured leaves the run's
generator as it was (the run goes on eagerly from where the chunks stopped).

:class:`ChunkedSteps` runs the chunks; without capture (``capture=False``) it calls
the same chunk eagerly, the path the tests compare on any device.

Kernels whose steps are not replayable (NUTS's trees, AdaptiveHMC's trajectories, whose
lengths are decided on the host) still spend most of a step in the energy and its
gradient, a hundred kernels or more for a posterior written in PyTorch.
:class:`ReplayedGradient` captures that one evaluation per batch shape and replays it
for every leapfrog step: the same kernels on the same inputs, so the same values.
"""

from __future__ import annotations

import dataclasses
import itertools
import warnings
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ebmlab.devices import CaptureError, warm_and_capture
from ebmlab.energies.base import EnergyFn, EnergyFunction, energy_and_grad
from ebmlab.samplers.diagnostics import SamplingWarning

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ebmlab.samplers.base import Sampler, SamplerState

MAX_CHUNK = 64  # steps per graph at most: the run's finiteness is read back as often
MIN_CHUNK = 4
# phases shorter than this run eagerly: a capture costs about a chunk's host time and a
# graph's instantiation, which a few replays would not repay (a training step's SGLD)
MIN_STEPS = 64
COUNTERS = ("t", "n_grad_evals")  # the integer fields a step advances
# a batch shape's gradient is captured at its third evaluation (a step-size search or
# a one-off batch never pays a capture), for at most four shapes per run
CAPTURE_AT, MAX_SHAPES = 3, 4


def chunk_size(n_steps: int, thin: int | None) -> int:
    """Steps per captured chunk for a phase of ``n_steps``: a power of two near an
    eighth of them, between :data:`MIN_CHUNK` and :data:`MAX_CHUNK` (capturing a chunk
    costs about as much host time as running it eagerly), rounded to a multiple of
    ``thin`` so that every chunk keeps the same positions."""
    size = MIN_CHUNK
    while size * 2 <= min(MAX_CHUNK, n_steps // 8):
        size *= 2
    return size if thin is None else thin * max(1, size // thin)


def tensors(value: Any) -> list[torch.Tensor]:
    """The tensors of a state, in field order, nested dataclasses (``info``) included."""
    if isinstance(value, torch.Tensor):
        return [value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [t for f in dataclasses.fields(value) for t in tensors(getattr(value, f.name))]
    return []


def layout(value: Any) -> tuple:
    """What a state holds besides its tensors' values: its classes, where its tensors
    sit (with shape and dtype) and its other fields' values, the counters left out. Two
    states of equal layout differ only in their tensors' values and their counters."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype, value.device)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = [f.name for f in dataclasses.fields(value) if f.name not in COUNTERS]
        return (type(value), *((name, layout(getattr(value, name))) for name in names))
    if value is None or isinstance(value, (bool, int, float, str)):
        return ("value", value)
    return ("object", id(value))


def rebuilt(template: Any, values: Iterator[torch.Tensor]) -> Any:
    """``template`` (a state) with its tensors replaced, in :func:`tensors` order, by
    ``values``."""
    if isinstance(template, torch.Tensor):
        return next(values)
    if dataclasses.is_dataclass(template) and not isinstance(template, type):
        changes = {}
        for f in dataclasses.fields(template):
            field = getattr(template, f.name)
            if tensors(field):
                changes[f.name] = rebuilt(field, values)
        return dataclasses.replace(template, **changes) if changes else template
    return template


def row_sum_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype of the chains' row sums (:func:`row_sums`): at least single precision,
    so that the sums of finite half-precision rows do not overflow; int64 for discrete
    states."""
    if not x.is_floating_point():
        return torch.int64
    return torch.float32 if x.element_size() < 4 else x.dtype


def row_sums(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Each chain's (row of ``x``) sum, written into ``out`` (B,), of
    :func:`row_sum_dtype`: a NaN or an infinity in a row makes its sum non-finite. One
    reduction per step; the finiteness test waits for the check that reads many steps
    at once."""
    return torch.sum(x.flatten(1), 1, dtype=out.dtype, out=out)


class ChunkedSteps:
    """Steps of ``kernel`` from ``state`` in chunks of ``size``: the state lives in
    fixed buffers, a chunk reads and writes them, records each step's row sums in
    ``sums`` (size, B; :func:`row_sums`) and every ``thin``-th position in ``kept``
    (size / thin, B, ...). The first chunk runs eagerly (on a side stream, as CUDA
    graphs want before a capture); with ``capture`` the next ones replay it as one CUDA
    graph.

    Args:
        kernel: the sampler; its steps from ``state`` must be replayable.
        energy: the energy callable.
        generator: the run's generator (``None``: the device's default one); with
            ``capture`` it seeds the chunks' own.
        state: the chains' state after at least one step (its layout is final).
        size: steps per chunk, a multiple of ``thin``.
        thin: keep every ``thin``-th state (``None``: keep none).
        capture: capture the chunk as a CUDA graph (CUDA devices only).
    """

    def __init__(
        self,
        kernel: Sampler,
        energy: EnergyFn,
        generator: torch.Generator | None,
        state: SamplerState,
        size: int,
        thin: int | None,
        capture: bool,
    ) -> None:
        self.kernel, self.energy, self.generator = kernel, energy, generator
        self.size, self.thin = size, thin
        self.template = state
        self.buffers = [t.clone() for t in tensors(state)]
        x = state.x
        self.sums = x.new_empty(size, x.shape[0], dtype=row_sum_dtype(x))
        self.kept = None if thin is None else x.new_empty(size // thin, *x.shape)
        self.capture = capture and x.device.type == "cuda"
        if self.capture:  # a failed capture spoils the generator it drew from: not the run's
            seed = torch.randint(2**62, (), generator=generator, device=x.device)
            self.generator = torch.Generator(x.device).manual_seed(int(seed))
        self.graph: torch.cuda.CUDAGraph | None = None
        self.advance: dict[str, int] = {}  # per chunk, of each counter
        self.counters = {name: getattr(state, name) for name in COUNTERS}
        self.broken: SamplerState | None = None  # the state where the layout changed

    def _chunk(self) -> bool:
        """``size`` steps from the buffers, their result written back into them; False
        (nothing written back) when the state's layout changed on the way."""
        state = rebuilt(self.template, iter(self.buffers))
        for j in range(self.size):
            state = self.kernel.step(state, self.energy, self.generator)
            row_sums(state.x, self.sums[j])
            if self.thin is not None and (j + 1) % self.thin == 0:
                self.kept[(j + 1) // self.thin - 1] = state.x
        if layout(state) != layout(self.template):
            self.broken = state
            return False
        self.advance = {name: getattr(state, name) - getattr(self.template, name)
                        for name in COUNTERS}  # fmt: skip
        results = [t.clone() for t in tensors(state)]  # a result may alias a buffer
        for buffer, result in zip(self.buffers, results, strict=True):
            buffer.copy_(result)
        return True

    def run(self) -> bool:
        """One chunk of steps; False when the layout changed in it (the steps are then
        not replayable: :attr:`broken` holds the state to go on from eagerly)."""
        if self.graph is not None:
            self.graph.replay()
        elif self.capture:
            self.graph = self._warm_and_capture()
        else:
            self._chunk()
        if self.broken is not None:
            return False
        for name, step in self.advance.items():
            self.counters[name] += step
        return True

    def _warm_and_capture(self) -> torch.cuda.CUDAGraph | None:
        """Run the first chunk (real steps) on a side stream, then capture the next;
        ``None``, after a :class:`SamplingWarning`, when the steps cannot be captured
        (an energy that reads values back to the host, say): the first chunk and the
        next ones then run eagerly."""
        try:
            return warm_and_capture(self._chunk, self.buffers[0].device, self.generator)
        except CaptureError as err:
            warnings.warn(
                f"the sampler's steps could not be captured as a CUDA graph ({err}); "
                "they run eagerly (Sampler.run(graphs=False) says so up front)",
                SamplingWarning,
                stacklevel=4,
            )
            self.capture = False
            if not err.ran:  # the buffers are untouched: the chunk runs again, eagerly
                self._chunk()
            return None

    def state(self) -> SamplerState:
        """The chains' state after the chunks run so far."""
        return rebuilt(self.template, iter(self.buffers)).replace(**self.counters)


def capturable(device: torch.device) -> bool:
    """Whether work on ``device`` can be captured now: a CUDA device, no capture under
    way (a replayed chunk's steps are captured whole)."""
    return device.type == "cuda" and not torch.cuda.is_current_stream_capturing()


@dataclasses.dataclass
class GradientGraphs:
    """The CUDA graphs of one energy's gradient, by batch shape, dtype, device,
    autocast state and the modes of the module it evaluates (``graphs``: graph, input
    buffer, outputs), how often each key was met (``seen``), whether a capture failed
    (``failed``), and ``where``: the addresses of the module's parameters and buffers.
    Graphs read those in place, so an optimiser's in-place update is seen by the next
    replay, while a module moved or reloaded by assignment makes its graphs stale. The
    graphs share one memory pool (``pool``): each is replayed alone and its outputs are
    copied out at once, so the pool holds what the largest of them needs, not the sum."""

    graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, torch.Tensor, list]] = dataclasses.field(
        default_factory=dict
    )
    seen: dict[tuple, int] = dataclasses.field(default_factory=dict)
    failed: bool = False
    where: tuple = ()
    pool: tuple | None = None


# a module's gradient graphs, kept across sampler runs (the short runs of a training
# loop's negatives) for as long as the module lives; they hold no reference to it
_KEPT: weakref.WeakKeyDictionary[nn.Module, GradientGraphs] = weakref.WeakKeyDictionary()


def module_addresses(module: nn.Module) -> tuple:
    """Where ``module``'s parameters and buffers lie."""
    return tuple(t.data_ptr() for t in itertools.chain(module.parameters(), module.buffers()))


class ReplayedGradient(EnergyFunction):
    """``energy`` whose gradient evaluations (:meth:`value_and_grad`) on a CUDA device
    are replayed from CUDA graphs, one per batch shape, dtype, device and autocast
    state, captured at that key's :data:`CAPTURE_AT`-th evaluation: the batch is copied
    into the graph's input, the graph replayed, its outputs copied out, four launches in
    place of the energy's forward and backward kernels. Values are those of the eager
    evaluation (the same kernels on the same inputs). The energy itself (``__call__``)
    runs eagerly. An energy that cannot be captured (one that reads values back to the
    host, say) is evaluated eagerly from then on, after a :class:`SamplingWarning`.

    Args:
        energy: the energy callable.
        module: the module ``energy`` evaluates, if any: its graphs are then kept per
            mode (training or evaluation, of each submodule) and dropped whenever its
            parameters or buffers move. Without one, the parameters must stay where
            they are while the graphs live (a sampler's run keeps them).
        graphs: the graphs to use and add to (default: new ones).
    """

    def __init__(
        self,
        energy: EnergyFn,
        module: nn.Module | None = None,
        graphs: GradientGraphs | None = None,
    ) -> None:
        super().__init__(energy)
        self.module = module
        self.store = GradientGraphs() if graphs is None else graphs

    def value_and_grad(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        store = self.store
        key = (tuple(x.shape), x.dtype, x.device, torch.is_autocast_enabled(x.device.type))
        if self.module is not None:
            if (where := module_addresses(self.module)) != store.where:
                store.graphs.clear()  # stale: they would read where the tensors were
                store.seen.clear()
                store.where, store.pool = where, None
            key += tuple(sub.training for sub in self.module.modules())
        if key in store.graphs:
            graph, x_in, out = store.graphs[key]
            x_in.copy_(x)
            graph.replay()
            return out[0].clone(), out[1].clone()
        if store.failed or len(store.graphs) >= MAX_SHAPES or not capturable(x.device):
            return energy_and_grad(self.fn, x)
        store.seen[key] = store.seen.get(key, 0) + 1
        if store.seen[key] < CAPTURE_AT:
            return energy_and_grad(self.fn, x)
        return self._capture(key, x)

    def _capture(self, key: tuple, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Capture the evaluation at ``x``'s key and replay it at ``x``; eagerly, after
        a warning, when it cannot be captured."""
        x_in, out = x.detach().clone(), []

        def evaluate() -> bool:
            out[:] = energy_and_grad(self.fn, x_in)
            return True

        try:
            graph = warm_and_capture(evaluate, x.device, pool=self.store.pool)
        except CaptureError as err:
            warnings.warn(
                f"the energy's gradient could not be captured as a CUDA graph ({err}); it "
                "is evaluated eagerly (Sampler.run(graphs=False) says so up front)",
                SamplingWarning,
                stacklevel=5,
            )
            self.store.failed = True
            return energy_and_grad(self.fn, x)
        self.store.graphs[key] = (graph, x_in, out)
        if self.store.pool is None:  # the first graph's pool, for the next ones too
            self.store.pool = graph.pool()
        return self.value_and_grad(x)


def replayed_gradients(energy: EnergyFn, device: torch.device) -> EnergyFn:
    """``energy`` as a :class:`ReplayedGradient` where work on ``device`` can be captured,
    else ``energy`` itself (no bookkeeping on a device without graphs)."""
    return ReplayedGradient(energy) if capturable(device) else energy


def module_gradients(module: nn.Module, energy: EnergyFn, device: torch.device) -> EnergyFn:
    """``energy``, which evaluates ``module``, as a :class:`ReplayedGradient` with the
    module's graphs kept from earlier runs, where work on ``device`` can be captured
    (else ``energy`` itself). A training loop draws its negatives by short runs of a
    few dozen steps between optimiser steps; the captures are paid once, not per run.
    (Longer runs capture their own graphs, freed when they end.)"""
    if not capturable(device):
        return energy
    if (graphs := _KEPT.get(module)) is None:
        graphs = _KEPT[module] = GradientGraphs()
    return ReplayedGradient(energy, module, graphs)
