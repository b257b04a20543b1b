"""Fingerprints of training data, so that a resumed run knows it sees the same data.

A checkpoint records the fingerprint of the rows it was trained on; resuming compares
it with the data given now. In-memory tensors are hashed whole (SHA-256 of shape,
dtype and bytes; about a second per GB). Rows kept on disk (:class:`EncodedRows`, sets
larger than a quarter of memory) are hashed by their shape, their split's row index
and 64 evenly spaced blocks of 1 MiB of the stored array, which any rewrite of the
file, a changed size or a different split shows, without reading gigabytes.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from ebmlab.data.encoding import EncodedRows

SAMPLED_BLOCKS, BLOCK_BYTES = 64, 1 << 20


def _update_with_tensor(digest, tensor: torch.Tensor) -> None:
    t = tensor.detach().cpu().contiguous()
    digest.update(f"{tuple(t.shape)}|{t.dtype}|".encode())
    digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")


def _update_with_rows(digest, rows: EncodedRows) -> None:
    digest.update(f"{tuple(rows.shape)}|{rows.array.dtype}|{rows.array.shape}|".encode())
    digest.update(np.ascontiguousarray(rows.index).tobytes())
    flat = rows.array.reshape(-1).view(np.uint8)
    if flat.size <= SAMPLED_BLOCKS * BLOCK_BYTES:
        digest.update(np.asarray(flat).tobytes())
        return
    for start in np.linspace(0, flat.size - BLOCK_BYTES, SAMPLED_BLOCKS).astype(np.int64):
        digest.update(np.asarray(flat[start : start + BLOCK_BYTES]).tobytes())


def data_fingerprint(data: tuple[torch.Tensor | EncodedRows, ...]) -> str:
    """The SHA-256 fingerprint (hex) of a run's training tensors, in order."""
    digest = hashlib.sha256()
    for part in data:
        if isinstance(part, EncodedRows):
            _update_with_rows(digest, part)
        else:
            _update_with_tensor(digest, part)
    return digest.hexdigest()
