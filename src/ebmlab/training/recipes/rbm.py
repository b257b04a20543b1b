"""Recipe ``rbm``: Boltzmann machines with hidden units on images (seed 002, section 6.5).

``model`` picks the machine:

- ``bernoulli``: binarised images, CD-k / persistent CD with the closed-form gradients
  of :class:`~ebmlab.training.rbm.ContrastiveDivergence`;
- ``categorical``: the digits' 17 grey levels, each pixel a softmax group;
- ``gaussian``: Gaussian-Bernoulli RBM on standardised grey levels (unit variance per
  pixel, sigma = 1), CD through the free energy; use a smaller ``--lr`` (0.01);
- ``dbm``: a two-layer deep Boltzmann machine (``n_hidden`` and ``n_hidden2`` units),
  mean-field positive phase and persistent Gibbs negative phase
  (:class:`~ebmlab.training.rbm.DBMLearning`).

The trainer's optimizer steps the gradients (SGD with momentum by default, learning
rate decaying linearly). Validation reports the exact average log-likelihood when the
model can be enumerated (the smaller RBM layer, the DBM's first hidden layer), else an
AIS estimate. The run directory gets the weight filters and samples from the persistent
chains as PNG grids.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from ebmlab import _checks
from ebmlab.data import load_dataset
from ebmlab.energies import (
    BernoulliRBM,
    CategoricalRBM,
    DeepBoltzmannMachine,
    GaussianBernoulliRBM,
)
from ebmlab.partition import (
    LogZEstimate,
    bethe_log_partition,
    exact_log_partition,
    perturb_and_map_log_partition,
    raise_,
    rbm_ais,
    rbm_log_partition,
    trw_log_partition,
)
from ebmlab.plotting import image_grid
from ebmlab.training import distributed
from ebmlab.training.rbm import ContrastiveDivergence, DBMLearning
from ebmlab.training.recipes import Recipe, Setup, register
from ebmlab.training.run_dir import RunDirectory
from ebmlab.training.trainer import StepResult, Task, TrainerConfig

ENUMERATE_UP_TO = 20
MODELS = ["bernoulli", "categorical", "gaussian", "dbm"]
LOGZ_METHODS = ["auto", "exact", "ais", "raise", "bethe", "trw", "pam"]


@dataclass
class RBMConfig:
    """Settings of the ``rbm`` recipe."""

    data: str = "digits"
    data_root: str = ""
    model: str = "bernoulli"
    n_hidden: int = 16
    n_hidden2: int = 16
    k: int = 5
    persistent: bool = True
    n_chains: int = 100
    sparsity_target: float = 0.0
    sparsity_cost: float = 0.0
    ais_chains: int = 100
    ais_temperatures: int = 1000

    def __post_init__(self) -> None:
        _checks.one_of("data", self.data, ["digits", "mnist10k", "mnist"])
        _checks.one_of("model", self.model, MODELS)
        if self.model == "categorical" and self.data != "digits":
            raise ValueError(
                "model 'categorical' reads the digits' 17 grey levels; use data 'digits'"
            )
        _checks.positive_int("n_hidden", self.n_hidden)
        _checks.positive_int("n_hidden2", self.n_hidden2)
        if self.model in ("gaussian", "dbm") and self.n_hidden > ENUMERATE_UP_TO:
            raise ValueError(
                f"model {self.model!r} evaluates its likelihood exactly, by enumerating "
                f"{self.n_hidden} hidden units; use n_hidden <= {ENUMERATE_UP_TO}"
            )
        if self.sparsity_target and self.model in ("gaussian", "dbm"):
            raise ValueError(f"sparsity_target is not available for model {self.model!r}")
        _checks.positive_int("k", self.k)
        _checks.positive_int("n_chains", self.n_chains)
        _checks.probability("sparsity_target", self.sparsity_target)
        _checks.positive("sparsity_cost", self.sparsity_cost, allow_zero=True)
        _checks.positive_int("ais_chains", self.ais_chains)
        _checks.positive_int("ais_temperatures", self.ais_temperatures)


GREY_LEVELS = 17  # digits pixels take values 0..16


def one_hot_pixels(data):
    """Digits with each pixel one-hot over its 17 grey levels (for the categorical RBM)."""
    raw = torch.as_tensor(data.raw, dtype=torch.long).flatten(1)
    return F.one_hot(raw, GREY_LEVELS).float().flatten(1)


def standardised(parts):
    """Grey levels with zero mean and unit variance per pixel (train statistics)."""
    mean = parts[0].x.mean(0)
    std = parts[0].x.std(0).clamp_min(0.1)
    return [dataclasses.replace(part, x=(part.x - mean) / std) for part in parts]


class RBMTask(Task):
    """Closed-form (or free-energy) CD updates; the trainer only steps the optimizer."""

    def __init__(self, config: RBMConfig, seed: int) -> None:
        self.config = config
        root = config.data_root or None
        split = "val" if config.data == "digits" else "test"
        transform = "binary" if config.model in ("bernoulli", "dbm") else "raw"
        self.train, self.val, self.test = (
            load_dataset(config.data, s, root=root, transform=transform)
            for s in ("train", split, "test")
        )
        torch.manual_seed(seed)
        if config.model == "dbm":
            self.model = DeepBoltzmannMachine(
                self.train.x.shape[1], config.n_hidden, config.n_hidden2
            )
            visible_biases = self._visible_logits()
        elif config.model == "gaussian":
            self.train, self.val, self.test = standardised([self.train, self.val, self.test])
            self.model = GaussianBernoulliRBM(self.train.x.shape[1], config.n_hidden)
            visible_biases = self.train.x.double().mean(0)
        elif config.model == "categorical":
            self.train, self.val, self.test = (
                dataclasses.replace(part, x=one_hot_pixels(part))
                for part in (self.train, self.val, self.test)
            )
            groups = self.train.x.shape[1] // GREY_LEVELS
            self.model = CategoricalRBM(groups, GREY_LEVELS, config.n_hidden)
            freq = self.train.x.double().mean(0).view(groups, GREY_LEVELS) + 1e-3
            visible_biases = (freq / freq.sum(1, keepdim=True)).log().flatten()
        else:
            self.model = BernoulliRBM(self.train.x.shape[1], config.n_hidden)
            visible_biases = self._visible_logits()
        with torch.no_grad():
            self.model.b.copy_(visible_biases)
        n_chains = distributed.share(config.n_chains)
        self.dbm = DBMLearning(self.model, n_chains, config.k) if config.model == "dbm" else None
        self.cd = (
            None
            if self.dbm is not None
            else ContrastiveDivergence(
                self.model,
                config.k,
                persistent=config.persistent,
                n_chains=n_chains,
                sparsity_target=config.sparsity_target or None,
                sparsity_cost=config.sparsity_cost,
            )
        )

    def _visible_logits(self) -> torch.Tensor:
        """Biases of the independent-pixel model fitted to the training data."""
        return torch.logit(self.train.x.double().mean(0).clamp(1e-3, 1 - 1e-3))

    @property
    def chains(self) -> torch.Tensor | None:
        """Visible states of the persistent chains (None before the first step)."""
        if self.dbm is not None:
            return None if self.dbm.chains is None else self.dbm.chains[0]
        return self.cd.chains

    def training_step(
        self, batch: tuple[torch.Tensor, ...], generator: torch.Generator
    ) -> StepResult:
        (x,) = batch
        if self.dbm is not None:
            error = self.dbm.accumulate(x, generator)
            return StepResult(torch.tensor(error), {"reconstruction_error": error}, True)
        stats = self.cd.accumulate(x, generator, stats=True)
        metrics = {
            "reconstruction_error": stats.reconstruction_error,
            "free_energy_gap": stats.free_energy_gap,
        }
        return StepResult(torch.tensor(stats.free_energy_gap), metrics, grads_ready=True)

    def log_partition(
        self, method: str = "auto", generator: torch.Generator | None = None
    ) -> LogZEstimate:
        """log Z by ``exact``, ``ais``, ``raise``, ``bethe``, ``trw``, ``pam`` (perturb-and-MAP)
        or ``auto`` (exact when enumerable, else AIS). Gaussian and categorical RBMs are
        exact only; a DBM runs every method on its bipartite view
        (:meth:`~ebmlab.energies.DeepBoltzmannMachine.as_rbm`)."""
        _checks.one_of("method", method, LOGZ_METHODS)
        if self.config.model not in ("bernoulli", "dbm"):
            if method not in ("auto", "exact"):
                raise ValueError(
                    f"method {method!r} supports Bernoulli RBMs and DBMs only; use exact"
                )
            return exact_log_partition(self.model)
        rbm = self.model.as_rbm() if self.dbm is not None else self.model
        if method == "auto":
            method = "exact" if min(rbm.n_visible, rbm.n_hidden) <= ENUMERATE_UP_TO else "ais"
        if method == "exact":
            return rbm_log_partition(rbm)
        if method == "bethe":
            return bethe_log_partition(rbm)
        if method == "trw":
            return trw_log_partition(rbm)
        if method == "pam":
            return perturb_and_map_log_partition(rbm, generator=generator)
        options = {
            "n_chains": self.config.ais_chains,
            "n_temperatures": self.config.ais_temperatures,
            "data": self.train.x,
            "generator": generator,
        }
        if method == "ais":
            return rbm_ais(self.model, **options)
        return raise_(self.model, samples=self._chain_states(), **options)

    def _chain_states(self) -> torch.Tensor | None:
        """The persistent chains as samples of the annealed layer: v, or (v, h2) for a DBM."""
        if self.dbm is not None:
            return None if self.dbm.chains is None else torch.cat(self.dbm.chains, 1)
        return self.cd.chains

    def log_likelihood(self, x: torch.Tensor, log_z: LogZEstimate) -> float:
        with torch.no_grad():
            return float(-self.model.free_energy(x).double().mean() - log_z.log_z)

    def validate(self, generator: torch.Generator) -> dict[str, float]:
        log_z = self.log_partition("auto", generator)
        return {"val_nll": -self.log_likelihood(self.val.x, log_z)}

    def images(self, v: torch.Tensor, soft: bool = False) -> torch.Tensor:
        """Visible vectors as pixel intensities in [0, 1] (grey level / 16 for categorical
        units; ``soft`` applies a softmax per pixel first, for weight vectors)."""
        if not isinstance(self.model, CategoricalRBM):
            return v.detach()
        groups = v.view(v.shape[0], -1, GREY_LEVELS)
        probs = torch.softmax(groups, 2) if soft else groups
        return (probs * torch.arange(GREY_LEVELS, dtype=v.dtype)).sum(2) / (GREY_LEVELS - 1)

    @property
    def value_range(self) -> tuple[float, float]:
        """Pixel range of the visible vectors as displayed."""
        if self.config.model == "gaussian":
            return float(self.train.x.min()), float(self.train.x.max())
        return 0.0, 1.0

    def grids(self, run: RunDirectory, epoch: int | None = None) -> None:
        shape = self.train.image_shape
        weights = self.model.W1 if self.dbm is not None else self.model.W
        filters = self.images(weights.detach().T[:100], soft=True)
        lo, hi = float(filters.min()), float(filters.max())
        image_grid(
            filters,
            run.path / "filters.png",
            image_shape=shape,
            value_range=(lo, hi),
            title="filters (W columns)",
        )
        if self.chains is not None:
            title = "persistent chains" + ("" if epoch is None else f", epoch {epoch}")
            image_grid(
                self.images(self.chains[:100]),
                run.samples / "chains.png",
                image_shape=shape,
                value_range=self.value_range,
                title=title,
            )

    def on_epoch_end(
        self, run: RunDirectory | None, epoch: int, generator: torch.Generator
    ) -> None:
        if run is not None:
            self.grids(run, epoch)

    def state_dict(self) -> dict[str, Any]:
        if self.dbm is not None:
            v, h2 = self.dbm.chains or (None, None)
            return {"chains": v, "top": h2}
        return {"chains": self.cd.chains}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.dbm is not None:
            v, h2 = state["chains"], state["top"]
            self.dbm.chains = None if v is None else (v, h2)
        else:
            self.cd.chains = state["chains"]


def build(config: RBMConfig, trainer: TrainerConfig) -> Setup:
    task = RBMTask(config, trainer.seed)
    return Setup(task, (task.train.x,))


def evaluate(setup: Setup, run: RunDirectory) -> dict[str, Any]:
    """Train and test log-likelihood with the partition function used, filters and samples."""
    task: RBMTask = setup.task  # type: ignore[assignment]
    log_z = task.log_partition("auto", torch.Generator().manual_seed(0))
    task.grids(run)
    return {
        "data": task.config.data,
        "n_visible": task.model.n_visible,
        "model": task.config.model,
        "n_hidden": task.config.n_hidden,
        "log_z": log_z.to_dict(),
        "train_log_likelihood": task.log_likelihood(task.train.x, log_z),
        "test_log_likelihood": task.log_likelihood(task.test.x, log_z),
    }


def sample(setup: Setup, run: RunDirectory, n: int, steps: int, out: Path, seed: int = 0) -> Path:
    """``n`` samples after ``steps`` block-Gibbs steps from the persistent chains (or data)."""
    task: RBMTask = setup.task  # type: ignore[assignment]
    gen = torch.Generator().manual_seed(seed)
    pool = task.chains if task.chains is not None else task.train.x
    start = pool[torch.randint(len(pool), (n,), generator=gen)]
    if task.dbm is not None:
        top = torch.zeros(n, task.model.n_hidden2)
        x = task.model.gibbs(start, top, steps, gen)[0]
    else:
        x = task.model.gibbs(start, steps, gen)
    image_grid(
        task.images(x),
        out,
        image_shape=task.train.image_shape,
        value_range=task.value_range,
        title=f"{n} samples, {steps} Gibbs steps",
    )
    return out


def log_partition(setup: Setup, method: str, seed: int = 0) -> LogZEstimate:
    task: RBMTask = setup.task  # type: ignore[assignment]
    return task.log_partition(method, torch.Generator().manual_seed(seed))


register(
    Recipe(
        name="rbm",
        help="RBMs (bernoulli, categorical, gaussian) and DBMs by CD-k / persistent CD",
        config_cls=RBMConfig,
        build=build,
        evaluate=evaluate,
        sample=sample,
        log_partition=log_partition,
        trainer_defaults={
            "epochs": 100,
            "batch_size": 10,
            "lr": 0.1,
            "optimizer": "sgd",
            "momentum": 0.5,
            "lr_schedule": "linear",
            "monitor": "val_nll",
            "val_every": 10,
        },
    )
)
