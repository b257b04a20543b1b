"""Checkpoints written atomically and loaded without executing code.

A checkpoint is a dict of tensors and plain containers saved with ``torch.save``
into a temporary file in the same directory, flushed to disk and renamed over
the old one, so a crash mid-write leaves the previous checkpoint intact. Loading
uses ``torch.load(weights_only=True)``, which refuses pickled code.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

import torch

from ebmlab.devices import move_to


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt, truncated or contains disallowed objects."""


def save_checkpoint(state: dict[str, Any], path: str | os.PathLike) -> Path:
    """Write ``state`` to ``path`` atomically (temp file + fsync + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


def load_checkpoint(
    path: str | os.PathLike, map_location: torch.device | str = "cpu"
) -> dict[str, Any]:
    """Load a checkpoint saved by :func:`save_checkpoint` with its tensors on
    ``map_location``; never runs code from the file. Random-number states stay on the
    CPU, where ``set_state`` expects them, and so does the optimizer state, which
    ``Optimizer.load_state_dict`` places next to each parameter itself."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)

    except pickle.UnpicklingError as err:
        raise CheckpointError(
            f"refused to load {path}: it holds objects other than tensors and plain containers "
            f"({str(err).splitlines()[0]})"
        ) from err
    except (RuntimeError, EOFError, ValueError, OSError) as err:
        raise CheckpointError(f"checkpoint {path} is corrupt or truncated: {err}") from err
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path} does not hold a dict")
    device = torch.device(map_location)
    if device.type == "cpu":
        return state
    kept = ("optimizer", "rng", "rng_by_rank")
    return {k: v if k in kept else move_to(v, device) for k, v in state.items()}
