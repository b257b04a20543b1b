"""Argument validation shared by every public entry point.

Each helper raises an :class:`ArgumentError` (a ``ValueError`` and a ``TypeError``)
whose message names the argument and what was expected, so bad input fails before any
work starts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch


class ArgumentError(ValueError, TypeError):
    """Bad input to a public function, a config or a command: raised before any work
    starts, naming the argument and what was expected. It is a ``ValueError`` and a
    ``TypeError``, so callers catch it as either; the command line reports it in one
    line with exit status 2, while any other exception is an internal error.
    """


def _number(name: str, value: float) -> float:
    """Return ``value`` if it is a Python int or float (not a bool), else say what it is."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        got = (f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor)
               else type(value).__name__)  # fmt: skip
        raise ArgumentError(f"{name} must be a number, got {got}")
    return value


def finite(name: str, value: float) -> float:
    """Return ``value`` as a float if it is a finite number (a 0-d tensor counts)."""
    if isinstance(value, torch.Tensor) and value.ndim == 0:
        value = value.item()
    if not math.isfinite(_number(name, value)):
        raise ArgumentError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def positive(name: str, value: float, *, allow_zero: bool = False) -> float:
    """Return ``value`` if it is a finite number > 0 (or >= 0 with ``allow_zero``)."""
    _number(name, value)
    ok = value >= 0 if allow_zero else value > 0
    if not (math.isfinite(value) and ok):
        bound = ">= 0" if allow_zero else "> 0"
        raise ArgumentError(f"{name} must be a finite number {bound}, got {value!r}")
    return value


def positive_int(name: str, value: int, *, allow_zero: bool = False) -> int:
    """Return ``value`` if it is an int > 0 (or >= 0 with ``allow_zero``)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentError(f"{name} must be an integer, got {type(value).__name__}")
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else ">= 1"
        raise ArgumentError(f"{name} must be an integer {bound}, got {value}")
    return value


def positive_ints(name: str, value: Sequence[int]) -> tuple[int, ...]:
    """Return ``value`` as a tuple if it is a sequence of ints >= 1 (layer widths)."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ArgumentError(f"{name} must be a sequence of integers >= 1, got {value!r}")
    return tuple(positive_int(name, v) for v in value)


def probability(name: str, value: float) -> float:
    """Return ``value`` if it lies in [0, 1]."""
    positive(name, value, allow_zero=True)
    if value > 1:
        raise ArgumentError(f"{name} must lie in [0, 1], got {value!r}")
    return value


def below_one(name: str, value: float) -> float:
    """Return ``value`` if it lies in [0, 1)."""
    probability(name, value)
    if value >= 1:
        raise ArgumentError(f"{name} must be < 1, got {value!r}")
    return value


def image_shape(name: str, value: Any) -> tuple[int, int, int]:
    """``value`` as an image shape (channels, height, width) of positive integers."""
    if value is None or len(value) != 3 or any(int(v) < 1 for v in value):
        raise ArgumentError(f"{name} must be (channels, height, width), got {value}")
    return tuple(int(v) for v in value)  # type: ignore[return-value]


def one_of(name: str, value: Any, choices: Sequence[Any]) -> Any:
    """Return ``value`` if it is one of ``choices``."""
    if value not in choices:
        raise ArgumentError(f"{name} must be one of {list(choices)}, got {value!r}")
    return value


def choices(config: Any) -> Any:
    """Check every field a config dataclass lists in its ``CHOICES`` (field name ->
    allowed values) and return the config; the command line shows the same choices."""
    for name, allowed in type(config).CHOICES.items():
        one_of(name, getattr(config, name), allowed)
    return config


def tensor(
    name: str,
    value: Any,
    *,
    ndim: int | None = None,
    min_ndim: int | None = None,
    last_dims: Sequence[int] | None = None,
    floating: bool = False,
    finite: bool = False,
) -> torch.Tensor:
    """Return ``value`` as a tensor after checking its shape, dtype and values."""
    if not isinstance(value, torch.Tensor):
        raise ArgumentError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if ndim is not None and value.ndim != ndim:
        raise ArgumentError(f"{name} must have {ndim} dimensions, got shape {tuple(value.shape)}")
    if min_ndim is not None and value.ndim < min_ndim:
        raise ArgumentError(
            f"{name} must have at least {min_ndim} dimensions, got shape {tuple(value.shape)}"
        )
    if last_dims is not None:
        tail = tuple(value.shape[value.ndim - len(last_dims) :]) if value.ndim else ()
        if tail != tuple(last_dims):
            raise ArgumentError(
                f"{name} must end in shape {tuple(last_dims)}, got shape {tuple(value.shape)}"
            )
    if floating and not value.is_floating_point():
        raise ArgumentError(f"{name} must be a floating-point tensor, got dtype {value.dtype}")
    if value.ndim and value.shape[0] == 0:
        raise ArgumentError(f"{name} must not be empty, got shape {tuple(value.shape)}")
    if finite and value.is_floating_point() and not torch.isfinite(value).all():
        raise ArgumentError(f"{name} contains NaN or infinite values")
    return value


def rows_of(name: str, x: Any, width: int) -> torch.Tensor:
    """Return ``x`` if it is a batch (B, ...) of ``width`` values a row; reads shapes
    only, so it is cheap enough for every sampler step."""
    if not isinstance(x, torch.Tensor) or x.ndim < 2 or math.prod(x.shape[1:]) != width:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ArgumentError(f"{name} must be a batch (B, ...) of {width} values a row, got {shape}")
    return x


def class_indices(name: str, y: Any, n: int, num_classes: int) -> torch.Tensor:
    """Return ``y`` if it holds ``n`` integer class indices in [0, num_classes)."""
    if (
        not isinstance(y, torch.Tensor)
        or y.shape != (n,)
        or y.is_floating_point()
        or y.is_complex()
        or (n and not bool(((y >= 0) & (y < num_classes)).all()))
    ):
        shape = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        raise ArgumentError(
            f"{name} must be ({n},) integer class indices in [0, {num_classes}), got {shape}"
        )
    return y


def finite_parameters(name: str, model: Any) -> Any:
    """Return ``model`` if every floating parameter and buffer of it (an ``nn.Module``)
    is finite; other objects pass. Reads the values: call it before work, not per step."""
    if isinstance(model, torch.nn.Module):
        for what, t in [*model.named_parameters(), *model.named_buffers()]:
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                raise ArgumentError(f"{name} has NaN or infinite values in {what!r}")
    return model


def instance(name: str, value: Any, kind: type, what: str) -> Any:
    """Return ``value`` if it is a ``kind``; ``what`` names the kind in the error."""
    if not isinstance(value, kind):
        raise ArgumentError(f"{name} must be {what}, got {type(value).__name__}")
    return value


def callable_(name: str, value: Any) -> Callable[..., Any]:
    """Return ``value`` if it can be called."""
    if not callable(value):
        raise ArgumentError(f"{name} must be callable, got {type(value).__name__}")
    return value


def generator(
    name: str, value: Any, device: torch.device | str | None = None
) -> torch.Generator | None:
    """Accept ``None``, a ``torch.Generator`` or an int seed; return a generator or None.

    A seed becomes a generator on ``device`` (the data's; the CPU when None), so that
    draws are made where the data lives. A generator on another device than ``device``
    is an error: PyTorch would fail deep inside a kernel, or copy every draw across.
    """
    if value is None:
        return None
    if isinstance(value, torch.Generator):
        if device is not None and not same_device(value.device, device):
            raise ArgumentError(
                f"{name} is a generator on {value.device}, but the data is on "
                f"{torch.device(device)}: make it with torch.Generator(device=...) on the "
                "data's device, or pass an int seed"
            )
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        gen = torch.Generator(device=device if device is not None else "cpu")
        gen.manual_seed(value)
        return gen
    raise ArgumentError(f"{name} must be a torch.Generator, an int seed or None, got {value!r}")


def same_device(a: torch.device | str, b: torch.device | str) -> bool:
    """Whether ``a`` and ``b`` name one device (``cuda`` meaning the current CUDA device)."""
    a, b = torch.device(a), torch.device(b)
    if a.type != b.type:
        return False
    if a.index == b.index or a.type not in ("cuda", "xpu"):
        return True
    current = torch.cuda.current_device() if a.type == "cuda" else 0
    return (a.index if a.index is not None else current) == (
        b.index if b.index is not None else current
    )
