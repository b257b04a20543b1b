"""Structured outputs: sequence labelling with exact inference, digit completion with
approximate inference (LeCun et al. 2006, §6).

:class:`ChainTask` labels sequences drawn from a known hidden Markov model with a chain
energy E(Y, X) = sum_t U_t[y_t] + sum_t P[y_{t-1}, y_t] (unary terms from a small
network, a learned transition matrix). Losses: ``perceptron`` (E(Y^i) - min_Y E(Y)),
``hinge`` (margin rescaled by the Hamming distance, found by Viterbi on the augmented
energy) and ``nll`` (E(Y^i) - F, the forward algorithm). Its error is reported for exact
(Viterbi) and approximate inference next to the Bayes-optimal error of the true model.

:class:`CompletionTask` completes the bottom half of binarised grayscale images (the
digits by default) from the top half: for the 8 x 8 digits Y is 32 binary pixels (2^32
answers, too many to enumerate), with a conditional Boltzmann
energy E(Y, X) = -(Y^T W Y + b(X)^T Y), fields b(X) from a network. The contrastive
answers come from annealed Gibbs inference: ``hinge`` takes the most offending answer
of the loss-augmented energy E(Y) - m Hamming(Y, Y^i); ``perceptron`` the approximate
argmin; ``cd`` k Gibbs sweeps at temperature 1 started at the data (LeCun et al.'s (2006)
contrastive-divergence update: pull down the data, pull up what inference found).
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F

from ebmlab._checks import ArgumentError
from ebmlab.data.sequences import HiddenMarkovModel
from ebmlab.devices import widen
from ebmlab.energies.base import in_chunks
from ebmlab.energies.structured import ChainEnergy, ConditionalBoltzmann
from ebmlab.inference import (
    PairwiseMRF,
    annealed_gibbs,
    chain_energy,
    chain_free_energy,
    chain_marginals,
    icm,
    mean_field,
    viterbi,
)
from ebmlab.training.recipes import data_splits
from ebmlab.training.recipes.structured.config import StructuredConfig
from ebmlab.training.trainer import StepResult, Task


class ChainTask(Task):
    """Sequence labelling with exact inference on a chain."""

    def __init__(self, config: StructuredConfig, seed: int) -> None:
        self.config = config
        self.hmm = HiddenMarkovModel(config.n_states, seed=seed)
        data_gen = torch.Generator().manual_seed(seed + 1)
        self.train = self.hmm.sample(config.n_sequences, config.seq_length, data_gen)
        self.val = self.hmm.sample(config.n_sequences // 2, config.seq_length, data_gen)
        self.test = self.hmm.sample(config.n_sequences, config.seq_length, data_gen)
        torch.manual_seed(seed)
        self.model = ChainEnergy(self.hmm.dim, config.hidden, config.n_states)

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        unary, transition = self.model(x)
        e_correct = chain_energy(unary, transition, y)
        if self.config.loss == "nll":
            return (e_correct - chain_free_energy(unary, transition, self.config.beta)).mean()
        if self.config.loss == "perceptron":
            return (e_correct - viterbi(unary, transition)[1]).mean()
        hamming = self.config.margin * (1 - F.one_hot(y, unary.shape[2]).to(unary.dtype))
        return (e_correct - viterbi(unary - hamming, transition)[1]).clamp_min(0).mean()

    def training_step(
        self, batch: tuple[torch.Tensor, ...], generator: torch.Generator
    ) -> StepResult:
        return StepResult(self.loss(*batch))

    def sequence_errors(
        self, x: torch.Tensor, y: torch.Tensor, inference: str = "viterbi"
    ) -> torch.Tensor:
        """Each sequence's share of positions (N,) that ``inference`` (one of INFERENCE)
        gets wrong: the sequences are independent, their positions are not, so the
        standard error of the per-position error is taken over these."""
        with torch.no_grad():
            unary, transition = self.model(x)
            if inference == "viterbi":
                labels, _ = viterbi(unary, transition)
            else:
                labels = approximate_argmin(PairwiseMRF.from_chain(unary, transition), inference)
        return widen(labels != y).mean(1)

    def error(self, x: torch.Tensor, y: torch.Tensor, inference: str = "viterbi") -> float:
        """Per-position error of the answers found by ``inference`` (one of INFERENCE)."""
        return float(self.sequence_errors(x, y, inference).mean())

    def bayes_errors(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Each sequence's per-position error (N,) of the max posterior marginals under
        the true HMM."""
        marginals = chain_marginals(*self.hmm.energies(x))
        return widen(marginals.argmax(2) != y).mean(1)

    def validate(self, generator: torch.Generator) -> dict[str, float]:
        return {"val_error": self.error(*self.val)}


INFERENCE = ("viterbi", "annealed_gibbs", "icm", "mean_field")


def approximate_argmin(mrf: PairwiseMRF, inference: str, sweeps: int = 100) -> torch.Tensor:
    """The answers of one approximate inference method (a fixed seed: evaluation is
    repeatable)."""
    if inference == "annealed_gibbs":
        return annealed_gibbs(mrf, sweeps, generator=0)[0]
    if inference == "icm":
        return icm(mrf)[0]
    return mean_field(mrf).argmax(2)


class CompletionTask(Task):
    """Bottom half of binarised grayscale images given the top half (the top H // 2
    rows), with annealed-Gibbs answers."""

    def __init__(self, config: StructuredConfig, seed: int) -> None:
        self.config = config
        self.train, self.val, self.test = data_splits(config, transform="binary", in_memory=True)
        shape = self.train.image_shape
        if shape is None or shape[0] != 1:
            raise ArgumentError(
                f"task 'completion' completes grayscale images; data {config.data!r} holds "
                f"{'feature vectors' if shape is None else f'{shape[0]}-channel images'}"
            )
        self.half = (shape[1] // 2) * shape[2]  # pixels of the top half
        torch.manual_seed(seed)
        pixels = shape[1] * shape[2]
        self.model = ConditionalBoltzmann(self.half, pixels - self.half, config.hidden)

    def halves(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x[:, : self.half], x[:, self.half :].long()

    def training_step(
        self, batch: tuple[torch.Tensor, ...], generator: torch.Generator
    ) -> StepResult:
        top, bottom = self.halves(batch[0])
        c = self.config
        mrf = PairwiseMRF.from_binary(*self.model(top))
        if c.loss == "cd":
            answer, _ = annealed_gibbs(
                mrf.detach(), c.gibbs_sweeps, beta_start=1.0, beta_end=1.0, y0=bottom,
                generator=generator,
            )  # fmt: skip
            loss = (mrf.energy(bottom) - mrf.energy(answer)).mean()
        else:
            margin = c.margin if c.loss == "hinge" else 0.0
            target = mrf.augmented(bottom, margin)
            answer, _ = annealed_gibbs(target.detach(), c.gibbs_sweeps, generator=generator)
            loss = (mrf.energy(bottom) - target.energy(answer)).clamp_min(0).mean()
        errors = widen(answer != bottom).mean()
        return StepResult(loss, {"contrastive_pixel_diff": float(errors)})

    def pixel_errors(self, x: torch.Tensor, inference: str = "annealed_gibbs") -> torch.Tensor:
        """Each image's share of bottom-half pixels (N,) that ``inference`` completes
        wrongly (the images are independent, their pixels are not), a chunk of images
        at a time."""

        def errors(part: torch.Tensor) -> torch.Tensor:
            top, bottom = self.halves(part)
            mrf = PairwiseMRF.from_binary(*self.model(top))
            return widen(approximate_argmin(mrf, inference) != bottom).mean(1)

        with torch.no_grad():
            return in_chunks(errors, x)

    def pixel_error(self, x: torch.Tensor, inference: str = "annealed_gibbs") -> float:
        """The share of bottom-half pixels that ``inference`` completes wrongly."""
        return float(self.pixel_errors(x, inference).mean())

    def validate(self, generator: torch.Generator) -> dict[str, float]:
        return {"val_error": self.pixel_error(self.val.x, "mean_field")}

    def baseline_pixel_errors(self) -> torch.Tensor:
        """Each test image's share of bottom-half pixels (N,) that independent per-pixel
        logistic regressions on the top half (scikit-learn) get wrong, the pixels fitted
        in parallel on every core."""
        from joblib import Parallel, delayed

        top, bottom = (t.cpu().numpy() for t in self.halves(self.train.x))
        test_top, test_bottom = (t.cpu().numpy() for t in self.halves(self.test.x))
        columns = Parallel(n_jobs=-1, prefer="threads")(
            delayed(_pixel_predictions)(top, bottom[:, j], test_top)
            for j in range(test_bottom.shape[1])
        )
        return torch.from_numpy((np.stack(columns, 1) != test_bottom).mean(1))


def _pixel_predictions(top: np.ndarray, pixel: np.ndarray, test_top: np.ndarray) -> np.ndarray:
    """One pixel's logistic regression on the top half, applied to the test tops (a
    pixel constant in training is predicted constant)."""
    from sklearn.linear_model import LogisticRegression

    if np.unique(pixel).size == 1:
        return np.full(len(test_top), pixel[0])
    return LogisticRegression(max_iter=1000).fit(top, pixel).predict(test_top)
