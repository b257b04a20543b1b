"""Choosing a device and moving work onto it.

``resolve_device("auto")`` picks a CUDA GPU, then Apple's MPS, then the CPU; under
``torchrun`` a CUDA run takes the GPU of its ``LOCAL_RANK``. A device that is not
there is a ``ValueError`` that lists the devices that are. :func:`move_to` moves a
task's state (tensors, modules, replay buffers, data records, and containers of
them) to a device. :func:`wide_dtype` is the dtype for sums and statistics that want
double precision: float64, except on devices without it (Apple's GPU).
:func:`warm_and_capture` records repeated GPU work as a CUDA graph.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ebmlab._checks import ArgumentError

DEVICE_CHOICES = ("auto", "cpu", "cuda", "cuda:N", "mps")
NO_FLOAT64 = {"mps"}  # device types whose kernels have no double precision (Metal)


def wide_dtype(device: torch.device) -> torch.dtype:
    """float64 for accumulations and statistics (AIS log-weights, metrics) on devices
    that have it, float32 on those that do not (MPS), where such sums lose about seven
    significant digits instead of sixteen.

    Args:
        device: where the sum runs.
    """
    return torch.float32 if device.type in NO_FLOAT64 else torch.float64


def widen(t: torch.Tensor) -> torch.Tensor:
    """``t`` in the :func:`wide_dtype` of its device (where ``.double()`` would be)."""
    return t.to(wide_dtype(t.device))


def available() -> list[str]:
    """The devices torch can use here, as ``--device`` spells them."""
    found = [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if torch.backends.mps.is_available():
        found.append("mps")
    return [*found, "cpu"]


def resolve_device(spec: str | torch.device = "auto") -> torch.device:
    """The device ``spec`` names (``auto``, ``cpu``, ``cuda``, ``cuda:N``, ``mps``),
    checked to exist here. ``auto`` and ``cuda`` take the GPU of ``LOCAL_RANK`` (0
    without torchrun)."""
    if isinstance(spec, torch.device):
        spec = str(spec)
    if not isinstance(spec, str):
        raise ArgumentError(f"device must be a string such as 'cuda:0', got {type(spec).__name__}")
    name = spec.strip().lower()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if name == "auto":
        if torch.cuda.is_available():
            name = "cuda"
        elif torch.backends.mps.is_available():
            name = "mps"
        else:
            name = "cpu"
    if name == "cuda":
        name = f"cuda:{local}"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ArgumentError(
            f"device must be one of {', '.join(DEVICE_CHOICES)}, got {spec!r}"
        ) from None
    present = (
        device.type == "cpu"
        or (device.type == "mps" and torch.backends.mps.is_available())
        or (device.type == "cuda" and (device.index or 0) < torch.cuda.device_count())
    )
    if not present:
        raise ArgumentError(
            f"device {spec!r} is not available here; available: {', '.join(available())}"
        )
    return torch.device("mps") if device.type == "mps" else device


def move_to(value: Any, device: torch.device) -> Any:
    """``value`` on ``device``: tensors and modules (in place), objects with a ``to``
    method (replay buffers, data records), and tuples, lists and dicts of them; other
    values are returned as they are."""
    if isinstance(value, (torch.Tensor, nn.Module)):
        return value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(move_to(v, device) for v in value)
    if isinstance(value, dict):
        return {k: move_to(v, device) for k, v in value.items()}
    mover = getattr(value, "to", None)
    if callable(mover) and not isinstance(value, type):
        return mover(device)
    return value


class CaptureError(RuntimeError):
    """Work could not be captured as a CUDA graph: ``message`` says why, ``ran``
    whether its warm-up call finished (else it stopped at a read-back to the host, its
    effects partial)."""

    def __init__(self, message: str, ran: bool) -> None:
        super().__init__(message)
        self.ran = ran


def warm_and_capture(
    run: Callable[[], bool],
    device: torch.device,
    generator: torch.Generator | None = None,
    pool: tuple | None = None,
) -> torch.cuda.CUDAGraph | None:
    """Call ``run()`` once for real on a side stream (the warm-up CUDA graphs want:
    lazily made handles and workspaces come into being outside the capture), then,
    if it returned True, capture the same call, unexecuted, as a CUDA graph to replay.

    The warm-up runs with torch's synchronisation check set to fail, so that work which
    reads values back to the host stops there rather than in the capture: a capture
    that fails leaves the device's default generator unusable for the process.

    Args:
        run: the work; returns whether it may be captured (False: ``None`` comes back).
        device: the CUDA device it runs on.
        generator: a non-default CUDA generator the work draws from, registered with
            the graph so that each replay advances its offset (``None``: the default).
        pool: a memory pool (``torch.cuda.graph_pool_handle()``) the graph shares with
            others never replayed at the same time (``None``: a pool of its own).

    Raises:
        CaptureError: the work reads values back to the host, or cannot be captured.
    """
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    checking = torch.cuda.get_sync_debug_mode()
    _set_sync_check("error")
    try:
        with torch.cuda.stream(side):
            ready = run()
    except RuntimeError as err:
        if "synchroniz" not in str(err).lower():
            raise
        raise CaptureError(f"it reads values back to the host: {err}", ran=False) from err
    finally:
        _set_sync_check(checking)
        torch.cuda.current_stream(device).wait_stream(side)
    if not ready:
        return None
    graph = torch.cuda.CUDAGraph()
    if generator is not None and hasattr(graph, "register_generator_state"):
        with warnings.catch_warnings():  # newer releases register it by themselves
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            graph.register_generator_state(generator)
    # capture_begin/end rather than torch.cuda.graph, which also empties the
    # allocator's cache before every capture
    torch.cuda.synchronize(device)
    try:
        with torch.cuda.stream(side):
            graph.capture_begin(pool=pool)
            try:
                run()
            finally:
                graph.capture_end()
    except RuntimeError as err:
        raise CaptureError(str(err), ran=True) from err
    return graph


def _set_sync_check(mode: str | int) -> None:
    """torch's check of synchronising calls, without its note that the check is a
    prototype (it catches the read-backs that matter here: .item(), .cpu(), copies)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        torch.cuda.set_sync_debug_mode(mode)
