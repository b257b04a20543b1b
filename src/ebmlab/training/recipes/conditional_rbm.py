"""The ``rbm`` recipe's conditional models: RBMs of a frame given its past and of an
image given another, trained by CD-k on p(v | condition) (Taylor et al. 2007, eq. 4;
Memisevic & Hinton 2010) through :func:`~ebmlab.losses.conditional_cd_loss`.

- ``conditional``: a conditional RBM (:class:`~ebmlab.energies.ConditionalRBM`) of
  simulated walking (``walking``: six joint angles, :func:`~ebmlab.data.motion.
  walking_gaits`; train, validation and test walkers from seeds 0, 2 and 1), each frame
  given the ``order`` frames before it. It starts from the least-squares linear
  autoregression, so its hidden units learn what the linear model misses; validation
  reports the exact conditional negative log-likelihood per frame (``val_nll``, the
  2^n_hidden hidden states enumerated) and the next-frame squared error (``val_mse``),
  evaluation both beside the linear autoregression's, each with its standard error over
  the walkers.
- ``gated``: a factored gated RBM (:class:`~ebmlab.energies.GatedRBM`) of random-dot
  pairs moved by one of eight transformations (``dot-pairs``,
  :func:`~ebmlab.data.pairs.transformed_pairs`, 13 x 13), with ``n_hidden`` mapping
  units and ``n_factors`` factors. It never sees the transformations' labels: validation
  and evaluation read them off the mapping units with a logistic regression fitted on
  the training pairs (``val_error``, ``test_error``: the fraction of held-out pairs
  whose transformation is inferred wrongly).

Neither model has one log Z (each condition has its own); their pictures are a
sequence plot (frames, next-frame predictions and a generated continuation) and an
analogy grid (a pair's inferred transformation applied to digits).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ebmlab import _checks
from ebmlab.data.motion import JOINTS, walking_gaits
from ebmlab.data.pairs import TRANSFORMATIONS, digits_on_canvas, transform_images, transformed_pairs
from ebmlab.devices import widen
from ebmlab.energies import ConditionalRBM, GatedRBM
from ebmlab.energies.base import energy_device
from ebmlab.evaluation.likelihood import mean_and_stderr
from ebmlab.losses import conditional_cd_loss
from ebmlab.plotting import image_grid, save_figure, subplots
from ebmlab.training.run_dir import RunDirectory
from ebmlab.training.trainer import StepResult, Task, TrainerConfig

WALKERS = {"train": (40, 0), "val": (10, 2), "test": (40, 1)}  # (sequences, seed)
FRAMES = 200
PAIRS = {"train": (4000, 0), "val": (1000, 2), "test": (2000, 1)}  # (pairs, seed)
SIZE = 13  # side of the dot images
PROBE_PAIRS = 2000  # training pairs the transformation probe is fitted on


class _ConditionalTask(Task):
    """What the two conditional models share: CD-k on p(v | condition) through autograd,
    no persistent state, and no single log Z."""

    def __init__(self, config: Any, trainer: TrainerConfig) -> None:
        self.config = config
        torch.manual_seed(trainer.seed)
        self.build()

    def build(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def training_step(
        self, batch: tuple[torch.Tensor, ...], generator: torch.Generator
    ) -> StepResult:
        v, condition = batch
        return StepResult(
            conditional_cd_loss(self.model, v, condition, k=self.config.k, generator=generator)
        )

    def log_partition(self, method: str = "auto", generator: torch.Generator | None = None):
        """Refused: a conditional model has one log Z per condition."""
        raise _checks.ArgumentError(
            f"model {self.config.model!r} has one log Z per condition, not one for the run; "
            "its exact conditional likelihood is part of `ebmlab evaluate`"
        )

    def final_metrics(self, generator: torch.Generator) -> dict[str, Any]:
        return self.evaluate()

    def evaluate(self) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def on_epoch_end(
        self, run: RunDirectory | None, epoch: int, generator: torch.Generator
    ) -> None:
        if run is not None:
            self.grids(run)

    def grids(self, run: RunDirectory) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


class ConditionalRBMTask(_ConditionalTask):
    """A conditional RBM of simulated walking, each frame given its ``order``
    predecessors."""

    def build(self) -> None:
        config = self.config
        self.model = ConditionalRBM(len(JOINTS), config.n_hidden, config.order, init_std=0.1)
        self.frames = {
            split: walking_gaits(n, FRAMES, seed=seed) for split, (n, seed) in WALKERS.items()
        }
        self.train, self.val, self.test = (
            self.model.windows(self.frames[split]) for split in ("train", "val", "test")
        )
        self.model.fit_autoregression(*self.train)
        # the model starts as the linear autoregression: keep it as the baseline
        self.linear = (self.model.A.detach().clone(), self.model.b.detach().clone())

    @property
    def data(self) -> tuple[torch.Tensor, ...]:
        """The training frames and their histories."""
        return self.train

    def scores(self, split: str) -> dict[str, float]:
        """Exact conditional negative log-likelihood per frame and next-frame squared
        errors of the model and of the least-squares linear autoregression on a split,
        each with its standard error over the split's walkers (``_stderr``): the frames
        of one walker are correlated, the walkers independent."""
        v, history = getattr(self, split)
        walkers = len(self.frames[split])
        weights, bias = self.linear
        with torch.no_grad():
            per_frame = {
                "nll": -self.model.log_likelihood(v, history),
                "mse": ((self.model.predict(history) - v) ** 2).mean(1),
                "mse_linear_autoregression": ((history @ weights.T + bias - v) ** 2).mean(1),
            }
        out = {}
        for name, values in per_frame.items():
            mean, stderr = mean_and_stderr(widen(values).view(walkers, -1).mean(1))
            out[name], out[f"{name}_stderr"] = mean, stderr
        return out

    def validate(self, generator: torch.Generator) -> dict[str, float]:
        return {f"val_{k}": value for k, value in self.scores("val").items()}

    def evaluate(self) -> dict[str, Any]:
        """Test scores beside the linear autoregression's."""
        return {
            "n_visible": len(JOINTS),
            **{f"test_{k}": value for k, value in self.scores("test").items()},
        }

    def picture(self, n: int, steps: int, out, generator: torch.Generator) -> None:
        """Up to ``n`` test walkers' knee and hip: the truth, the next-frame predictions
        and a continuation generated by ``steps`` Gibbs steps per frame from the first
        ``order`` frames."""
        order, length = self.config.order, 80
        frames = self.frames["test"][: max(1, min(n, 4)), :length]
        with torch.no_grad():
            _, history = self.model.windows(frames)
            predicted = self.model.predict(history).view(len(frames), -1, len(JOINTS))
            generated = self.model.generate(frames[:, :order], 30, steps, generator)
        fig, axes = subplots(len(frames), 2, figsize=(10, 2.5 * len(frames)), squeeze=False)
        t = np.arange(length)
        for row, walker in enumerate(frames.cpu()):
            for col, joint in enumerate((1, 0)):
                ax = axes[row, col]
                ax.plot(t, walker[:, joint], "k", lw=2, label="simulated")
                ax.plot(t[order:], predicted[row, :, joint].cpu(), "C1--", label="next frame")
                ax.plot(t[order : order + 30], generated[row, :, joint].cpu(), "C0",
                        label="generated")  # fmt: skip
                ax.set_title(f"test walker {row + 1}, {JOINTS[joint]}")
        axes[0, 0].legend(loc="lower left", fontsize=8)
        fig.tight_layout()
        save_figure(fig, out)

    def grids(self, run: RunDirectory) -> None:
        self.picture(2, 30, run.samples / "sequences.png", self.generator(0))


class GatedRBMTask(_ConditionalTask):
    """A factored gated RBM of random-dot pairs, the output image given the input."""

    def build(self) -> None:
        config = self.config
        self.pairs = {
            split: transformed_pairs(n, SIZE, seed=seed) for split, (n, seed) in PAIRS.items()
        }
        n = SIZE * SIZE
        self.model = GatedRBM(n, n, config.n_hidden, config.n_factors, init_std=0.3)
        x, y, _ = self.pairs["train"]
        self.model.fit_biases(y, x)

    @property
    def data(self) -> tuple[torch.Tensor, ...]:
        """The training outputs and their inputs."""
        x, y, _ = self.pairs["train"]
        return y, x

    def wrong(self, split: str) -> torch.Tensor:
        """1 for each of the split's pairs (float64, (N,)) whose transformation a logistic
        regression on the mapping units (fitted on training pairs) infers wrongly, else 0."""

        def features(split: str) -> tuple[np.ndarray, np.ndarray]:
            x, y, labels = self.pairs[split]
            with torch.no_grad():
                h = self.model.hidden_probs(y, x)
            return h.cpu().double().numpy(), labels.cpu().numpy()

        h, labels = features("train")
        from sklearn.linear_model import LogisticRegression

        probe = LogisticRegression(max_iter=2000).fit(h[:PROBE_PAIRS], labels[:PROBE_PAIRS])
        h, labels = features(split)
        return widen(torch.from_numpy(probe.predict(h) != labels))

    def validate(self, generator: torch.Generator) -> dict[str, float]:
        return {"val_error": float(self.wrong("val").mean())}

    def evaluate(self) -> dict[str, Any]:
        """Held-out transformation error of the mapping units and its standard error
        (the pairs are independent)."""
        error, stderr = mean_and_stderr(self.wrong("test"))
        return {"n_visible": SIZE * SIZE, "test_error": error, "test_error_stderr": stderr}

    def picture(self, n: int, steps: int, out, generator: torch.Generator) -> None:
        """The analogy grid of :func:`analogy_picture` (``n`` and ``steps`` unused: the
        analogies are exact)."""
        analogy_picture(self.model, *self.pairs["train"], out)

    def grids(self, run: RunDirectory) -> None:
        self.picture(len(TRANSFORMATIONS), 0, run.samples / "analogies.png", self.generator(0))


def analogy_picture(
    model: GatedRBM, x: torch.Tensor, y: torch.Tensor, labels: torch.Tensor, path
) -> None:
    """One row per transformation: a pair (x, y) moved by it, a digit x*, the analogy
    p(y* | h(x, y), x*) of the gated ``model``, and the digit truly moved; written to
    ``path``.

    Args:
        model: the gated RBM, of 13 x 13 images.
        x: inputs (N, 169) of dot pairs.
        y: their outputs (N, 169).
        labels: their transformations (N,), indices into ``TRANSFORMATIONS``; each
            transformation must occur.
        path: the PNG written.
    """
    kinds = torch.arange(len(TRANSFORMATIONS))
    example = torch.stack([torch.nonzero(labels.cpu() == k)[0, 0] for k in kinds])
    x, y = x.cpu()[example], y.cpu()[example]
    new = digits_on_canvas(len(kinds), SIZE)
    device = energy_device(model)
    with torch.no_grad():
        analogy = model.analogy(y.to(device), x.to(device), new.to(device)).cpu()
    truth = transform_images(new.view(-1, SIZE, SIZE), kinds).flatten(1)
    grid = torch.stack([x, y, new, analogy, truth], 1).flatten(0, 1)
    image_grid(
        grid,
        path,
        image_shape=(SIZE, SIZE),
        value_range=(0, 1),
        ncol=5,
        row_labels=[name for name, *_ in TRANSFORMATIONS],
        title="pair x, y | new x* | analogy | x* moved",
    )
