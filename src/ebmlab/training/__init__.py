"""Training: the shared loop, run directories, checkpoints and recipes."""

from ebmlab.training import distributed
from ebmlab.training.callbacks import Callback, TensorBoardLogger
from ebmlab.training.checkpoint import (
    CheckpointError,
    CheckpointWriteError,
    load_checkpoint,
    save_checkpoint,
)
from ebmlab.training.run_dir import RunDirectory
from ebmlab.training.trainer import DivergenceError, StepResult, Task, Trainer, TrainerConfig

__all__ = [
    "Callback",
    "CheckpointError",
    "CheckpointWriteError",
    "DivergenceError",
    "RunDirectory",
    "StepResult",
    "Task",
    "TensorBoardLogger",
    "Trainer",
    "TrainerConfig",
    "distributed",
    "load_checkpoint",
    "save_checkpoint",
]
