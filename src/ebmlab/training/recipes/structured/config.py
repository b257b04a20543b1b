"""Settings of the ``structured`` recipe and the losses each of its tasks takes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.data import (
    IMAGE_SETS,
    VALIDATION_FRACTION,
    check_data,
    check_resize,
    check_validation_fraction,
)
from ebmlab.learning.structured import LOSSES

CHAIN_LOSSES = ("perceptron", "hinge", "nll")
COMPLETION_LOSSES = ("hinge", "perceptron", "cd")
TASK_LOSSES = {"digits": LOSSES, "chain": CHAIN_LOSSES, "completion": COMPLETION_LOSSES}


@dataclass
class StructuredConfig:
    """Settings of the ``structured`` recipe.

    Attributes:
        task: classification (of the digits, or of ``data``), sequence labelling on a
            chain, or completing the bottom half of binarised grayscale images.
        data: the labelled data of classification and the images of completion: a data
            set name (digits, mnist, cifar10, ...) or an .npy/.npz file or image folder.
        data_root: directory holding published data sets (else $EBMLAB_DATA).
        resize: (height, width) for image folders of mixed sizes.
        validation_fraction: share of the training split held out for validation where
            the data set has no validation split (0: validate on the test split).
        arch: logits E = -NN(x)[y] or distance E = ||G(x) - e_y||^2 (digits).
        loss: one of LeCun et al.'s (2006) losses (chain and completion take a subset).
        hidden: hidden widths of the network.
        embed_dim: dimension of the distance architecture's embeddings.
        embed_init: standard deviation of the answer embeddings at initialisation.
        gibbs_sweeps: annealed Gibbs sweeps of approximate inference (completion).
        margin: margin of the hinge and square-square losses.
        beta: inverse temperature of the NLL and MEE losses.
        gamma: scale of the square-exponential loss.
        delta: LVQ2's margin.
        n_states: labels of the chain task's hidden Markov model.
        seq_length: length of each sequence (chain).
        n_sequences: training sequences (chain).
    """

    CHOICES: ClassVar[dict[str, Sequence[str]]] = {
        "task": tuple(TASK_LOSSES),
        "arch": ("logits", "distance"),
        "loss": LOSSES,
    }

    task: str = "digits"
    data: str = "digits"
    data_root: str = ""
    resize: tuple[int, ...] = ()
    validation_fraction: float = VALIDATION_FRACTION
    arch: str = "logits"
    loss: str = "hinge"
    hidden: tuple[int, ...] = (128,)
    embed_dim: int = 16
    embed_init: float = 0.01
    gibbs_sweeps: int = 20
    margin: float = 1.0
    beta: float = 1.0
    gamma: float = 1.0
    delta: float = 0.1
    n_states: int = 4
    seq_length: int = 20
    n_sequences: int = 500

    def __post_init__(self) -> None:
        _checks.choices(self)
        _checks.one_of(f"loss (for task {self.task})", self.loss, TASK_LOSSES[self.task])
        if self.task == "chain" and self.data != "digits":
            raise ArgumentError(
                "task 'chain' draws its sequences from a hidden Markov model; data applies "
                "to the digits (classification) and completion tasks"
            )
        self.data = check_data(self.data, IMAGE_SETS, self.data_root or None)
        check_resize(self.resize)
        check_validation_fraction(self.validation_fraction)
        _checks.positive_int("n_states", self.n_states)
        _checks.positive_int("seq_length", self.seq_length)
        _checks.positive_int("n_sequences", self.n_sequences)
        _checks.positive("embed_init", self.embed_init, allow_zero=True)
        _checks.positive_int("gibbs_sweeps", self.gibbs_sweeps)
        _checks.positive_ints("hidden", self.hidden)
        _checks.positive_int("embed_dim", self.embed_dim)
        _checks.positive("margin", self.margin, allow_zero=True)
        _checks.positive("beta", self.beta)
        _checks.positive("gamma", self.gamma)
        _checks.positive("delta", self.delta)
