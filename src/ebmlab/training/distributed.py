"""Data-parallel training over ``torch.distributed`` (launched with ``torchrun``).

Every process (rank) holds a full copy of the model and takes its contiguous slice of
each global batch; after the backward pass the gradients are averaged across ranks,
weighted by slice size, so every rank applies the update a single process would apply
to the whole batch. Per-chain state (replay buffers, persistent chains) is split
across ranks: each rank owns ``share(n)`` of the ``n`` chains, seeded with
:func:`rank_seed`. Checkpoints hold the chains of all ranks concatenated in rank
order (:func:`gather_state`), so a distributed run's checkpoint is also a valid
single-process one; on resume each rank takes back its slice (:func:`scatter_state`).

The process group is joined on first use from the environment ``torchrun`` provides
(``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR``...). The training device
decides the backend: NCCL for CUDA, with one GPU per rank (``LOCAL_RANK``, made the
current device), and gloo otherwise; every collective's tensors sit on the backend's
device. Without that environment every function here is the identity of a single
process.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import torch
from torch import distributed as dist

from ebmlab._checks import ArgumentError

_joined: dict[str, Any] = {}  # rank, group size and collective device, decided once


def init(device: torch.device | None = None) -> None:
    """Join the process group described by the environment, or settle on a single
    process, for training on ``device`` (the CPU when None). Decided on first use and
    kept: it never joins again after :func:`shutdown`."""
    device = torch.device("cpu") if device is None else torch.device(device)
    if _joined:
        if _joined["world"] > 1 and _joined["device"].type != device.type:
            raise ArgumentError(
                f"the process group was joined for {_joined['device'].type} and training "
                f"asks for {device}: choose the device before anything else joins the group"
            )
        return
    if not dist.is_initialized():
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            _joined.update(rank=0, world=1, device=device)
            return
        # This module binds the default group into its functions' default arguments when
        # first imported (torch.optim imports it through torch._dynamo). Imported after
        # joining, it keeps the group and its threads alive past destroy_process_group,
        # and those threads can abort the process at interpreter exit.
        importlib.import_module("torch.distributed.nn.functional")

        if device.type == "cuda":
            torch.cuda.set_device(device)
        # torchrun's agent keeps one key-value store across the restarts of its workers
        # (--max-restarts): each attempt's keys get their own prefix, or a restarted rank
        # would read the address of a process that died with the previous attempt
        store, rank, world = next(dist.rendezvous("env://"))
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            store=dist.PrefixStore(f"ebmlab/attempt_{attempt}", store),
            rank=rank,
            world_size=world,
        )
    backend_device = device if dist.get_backend() == "nccl" else torch.device("cpu")
    _joined.update(rank=dist.get_rank(), world=dist.get_world_size(), device=backend_device)


def shutdown() -> None:
    """Leave the process group if one was joined, all ranks together: a rank that tore
    its connections down while another still used them could abort the other at exit."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def active() -> bool:
    """Whether several processes train together now (joins their group on first use)."""
    init()
    return _joined["world"] > 1 and dist.is_initialized()


def rank() -> int:
    """This process's rank (still known after :func:`shutdown`)."""
    init()
    return _joined["rank"]


def world_size() -> int:
    return _joined["world"] if active() else 1


def is_main() -> bool:
    """True on the process that writes files (rank 0, or the only process)."""
    return rank() == 0


def rank_seed(seed: int) -> int:
    """A seed for this rank's random streams; rank 0 keeps ``seed`` itself."""
    return seed + 1_000_033 * rank()


def share(n: int, which: int | None = None) -> int:
    """How many of ``n`` items (chains, batch rows) rank ``which`` (default: this one) owns.

    The split is ``torch.tensor_split``'s: the first ``n % world_size`` ranks own one more.
    """
    r = rank() if which is None else which
    w = world_size()
    return n // w + (1 if r < n % w else 0)


def local_slice(x: torch.Tensor) -> torch.Tensor:
    """This rank's contiguous slice of ``x`` along the first dimension."""
    return x.tensor_split(world_size())[rank()] if active() else x


def barrier() -> None:
    if active():
        dist.barrier()


def any_true(flag: bool) -> bool:
    """Whether ``flag`` holds on any rank (every rank must call)."""
    if not active():
        return flag
    t = torch.tensor([float(flag)], device=_joined["device"])
    dist.all_reduce(t)
    return bool(t.item() > 0)


def weighted_mean(values: dict[str, float], weight: float) -> dict[str, float]:
    """The ``weight``-weighted mean of each value over ranks (same keys on every rank)."""
    if not active() or not values:
        return values
    t = torch.tensor(
        [weight, *(weight * v for v in values.values())],
        dtype=torch.float64,
        device=_joined["device"],
    )
    dist.all_reduce(t)
    return {k: float(v) for k, v in zip(values, (t[1:] / t[0]).tolist(), strict=True)}


def average_gradients(params: list[torch.nn.Parameter], weight: float) -> None:
    """Replace each ``.grad`` by the ``weight``-weighted average over ranks (one all-reduce).

    ``weight`` is this rank's share of the global batch (they sum to 1), so the result
    is the gradient of the global mean loss. A parameter without a gradient on every rank
    (a frozen layer) keeps none, so optimizers skip it as a single process would.
    """
    if not active():
        return
    grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in params]
    present = torch.tensor(
        [float(p.grad is not None) for p in params], dtype=grads[0].dtype, device=grads[0].device
    )
    flat = torch.cat([*(g.reshape(-1) for g in grads), present]).mul_(weight)
    dist.all_reduce(flat)
    parts = flat.split([*(g.numel() for g in grads), len(params)])
    for p, part, seen in zip(params, parts[:-1], parts[-1].tolist(), strict=True):
        p.grad = part.view_as(p) if seen > 0 else None


def broadcast_parameters(module: torch.nn.Module) -> None:
    """Copy rank 0's parameters and buffers to every rank."""
    if not active():
        return
    with torch.no_grad():
        for t in [*module.parameters(), *module.buffers()]:
            dist.broadcast(t.data, 0)


def all_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj`` in rank order (every rank must call)."""
    if not active():
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def gather_state(state: Any) -> Any:
    """Merge per-rank task states: tensors are concatenated along dim 0 in rank order,
    everything else is taken from rank 0. Every rank must call; all receive the result."""
    states = all_objects(state)
    return _merge(states) if len(states) > 1 else state


def _merge(states: list[Any]) -> Any:
    first = states[0]
    if isinstance(first, torch.Tensor) and first.dim() > 0:
        return torch.cat(states)
    if isinstance(first, dict):
        return {k: _merge([s[k] for s in states]) for k in first}
    return first


def scatter_state(state: Any) -> Any:
    """This rank's slice of a merged state (the inverse of :func:`gather_state`)."""
    if not active():
        return state
    if isinstance(state, torch.Tensor) and state.dim() > 0:
        return state.tensor_split(world_size())[rank()].clone()
    if isinstance(state, dict):
        return {k: scatter_state(v) for k, v in state.items()}
    return state
