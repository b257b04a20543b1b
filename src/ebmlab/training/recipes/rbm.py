"""Recipe ``rbm``: Boltzmann machines with hidden units on images (Tomczak 2024, section 6.5).

``model`` picks the machine:

- ``bernoulli``: binarised images, CD-k / persistent CD with the closed-form gradients
  of :class:`~ebmlab.learning.rbm.ContrastiveDivergence`;
- ``categorical``: the digits' 17 grey levels, each pixel a softmax group;
- ``gaussian``: Gaussian-Bernoulli RBM on standardised grey levels (unit variance per
  pixel, sigma = 1), CD through the free energy; use a smaller ``--lr`` (0.01);
- ``spike_slab``: the µ-ssRBM (Courville et al. 2011) on standardised grey levels, with
  ``n_hidden`` spike-and-slab pairs, CD through the free energy; its log Z is exact by
  enumerating the spikes, else AIS from N(b, Lambda^-1) with HMC transitions;
- ``conv``: a convolutional RBM (Lee et al. 2009) on binarised images with ``n_hidden``
  filters of ``filter_size`` pixels square and one visible bias per pixel, CD through
  the free energy; its log Z goes through the dense view (exact or AIS);
- ``subspace``: the subspace RBM (eqs. 6.44-6.47) with ``n_hidden`` gates of
  ``n_subspace`` units each, CD through the free energy;
- ``classification``: the joint RBM over images and labels (Larochelle & Bengio 2008),
  trained ``discriminative``-ly, ``generative``-ly or as a ``hybrid`` (``--objective``);
  validation reports the exact error rate and -log p(y | x), and the joint likelihood
  while ``n_hidden <= 20`` (monitor ``val_error`` for wider models);
- ``dbn``: a two-layer deep belief network trained greedily: the first half of the
  epochs trains the bottom RBM, the second half the top RBM on the bottom one's
  p(h1 | v); validation reports the exact (or AIS) likelihood of the bottom RBM, then
  the variational bound of the stack;
- ``dbm``: a two-layer deep Boltzmann machine (``n_hidden`` and ``n_hidden2`` units),
  mean-field positive phase and persistent Gibbs negative phase
  (:class:`~ebmlab.learning.rbm.DBMLearning`), after ``pretrain_epochs`` of greedy
  layer-wise pre-training (:func:`~ebmlab.learning.rbm.pretrain_dbm`);
- ``conditional`` and ``gated``: a conditional RBM of simulated walking and a gated
  RBM of transformed random-dot pairs (:mod:`ebmlab.training.recipes.conditional_rbm`);
  their data sets are ``walking`` and ``dot-pairs``.

The trainer's optimizer steps the gradients (SGD with momentum by default, learning
rate decaying linearly). Validation reports the exact average negative log-likelihood
``val_nll`` when the model can be enumerated (the smaller RBM layer, the DBM's first
hidden layer, the subspace RBM's gate-subspace products), else an AIS estimate. The run
directory gets the weight filters and samples from the persistent chains as PNG grids.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch.nn import functional as F

from ebmlab import _checks, partition
from ebmlab._checks import ArgumentError
from ebmlab.data import (
    IMAGE_SETS,
    VALIDATION_FRACTION,
    check_data,
    check_resize,
    check_validation_fraction,
)
from ebmlab.devices import widen
from ebmlab.energies import (
    BernoulliRBM,
    CategoricalRBM,
    ClassificationRBM,
    ConvolutionalRBM,
    DeepBeliefNetwork,
    DeepBoltzmannMachine,
    GaussianBernoulliRBM,
    SpikeSlabRBM,
    SubspaceRBM,
)
from ebmlab.energies.boltzmann import ENUMERATION_LIMIT, base_rate_logits
from ebmlab.evaluation import log_likelihood
from ebmlab.evaluation.likelihood import mean_and_stderr
from ebmlab.evaluation.progress import quiet
from ebmlab.learning.rbm import ContrastiveDivergence, DBMLearning, pretrain_dbm
from ebmlab.losses import classification_rbm_loss
from ebmlab.partition import LogZEstimate
from ebmlab.plotting import image_grid
from ebmlab.training import distributed
from ebmlab.training.recipes import Recipe, Setup, data_splits, register
from ebmlab.training.recipes.conditional_rbm import ConditionalRBMTask, GatedRBMTask
from ebmlab.training.run_dir import RunDirectory
from ebmlab.training.trainer import StepResult, Task, TrainerConfig

MODELS = [
    "bernoulli",
    "categorical",
    "gaussian",
    "spike_slab",
    "conv",
    "subspace",
    "classification",
    "dbn",
    "dbm",
    "conditional",
    "gated",
]
BINARY = ("bernoulli", "conv", "subspace", "classification", "dbn", "dbm")
REAL = ("gaussian", "spike_slab")  # standardised grey levels
OBJECTIVES = ["discriminative", "generative", "hybrid"]
CONDITIONAL_DATA = {"conditional": "walking", "gated": "dot-pairs"}  # their one data set
# CD-1 of p(v | condition) with Adam, as in Taylor et al. (2007) and Memisevic & Hinton
# (2010): the walkers' tiny residual deviations make plain SGD's steps explode.
CONDITIONAL_TRAINING = {
    "conditional": {"n_hidden": 8, "k": 1, "optimizer": "adam", "lr": 0.003,
                    "batch_size": 100, "epochs": 40, "lr_schedule": "constant",
                    "monitor": "val_nll", "val_every": 5},
    "gated": {"n_hidden": 64, "k": 1, "optimizer": "adam", "lr": 0.01, "batch_size": 100,
              "epochs": 40, "lr_schedule": "constant", "monitor": "val_error",
              "val_every": 5},
}  # fmt: skip


@dataclass
class RBMConfig:
    """Settings of the ``rbm`` recipe.

    Attributes:
        data: a data set name (digits, mnist, ...) or a path; binarised unless the model
            reads grey levels or real values. ``auto``: digits, or the conditional
            models' own sets (walking, dot-pairs).
        data_root: directory holding published data sets (else $EBMLAB_DATA).
        resize: (height, width) for image folders of mixed sizes.
        validation_fraction: share of the training split held out for validation where
            the data set has no validation split (0: validate on the test split).
        model: Bernoulli, categorical (17 grey levels), Gaussian-Bernoulli,
            spike-and-slab, convolutional, subspace or classification RBM, deep belief
            network, deep Boltzmann machine, or conditional or gated RBM (these two
            default to CD-1 with Adam: 40 epochs, batches of 100, lr 0.003 and 0.01,
            with 8 and 64 hidden units).
        n_hidden: hidden units (of the first hidden layer for dbn and dbm; filters for
            conv).
        filter_size: side of the square filters (conv).
        n_hidden2: units of the second hidden layer (dbn, dbm).
        n_subspace: subspace units per gate (subspace).
        order: frames of history each frame is conditioned on (conditional).
        n_factors: factors of the three-way interaction (gated).
        k: Gibbs steps per update (CD-k or PCD-k).
        persistent: persistent chains (PCD) instead of chains started at the data (CD).
        n_chains: persistent chains.
        sparsity_target: target mean activation of the hidden units (0: no sparsity term).
        sparsity_cost: weight of the sparsity term.
        centering: the centred update (Montavon & Müller 2012).
        objective: what the classification RBM maximises: log p(y | x), log p(x, y) or
            the first plus alpha times the second.
        alpha: weight of the generative term of the hybrid objective.
        pretrain_epochs: epochs of greedy layer-wise pre-training before the DBM (dbm).
        ais_chains: AIS chains for log Z when enumeration is out of reach.
        ais_temperatures: AIS temperatures.
    """

    CHOICES: ClassVar[dict[str, Sequence[str]]] = {
        "model": MODELS,
        "objective": OBJECTIVES,
    }

    data: str = "auto"
    data_root: str = ""
    resize: tuple[int, ...] = ()
    validation_fraction: float = VALIDATION_FRACTION
    model: str = "bernoulli"
    n_hidden: int = 16
    n_hidden2: int = 16
    n_subspace: int = 1
    order: int = 2
    n_factors: int = 200
    filter_size: int = 5
    k: int = 5
    persistent: bool = True
    n_chains: int = 100
    sparsity_target: float = 0.0
    sparsity_cost: float = 0.0
    centering: bool = False
    objective: str = "hybrid"
    alpha: float = 0.01
    pretrain_epochs: int = 0
    ais_chains: int = 100
    ais_temperatures: int = 1000

    def __post_init__(self) -> None:
        _checks.choices(self)
        own = CONDITIONAL_DATA.get(self.model)
        if self.data == "auto":
            self.data = own or "digits"
        if own is not None and self.data != own:
            raise ArgumentError(f"model {self.model!r} trains on data {own!r}, got {self.data!r}")
        if own is None:
            self.data = check_data(self.data, IMAGE_SETS, self.data_root or None)
        check_resize(self.resize)
        check_validation_fraction(self.validation_fraction)
        if self.model == "categorical" and self.data != "digits":
            raise ArgumentError(
                "model 'categorical' reads the digits' 17 grey levels; use data 'digits'"
            )
        _checks.positive_int("n_hidden", self.n_hidden)
        _checks.positive_int("n_hidden2", self.n_hidden2)
        _checks.positive_int("n_subspace", self.n_subspace)
        _checks.positive_int("filter_size", self.filter_size)
        enumerated = {
            "gaussian": ("hidden units", self.n_hidden),
            "conditional": ("hidden units", self.n_hidden),
            "subspace": ("gate-subspace products n_hidden * n_subspace",
                         self.n_hidden * self.n_subspace),
        }  # fmt: skip
        if self.model in enumerated and enumerated[self.model][1] > ENUMERATION_LIMIT:
            what, count = enumerated[self.model]
            raise ArgumentError(
                f"model {self.model!r} evaluates its likelihood exactly, by enumerating "
                f"{count} {what}; use at most {ENUMERATION_LIMIT}"
            )
        _checks.positive_int("order", self.order)
        _checks.positive_int("n_factors", self.n_factors)
        if self.sparsity_target and self.model in ("classification", "dbm", *CONDITIONAL_DATA):
            raise ArgumentError(f"sparsity_target is not available for model {self.model!r}")
        _checks.positive_int("k", self.k)
        _checks.positive_int("n_chains", self.n_chains)
        _checks.probability("sparsity_target", self.sparsity_target)
        _checks.positive("sparsity_cost", self.sparsity_cost, allow_zero=True)
        _checks.positive("alpha", self.alpha, allow_zero=True)
        _checks.positive_int("pretrain_epochs", self.pretrain_epochs, allow_zero=True)
        if self.pretrain_epochs and self.model != "dbm":
            raise ArgumentError("pretrain_epochs applies to model 'dbm' only")
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


def cd_step(cd: ContrastiveDivergence, x: torch.Tensor, generator: torch.Generator) -> StepResult:
    """One CD update with its reconstruction error and free-energy gap as metrics."""
    stats = cd.accumulate(x, generator, stats=True)
    metrics = {
        "reconstruction_error": stats.reconstruction_error,
        "free_energy_gap": stats.free_energy_gap,
    }
    return StepResult(torch.tensor(stats.free_energy_gap), metrics, grads_ready=True)


class RBMTask(Task):
    """Bernoulli, categorical, Gaussian and subspace RBMs and the DBM: closed-form or
    free-energy CD updates written into ``.grad``; the trainer only steps the optimizer."""

    def __init__(self, config: RBMConfig, trainer: TrainerConfig) -> None:
        self.config = config
        transform = "binary" if config.model in BINARY else "raw"
        self.train, self.val, self.test = data_splits(config, transform=transform)
        torch.manual_seed(trainer.seed)
        self.n_chains = distributed.share(config.n_chains)
        self.build_model()

    def build_model(self) -> None:
        config, d = self.config, self.train.x.shape[1]
        self.dbm = self.cd = None
        if config.model == "dbm":
            self.model = DeepBoltzmannMachine(d, config.n_hidden, config.n_hidden2)
            self.dbm = DBMLearning(self.model, self.n_chains, config.k)
            self.pretrained = not config.pretrain_epochs
            visible_biases = base_rate_logits(self.train.x)
        elif config.model in REAL:
            self.train, self.val, self.test = standardised([self.train, self.val, self.test])
            real = GaussianBernoulliRBM if config.model == "gaussian" else SpikeSlabRBM
            self.model = real(d, config.n_hidden)
            visible_biases = widen(self.train.x).mean(0)
        elif config.model == "categorical":
            self.train, self.val, self.test = (
                dataclasses.replace(part, x=one_hot_pixels(part))
                for part in (self.train, self.val, self.test)
            )
            groups = self.train.x.shape[1] // GREY_LEVELS
            self.model = CategoricalRBM(groups, GREY_LEVELS, config.n_hidden)
            freq = widen(self.train.x).mean(0).view(groups, GREY_LEVELS) + 1e-3
            visible_biases = (freq / freq.sum(1, keepdim=True)).log().flatten()
        elif config.model == "subspace":
            self.model = SubspaceRBM(d, config.n_hidden, config.n_subspace)
            visible_biases = base_rate_logits(self.train.x)
        elif config.model == "conv":
            shape = self.train.image_shape
            self.model = ConvolutionalRBM(shape, config.n_hidden, config.filter_size,
                                          visible_bias="pixel")  # fmt: skip
            visible_biases = base_rate_logits(self.train.x).view(shape)
        else:
            self.model = BernoulliRBM(d, config.n_hidden)
            visible_biases = base_rate_logits(self.train.x)
        with torch.no_grad():
            self.model.b.copy_(visible_biases)
        if self.dbm is None:
            self.cd = self.contrastive_divergence(self.model)

    def contrastive_divergence(self, rbm) -> ContrastiveDivergence:
        config = self.config
        return ContrastiveDivergence(
            rbm,
            config.k,
            persistent=config.persistent,
            n_chains=self.n_chains,
            sparsity_target=config.sparsity_target or None,
            sparsity_cost=config.sparsity_cost,
            centering=config.centering,
        )

    @property
    def chains(self) -> torch.Tensor | None:
        """Visible states of the persistent chains (None before the first step)."""
        if self.dbm is not None:
            return None if self.dbm.chains is None else self.dbm.chains[0]
        return self.cd.chains

    def training_step(
        self, batch: tuple[torch.Tensor, ...], generator: torch.Generator
    ) -> StepResult:
        x = batch[0]
        if self.dbm is not None:
            if not self.pretrained:
                pretrain_dbm(self.model, self.train.x, self.config.pretrain_epochs,
                             generator=generator)  # fmt: skip
                self.pretrained = True
            error = self.dbm.accumulate(x, generator)
            return StepResult(torch.tensor(error), {"reconstruction_error": error}, True)
        return cd_step(self.cd, x, generator)

    def on_restart(self, generator: torch.Generator) -> dict[str, float]:
        rule = self.dbm or self.cd
        if rule is None:
            return {}
        return {"chains_reset": rule.reset_diverged(self.train.x, generator)}

    def log_partition(
        self, method: str = "auto", generator: torch.Generator | None = None
    ) -> LogZEstimate:
        """log Z by ``exact``, ``ais``, ``raise``, ``bethe``, ``trw``, ``pam`` (perturb-and-MAP)
        or ``auto`` (exact when enumerable, else AIS). Gaussian, categorical, subspace and
        classification RBMs are exact only; a DBM runs every method on its bipartite view
        (:meth:`~ebmlab.energies.DeepBoltzmannMachine.as_rbm`)."""
        return partition.log_partition(
            self.model,
            method,
            data=self.train.x,
            labels=self.train.y,
            samples=self._chain_states(),
            n_chains=self.config.ais_chains,
            n_temperatures=self.config.ais_temperatures,
            generator=generator,
        )

    def _chain_states(self) -> torch.Tensor | None:
        """The persistent chains as samples of the annealed layer: v, or (v, h2) for a DBM."""
        if self.dbm is not None:
            return None if self.dbm.chains is None else torch.cat(self.dbm.chains, 1)
        return None if self.cd is None else self.cd.chains

    @property
    def mean_field_bound(self) -> bool:
        """Whether the log-likelihoods are a DBM's mean-field lower bound (h1 too wide to
        enumerate its free energy)."""
        return isinstance(self.model, DeepBoltzmannMachine) and not self.model.enumerable

    def log_likelihood(self, part, log_z: LogZEstimate) -> tuple[float, float]:
        """Mean log-likelihood of a data split given log Z, and its standard error (the
        rows' spread and log Z's, independent of each other). A DBM too wide to
        enumerate h1 gives its mean-field lower bound instead."""
        model = self.model.free_energy_bound if self.mean_field_bound else self.model
        fit = log_likelihood(model, part.x, log_z)
        return fit.mean, fit.total_stderr

    def _log_likelihoods(self, log_z: LogZEstimate, *splits: str) -> dict[str, float]:
        """``{split}_log_likelihood`` and its ``_stderr`` for each named split."""
        out = {}
        for split in splits:
            value, stderr = self.log_likelihood(getattr(self, split), log_z)
            out[f"{split}_log_likelihood"], out[f"{split}_log_likelihood_stderr"] = value, stderr
        return out

    def final_metrics(self, generator: torch.Generator) -> dict[str, Any]:
        """The test log-likelihood at the end of training, with the log Z used (exact when
        enumerable, else AIS with ``ais_temperatures``)."""
        log_z = self.log_partition("auto", generator)
        return {**self._log_likelihoods(log_z, "test"), "log_z": log_z.to_dict()}

    def validate(self, generator: torch.Generator) -> dict[str, float]:
        log_z = self.log_partition("auto", generator)
        return {"val_nll": -self.log_likelihood(self.val, log_z)[0]}

    def evaluate(self) -> dict[str, Any]:
        """Train and test log-likelihood, each with its standard error, and the partition
        function used."""
        log_z = self.log_partition("auto", self.generator(0))
        return {
            "n_visible": self.train.x.shape[1],
            "log_z": log_z.to_dict(),
            **self._log_likelihoods(log_z, "train", "test"),
            **({"log_likelihood_bound": "mean field"} if self.mean_field_bound else {}),
        }

    def draw(self, n: int, steps: int, generator: torch.Generator) -> torch.Tensor:
        """``n`` visible samples after ``steps`` Gibbs steps from the persistent chains (or
        from training images)."""
        start = self.starts(n, generator)
        if self.dbm is not None:
            top = start.new_zeros(n, self.model.n_hidden2)
            return self.model.gibbs(start, top, steps, generator)[0]
        return self.model.gibbs(start, steps, generator)

    def starts(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """``n`` rows drawn from the persistent chains (or the training images) to start
        sampling from."""
        pool = self.chains if self.chains is not None else self.train.x
        return pool[torch.randint(len(pool), (n,), generator=generator, device=pool.device)]

    def filters(self) -> torch.Tensor:
        """The first layer's weights, one column per hidden unit (D x M), or per filter
        of a convolutional RBM (C r r x K)."""
        if self.dbm is not None:
            return self.model.W1
        if isinstance(self.model, ConvolutionalRBM):
            return self.model.filter_images().T
        return self.model.W.flatten(1)  # a subspace RBM's D x M x K as D x (M K)

    @property
    def filter_shape(self) -> tuple[int, ...]:
        """The shape of one filter as an image."""
        if isinstance(self.model, ConvolutionalRBM):
            return self.model.W.shape[1:]
        return self.train.image_shape

    def images(self, v: torch.Tensor, soft: bool = False) -> torch.Tensor:
        """Visible vectors as pixel intensities in [0, 1] (grey level / 16 for categorical
        units; ``soft`` applies a softmax per pixel first, for weight vectors)."""
        if not isinstance(self.model, CategoricalRBM):
            return v.detach()
        groups = v.view(v.shape[0], -1, GREY_LEVELS)
        probs = torch.softmax(groups, 2) if soft else groups
        levels = torch.arange(GREY_LEVELS, dtype=v.dtype, device=v.device)
        return (probs * levels).sum(2) / (GREY_LEVELS - 1)

    @property
    def value_range(self) -> tuple[float, float]:
        """Pixel range of the visible vectors as displayed."""
        if self.config.model in REAL:
            return float(self.train.x.min()), float(self.train.x.max())
        return 0.0, 1.0

    def picture(self, n: int, steps: int, out: Path, generator: torch.Generator) -> None:
        """A grid of ``n`` samples after ``steps`` Gibbs steps (see :meth:`draw`)."""
        image_grid(
            self.images(self.draw(n, steps, generator)),
            out,
            image_shape=self.train.image_shape,
            value_range=self.value_range,
            title=f"{n} samples, {steps} Gibbs steps",
        )

    def grids(self, run: RunDirectory, epoch: int | None = None) -> None:
        shape = self.train.image_shape
        filters = self.images(self.filters().detach().T[:100], soft=True)
        lo, hi = float(filters.min()), float(filters.max())
        image_grid(
            filters,
            run.path / "filters.png",
            image_shape=self.filter_shape,
            value_range=(lo, hi),
            title="filters (first-layer weights)",
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
            return {"chains": v, "top": h2, "pretrained": self.pretrained}
        return {"chains": self.cd.chains}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.dbm is not None:
            v, h2 = state["chains"], state["top"]
            self.dbm.chains = None if v is None else (v, h2)
            self.pretrained = state.get("pretrained", True)
        else:
            self.cd.chains = state["chains"]


class ClassificationRBMTask(RBMTask):
    """The joint RBM over images and labels, trained through autograd on
    :func:`~ebmlab.losses.classification_rbm_loss`."""

    def build_model(self) -> None:
        self.dbm = self.cd = None
        self.model = ClassificationRBM(
            self.train.x.shape[1], self.config.n_hidden, self.train.num_classes, init_std=0.1
        )  # larger weights than an RBM's break the symmetry between labels sooner
        with torch.no_grad():
            self.model.b.copy_(base_rate_logits(self.train.x))

    @property
    def chains(self) -> None:
        return None  # negatives start at the data

    def training_step(
        self, batch: tuple[torch.Tensor, ...], generator: torch.Generator
    ) -> StepResult:
        x, y = batch
        c = self.config
        loss = classification_rbm_loss(
            self.model, x, y, mode=c.objective, alpha=c.alpha, k=c.k, generator=generator
        )
        return StepResult(loss)

    def log_likelihood(self, part, log_z: LogZEstimate) -> tuple[float, float]:
        """Mean joint log-likelihood log p(x, y) of a split, and its standard error."""
        with torch.no_grad():
            per_row = -widen(self.model.free_energy(part.x, part.y)) - log_z.log_z
        mean, spread = mean_and_stderr(per_row)
        return mean, math.hypot(spread, log_z.stderr)

    def classification(self, part) -> dict[str, float]:
        """Exact error rate and mean -log p(y | x) of a split."""
        with torch.no_grad():
            scores = self.model.class_scores(part.x)
            nll = float(F.cross_entropy(widen(scores), part.y))
            error = float(widen(scores.argmax(1) != part.y).mean())
        return {"error": error, "class_nll": nll}

    @property
    def enumerable(self) -> bool:
        """Whether log Z, hence the joint likelihood, is exact (enumerating h)."""
        return self.config.n_hidden <= ENUMERATION_LIMIT

    def validate(self, generator: torch.Generator) -> dict[str, float]:
        out = {f"val_{k}": v for k, v in self.classification(self.val).items()}
        return {**(super().validate(generator) if self.enumerable else {}), **out}

    def evaluate(self) -> dict[str, Any]:
        out = {f"test_{k}": v for k, v in self.classification(self.test).items()}
        return {**(super().evaluate() if self.enumerable else {}), **out}

    def final_metrics(self, generator: torch.Generator) -> dict[str, Any]:
        out = {f"test_{k}": v for k, v in self.classification(self.test).items()}
        return {**(super().final_metrics(generator) if self.enumerable else {}), **out}

    def draw(self, n: int, steps: int, generator: torch.Generator) -> torch.Tensor:
        """Images after ``steps`` joint Gibbs steps over (x, y) from training pairs."""
        idx = torch.randint(
            len(self.train.x), (n,), generator=generator, device=self.train.x.device
        )
        return self.model.gibbs(self.train.x[idx], self.train.y[idx], steps, generator)[0]

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


class DBNTask(RBMTask):
    """Greedy layer-wise training of a two-layer deep belief network: the bottom RBM for
    the first half of the epochs, then the top RBM on the bottom one's p(h1 | v)."""

    def __init__(self, config: RBMConfig, trainer: TrainerConfig) -> None:
        self.epochs_per_layer = max(1, trainer.epochs // 2)
        self.layer = 0
        super().__init__(config, trainer)

    def build_model(self) -> None:
        self.dbm = self.cd = None
        c = self.config
        self.model = DeepBeliefNetwork(self.train.x.shape[1], (c.n_hidden, c.n_hidden2))
        with torch.no_grad():
            self.model.layers[0].b.copy_(base_rate_logits(self.train.x))
        self.cds = [self.contrastive_divergence(rbm) for rbm in self.model.layers]

    @property
    def chains(self) -> torch.Tensor | None:
        return self.cds[0].chains

    def training_step(
        self, batch: tuple[torch.Tensor, ...], generator: torch.Generator
    ) -> StepResult:
        with torch.no_grad():
            codes = self.model.up(batch[0], self.layer)
        return cd_step(self.cds[self.layer], codes, generator)

    def on_restart(self, generator: torch.Generator) -> dict[str, float]:
        with torch.no_grad():
            codes = self.model.up(self.train.x, self.layer)
        return {"chains_reset": self.cds[self.layer].reset_diverged(codes, generator)}

    def on_epoch_end(
        self, run: RunDirectory | None, epoch: int, generator: torch.Generator
    ) -> None:
        self.layer = min(len(self.cds) - 1, (epoch + 1) // self.epochs_per_layer)
        super().on_epoch_end(run, epoch, generator)

    def log_partition(
        self, method: str = "auto", generator: torch.Generator | None = None
    ) -> LogZEstimate:
        """log Z of the RBM being trained (the bottom one, then the top one) by ``method``."""
        with torch.no_grad():
            data = self.model.up(self.train.x, self.layer)
        return partition.log_partition(
            self.model.layers[self.layer],
            method,
            data=data,
            samples=self.cds[self.layer].chains,
            n_chains=self.config.ais_chains,
            n_temperatures=self.config.ais_temperatures,
            generator=generator,
        )

    def log_likelihood(self, part, log_z: LogZEstimate) -> tuple[float, float]:
        """The bottom RBM's mean log-likelihood, or once the top RBM trains, the stack's
        variational lower bound (10 draws per image), each with its standard error."""
        if self.layer == 0:
            fit = log_likelihood(self.model.layers[0], part.x, log_z)
            return fit.mean, fit.total_stderr
        bound, stderr = self.model.log_likelihood_bound(part.x, log_z.log_z, 10, self.generator(0))
        return bound, math.hypot(stderr, log_z.stderr)

    def draw(self, n: int, steps: int, generator: torch.Generator) -> torch.Tensor:
        if self.layer == 0:  # only the bottom RBM has trained yet
            return self.model.layers[0].gibbs(self.starts(n, generator), steps, generator)
        return self.model.sample(n, steps, generator)

    def filters(self) -> torch.Tensor:
        return self.model.layers[0].W

    def state_dict(self) -> dict[str, Any]:
        chains = {f"layer{i}": cd.chains for i, cd in enumerate(self.cds)}
        return {"chains": chains, "layer": self.layer}  # a dict: ranks merge it per layer

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for i, cd in enumerate(self.cds):
            cd.chains = state["chains"][f"layer{i}"]
        self.layer = state["layer"]


TASKS = {
    "classification": ClassificationRBMTask,
    "dbn": DBNTask,
    "conditional": ConditionalRBMTask,
    "gated": GatedRBMTask,
}


def build(config: RBMConfig, trainer: TrainerConfig) -> Setup:
    task = TASKS.get(config.model, RBMTask)(config, trainer)
    if config.model in CONDITIONAL_DATA:
        return Setup(task, task.data)
    data = (task.train.x, task.train.y) if config.model == "classification" else (task.train.x,)
    return Setup(task, data)


def evaluate(
    setup: Setup, run: RunDirectory, progress: Callable[[str], None] = quiet
) -> dict[str, Any]:
    """Train and test log-likelihood with the partition function used (the conditional
    models: their own scores), and the run's pictures; ``progress`` is called with each
    stage's name as it starts."""
    task: RBMTask = setup.task  # type: ignore[assignment]
    progress("filters and samples")
    task.grids(run)
    progress("log Z and the log-likelihoods (the conditional models: their scores)")
    return {
        "data": task.config.data,
        "model": task.config.model,
        "n_hidden": task.config.n_hidden,
        **task.evaluate(),
    }


def sample(setup: Setup, run: RunDirectory, n: int, steps: int, out: Path, seed: int = 0) -> Path:
    """A picture of ``n`` samples after ``steps`` Gibbs steps (see each task's
    ``picture``)."""
    task: RBMTask = setup.task  # type: ignore[assignment]
    task.picture(n, steps, out, task.generator(seed))
    return out


def log_partition(setup: Setup, method: str, seed: int = 0) -> LogZEstimate:
    task: RBMTask = setup.task  # type: ignore[assignment]
    return task.log_partition(method, task.generator(seed))


register(
    Recipe[RBMConfig, RBMTask](
        name="rbm",
        help="RBMs (bernoulli, categorical, gaussian, spike_slab, conv, subspace, "
        "classification, conditional, gated), DBNs and DBMs",
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
        config_defaults=lambda config: CONDITIONAL_TRAINING.get(config.model, {}),
    )
)
