"""Training recipes: named, configurable jobs that ``ebmlab train <recipe>`` runs.

A recipe module in this package calls :func:`register` at import time; the
registry imports every module here on first use, so adding a recipe needs no
change to the command-line dispatcher.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import torch

from ebmlab._checks import ArgumentError
from ebmlab.data import Dataset, run_splits
from ebmlab.samplers import ReplayBuffer
from ebmlab.training import distributed
from ebmlab.training.run_dir import RunDirectory
from ebmlab.training.trainer import Task, TrainerConfig

RUNAWAY = 10.0  # a chain farther out than this many times the data's extent has diverged


class BufferTask(Task):
    """A task whose negatives live in a replay buffer, this rank's share of the chains;
    the buffer is the task's checkpointed state. ``data_extent`` is the largest magnitude
    of the data; after a divergence restart, chains beyond ``RUNAWAY`` times it (or
    non-finite) are redrawn. The task also counts its training steps, which decide
    Energy Matching's phase (:meth:`em_phase`): its flow warm-up lasts ``warmup_steps``
    (:meth:`plan_warmup`)."""

    data_extent: float | None = None
    steps_taken = 0
    warmup_steps = 0

    def plan_warmup(self, share: float, trainer: TrainerConfig, rows: int) -> None:
        """Spend the share ``share`` of the run's training steps (its epochs over
        ``rows`` training rows, or ``max_steps`` if fewer) in the flow warm-up."""
        steps = trainer.epochs * -(-rows // trainer.batch_size)
        if trainer.max_steps:
            steps = min(steps, trainer.max_steps)
        self.warmup_steps = round(share * steps)

    def em_phase(self) -> str:
        """Count one training step and name its Energy Matching phase: ``"flow"`` during
        the warm-up, ``"joint"`` after it."""
        self.steps_taken += 1
        return "flow" if self.steps_taken <= self.warmup_steps else "joint"

    def _replay_buffer(
        self, size: int, init: Callable[..., torch.Tensor], reinit_prob: float, seed: int
    ) -> ReplayBuffer:
        return ReplayBuffer(
            distributed.share(size),
            init,
            reinit_prob,
            torch.Generator().manual_seed(distributed.rank_seed(seed)),
        )

    def on_restart(self, generator: torch.Generator) -> dict[str, float]:
        bound = None if self.data_extent is None else RUNAWAY * self.data_extent
        return {"chains_reset": self.buffer.reset_diverged(generator, bound)}

    def state_dict(self) -> dict[str, Any]:
        return {"buffer": self.buffer.state_dict(), "steps_taken": self.steps_taken}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffer.load_state_dict(state["buffer"])
        self.steps_taken = state.get("steps_taken", 0)


def data_splits(config: Any, **options: Any) -> tuple[Dataset, Dataset, Dataset]:
    """The train, validation and test splits (:func:`ebmlab.data.run_splits`) that a
    recipe's ``config`` names by its ``data``, ``data_root``, ``resize`` and
    ``validation_fraction``; ``options`` go to :func:`ebmlab.data.load_dataset`.

    Args:
        config: a recipe config with those four settings.
    """
    return run_splits(
        config.data,
        root=config.data_root or None,
        resize=config.resize,
        validation_fraction=config.validation_fraction,
        **options,
    )


ConfigT = TypeVar("ConfigT")
TaskT = TypeVar("TaskT", bound=Task)


@dataclass
class Setup(Generic[TaskT]):
    """What a recipe builds: the task and the tensors it trains on; ``step`` is the
    training step of the checkpoint restored into it, if any."""

    task: TaskT
    train_data: tuple[torch.Tensor, ...]
    step: int | None = None


@dataclass(frozen=True)
class Recipe(Generic[ConfigT, TaskT]):
    """A named job: its config dataclass, how to build it and how to evaluate a run,
    typed by its config and its task (``Recipe[JEMConfig, JEMTask]``).

    ``build(config, trainer_config)`` returns a :class:`Setup`;
    ``evaluate(setup, run, **options)`` returns a JSON-serialisable dict and may
    write PNG files into the run directory; ``sample(setup, run, n, steps, out)``
    (optional) writes a picture of ``n`` samples; ``log_partition(setup, method)``
    (optional) returns a ``LogZEstimate``. They receive a setup whose task
    state was restored from a checkpoint. ``trainer_defaults`` overrides the
    generic :class:`TrainerConfig` defaults for this recipe, and ``config_defaults``
    (optional) maps a recipe config to the settings, of the recipe or the trainer,
    whose defaults differ for it (say, per model).
    """

    name: str
    help: str
    config_cls: type[ConfigT]
    build: Callable[[ConfigT, TrainerConfig], Setup[TaskT]]
    evaluate: Callable[..., dict[str, Any]]
    sample: Callable[..., Any] | None = None
    log_partition: Callable[..., Any] | None = None
    trainer_defaults: dict[str, Any] = field(default_factory=dict)
    config_defaults: Callable[[ConfigT], dict[str, Any]] | None = None

    def split_settings(self, settings: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """One flat dict of settings as (recipe config settings, trainer settings);
        a name that is neither is a ``ValueError``."""
        recipe_keys = {f.name for f in dataclasses.fields(self.config_cls)}
        trainer_keys = {f.name for f in dataclasses.fields(TrainerConfig)}
        unknown = set(settings) - recipe_keys - trainer_keys
        if unknown:
            raise ArgumentError(
                f"unknown setting(s) for recipe {self.name!r}: {', '.join(sorted(unknown))}"
            )
        return (
            {k: v for k, v in settings.items() if k in recipe_keys},
            {k: v for k, v in settings.items() if k in trainer_keys},
        )

    def configs(self, settings: dict[str, Any]) -> tuple[ConfigT, TrainerConfig]:
        """(recipe config, trainer config) from one flat dict of settings, as read from
        TOML or a run's config.json (lists become the tuples the configs hold); settings
        not given take the recipe's defaults: ``config_defaults`` of the recipe config
        built from the given settings, then ``trainer_defaults``."""
        recipe_settings, trainer_settings = self.split_settings(settings)
        recipe_settings = {
            k: tuple(v) if isinstance(v, list) else v for k, v in recipe_settings.items()
        }
        config = self.config_cls(**recipe_settings)
        specific_recipe, specific_trainer = self.split_settings(
            self.config_defaults(config) if self.config_defaults else {}
        )
        if specific_recipe:
            config = self.config_cls(**{**specific_recipe, **recipe_settings})
        defaults = {**self.trainer_defaults, **specific_trainer}
        return config, TrainerConfig(**{**defaults, **trainer_settings})


_REGISTRY: dict[str, Recipe] = {}


def register(recipe: Recipe) -> Recipe:
    if recipe.name in _REGISTRY:
        raise ArgumentError(f"a recipe named {recipe.name!r} is already registered")
    _REGISTRY[recipe.name] = recipe
    return recipe


def recipes() -> dict[str, Recipe]:
    """All registered recipes by name (imports this package's modules on first call)."""
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
    return dict(sorted(_REGISTRY.items()))


def get_recipe(name: str) -> Recipe:
    known = recipes()
    if name not in known:
        raise ArgumentError(f"unknown recipe {name!r}; known recipes: {', '.join(known)}")
    return known[name]


__all__ = ["Recipe", "RunDirectory", "Setup", "get_recipe", "recipes", "register"]
