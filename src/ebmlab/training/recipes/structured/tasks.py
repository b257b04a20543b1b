"""Structured outputs: sequence labelling with exact inference, digit completion with
approximate inference (LeCun et al. 2006, §6).

:class:`ChainTask` labels sequences drawn from a known hidden Markov model with a chain
energy E(Y, X) = sum_t U_t[y_t] + sum_t P[y_{t-1}, y_t] (unary terms from a small
network, a learned transition matrix). Losses: ``perceptron`` (E(Y^i) - min_Y E(Y)),
``hinge`` (margin rescaled by the Hamming distance, found by Viterbi on the augmented
energy) and ``nll`` (E(Y^i) - F, the forward algorithm). Its error is reported for exact
(Viterbi) and approximate inference next to the Bayes-optimal error of the true model.

:class:`CompletionTask` completes the bottom half of binarised digits from the top half:
Y is 32 binary pixels (2^32 answers, too many to enumerate) with a conditional Boltzmann
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

from ebmlab.data import load_dataset
from ebmlab.data.sequences import HiddenMarkovModel
from ebmlab.devices import widen
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

    def bayes_error(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Per-position error of the max posterior marginals under the true HMM."""
        marginals = chain_marginals(*self.hmm.energies(x))
        return float(widen(marginals.argmax(2) != y).mean())

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


HALF = 32  # pixels in each half of an 8x8 digit


class CompletionTask(Task):
    """Bottom half of binarised digits given the top half, with annealed-Gibbs answers."""

    def __init__(self, config: StructuredConfig, seed: int) -> None:
        self.config = config
        self.train, self.val, self.test = (
            load_dataset("digits", s, transform="binary") for s in ("train", "val", "test")
        )
        torch.manual_seed(seed)
        self.model = ConditionalBoltzmann(HALF, HALF, config.hidden)

    @staticmethod
    def halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x[:, :HALF], x[:, HALF:].long()

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
        wrongly (the images are independent, their pixels are not)."""
        top, bottom = self.halves(x)
        with torch.no_grad():
            answer = approximate_argmin(PairwiseMRF.from_binary(*self.model(top)), inference)
        return widen(answer != bottom).mean(1)

    def pixel_error(self, x: torch.Tensor, inference: str = "annealed_gibbs") -> float:
        """The share of bottom-half pixels that ``inference`` completes wrongly."""
        return float(self.pixel_errors(x, inference).mean())

    def validate(self, generator: torch.Generator) -> dict[str, float]:
        return {"val_error": self.pixel_error(self.val.x, "mean_field")}

    def baseline_pixel_error(self) -> float:
        """Independent per-pixel logistic regression on the top half (scikit-learn)."""
        from sklearn.linear_model import LogisticRegression

        top, bottom = (t.cpu().numpy() for t in self.halves(self.train.x))
        test_top, test_bottom = (t.cpu().numpy() for t in self.halves(self.test.x))
        predictions = np.empty_like(test_bottom)
        for j in range(HALF):
            if np.unique(bottom[:, j]).size == 1:  # a pixel constant in training
                predictions[:, j] = bottom[0, j]
            else:
                clf = LogisticRegression(max_iter=1000).fit(top, bottom[:, j])
                predictions[:, j] = clf.predict(test_top)
        return float((predictions != test_bottom).mean())
