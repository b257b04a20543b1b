"""Trains a small deterministic task; run alone or under torchrun by test_distributed.py.

Usage: python ddp_worker.py OUT.pt [--optimizer sgd|adam] [--diverge-on-rank R]
Rank 0 saves the gradients seen before every optimizer step, the final parameters (or
the error that stopped training) and the threads still running after leaving the group.
"""

import argparse
import gc
from pathlib import Path

import torch
from torch import nn

from ebmlab.training import DivergenceError, StepResult, Task, Trainer, TrainerConfig, distributed


class Regression(Task):
    def __init__(self, diverge_on_rank: int) -> None:
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 1))
        self.diverge_on_rank = diverge_on_rank
        self.calls = 0

    def training_step(self, batch, generator):
        self.calls += 1
        if self.calls == 3 and distributed.rank() == self.diverge_on_rank:
            raise DivergenceError(f"planted fault on rank {distributed.rank()}")
        x, y = batch
        loss = (self.model(x).squeeze(1) - y).pow(2).mean()
        return StepResult(loss)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--optimizer", default="sgd")
    parser.add_argument("--diverge-on-rank", type=int, default=-1)
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(203, 5, generator=gen)
    y = x.sum(1).sin() + 0.1 * torch.randn(203, generator=gen)
    task = Regression(args.diverge_on_rank)
    config = TrainerConfig(
        epochs=2, batch_size=40, lr=0.05, optimizer=args.optimizer, progress=False, log_every=1
    )
    trainer = Trainer(task, (x, y), config)
    grads = []
    trainer.optimizer.register_step_pre_hook(
        lambda opt, a, k: grads.append([p.grad.clone() for p in trainer._params])
    )
    try:
        trainer.fit()
        result = {
            "grads": grads,
            "params": [p.detach() for p in trainer._params],
            "losses": [r["loss"] for r in trainer.history if r["split"] == "train"],
            "world_size": trainer.world_size,
        }
    except DivergenceError as err:
        result = {"error": str(err)}
    finally:
        distributed.shutdown()
    if distributed.is_main():
        result["threads_after_shutdown"] = thread_names()
        torch.save(result, args.out)


def thread_names() -> list[str]:
    """Names of this process's native threads (Linux), to see what outlives the group."""
    tasks = Path("/proc/self/task")
    return [(t / "comm").read_text().strip() for t in tasks.iterdir()] if tasks.is_dir() else []


if __name__ == "__main__":
    gc.freeze()  # as ebmlab.cli.run does: teardown skips the imports' objects
    main()
