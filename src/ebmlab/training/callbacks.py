"""Callbacks: code that runs at the trainer's logging and epoch boundaries.

A callback sees every record the trainer logs (``on_log``: training windows and
validation results, the same dicts that go to ``metrics.jsonl``) and the end of
every epoch (``on_epoch_end``). Subclass :class:`Callback` and pass instances to
``Trainer(..., callbacks=[...])``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ebmlab.training.trainer import Trainer


class Callback:
    """Base class; every hook does nothing by default."""

    def on_log(self, trainer: Trainer, record: dict[str, Any]) -> None:
        """Called with each record written to metrics.jsonl.

        Args:
            trainer: the ``Trainer`` running the task.
        """
        return None

    def on_epoch_end(self, trainer: Trainer) -> None:
        """Called after each epoch, validation included.

        Args:
            trainer: the ``Trainer`` running the task.
        """
        return None

    def on_train_end(self, trainer: Trainer, summary: dict[str, Any]) -> None:
        """Called once when training stops, with the run's summary.

        Args:
            trainer: the ``Trainer`` running the task.
        """
        return None


class TensorBoardLogger(Callback):
    """Writes every logged metric as a TensorBoard scalar ``<split>/<name>``.

    Needs the ``tensorboard`` extra (``pip install 'ebmlab[tensorboard]'``).

    Args:
        log_dir: the directory of the event file.
    """

    def __init__(self, log_dir: str | Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:  # pragma: no cover - depends on the optional extra
            raise ImportError(
                "TensorBoard logging needs the tensorboard package: "
                "pip install 'ebmlab[tensorboard]'"
            ) from err
        self.writer = SummaryWriter(str(log_dir))

    def on_log(self, trainer: Trainer, record: dict[str, Any]) -> None:
        """Write each numeric metric of the record as a scalar at its step.

        Args:
            trainer: the ``Trainer`` running the task.
        """
        split = record.get("split", "train")
        for key, value in record.items():
            if key not in ("split", "step", "epoch") and isinstance(value, int | float):
                self.writer.add_scalar(f"{split}/{key}", value, record["step"])

    def on_train_end(self, trainer: Trainer, summary: dict[str, Any]) -> None:
        """Close the event file.

        Args:
            trainer: the ``Trainer`` running the task.
            summary: the run's final summary.
        """
        self.writer.close()
