"""The training loop shared by every recipe.

A :class:`Task` says what one step computes (a loss and metrics for a batch);
the :class:`Trainer` owns everything else: batching with a seeded shuffle,
the optimizer and learning-rate schedule, gradient clipping, logging with a
progress bar, validation, early stopping, checkpoints, divergence detection,
graceful preemption (:mod:`ebmlab.training.preemption`) and exact resumption.
Resuming from ``checkpoints/last.pt`` reproduces the uninterrupted run bit for bit on
CPU: the checkpoint carries the model, optimizer and task state, the step counters,
and every random-number state.

Under ``torchrun`` the same loop runs data-parallel (see
:mod:`ebmlab.training.distributed`): each rank trains on its slice of every global
batch, gradients and metrics are averaged across ranks, and only rank 0 writes the
run directory.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn
from tqdm.auto import tqdm

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.data.encoding import EncodedRows
from ebmlab.devices import move_to, resolve_device
from ebmlab.energies.base import energy_device
from ebmlab.samplers.base import NonFiniteChainError
from ebmlab.threads import apply_threads, busy_warning
from ebmlab.training import distributed
from ebmlab.training.callbacks import Callback, TensorBoardLogger
from ebmlab.training.checkpoint import CheckpointWriteError, load_newest_good, save_checkpoint
from ebmlab.training.ema import WeightAverage
from ebmlab.training.fingerprint import data_fingerprint
from ebmlab.training.preemption import Preemption
from ebmlab.training.run_dir import RunDirectory, RunDirectoryBusyError, RunDirectoryInUseError

# Adam, AdamW and SGD use PyTorch's fused kernels: one pass over all parameters, 3-5x
# faster steps than the default per-tensor loop on CPUs (Adamax has none).
OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "adam": lambda params, lr, weight_decay, momentum: torch.optim.Adam(
        params, lr=lr, weight_decay=weight_decay, fused=True
    ),
    "adamw": lambda params, lr, weight_decay, momentum: torch.optim.AdamW(
        params, lr=lr, weight_decay=weight_decay, fused=True
    ),
    "adamax": lambda params, lr, weight_decay, momentum: torch.optim.Adamax(
        params, lr=lr, weight_decay=weight_decay
    ),
    "sgd": lambda params, lr, weight_decay, momentum: torch.optim.SGD(
        params, lr=lr, momentum=momentum, weight_decay=weight_decay, fused=True
    ),
}
SCHEDULES = ("constant", "cosine", "linear")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
RESEED = 7_919  # seed offset per divergence restart: a fresh stream on every rank


def compile_networks(model: nn.Module, mode: str = "default") -> None:
    """``torch.compile`` the networks inside ``model`` (its child modules, in place): the
    training loss and the autograd gradients samplers take both go through their
    forward passes, so both run compiled. ``reduce-overhead`` adds CUDA graphs, which
    pay off where shapes stay fixed (a constant batch and chain count)."""
    for child in list(model.children()) or [model]:
        child.compile(mode=mode)


class _Batches(torch.utils.data.Dataset):
    """Item i is the rows ``shares[i]`` of every array in ``data``: a DataLoader over it
    yields whole batches, in the order the trainer's seeded shuffle chose."""

    def __init__(self, data: tuple[Any, ...], shares: list[torch.Tensor]) -> None:
        self.data, self.shares = data, shares

    def __len__(self) -> int:
        return len(self.shares)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, ...]:
        return tuple(t[self.shares[i]] for t in self.data)


class DivergenceError(RuntimeError):
    """Training produced a non-finite loss, metric or gradient, or a task saw it diverge.

    Tasks raise it from ``training_step`` for recipe-specific signs (e.g. energies
    running away); the trainer adds the step and the last good checkpoint.
    """


@dataclass
class TrainerConfig:
    """Settings of the training loop (every recipe shares them).

    Attributes:
        epochs: passes over the training data.
        batch_size: rows per step (the global batch under data parallelism).
        lr: peak learning rate.
        optimizer: the torch optimizer (fused kernels where PyTorch has them).
        weight_decay: L2 penalty (decoupled for adamw).
        momentum: momentum of SGD.
        lr_schedule: learning rate after warm-up: constant, cosine or linear decay to zero.
        warmup_steps: steps of linear warm-up from zero (at most a tenth of the run:
            a longer one is shortened to that, with a message).
        grad_clip: bound on the gradients' global norm (0: none).
        seed: seed of every random choice of the run.
        checkpoint_every: also save checkpoints/last.pt every this many steps (0: per epoch).
        log_every: steps per record in metrics.jsonl.
        val_every: epochs between validations.
        early_stopping_patience: epochs without improvement before stopping (0: never).
        monitor: the validation metric that picks checkpoints/best.pt.
        monitor_mode: whether lower (min) or higher (max) values of monitor are better.
        max_steps: stop after this many steps (0: after all epochs).
        divergence_restarts: on divergence, restarts from the last good checkpoint.
        restart_lr_factor: learning rate factor applied at each restart.
        progress: show a progress bar.
        tensorboard: also write TensorBoard event files.
        device: auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps.
        threads: CPU threads (0: PyTorch's count, at most the CPUs this process may use).
        compile: torch.compile the model's networks (training and sampler passes).
        compile_mode: torch.compile mode; reduce-overhead adds CUDA graphs.
        channels_last: convolution weights and inputs in NHWC (tensor cores on CUDA).
        grad_scaler: scale the loss against float16 underflow (train_dtype float16).
        num_workers: DataLoader worker processes for data kept on disk.
        pin_memory: page-locked batches for faster copies to a CUDA device.
        prefetch: batches each DataLoader worker loads ahead.
        ema: decay of a moving average of the weights used for evaluation (0: none).
        preempt_grace: seconds from SIGTERM/SIGINT to the checkpoint at most.
        on_save_error: when a checkpoint cannot be written (a full disk): stop with the
            previous checkpoint intact, or record it in metrics.jsonl and go on.
        allow_data_change: resume even when the training data's fingerprint differs
            from the one the checkpoint recorded (else the resume is refused).
    """

    CHOICES: ClassVar[dict[str, Sequence[str]]] = {
        "optimizer": tuple(OPTIMIZERS),
        "lr_schedule": SCHEDULES,
        "monitor_mode": ("min", "max"),
        "compile_mode": COMPILE_MODES,
        "on_save_error": ("stop", "continue"),
    }

    epochs: int = 10
    batch_size: int = 64
    lr: float = 1e-3
    optimizer: str = "adam"
    weight_decay: float = 0.0
    momentum: float = 0.9
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    grad_clip: float = 0.0
    seed: int = 0
    checkpoint_every: int = 0
    log_every: int = 10
    val_every: int = 1
    early_stopping_patience: int = 0
    monitor: str = "val_loss"
    monitor_mode: str = "min"
    max_steps: int = 0
    divergence_restarts: int = 0
    restart_lr_factor: float = 0.5
    progress: bool = True
    tensorboard: bool = False
    device: str = "auto"
    threads: int = 0
    compile: bool = False
    compile_mode: str = "default"
    channels_last: bool = False
    grad_scaler: bool = False
    num_workers: int = 0
    pin_memory: bool = True
    prefetch: int = 2
    ema: float = 0.0
    preempt_grace: float = 30.0
    on_save_error: str = "stop"
    allow_data_change: bool = False

    def __post_init__(self) -> None:
        _checks.positive_int("epochs", self.epochs)
        _checks.positive_int("batch_size", self.batch_size)
        _checks.positive("lr", self.lr)
        _checks.choices(self)
        _checks.positive("weight_decay", self.weight_decay, allow_zero=True)
        _checks.probability("momentum", self.momentum)
        _checks.positive_int("warmup_steps", self.warmup_steps, allow_zero=True)
        _checks.positive("grad_clip", self.grad_clip, allow_zero=True)
        _checks.positive_int("seed", self.seed, allow_zero=True)
        _checks.positive_int("checkpoint_every", self.checkpoint_every, allow_zero=True)
        _checks.positive_int("log_every", self.log_every)
        _checks.positive_int("val_every", self.val_every)
        _checks.positive_int(
            "early_stopping_patience", self.early_stopping_patience, allow_zero=True
        )
        _checks.positive_int("max_steps", self.max_steps, allow_zero=True)
        _checks.positive_int("divergence_restarts", self.divergence_restarts, allow_zero=True)
        _checks.probability("restart_lr_factor", self.restart_lr_factor)
        resolve_device(self.device)
        _checks.positive_int("threads", self.threads, allow_zero=True)
        _checks.positive_int("num_workers", self.num_workers, allow_zero=True)
        _checks.positive_int("prefetch", self.prefetch)
        _checks.positive("preempt_grace", self.preempt_grace)
        if self.ema and not 0 < self.ema < 1:
            raise ArgumentError(f"ema must be 0 (off) or a decay in (0, 1), got {self.ema!r}")


@dataclass
class StepResult:
    """What a task's training step returns: the loss to minimise and scalar metrics.

    ``grads_ready`` means the task already wrote the parameters' ``.grad`` (closed-form
    gradients, e.g. contrastive divergence for RBMs); ``loss`` is then only logged.
    """

    loss: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    grads_ready: bool = False


class Task:
    """What a recipe trains. Subclasses set ``model`` and implement ``training_step``.

    ``validate`` returns validation metrics (the monitored one among them),
    ``on_epoch_end`` may write pictures into the run directory, and
    ``state_dict``/``load_state_dict`` carry extra state such as replay buffers.
    ``differentiates_twice`` says that the loss holds input gradients of the model
    (score matching, flow matching of -grad V), so its backward pass differentiates
    the network twice, which ``torch.compile`` cannot do.
    """

    model: nn.Module
    differentiates_twice = False

    def training_step(
        self, batch: tuple[torch.Tensor, ...], generator: torch.Generator
    ) -> StepResult:
        """The loss of one batch (a tuple of tensors, this rank's share) and its metrics.

        Args:
            generator: source of randomness, a ``torch.Generator`` on the data's device
                (``None``: the global one).
        """
        raise NotImplementedError  # pragma: no cover - abstract

    def validate(self, generator: torch.Generator) -> dict[str, float]:
        """Validation metrics after an epoch; the monitored one picks best.pt.

        Args:
            generator: source of randomness, a ``torch.Generator`` on the data's device
                (``None``: the global one).
        """
        return {}

    def on_epoch_end(
        self, run: RunDirectory | None, epoch: int, generator: torch.Generator
    ) -> None:
        """Write pictures or other artefacts into the run directory after an epoch.

        Args:
            generator: source of randomness, a ``torch.Generator`` on the data's device
                (``None``: the global one).
        """
        return None

    def state_dict(self) -> dict[str, Any]:
        """State beyond the model's parameters (replay buffers, chains) for checkpoints."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the state of :meth:`state_dict`."""
        return None

    def on_restart(self, generator: torch.Generator) -> dict[str, float]:
        """After a divergence restart reloaded the last good checkpoint: reset the state
        that ran away (chains that are non-finite or out of bounds), and return counts
        for the restart's record in ``metrics.jsonl``.

        Args:
            generator: source of randomness, a ``torch.Generator`` on the data's device
                (``None``: the global one).
        """
        return {}

    def final_metrics(self, generator: torch.Generator) -> dict[str, Any]:
        """Measurements of the trained model for the run's summary, when affordable
        (e.g. the test log-likelihood of an RBM).

        Args:
            generator: source of randomness, a ``torch.Generator`` on the data's device
                (``None``: the global one).
        """
        return {}

    def generator(self, seed: int) -> torch.Generator:
        """A generator seeded with ``seed`` on the model's device."""
        return torch.Generator(energy_device(self.model)).manual_seed(seed)

    def to(self, device: torch.device) -> Task:
        """Move everything the task holds to ``device``: the model, tensors, replay
        buffers, data records (see :func:`ebmlab.devices.move_to`). Tasks that keep
        device state elsewhere extend it."""
        for name, value in vars(self).items():
            setattr(self, name, move_to(value, device))
        return self


class Trainer:
    """Runs a :class:`Task` over in-memory tensors ``train_data`` for ``config.epochs``.

    Args:
        task: what is trained: its model, loss and evaluation.
        run_dir: where checkpoints, metrics and figures go (``None``: nothing written).
        run_config: the run's configuration, saved in config.json and checkpoints.
        callbacks: hooks called on logging, epoch ends and the end of training.
    """

    def __init__(
        self,
        task: Task,
        train_data: tuple[torch.Tensor, ...],
        config: TrainerConfig | None = None,
        run_dir: str | RunDirectory | None = None,
        run_config: dict[str, Any] | None = None,
        callbacks: list[Callback] | None = None,
    ) -> None:
        self.task = task
        self.callbacks = list(callbacks or [])
        self.config = config or TrainerConfig()
        self.preemption = Preemption(self.config.preempt_grace)
        if (
            not isinstance(train_data, tuple)
            or not train_data
            or not all(isinstance(t, (torch.Tensor, EncodedRows)) for t in train_data)
        ):
            raise ArgumentError(
                "train_data must be a non-empty tuple of tensors (or EncodedRows) with equal "
                "first dimension"
            )
        n = train_data[0].shape[0]
        if n == 0 or any(t.shape[0] != n for t in train_data):
            raise ArgumentError(
                "train_data tensors must be non-empty and share their first dimension"
            )
        self.device = resolve_device(self.config.device)
        self.threads = apply_threads(self.config.threads)
        distributed.init(self.device)
        self.world_size = distributed.world_size()
        if self.config.batch_size < self.world_size:
            raise ArgumentError(
                f"batch_size ({self.config.batch_size}) must be at least the number of "
                f"processes ({self.world_size})"
            )
        if n < self.world_size:
            raise ArgumentError(
                f"train_data has {n} rows, fewer than the {self.world_size} processes"
            )
        self.main = distributed.is_main()
        self.task = task.to(self.device)
        if self.config.channels_last:
            task.model.to(memory_format=torch.channels_last)
        if self.config.compile:
            if task.differentiates_twice:
                raise ArgumentError(
                    "compile: this loss differentiates the network twice (it holds input "
                    "gradients), which torch.compile does not support; train without it"
                )
            compile_networks(task.model, self.config.compile_mode)
        # rows kept on disk are read by a DataLoader (workers, pinned memory) together
        # with the arrays beside them, which stay on the host; in-memory tensors move to
        # the device and are indexed there
        self.streamed = any(isinstance(t, EncodedRows) for t in train_data)
        home = torch.device("cpu") if self.streamed else self.device
        self.train_data = tuple(t.to(home) for t in train_data)
        self.data_fingerprint = data_fingerprint(train_data) if run_dir is not None else None
        self.n_batches = len(self._batches(0))
        self.total_steps = self.config.epochs * self.n_batches
        if self.config.max_steps:
            self.total_steps = min(self.total_steps, self.config.max_steps)
        self.warmup_steps = min(self.config.warmup_steps, self.total_steps // 10)
        if run_dir is None:
            self.run = None
        else:
            self.run = run_dir if isinstance(run_dir, RunDirectory) else RunDirectory(run_dir)
        self.run_config = {"trainer": asdict(self.config), **(run_config or {})}
        params = [p for p in task.model.parameters() if p.requires_grad]
        self._params = params
        distributed.broadcast_parameters(task.model)
        self.ema = WeightAverage(task.model, self.config.ema) if self.config.ema else None
        self.optimizer = OPTIMIZERS[self.config.optimizer](
            params,
            lr=self.config.lr,
            weight_decay=self.config.weight_decay,
            momentum=self.config.momentum,
        )
        self.generator = torch.Generator(self.device).manual_seed(
            distributed.rank_seed(self.config.seed)
        )
        # float16 gradients underflow: the scaler multiplies the loss, unscales the
        # gradients, and skips (and counts) a step whose gradients overflowed
        self.scaler = torch.amp.GradScaler(self.device.type) if self.config.grad_scaler else None
        self.epoch = 0
        self.batch = 0
        self.step = 0
        self.best = math.inf if self.config.monitor_mode == "min" else -math.inf
        self.bad_epochs = 0
        self.metric_records = 0
        self.lr_scale = 1.0
        self.restarts = 0
        self.seconds_before = 0.0  # wall time of the parts this run was resumed from
        self.started = time.perf_counter()
        self.history: list[dict[str, Any]] = []

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """The full training state; under ``torchrun`` every rank must call it (the task
        state and random-number states of all ranks are gathered)."""
        rng = {
            "device": str(self.device),
            "generator": self.generator.get_state(),
            "torch": torch.get_rng_state(),
        }
        if torch.cuda.is_initialized():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        rngs = distributed.all_objects(rng)
        return {
            "format": 1,
            "data": self.data_fingerprint,
            "model": self.task.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            **({"grad_scaler": self.scaler.state_dict()} if self.scaler else {}),
            **({"ema": self.ema.state_dict()} if self.ema else {}),
            "task": distributed.gather_state(self.task.state_dict()),
            "trainer": {
                "world_size": self.world_size,
                "epoch": self.epoch,
                "batch": self.batch,
                "step": self.step,
                "best": self.best,
                "bad_epochs": self.bad_epochs,
                "metric_records": self.metric_records,
                "lr_scale": self.lr_scale,
                "restarts": self.restarts,
                "seconds": self.seconds(),
            },
            "rng": rngs[0],
            **({"rng_by_rank": rngs} if self.world_size > 1 else {}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a full training state of :meth:`state_dict` (onto this trainer's device)."""
        self._check_data(state.get("data"))
        t = state["trainer"]
        saved_world = t.get("world_size", 1)
        if saved_world != self.world_size:
            raise ArgumentError(
                f"the checkpoint was written by {saved_world} process(es) and is resumed by "
                f"{self.world_size}; resume with --nproc {saved_world} for an exact continuation"
            )
        self.task.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler is not None and "grad_scaler" in state:
            self.scaler.load_state_dict(state["grad_scaler"])
        if self.ema is not None and "ema" in state:
            self.ema.load_state_dict(state["ema"])
        self.task.load_state_dict(distributed.scatter_state(state["task"]))
        self.epoch, self.batch, self.step = t["epoch"], t["batch"], t["step"]
        self.lr_scale, self.restarts = t.get("lr_scale", 1.0), t.get("restarts", 0)
        self.seconds_before, self.started = t.get("seconds", 0.0), time.perf_counter()
        self.best, self.bad_epochs, self.metric_records = (
            t["best"],
            t["bad_epochs"],
            t["metric_records"],
        )
        rng = state["rng_by_rank"][distributed.rank()] if self.world_size > 1 else state["rng"]
        torch.set_rng_state(rng["torch"])
        if rng.get("device", "cpu").split(":")[0] == self.device.type:
            self.generator.set_state(rng["generator"])
            if "cuda" in rng and len(rng["cuda"]) == torch.cuda.device_count():
                torch.cuda.set_rng_state_all(rng["cuda"])
        else:  # another kind of generator: the run goes on, not bit for bit
            self.generator.manual_seed(distributed.rank_seed(self.config.seed) + self.step)

    def _check_data(self, saved: str | None) -> None:
        """Refuse to resume on training data whose fingerprint differs from the
        checkpoint's, unless ``allow_data_change`` (then say so)."""
        if saved is None or self.data_fingerprint is None or saved == self.data_fingerprint:
            return
        if not self.config.allow_data_change:
            raise ArgumentError(
                f"the training data changed since the checkpoint was written (fingerprint "
                f"{saved[:12]}..., now {self.data_fingerprint[:12]}...); resume with "
                "--allow-data-change to continue on the new data"
            )
        if self.main:
            print("ebmlab: the training data changed since the checkpoint; resuming on the "
                  "new data (--allow-data-change)", file=sys.stderr)  # fmt: skip

    def save(self, which: str = "last") -> None:
        """Write the training state to ``checkpoints/{which}.pt`` (rank 0; every rank must call
        it)."""
        if self.run is None:
            return
        for name, p in self.task.model.named_parameters():
            self._check(f"parameter '{name}'", 0.0 if torch.isfinite(p).all() else math.nan)
        state = self.state_dict()
        failure = None
        if self.main:
            try:
                save_checkpoint(state, self.run.checkpoints / f"{which}.pt", which == "last")
            except CheckpointWriteError as err:
                failure = err
        if not distributed.any_true(failure is not None):
            return
        message = str(failure or "rank 0 could not write a checkpoint")
        if self.config.on_save_error == "stop":
            raise CheckpointWriteError(f"training stopped at step {self.step}: {message}")
        self._log({"split": "save_failed", "epoch": self.epoch, "step": self.step,
                   "checkpoint": which})  # fmt: skip
        if self.main:
            print(f"ebmlab: {message}; training goes on (on_save_error = continue)",
                  file=sys.stderr)  # fmt: skip

    def resume(self) -> None:
        """Continue from ``checkpoints/last.pt`` of the run directory."""
        if self.run is None:
            raise ArgumentError("resume needs a run directory")
        state, used, problem = load_newest_good(self.run.last, map_location=self.device)
        if problem and self.main:
            print(f"ebmlab: {problem}; resuming from {used.name} instead", file=sys.stderr)
        self.load_state_dict(state)
        if self.main:
            self.run.truncate_metrics(self.metric_records)

    def seconds(self) -> float:
        """Wall time of the run so far: this part and every part it was resumed from."""
        return self.seconds_before + time.perf_counter() - self.started

    # -------------------------------------------------------------- schedule
    def lr_at(self, step: int) -> float:
        """The learning rate at ``step``: warm-up, then the schedule, times any restart factor."""
        return self.lr_scale * self._base_lr_at(step)

    def _base_lr_at(self, step: int) -> float:
        c = self.config
        if step < self.warmup_steps:
            return c.lr * (step + 1) / self.warmup_steps
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        if c.lr_schedule == "cosine":
            return c.lr * 0.5 * (1 + math.cos(math.pi * progress))
        if c.lr_schedule == "linear":
            return c.lr * (1 - progress)
        return c.lr

    def _batches(self, epoch: int) -> list[torch.Tensor]:
        """The epoch's global batches (the same on every rank). With several processes a
        last batch smaller than their number is dropped, so every rank has data."""
        gen = torch.Generator().manual_seed(self.config.seed * 1_000_003 + epoch)
        perm = torch.randperm(self.train_data[0].shape[0], generator=gen)
        batches = list(perm.split(self.config.batch_size))
        if len(batches[-1]) < self.world_size:
            batches.pop()
        return batches

    # ------------------------------------------------------------------ loop
    def _log(self, record: dict[str, Any]) -> None:
        self.history.append(record)
        self.metric_records += 1
        if not self.main:
            return
        if self.run is not None:
            self.run.append_metrics(record)
        for callback in self.callbacks:
            callback.on_log(self, record)

    def _check(self, what: str, value: float) -> None:
        if not math.isfinite(value):
            raise DivergenceError(
                f"training diverged at step {self.step}: {what} is {value}; {self._where()}"
            )

    def _epoch_data(
        self, batches: list[torch.Tensor]
    ) -> Iterator[tuple[tuple[torch.Tensor, ...], float]]:
        """This rank's share of the epoch's batches from ``self.batch`` on, each with its
        weight (the share of the global batch), on the trainer's device."""
        shares = [distributed.local_slice(idx) for idx in batches[self.batch :]]
        weights = [
            len(share) / len(idx) for share, idx in zip(shares, batches[self.batch :], strict=True)
        ]
        if not self.streamed:
            for share, weight in zip(shares, weights, strict=True):
                local = share.to(self.device)
                yield tuple(t[local] for t in self.train_data), weight
            return
        c = self.config
        loader = torch.utils.data.DataLoader(
            _Batches(self.train_data, shares),
            batch_size=None,
            num_workers=c.num_workers,
            pin_memory=c.pin_memory and self.device.type == "cuda",
            prefetch_factor=c.prefetch if c.num_workers else None,
            generator=torch.Generator(),  # its seed draw leaves the global stream alone
        )
        for batch, weight in zip(loader, weights, strict=True):
            yield tuple(t.to(self.device, non_blocking=True) for t in batch), weight

    def _train_step(self, batch: tuple[torch.Tensor, ...], weight: float) -> dict[str, float]:
        lr = self.lr_at(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        failure = None
        self.optimizer.zero_grad(set_to_none=True)  # a parameter the step leaves alone stays still
        try:
            result = self.task.training_step(batch, self.generator)
        except (DivergenceError, NonFiniteChainError) as err:  # a chain ran off: diverged
            failure = err
        if distributed.any_true(failure is not None):
            reasons = [str(e) for e in distributed.all_objects(failure) if e is not None]
            raise DivergenceError(
                f"training diverged at step {self.step}: {reasons[0]}; {self._where()}"
            ) from failure
        out = {"loss": float(result.loss.detach())}
        out.update((k, float(v)) for k, v in result.metrics.items())
        out = distributed.weighted_mean(out, weight)
        for name, value in out.items():
            self._check("the loss" if name == "loss" else f"metric '{name}'", value)
        if not result.grads_ready:
            (result.loss if self.scaler is None else self.scaler.scale(result.loss)).backward()
        distributed.average_gradients(self._params, weight)
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        # The gradient norm costs a pass over all gradients: it is taken when clipping and once
        # per logging window for the curves. A non-finite gradient that slips through makes the
        # parameters, hence the next loss, non-finite, and checkpoints refuse such parameters.
        if self.config.grad_clip or (self.step + 1) % self.config.log_every == 0:
            grads = [p.grad for p in self._params if p.grad is not None]
            grad_norm = float(torch.nn.utils.get_total_norm(grads))
            if self.scaler is None:  # with a scaler, an overflowed step is skipped instead
                self._check("the gradient norm", grad_norm)
            if self.config.grad_clip and grad_norm > self.config.grad_clip:
                torch._foreach_mul_(grads, self.config.grad_clip / grad_norm)
            out["grad_norm"] = grad_norm
        if self.scaler is None:
            self.optimizer.step()
        else:
            self.scaler.step(self.optimizer)
            self.scaler.update()
            out["loss_scale"] = self.scaler.get_scale()
        if self.ema is not None:
            self.ema.update()
        out["lr"] = lr
        return out

    def _where(self) -> str:
        if self.run is None:
            return "no run directory, nothing was saved"
        if self.run.last.is_file():
            restart = (
                ""
                if self.config.divergence_restarts
                else " (divergence_restarts > 0, --divergence-restarts on the command line, "
                "restarts from it at a lower learning rate)"
            )
            return f"the last good checkpoint is {self.run.last}{restart}"
        return "no checkpoint had been written yet"

    def _flush(self, window: list[dict[str, float]]) -> None:
        if window:
            avg = {}
            for key in dict.fromkeys(k for w in window for k in w):
                values = [w[key] for w in window if key in w]
                avg[key] = sum(values) / len(values)
            self._log({"split": "train", "epoch": self.epoch, "step": self.step, **avg})
            window.clear()

    def _validate_and_checkpoint(self) -> bool:
        """End-of-epoch work; returns True when early stopping says stop."""
        self.task.model.eval()
        due = (self.epoch + 1) % self.config.val_every == 0 or self.epoch + 1 == self.config.epochs
        with self.ema.applied() if self.ema else contextlib.nullcontext():
            val = self.task.validate(self.generator) if due else {}
        val = distributed.weighted_mean(val, 1.0)
        stop = False
        if val:
            for name, value in val.items():
                self._check(f"validation metric '{name}'", float(value))
            self._log({"split": "val", "epoch": self.epoch, "step": self.step, **val})
            monitored = val.get(self.config.monitor)
            if monitored is not None:
                better = (
                    monitored < self.best
                    if self.config.monitor_mode == "min"
                    else monitored > self.best
                )
                if better:
                    self.best, self.bad_epochs = monitored, 0
                    self.save("best")
                else:
                    self.bad_epochs += 1
                patience = self.config.early_stopping_patience
                stop = bool(patience) and self.bad_epochs >= patience
        self.task.on_epoch_end(self.run if self.main else None, self.epoch, self.generator)
        for callback in self.callbacks if self.main else ():
            callback.on_epoch_end(self)
        self.epoch += 1
        self.batch = 0
        self.save("last")
        return stop

    def fit(self, resume: bool = False, overwrite: bool = False) -> dict[str, Any]:
        """Train; with ``resume`` continue from the run directory's last checkpoint.

        A fresh start into a directory that holds a run is refused unless ``overwrite``,
        which first removes every file of the old run. The main process holds the run
        directory's lock meanwhile, so a second training pointed at it is refused
        (:meth:`RunDirectory.owned`)."""
        with contextlib.ExitStack() as stack:
            refused = None
            if self.run is not None and self.main:
                try:
                    stack.enter_context(self.run.owned())
                    if not resume and overwrite:
                        self.run.clear()
                    elif not resume:
                        self.run.refuse_fresh_start("resume=True", "overwrite=True")
                except (RunDirectoryBusyError, RunDirectoryInUseError) as err:
                    refused = err
            if distributed.any_true(refused is not None):
                raise refused or RunDirectoryBusyError(f"{self.run.path} is refused on rank 0")
            return self._fit(resume)

    def _fit(self, resume: bool) -> dict[str, Any]:
        c = self.config
        self.started = time.perf_counter()
        if self.run is not None:
            if self.main:
                self.run.create()
                if c.tensorboard and not any(
                    isinstance(cb, TensorBoardLogger) for cb in self.callbacks
                ):
                    self.callbacks.append(TensorBoardLogger(self.run.path / "tensorboard"))
            if resume:
                self.resume()
            elif self.main:
                self.run.write_config(self.run_config)
            distributed.barrier()
        elif resume:
            raise ArgumentError("resume needs a run directory")
        if self.main and self.warmup_steps < c.warmup_steps:
            print(f"ebmlab: warmup_steps {c.warmup_steps} is more than a tenth of this run's "
                  f"{self.total_steps} steps; warming up over {self.warmup_steps} instead",
                  file=sys.stderr)  # fmt: skip
        if self.main and self.device.type == "cpu" and (busy := busy_warning(self.threads)):
            print(f"ebmlab: {busy}", file=sys.stderr)
        bar = tqdm(
            total=self.total_steps,
            initial=self.step,
            disable=not (c.progress and self.main),
            desc="train",
            leave=False,
        )
        try:
            with self.preemption:
                while True:
                    try:
                        status = self._run(bar)
                        break
                    except DivergenceError as err:
                        if not self._restart_after(err):
                            self._finish("diverged", error=str(err))
                            raise
                        bar.reset(total=self.total_steps)
                        bar.update(self.step)
        finally:
            bar.close()
        if status == "interrupted":
            return self._finish(status, final={"signal": self.preemption.name})
        return self._finish(status, final=self.task.final_metrics(self.generator))

    def _interrupted(self, window: list[dict[str, float]]) -> bool:
        """At a step boundary: if a stop was asked for (on any rank), record it, save the
        last checkpoint and say so."""
        if not distributed.any_true(self.preemption.received is not None):
            return False
        self._flush(window)
        signal_name = self.preemption.name or "signal on another rank"
        self._log(
            {"split": "interrupted", "epoch": self.epoch, "step": self.step, "signal": signal_name}
        )
        self.save("last")
        return True

    def _restart_after(self, err: DivergenceError) -> bool:
        """Opt-in recovery, the remedy the JEM authors advise for runs that diverge
        (Grathwohl et al. 2019): reload the last good checkpoint, lower the learning
        rate, draw a fresh random stream (the same noise would lead to the same blow-up)
        and let the task reset chains that ran away (:meth:`Task.on_restart`)."""
        c = self.config
        if (
            self.restarts >= c.divergence_restarts
            or self.run is None
            or not self.run.last.is_file()
        ):
            return False
        scale = self.lr_scale * c.restart_lr_factor
        restarts, seconds = self.restarts + 1, self.seconds()
        self.resume()
        self.lr_scale, self.restarts = scale, restarts
        self.seconds_before, self.started = seconds, time.perf_counter()
        self.generator.manual_seed(distributed.rank_seed(c.seed + RESEED * restarts))
        per_rank = distributed.all_objects(self.task.on_restart(self.generator))
        reset = {k: sum(counts[k] for counts in per_rank) for k in per_rank[0]}  # totals
        self._log(
            {"split": "restart", "epoch": self.epoch, "step": self.step, "lr_scale": scale,
             **reset}
        )  # fmt: skip
        if self.main:
            print(
                f"ebmlab: {err}; restarting from step {self.step} with learning rate x{scale:g}",
                file=sys.stderr,
            )
        return True

    def _run(self, bar) -> str:
        """The epoch loop from the current counters; returns the final status."""
        c = self.config
        status = "completed"
        window: list[dict[str, float]] = []
        while self.epoch < c.epochs and (not c.max_steps or self.step < c.max_steps):
            batches = self._batches(self.epoch)
            self.task.model.train()
            for batch, weight in self._epoch_data(batches):
                metrics = self._train_step(batch, weight)
                self.batch += 1
                self.step += 1
                window.append(metrics)
                bar.update(1)
                if c.progress and self.step % 10 == 0:
                    bar.set_postfix({k: f"{v:.3g}" for k, v in list(metrics.items())[:4]})
                if len(window) >= c.log_every:
                    self._flush(window)
                at_limit = bool(c.max_steps) and self.step >= c.max_steps
                if (c.checkpoint_every and self.step % c.checkpoint_every == 0) or at_limit:
                    self._flush(window)
                    self.save("last")
                if at_limit:
                    break
                if self._interrupted(window):
                    return "interrupted"
            if self.batch < len(batches):
                break
            self._flush(window)
            if self._validate_and_checkpoint():
                status = "early_stopped"
                break
        if status == "completed" and self.epoch < c.epochs:
            status = "max_steps"
        return status

    def _finish(
        self,
        status: str,
        error: str | None = None,
        final: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        last = {k: v for k, v in self.history[-1].items()} if self.history else {}
        summary = {
            "status": status,
            "epoch": self.epoch,
            "step": self.step,
            "seconds": self.seconds(),
            "best": {self.config.monitor: self.best} if math.isfinite(self.best) else {},
            "restarts": self.restarts,
            "last_record": last,
            **(final or {}),
        }
        if error:
            summary["error"] = error
        if self.run is not None and self.main:
            self.run.write_summary(summary)
            self.run.plot_curves()
        for callback in self.callbacks if self.main else ():
            callback.on_train_end(self, summary)
        return summary
