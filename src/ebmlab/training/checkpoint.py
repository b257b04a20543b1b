"""Checkpoints written atomically, verified, and loaded without executing code.

A checkpoint is a dict of tensors and plain containers saved with ``torch.save``
into a temporary file in the same directory, flushed to disk and renamed over
the old one, so a crash mid-write leaves the previous checkpoint intact. Next to it,
``NAME.pt.sha256`` holds the SHA-256 of its bytes: a truncated or corrupted file is
detected before it is read. With ``keep_previous`` the checkpoint it replaces stays
as ``NAME-1.pt``, which :func:`load_newest_good` falls back to. Every checkpoint
records its ``format``; files from before the format was recorded (format 1, the
same layout) load as they are, newer formats are refused by name. Loading uses
``torch.load(weights_only=True)``, which refuses pickled code.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from ebmlab.devices import move_to

FORMAT = 2  # 1: no format key and no checksum file; 2: both


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt, truncated or contains disallowed objects."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (disk full, quota, I/O error); the file at its
    path is still the last complete checkpoint."""


def _write_temporary(data: bytes, path: Path) -> str:
    """``data`` in a flushed temporary file beside ``path``; returns its name."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def _keep_copy(source: Path, target: Path) -> None:
    """Replace ``target`` by ``source``'s content atomically, leaving ``source`` in place
    (a hard link where the file system has them, else a copy)."""
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copyfile(source, tmp)
    os.replace(tmp, target)


def checksum_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def previous_path(path: Path) -> Path:
    return path.with_name(f"{path.stem}-1{path.suffix}")


def save_checkpoint(
    state: dict[str, Any], path: str | os.PathLike, keep_previous: bool = False
) -> Path:
    """Write ``state`` to ``path`` atomically (temp file + fsync + rename) with its
    checksum file; ``keep_previous`` first keeps the checkpoint being replaced as
    NAME-1.pt. ``path`` exists throughout, for readers such as ``ebmlab evaluate``.
    A failed write (a full disk) raises :class:`CheckpointWriteError` and leaves the
    previous checkpoint in place."""
    path = Path(path)
    buffer = io.BytesIO()
    torch.save({**state, "format": FORMAT}, buffer)
    try:
        _replace_atomically(buffer.getvalue(), path, keep_previous)
    except OSError as err:
        raise CheckpointWriteError(
            f"could not write checkpoint {path} ({err.strerror or err}); the file there is "
            "still the last complete checkpoint"
        ) from err
    return path


def _replace_atomically(data: bytes, path: Path, keep_previous: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _write_temporary(data, path)
    if keep_previous and path.is_file():
        _keep_copy(path, previous_path(path))
        if checksum_path(path).is_file():
            _keep_copy(checksum_path(path), checksum_path(previous_path(path)))
        else:
            checksum_path(previous_path(path)).unlink(missing_ok=True)
    checksum_path(path).unlink(missing_ok=True)  # never a new file beside an old checksum
    os.replace(tmp, path)
    digest = hashlib.sha256(data).hexdigest().encode()
    os.replace(_write_temporary(digest, checksum_path(path)), checksum_path(path))
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _read_verified(path: Path) -> bytes:
    """The file's bytes, checked against its SHA-256 file (format 1 files have none)."""
    stored = checksum_path(path)
    for wait in (0.0, 0.2):  # a writer may be between replacing the file and its checksum
        time.sleep(wait)
        data = path.read_bytes()
        try:  # read, not looked for first: a writer may remove it in between
            expected = stored.read_text().strip()
        except FileNotFoundError:  # format 1, or a writer between a file and its checksum
            return data
        actual = hashlib.sha256(data).hexdigest()
        if actual == expected:
            return data
    raise CheckpointError(
        f"checkpoint {path} is corrupt or truncated: its SHA-256 {actual[:12]}... differs "
        f"from the one recorded when it was written ({expected[:12]}...)"
    )


def load_checkpoint(
    path: str | os.PathLike, map_location: torch.device | str = "cpu"
) -> dict[str, Any]:
    """Load a checkpoint saved by :func:`save_checkpoint` with its tensors on
    ``map_location``; never runs code from the file. Random-number states stay on the
    CPU, where ``set_state`` expects them, and so does the optimizer state, which
    ``Optimizer.load_state_dict`` places next to each parameter itself.

    Args:
        path: the checkpoint file.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    data = _read_verified(path)
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise CheckpointError(
            f"refused to load {path}: it holds objects other than tensors and plain containers "
            f"({str(err).splitlines()[0]})"
        ) from err
    except (RuntimeError, EOFError, ValueError, OSError) as err:
        raise CheckpointError(f"checkpoint {path} is corrupt or truncated: {err}") from err
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path} does not hold a dict")
    version = state.pop("format", 1)
    if version not in (1, FORMAT):
        raise CheckpointError(
            f"checkpoint {path} has format {version!r}; this ebmlab reads formats 1 to "
            f"{FORMAT}: load it with the ebmlab version that wrote it"
        )
    device = torch.device(map_location)
    if device.type == "cpu":
        return state
    kept = ("optimizer", "rng", "rng_by_rank")
    return {k: v if k in kept else move_to(v, device) for k, v in state.items()}


def load_newest_good(
    path: str | os.PathLike, map_location: torch.device | str = "cpu"
) -> tuple[dict[str, Any], Path, str | None]:
    """The checkpoint at ``path``, or, when it is missing or damaged, the one it replaced
    (NAME-1.pt). Returns the state, the file used, and why ``path`` was passed over
    (None when it was not)."""
    path = Path(path)
    try:
        return load_checkpoint(path, map_location), path, None
    except CheckpointError as err:
        if not previous_path(path).is_file():
            raise
        fallback = previous_path(path)
        return load_checkpoint(fallback, map_location), fallback, str(err)
