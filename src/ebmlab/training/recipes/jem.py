"""Recipe ``jem``: the hybrid classifier/generator EBM (Tomczak 2024, §6.2-6.4;
Grathwohl et al. 2020).

One network NN(x) with K outputs is both a classifier, p(y | x) = softmax NN(x),
and an unnormalised density, log p(x) = LogSumExp_y NN(x)[y] - log Z. Training
maximises log p(x, y) = log p(y | x) + log p(x) (Tomczak 2024, eq. 6.26): cross-entropy
plus the contrastive term E(x_data) - E(x_sample), with E(x) = -LogSumExp_y NN(x)[y]
and samples from SGLD, x' = x - alpha grad E(x) + sigma eps (eq. 6.28, written there
for f = -E).

``gen_objective`` can replace those SGLD negatives: ``"drl"`` draws them from the
recovery likelihood's conditional p(x | x~) of blurred training images x~ (Gao et al.
2021, with one noise level, ``drl_sigma``), ``"ed"`` drops them for energy discrepancy
(Schröder et al. 2023), and ``"em"`` trains the energy as Energy Matching's potential V
(Balcerak et al. 2025): first, for the share ``em_warmup`` of the run, -grad E regresses
the optimal-transport flow from standard normal noise to the images (their eq. 5), then
the contrastive term joins it, with negatives from the replay buffer moved by Langevin
dynamics at the temperature ``eps_max`` (the density exp(-E / eps_max), their eq. 7).
Its samples are generated as the paper does: the flow down E from noise for
``flow_steps`` steps of 1 / ``flow_steps``, the temperature rising from ``tau_star``,
then as many Langevin steps at ``eps_max``. With ``em_conditional`` each class's
energy E(x, y) = -NN(x)[y] is the potential of its own flow, from noise to the images
of that class, and samples are generated class by class.

Negatives start either from uniform noise in the data range (the book's variant,
``init="uniform"``) or from a replay buffer of persistent chains with
re-initialisation (JEM's variant, the default). ``start`` says where fresh chains
begin: uniformly in the data range (eq. 6.28) or, with ``"gaussian"`` (the default),
at draws from one Gaussian per class fitted to the training data (the informative
initialisation of JEM++, Yang & Ji 2021; :func:`~ebmlab.samplers.gaussian_init`),
except for a share ``uniform_share`` still drawn uniformly so that the model also
meets noise.

Options that keep training stable: ``data_noise`` (Gaussian noise added to the data,
as in JEM), ``energy_l2`` (the penalty on E^2 of data and samples of Du & Mordatch
2019, which holds both energies near zero so that log p(x) ranks by shape),
``sampler_grad_clip`` (per-chain gradient norm bound in SGLD), ``clamp`` (chains
projected onto the data range: images live in a box) and smooth activations (SiLU).
``shift_augment``, ``rotate_augment`` and ``scale_augment`` move each training image
by a random affine map (up to that many pixels, degrees and relative zoom); the
augmented copies join the data in the cross-entropy only, so that p(x) still models
the data rather than its augmentations. ``calibrate`` fits the inverse temperature
beta of p(y | x) on the validation split after every epoch
(:meth:`~ebmlab.energies.ClassifierEnergy.calibrate`; Guo et al. 2017), so that the
classifier's confidence matches its accuracy; the density is untouched. The MNIST sets
have no validation split here (fitting on the test split would leak), so beta stays 1.

``sampler_dtype="bfloat16"`` computes SGLD gradients in bfloat16;
``train_dtype="bfloat16"`` runs the network's forward and backward pass of the loss in
bfloat16 as well (mixed precision through :class:`torch.autocast`: parameters,
optimizer state and the loss terms stay float32); ``train_dtype="float16"`` does so in
float16, with the trainer's loss scaling (``grad_scaler``) against underflowing
gradients. Measured results of the defaults and their ablations: ``docs/results/jem.md``.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch.nn import functional as F
from tqdm.auto import tqdm

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.data import (
    IMAGE_SETS,
    VALIDATION_FRACTION,
    Dataset,
    check_data,
    check_resize,
    check_validation_fraction,
)
from ebmlab.data.augment import random_affine, random_crop_flip
from ebmlab.devices import widen
from ebmlab.energies import (
    ClassifierEnergy,
    ConvNet,
    EnergyModel,
    FeedForward,
    SNResNet,
    TemperedEnergy,
    UNetDot,
    UNetViT,
    WideResNet,
)
from ebmlab.energies.base import in_chunks
from ebmlab.energies.mlp import ACTIVATIONS
from ebmlab.energies.resnet import NORMS
from ebmlab.evaluation import (
    InceptionV3,
    accuracy,
    auroc,
    expected_calibration_error,
    inception_outputs,
    inception_score,
    load_inception,
    load_ood_images,
    mixture_log_likelihood,
    mmd2,
    nll,
    penultimate_features,
    reliability_diagram,
    sample_quality,
    shifted_images,
    uniform_noise,
)
from ebmlab.evaluation.progress import quiet
from ebmlab.hardware import autocast
from ebmlab.losses.discrepancy import energy_discrepancy_loss
from ebmlab.losses.energy_matching import energy_matching_loss
from ebmlab.partition import LogZEstimate, box_smc
from ebmlab.plotting import image_grid
from ebmlab.samplers import (
    EnergyMatchingSampler,
    Langevin,
    gaussian_init,
    mixture_init,
    uniform_init,
)
from ebmlab.samplers.recovery import OneLevel, blur, recover
from ebmlab.samplers.replay_buffer import InitFn
from ebmlab.training.recipes import BufferTask, Recipe, Setup, data_splits, register
from ebmlab.training.run_dir import RunDirectory
from ebmlab.training.trainer import DivergenceError, StepResult, TrainerConfig

PRECISIONS = ["float32", "bfloat16"]  # of SGLD gradients
ARCHS = ["mlp", "conv", "wrn", "resnet", "unet", "unet-dot"]
TRAIN_PRECISIONS = [*PRECISIONS, "float16"]  # of the training step (float16: --grad-scaler)


@dataclass
class JEMConfig:
    """Settings of the ``jem`` recipe.

    Attributes:
        data: a data set name (digits, digits-rgb, mnist, cifar10, ...) or a path.
        data_root: directory holding published data sets (else $EBMLAB_DATA).
        resize: (height, width) for image folders of mixed sizes.
        validation_fraction: share of the training split held out for validation where
            the data set has no validation split (0: validate on the test split).
        arch: the network: MLP, small conv net, WideResNet, IGEBM's SN ResNet,
            Energy Matching's U-Net with a patch-transformer head, or that U-Net with
            Equilibrium Matching's dot-product head.
        hidden: hidden widths of the MLP.
        activation: the networks' nonlinearity.
        conv_width: channels of the conv net's first layer (resnet: its first stage;
            unet, unet-dot: its first level).
        wrn_depth: WideResNet depth (6n + 4).
        wrn_widen: WideResNet widening factor.
        unet_mults: the U-Net levels' channels as multiples of conv_width (unet,
            unet-dot).
        unet_blocks: residual blocks per U-Net level and direction (unet, unet-dot).
        vit_patch: the transformer head's patch size (unet).
        vit_embed: its tokens' width (unet).
        vit_heads: its attention heads (unet).
        vit_layers: its layers (unet).
        norm: WideResNet normalisation layers.
        dropout: WideResNet dropout rate.
        sampler_steps: SGLD steps per training step.
        step_size: SGLD step alpha on the energy gradient (Tomczak 2024, eq. 6.28).
        noise: SGLD noise standard deviation sigma.
        init: negatives from a replay buffer of persistent chains, or fresh each step.
        start: where fresh chains begin: uniform noise or per-class Gaussians.
        uniform_share: share of fresh chains drawn uniformly when start is gaussian.
        buffer_size: persistent chains in the replay buffer.
        reinit_prob: share of buffer starts replaced by fresh chains each step.
        sampler_grad_clip: bound on each chain's gradient norm in SGLD (0: none).
        clamp: project chains onto the data range after every SGLD step.
        sampler_dtype: precision of the SGLD gradients.
        train_dtype: precision of the training step's forward and backward pass.
        data_noise: standard deviation of Gaussian noise added to the data.
        shift_augment: random shifts of up to this many pixels (cross-entropy only).
        rotate_augment: random rotations of up to this many degrees (cross-entropy only).
        scale_augment: random zooms of up to this relative size (cross-entropy only).
        crop_pad: random crops of the image padded by this many pixels (CIFAR: 4).
        hflip: random horizontal flips (natural images, not digits).
        energy_l2: weight of the E^2 penalty on data and samples (Du & Mordatch 2019).
        gen_weight: weight of the generative term log p(x) against the cross-entropy.
        gen_objective: the generative term: PCD with SGLD negatives, recovery likelihood
            from one noise level (``drl``), or energy discrepancy.
        ed_scale: energy discrepancy's Gaussian perturbation scale.
        ed_negatives: energy discrepancy's contrasting points per image.
        drl_sigma: recovery likelihood's noise level (standard deviation of the blur).
        drl_step_scale: the recovery's Langevin step as a fraction of the conditional
            variance (sigma / alpha)^2; it runs ``sampler_steps`` steps.
        eps_max: Energy Matching's temperature: the density exp(-E / eps_max) its
            Langevin steps sample (em).
        tau_star: where its generation temperature starts to rise, in [0, 1) (em).
        flow_steps: its generation steps from noise to the images, each of 1 /
            flow_steps; also the step of its Langevin dynamics (em).
        em_warmup: the share of the training steps spent in its flow warm-up (em).
        em_conditional: train each class's energy E(x, y) = -NN(x)[y] as the
            potential of its own flow, from noise to that class's images (the OT plan
            pairs within classes), with contrastive negatives started at the batch's
            images and moved by Langevin at eps_max under their class's energy; samples
            are generated class by class (em).
        max_energy: stop as diverged when an energy's magnitude exceeds this.
        calibrate: fit p(y | x)'s inverse temperature on the validation split each epoch.
    """

    CHOICES: ClassVar[dict[str, Sequence[str]]] = {
        "arch": ARCHS,
        "activation": tuple(ACTIVATIONS),
        "norm": NORMS,
        "init": ("buffer", "uniform"),
        "start": ("uniform", "gaussian"),
        "sampler_dtype": PRECISIONS,
        "train_dtype": TRAIN_PRECISIONS,
        "gen_objective": ("pcd", "drl", "ed", "em"),
    }

    data: str = "digits"
    data_root: str = ""
    resize: tuple[int, ...] = ()
    validation_fraction: float = VALIDATION_FRACTION
    arch: str = "conv"
    hidden: tuple[int, ...] = (256, 256)
    activation: str = "silu"
    conv_width: int = 48
    wrn_depth: int = 28
    wrn_widen: int = 10
    unet_mults: tuple[int, ...] = (1, 2, 2)
    unet_blocks: int = 1
    vit_patch: int = 4
    vit_embed: int = 128
    vit_heads: int = 4
    vit_layers: int = 2
    norm: str = "none"
    dropout: float = 0.0
    sampler_steps: int = 20
    step_size: float = 1.0
    noise: float = 0.01
    init: str = "buffer"
    start: str = "gaussian"
    uniform_share: float = 0.1
    buffer_size: int = 1000
    reinit_prob: float = 0.2
    sampler_grad_clip: float = 0.0
    clamp: bool = True
    sampler_dtype: str = "float32"
    train_dtype: str = "float32"
    data_noise: float = 0.03
    shift_augment: float = 1.0
    rotate_augment: float = 12.0
    scale_augment: float = 0.1
    crop_pad: int = 0
    hflip: bool = False
    energy_l2: float = 0.3
    gen_weight: float = 1.0
    gen_objective: str = "pcd"
    ed_scale: float = 0.3
    ed_negatives: int = 8
    drl_sigma: float = 0.6
    drl_step_scale: float = 0.1
    eps_max: float = 0.01
    tau_star: float = 0.9
    flow_steps: int = 100
    em_warmup: float = 0.5
    em_conditional: bool = False
    max_energy: float = 1e4
    calibrate: bool = True

    def __post_init__(self) -> None:
        self.data = check_data(self.data, IMAGE_SETS, self.data_root or None)
        check_resize(self.resize)
        check_validation_fraction(self.validation_fraction)
        _checks.choices(self)
        _checks.probability("dropout", self.dropout)
        _checks.positive_int("crop_pad", self.crop_pad, allow_zero=True)
        _checks.positive_ints("hidden", self.hidden)
        _checks.positive_int("conv_width", self.conv_width)
        _checks.positive_int("sampler_steps", self.sampler_steps)
        _checks.positive("step_size", self.step_size)
        _checks.positive("noise", self.noise, allow_zero=True)
        _checks.probability("uniform_share", self.uniform_share)
        _checks.positive_int("buffer_size", self.buffer_size)
        _checks.probability("reinit_prob", self.reinit_prob)
        _checks.positive("sampler_grad_clip", self.sampler_grad_clip, allow_zero=True)
        _checks.positive("data_noise", self.data_noise, allow_zero=True)
        _checks.positive("shift_augment", self.shift_augment, allow_zero=True)
        _checks.positive("rotate_augment", self.rotate_augment, allow_zero=True)
        _checks.probability("scale_augment", self.scale_augment)
        _checks.positive("energy_l2", self.energy_l2, allow_zero=True)
        _checks.positive("gen_weight", self.gen_weight, allow_zero=True)
        _checks.positive("ed_scale", self.ed_scale)
        _checks.positive_int("ed_negatives", self.ed_negatives)
        if not 0 < self.drl_sigma < 1:
            raise ArgumentError(f"drl_sigma must be in (0, 1), got {self.drl_sigma}")
        _checks.positive("drl_step_scale", self.drl_step_scale)
        _checks.positive("eps_max", self.eps_max)
        _checks.below_one("tau_star", self.tau_star)
        _checks.positive_int("flow_steps", self.flow_steps)
        if self.em_conditional and self.gen_objective != "em":
            raise ArgumentError(
                f"em_conditional needs gen_objective 'em', got {self.gen_objective!r}"
            )
        _checks.probability("em_warmup", self.em_warmup)
        _checks.positive("max_energy", self.max_energy)


EVAL_SAMPLES = 500  # samples for the sample-quality metrics by default, and per draw beyond
MIN_EVAL_SAMPLES = 20  # the fewest samples the sample-quality metrics accept
GAUSSIAN_FIT_ROWS = 10_000  # training rows the class Gaussians of fresh chains are fitted to
GRID_CLASSES = 10  # classes drawn in the conditional-samples picture
STABILITY_STEPS = 200  # SGLD steps of the stability check's first look; the long run goes on


def check_eval_samples(name: str, n: int) -> int:
    """``n``, a count of samples for the sample-quality metrics, if it is at least
    :data:`MIN_EVAL_SAMPLES`; else an error naming the argument ``name``."""
    if _checks.positive_int(name, n) < MIN_EVAL_SAMPLES:
        raise ArgumentError(f"{name} must be at least {MIN_EVAL_SAMPLES}, got {n}")
    return n


def network(
    config: JEMConfig, dim: int, image_shape: tuple[int, ...] | None, k: int
) -> torch.nn.Module:
    """The classifier network NN(x) with ``k`` outputs that ``config.arch`` names."""
    c = config
    if c.arch == "mlp":
        return FeedForward([dim, *c.hidden, k], c.activation)
    if c.arch == "conv":
        return ConvNet(image_shape, k, c.conv_width, c.activation)
    if c.arch == "resnet":
        return SNResNet(image_shape, k, c.conv_width, activation=c.activation)
    if c.arch == "unet":
        return UNetViT(
            image_shape, k, c.conv_width, c.unet_mults, c.unet_blocks, c.vit_patch,
            c.vit_embed, c.vit_heads, c.vit_layers, c.activation,
        )  # fmt: skip
    if c.arch == "unet-dot":
        return UNetDot(image_shape, k, c.conv_width, c.unet_mults, c.unet_blocks, c.activation)
    return WideResNet(image_shape, k, c.wrn_depth, c.wrn_widen, c.dropout, c.norm, c.activation)


class JEMTask(BufferTask):
    """Cross-entropy plus the contrastive generative term, with SGLD negatives."""

    def __init__(self, config: JEMConfig, seed: int) -> None:
        self.config = config
        self.train, self.val, self.test = data_splits(config)
        k = self.train.num_classes
        if self.train.y is None or k is None or k < 2:
            raise ArgumentError(
                f"data {config.data!r} needs labels of at least two classes for JEM"
            )
        if self.train.image_shape is None and (config.arch != "mlp" or self.augments):
            raise ArgumentError(
                f"data {config.data!r} holds feature vectors, not images: use arch 'mlp' and "
                "turn the image augmentations off (shift/rotate/scale_augment 0)"
            )
        torch.manual_seed(seed)
        self.model = ClassifierEnergy(
            network(config, self.train.x.shape[1], self.train.image_shape, k), k
        )
        self.model.grad_dtype = None if config.sampler_dtype == "float32" else torch.bfloat16
        self.recovery = OneLevel(self.model)  # the network as drl's one-level energy
        self.recovery_sigmas = torch.tensor([config.drl_sigma])
        self.init_fn = self._start_fn()
        self.buffer = self._replay_buffer(
            config.buffer_size, self.init_fn, config.reinit_prob, seed
        )
        self.data_extent = max(abs(v) for v in self.train.value_range)
        step, noise = config.step_size, config.noise
        if config.gen_objective == "em":  # Langevin at eps_max: noise sqrt(2 eps_max h)
            step = 1 / config.flow_steps
            noise = (2 * config.eps_max * step) ** 0.5
        self.sampler = Langevin(
            step,
            noise,
            grad_clip=config.sampler_grad_clip or None,
            clamp=self.train.value_range if config.clamp else None,
        )

    @property
    def augments(self) -> bool:
        c = self.config
        return bool(c.shift_augment or c.rotate_augment or c.scale_augment or c.crop_pad or c.hflip)

    def augment(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """A randomly moved copy of the flat images ``x``: affine moves, then crops and flips."""
        c, shape, fill = self.config, self.train.image_shape, self.train.value_range[0]
        if c.shift_augment or c.rotate_augment or c.scale_augment:
            moves = {"shift": c.shift_augment, "rotate": c.rotate_augment, "scale": c.scale_augment}
            x = random_affine(x, shape, generator, **moves, fill=fill)
        if c.crop_pad or c.hflip:
            x = random_crop_flip(x, shape, generator, pad=c.crop_pad, flip=c.hflip, fill=fill)
        return x

    def _start_fn(self) -> InitFn:
        """Where fresh chains begin: the data box, or the class Gaussians with a share
        ``uniform_share`` still drawn from the box."""
        uniform = uniform_init((self.train.x.shape[1],), *self.train.value_range)
        if self.config.start == "uniform":
            return uniform
        rows = slice(0, GAUSSIAN_FIT_ROWS)
        gaussian = gaussian_init(
            self.train.x[rows], self.train.y[rows], clamp=self.train.value_range
        )
        share = self.config.uniform_share
        return mixture_init([uniform, gaussian], [share, 1 - share])

    def negatives(
        self, n: int, generator: torch.Generator, steps: int | None = None
    ) -> torch.Tensor:
        """SGLD samples of the marginal p(x), from the replay buffer or from uniform noise."""
        steps = steps or self.config.sampler_steps
        if self.config.init == "uniform":
            return self.sampler.sample(
                self.model, self.init_fn(n, generator), steps, generator=generator
            )
        starts, slots = self.buffer.sample(n, generator)
        x = self.sampler.sample(self.model, starts, steps, generator=generator)
        self.buffer.push(x, slots)
        return x

    @property
    def differentiates_twice(self) -> bool:  # type: ignore[override]
        return self.config.gen_objective == "em"

    @property
    def density(self) -> EnergyModel:
        """The energy of the run's density p(x) on the pixel box: E, or E / eps_max for
        Energy Matching, whose density is exp(-E / eps_max)."""
        if self.config.gen_objective == "em":
            return TemperedEnergy(self.model, self.config.eps_max)
        return self.model

    @property
    def components(self) -> list[EnergyModel]:
        """The run's p(x) as the equal mixture of these energies' densities, each
        normalised on its own: :attr:`density` alone, or with ``em_conditional`` each
        class's exp(-E(x, y) / eps_max), p(x) = (1 / K) sum_y p(x | y), since every
        class's potential is fitted to its own flow and so has its own log Z."""
        c = self.config
        if not c.em_conditional:  # which the config allows only with gen_objective "em"
            return [self.density]
        device = self.train.x.device
        return [
            TemperedEnergy(self.model.conditional(torch.tensor(y, device=device)), c.eps_max)
            for y in range(self.model.num_classes)
        ]

    @property
    def samples_from_buffer(self) -> bool:
        """Whether :meth:`generate` draws its samples from the replay buffer, and so at
        most as many as it holds."""
        return self.config.gen_objective != "em" and self.config.init == "buffer"

    def generate(
        self,
        n: int,
        generator: torch.Generator,
        labels: torch.Tensor | None = None,
        progress: bool | str = False,
        guidance: float = 0.0,
    ) -> torch.Tensor:
        """``n`` samples of p(x) as the generative term draws them: Energy Matching's
        generation from standard normal noise (the flow, then as many Langevin steps at
        eps_max), projected onto the data range, or distinct chains of the replay buffer
        (as many as it holds, at most) moved by the training's SGLD steps.
        With ``em_conditional`` each sample follows its class's flow: of ``labels`` (n,),
        by default the classes in turn, down the guided energy of ``guidance`` w,
        towards p(x | y) p(y | x)^w (:class:`~ebmlab.energies.ClassConditionalEnergy`).
        ``progress`` shows a bar of the generation's steps (a string is its label)."""
        c = self.config
        if self.samples_from_buffer:
            return self.sampler.sample(self.model, self.buffer.distinct(n, generator),
                                       c.sampler_steps, generator=generator,
                                       progress=progress)  # fmt: skip
        if c.gen_objective != "em":
            return self.negatives(n, generator)
        sampler = EnergyMatchingSampler(
            1 / c.flow_steps, tau_star=c.tau_star, eps_max=c.eps_max, flow_steps=c.flow_steps
        )
        device = generator.device
        noise = torch.randn(n, self.train.x.shape[1], generator=generator, device=device)
        potential: EnergyModel = self.model
        if c.em_conditional:
            if labels is None:
                labels = torch.arange(n, device=device) % self.model.num_classes
            potential = self.model.conditional(labels, guidance)
        x = sampler.sample(potential, noise, 2 * c.flow_steps, generator=generator,
                           progress=progress)  # fmt: skip
        return x.clamp(*self.train.value_range)

    def recovered(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Draws from the recovery likelihood's conditional p(x | x~) of the blurred images
        x~ = alpha x + sigma eps (Gao et al. 2021, eq. 6, one noise level: the network's
        own energy), by ``sampler_steps`` steps of Langevin dynamics from x~ / alpha,
        projected onto the data range after each step when ``clamp`` is set."""
        c, sigmas = self.config, self.recovery_sigmas
        level = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
        _, blurred = blur(x, sigmas, level, generator)
        box = self.train.value_range if c.clamp else None
        return recover(
            self.recovery, blurred, level, sigmas, c.sampler_steps, c.drl_step_scale,
            generator, clamp=box,
        )  # fmt: skip

    def out_of_range(self, x: torch.Tensor) -> float:
        lo, hi = self.train.value_range
        return float(widen((x < lo) | (x > hi)).mean())

    def training_step(
        self, batch: tuple[torch.Tensor, ...], generator: torch.Generator
    ) -> StepResult:
        x, y = batch
        c = self.config
        n = x.shape[0]
        rows = [x]
        if self.augments:
            rows.append(self.augment(x, generator))
        if c.data_noise:
            rows = [
                r + c.data_noise * torch.randn(r.shape, generator=generator, device=r.device)
                for r in rows
            ]
        sampled = c.gen_objective in ("pcd", "drl")
        if c.gen_objective == "pcd":
            x_neg = self.negatives(n, generator)
        elif c.gen_objective == "drl":
            x_neg = self.recovered(rows[0], generator)
        else:
            x_neg = rows[0][:0]
        # One forward pass: data, its augmented copy (classifier only), then the samples.
        low = None if c.train_dtype == "float32" else getattr(torch, c.train_dtype)
        with autocast(x.device, low):
            out = self.model.logits(torch.cat([*rows, x_neg])).float()
        logits = out[: len(rows) * n]
        y = y.repeat(len(rows))
        ce = F.cross_entropy(logits, y)
        e_data = -torch.logsumexp(out[:n], 1)
        extra: dict[str, float] = {}

        def energy(z: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
            with autocast(x.device, low):
                logits = self.model.logits(z).float()
            if labels is None:
                return -torch.logsumexp(logits, 1)
            return -logits.gather(1, labels.view(-1, 1)).squeeze(1)

        if sampled:
            e_neg = -torch.logsumexp(out[-n:], 1)
            gen = e_data.mean() - e_neg.mean()
        elif c.gen_objective == "ed":
            gen, gap = energy_discrepancy_loss(
                energy,
                rows[0],
                scale=c.ed_scale,
                n_negatives=c.ed_negatives,
                generator=generator,
            )
            e_neg = e_data.detach() + gap["energy_gap"]
        else:
            labels = y[:n] if c.em_conditional else None
            gen, extra = self.energy_matching(energy, rows[0], labels, generator)
            e_neg = e_data.detach() - extra.get("contrastive_gap", 0.0)
        magnitude = float(torch.maximum(e_data.detach().abs().max(), e_neg.detach().abs().max()))
        if magnitude > c.max_energy:
            raise DivergenceError(
                f"energies reached {magnitude:.3g} (> max_energy {c.max_energy:g}): data and "
                "sample energies are running apart; try energy_l2 > 0 or a lower learning rate"
            )
        loss = ce + c.gen_weight * gen
        if c.energy_l2:
            penalty = e_data.pow(2).mean() + (e_neg.pow(2).mean() if sampled else 0.0)
            loss = loss + c.energy_l2 * penalty
        metrics = {
            "ce": float(ce.detach()),
            "acc": float(widen(logits.argmax(1) == y).mean()),
            "gen": float(gen.detach()),
            "energy_data": float(e_data.detach().mean()),
            "energy_sample": float(e_neg.detach().mean()),
            **extra,
        }
        if sampled:
            metrics["sample_out_of_range"] = self.out_of_range(x_neg)
        return StepResult(loss, metrics)

    def energy_matching(
        self,
        energy: Callable[..., torch.Tensor],
        x: torch.Tensor,
        labels: torch.Tensor | None,
        generator: torch.Generator,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Energy Matching's loss of the energy on the images ``x``: the OT flow term in
        the warm-up, then with the contrastive term against replay-buffer chains moved
        by Langevin dynamics at eps_max. With ``labels`` (``em_conditional``) the
        potential of row i is its class's energy, and the negatives are the images
        moved by ``sampler_steps`` Langevin steps at eps_max under their class's energy."""
        c = self.config
        phase = self.em_phase()
        potential = energy if labels is None else functools.partial(energy, labels=labels)
        given = {}
        if phase == "joint" and labels is None:
            given["negatives"] = self.negatives(len(x), generator)
        elif phase == "joint":
            moved = self.model.conditional(labels)
            given["negatives"] = self.sampler.sample(moved, x, c.sampler_steps, generator=generator)
        return energy_matching_loss(
            potential, x, tau_star=c.tau_star, eps_max=c.eps_max, phase=phase, labels=labels,
            generator=generator, **given,
        )  # fmt: skip

    def validate(self, generator: torch.Generator) -> dict[str, float]:
        """Error and NLL at beta = 1, then (``calibrate``) beta refitted on this split."""
        with torch.no_grad():
            probs = torch.softmax(in_chunks(self.model.logits, self.val.x), 1)
        metrics = {"val_error": 1 - accuracy(probs, self.val.y), "val_nll": nll(probs, self.val.y)}
        if self.config.calibrate and self.val.split == "val":
            metrics["beta"] = self.model.calibrate(self.val.x, self.val.y)
        return metrics

    def grid(self, x: torch.Tensor, path: Path, title: str, row_labels=None, ncol=10) -> None:
        """A picture of images ``x`` (nothing for feature vectors)."""
        if self.train.image_shape is None:
            return
        image_grid(
            x,
            path,
            image_shape=self.train.image_shape,
            value_range=self.train.value_range,
            ncol=ncol,
            title=title,
            row_labels=row_labels,
        )

    def on_epoch_end(
        self, run: RunDirectory | None, epoch: int, generator: torch.Generator
    ) -> None:
        if (
            run is not None
            and self.config.init == "buffer"
            and self.config.gen_objective
            in (
                "pcd",
                "em",
            )
        ):
            self.grid(
                self.buffer.buffer[:100],
                run.samples / "buffer.png",
                f"replay buffer, epoch {epoch}",
            )


def build(config: JEMConfig, trainer: TrainerConfig) -> Setup:
    if config.train_dtype == "float16" and not trainer.grad_scaler:
        raise ArgumentError("train_dtype float16 needs grad_scaler (--grad-scaler): float16 "
                         "gradients underflow without loss scaling")  # fmt: skip
    task = JEMTask(config, trainer.seed)
    task.plan_warmup(config.em_warmup, trainer, len(task.train))
    return Setup(task, (task.train.x, task.train.y))


def _ood_scores(task: JEMTask, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The three OOD scores, higher meaning more in-distribution."""
    with torch.no_grad():
        logits = in_chunks(task.model.logits, x)
    _, grad = in_chunks(task.model.energy_and_grad, x)
    return {
        "log_px": torch.logsumexp(logits, 1),
        "max_prob": torch.softmax(task.model.beta * logits, 1).max(1).values,
        "neg_grad_norm": -grad.flatten(1).norm(dim=1),
    }


def ood_sets(
    task: JEMTask, ood_data: str | None = None, ood_root: str | None = None
) -> dict[str, torch.Tensor]:
    """The OOD sets of the evaluation, in the model's input format: uniform noise, the test
    images with permuted pixels and flipped left-right and up-down, and the user's set
    (:func:`~ebmlab.evaluation.load_ood_images`: a file, a folder, or a published set
    by name read from ``ood_root``, else from the training data's root)."""
    test = task.test
    device = test.x.device
    noise = uniform_noise(len(test), test.x.shape[1], test.value_range, device=device)
    sets = {"uniform_noise": noise}
    if test.raw is None:  # feature vectors (or a test split kept on disk): noise only
        return sets
    raws = shifted_images(test.raw)
    if ood_data:
        root = ood_root or task.config.data_root or None
        key, images = load_ood_images(ood_data, test.raw.shape[1:], root)
        raws[key] = images
    for name, raw in raws.items():
        sets[name] = test.encoding(raw).reshape(len(raw), -1).to(device)
    return sets


def _sample_metrics(task: JEMTask, x: torch.Tensor, reference: torch.Tensor) -> dict[str, float]:
    value, stderr = mmd2(x, reference, return_stderr=True)
    return {
        "mmd2": value,
        "mmd2_stderr": stderr,
        "out_of_range": task.out_of_range(x),
        "finite": bool(torch.isfinite(x).all()),
    }


INCEPTION_REFERENCES = ("test", "train")


def _inception_network(
    task: JEMTask, weights: str | None, samples: int | None, reference: str, preprocessing: str
) -> InceptionV3 | None:
    """The FID tools' Inception-v3 from ``weights`` (None without), after checking the
    evaluation's Inception options; the SHA-256 of the file is reported with the
    figures, since which weights gave an FID decides what it compares with."""
    _checks.one_of("inception_reference", reference, INCEPTION_REFERENCES)
    if weights is None:
        if samples is not None:
            raise ArgumentError("inception_samples needs inception (an Inception-v3 weights file)")
        return None
    if samples is not None:
        check_eval_samples("inception_samples", samples)
    if task.train.image_shape is None:
        raise ArgumentError(f"inception needs images; the data {task.config.data!r} are vectors")
    return load_inception(weights, task.test.x.device, preprocessing)


def _inception_quality(
    task: JEMTask, network: InceptionV3, x: torch.Tensor, wanted: int, split: Dataset
) -> dict[str, Any]:
    """FD, KID, precision and recall of ``wanted`` samples (``x``, then more drawn 500 at
    a time) against as many images of ``split`` in Inception-v3's pool features, and
    the Inception score of both sets. Only features are kept, so memory does not grow
    with the number of images."""
    lo, hi = task.train.value_range
    shape = task.train.image_shape
    more = torch.Generator(x.device).manual_seed(2025)  # the evaluation's other draws stay
    samples = itertools.chain(
        [x[:wanted]],
        (task.generate(min(EVAL_SAMPLES, wanted - done), more)
         for done in range(len(x), wanted, EVAL_SAMPLES)),
    )  # fmt: skip
    m = min(len(split), wanted)
    reference = (split.x[i : min(i + EVAL_SAMPLES, m)].to(x.device)
                 for i in range(0, m, EVAL_SAMPLES))  # fmt: skip
    bar = tqdm(total=wanted + m, desc="inception features", unit="image", leave=False)

    def outputs(chunks: Iterable[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        parts = []
        for images in chunks:
            pixels = ((images - lo) / (hi - lo)).clamp(0, 1).reshape(len(images), *shape)
            parts.append(inception_outputs(network, pixels))
            bar.update(len(images))
        return torch.cat([f for f, _ in parts]), torch.cat([g for _, g in parts])

    (features, logits), (data_features, data_logits) = outputs(samples), outputs(reference)
    bar.close()
    splits = min(10, len(features) // 2, len(data_features) // 2)
    score, score_stderr = inception_score(logits, splits)
    data_score, data_score_stderr = inception_score(data_logits, splits)
    return {
        **sample_quality(features, data_features),
        "samples": len(features),
        "reference": len(data_features),
        "inception_score": score,
        "inception_score_stderr": score_stderr,
        "data_inception_score": data_score,
        "data_inception_score_stderr": data_score_stderr,
    }


def _test_log_likelihood(setup: Setup, bars: bool = False) -> dict[str, Any]:
    """Mean log p(x) of the test split with log Z of each of the density's
    :attr:`~JEMTask.components` by tempered SMC over the pixel box, and the NLL
    in bits per dimension: for pixels scaled to [-1, 1] by x = 2 (v - low) / d - 1 in
    the pixels' units (-log p(x) + D log(d / 2), over D log 2; the density at the
    stored values, without dequantisation), else in the model's units. ``bars``
    shows each SMC run's progress."""
    task: JEMTask = setup.task  # type: ignore[assignment]
    test = task.test
    gen = torch.Generator(test.x.device).manual_seed(0)
    components = task.components
    per_class = len(components) > 1  # a class-conditional run: one log Z per class
    estimates = [
        _box_log_z(task, energy, gen, bars and (f"log Z, class {y}" if per_class else "log Z"))
        for y, energy in enumerate(components)
    ]
    ll = mixture_log_likelihood(components, test.x, estimates)
    log_z: Any = [e.log_z for e in estimates]  # one per class for a class-conditional run
    log_z_stderr: Any = [e.stderr for e in estimates]
    if len(estimates) == 1:
        log_z, log_z_stderr = log_z[0], log_z_stderr[0]
    d = test.x.shape[1]
    encoding = test.encoding
    jacobian = d * math.log(encoding.divisor / 2) if encoding.transform == "scaled" else 0.0
    per_bit = d * math.log(2)
    return {
        **ll.to_dict(),
        "log_z": log_z,
        "log_z_stderr": log_z_stderr,
        "bits_per_dim": (jacobian - ll.mean) / per_bit,
        "bits_per_dim_stderr": ll.total_stderr / per_bit,
    }


def _feature_quality(
    model: torch.nn.Module, x: torch.Tensor, train_rows: torch.Tensor, reference: torch.Tensor
) -> dict[str, Any]:
    """FD, KID, precision and recall of ``x`` against ``reference`` in ``model``'s
    penultimate features, beside the same of as many training rows: the floor that
    gives their scale a meaning."""
    reference_features = penultimate_features(model, reference)
    return {
        **sample_quality(penultimate_features(model, x), reference_features),
        "train_test_floor": sample_quality(
            penultimate_features(model, train_rows), reference_features
        ),
    }


def evaluate(
    setup: Setup,
    run: RunDirectory,
    ood_data: str | None = None,
    ood_root: str | None = None,
    long_run_steps: int = 1000,
    samples: int = EVAL_SAMPLES,
    inception: str | None = None,
    inception_samples: int | None = None,
    inception_reference: str = "test",
    inception_preprocessing: str = "tensorflow",
    feature_model: torch.nn.Module | None = None,
    likelihood: bool = False,
    guidance: float = 0.0,
    progress: Callable[[str], None] = quiet,
) -> dict[str, Any]:
    """Accuracy, NLL, ECE with reliability diagram, OOD AUROC, sample quality and stability
    (the samples again after 200 and after ``long_run_steps`` further SGLD steps).

    Args:
        ood_data: one more OOD set: a .npy file of images (N, H, W), or the test split
            (``name:split`` for another) of a folder of data files or of a published
            image set by name, such as ``mnist`` for a Fashion-MNIST model.
        ood_root: the folder of a named ``ood_data`` set's files (default: the
            training data's root, else ``$EBMLAB_DATA`` and the system's data folders).
        samples: model samples for the sample-quality metrics and the stability check,
            against as many test images (at most the test split's, and a replay
            buffer's chains): the Frechet distance's bias and error shrink with more.
        inception: a local Inception-v3 weights file of the FID tools
            (:func:`~ebmlab.evaluation.load_inception`): sample quality in its pool
            features too, the numbers papers report, and the Inception score.
        inception_samples: model samples for those (default: as many as the other
            sample metrics use); papers' FID-50k takes 50 000.
        inception_reference: the split the samples are compared with, ``test`` or
            ``train`` (papers' FID on CIFAR-10: the 50 000 training images).
        inception_preprocessing: ``tensorflow`` (the original FID and IS code's,
            and torch-fidelity's) or ``pytorch-fid`` (see :mod:`ebmlab.evaluation.inception`).
        feature_model: another classifier (say, the cross-entropy twin's): the sample
            quality in its penultimate features too, one feature space for several runs.
        likelihood: the test split's log-likelihood under p(x), with log Z by tempered
            SMC over the pixel box (:func:`log_partition`), and in bits per dimension.
        guidance: class-conditional samples of p(x | y) p(y | x)^w for w = ``guidance``
            (:class:`~ebmlab.energies.ClassConditionalEnergy`): sharper, less diverse.
            They make the class-conditional grid, and the sample-quality metrics' samples
            where those are drawn class by class (``em_conditional``).
        progress: called with each stage's name as it starts (the CLI prints it).
    """
    if long_run_steps <= STABILITY_STEPS:
        raise ArgumentError(f"long_run_steps must be > {STABILITY_STEPS}, got {long_run_steps}")
    check_eval_samples("samples", samples)
    _checks.positive("guidance", guidance, allow_zero=True)
    if ood_root is not None and not ood_data:
        raise ArgumentError("ood_root needs ood_data (a published set's name)")
    task: JEMTask = setup.task  # type: ignore[assignment]
    test = task.test
    ood = ood_sets(task, ood_data, ood_root)  # a bad --ood-data stops here, before any work
    network = _inception_network(
        task, inception, inception_samples, inception_reference, inception_preprocessing
    )
    bars = progress is not quiet  # a bar in the stages that run a sampler long
    progress("classification and calibration of the test split")
    with torch.no_grad():
        logits = in_chunks(task.model.logits, test.x)
    probs = torch.softmax(task.model.beta * logits, 1)
    reliability_diagram(probs, test.y, run.path / "reliability.png")
    acc, acc_stderr = accuracy(probs, test.y, return_stderr=True)
    test_nll, test_nll_stderr = nll(probs, test.y, return_stderr=True)
    ece, ece_stderr = expected_calibration_error(
        probs, test.y, 15, return_stderr=True, generator=2024
    )
    result: dict[str, Any] = {
        "data": task.config.data,
        "guidance": guidance,
        "test_accuracy": acc,
        "test_accuracy_stderr": acc_stderr,
        "test_error": 1 - acc,
        "test_error_stderr": acc_stderr,
        "test_nll": test_nll,
        "test_nll_stderr": test_nll_stderr,
        "ece": ece,
        "ece_stderr": ece_stderr,
        "beta": float(task.model.beta),
        "ece_at_beta_1": expected_calibration_error(torch.softmax(logits, 1), test.y, 15),
    }
    if likelihood:
        progress("test log-likelihood: log Z by tempered SMC over the pixel box")
        result["test_log_likelihood"] = _test_log_likelihood(setup, bars)
    progress("OOD scores: log p(x), max p(y|x), gradient norm")
    in_scores = _ood_scores(task, test.x)
    result["ood_auroc"], result["ood_auroc_stderr"] = {}, {}
    for name, x in ood.items():
        values, stderrs = {}, {}
        for score, s in _ood_scores(task, x).items():
            values[score], stderrs[score] = auroc(in_scores[score], s, return_stderr=True)
        result["ood_auroc"][name], result["ood_auroc_stderr"][name] = values, stderrs
    gen = torch.Generator(test.x.device).manual_seed(2024)
    n = min(len(test), samples)
    if task.samples_from_buffer:
        n = min(n, task.buffer.capacity)
    reference = test.x[:n]
    progress(f"{n} samples of p(x) and their quality")
    x = task.generate(n, gen, progress=bars and "generation", guidance=guidance)
    train_rows = task.train.x[:n].to(reference.device)
    floor, floor_stderr = mmd2(train_rows, reference, return_stderr=True)
    # FD, KID, precision and recall in the classifier's penultimate features, beside the
    # same of as many training images: the floor that gives their scale a meaning
    quality = {
        "count": n,
        "train_test_floor_mmd2": floor,
        "train_test_floor_mmd2_stderr": floor_stderr,
        "after_training_steps": _sample_metrics(task, x, reference),
        "classifier_features": _feature_quality(task.model, x, train_rows, reference),
    }
    if feature_model is not None:
        quality["other_classifier_features"] = _feature_quality(
            feature_model, x, train_rows, reference
        )
    if network is not None:
        split = test if inception_reference == "test" else task.train
        with open(str(inception), "rb") as fh:
            digest = hashlib.file_digest(fh, "sha256").hexdigest()
        quality["inception_features"] = {
            "weights_sha256": digest,
            "preprocessing": inception_preprocessing,
            **_inception_quality(task, network, x, inception_samples or n, split),
        }
    first = STABILITY_STEPS
    progress(f"stability: the samples after {first} and {long_run_steps} more SGLD steps")
    x_first = task.sampler.sample(task.model, x, first, generator=gen, progress=bars)
    quality[f"after_{first}_more_steps"] = _sample_metrics(task, x_first, reference)
    x_long = task.sampler.sample(
        task.model, x_first, long_run_steps - first, generator=gen, progress=bars
    )
    long = quality[f"after_{long_run_steps}_more_steps"] = _sample_metrics(task, x_long, reference)
    if feature_model is not None:  # one feature space for the runs' long-run samples too
        long["other_classifier_features"] = _feature_quality(
            feature_model, x_long, train_rows, reference
        )
    result["samples"] = quality
    task.grid(x[:100], run.path / "samples_unconditional.png", "unconditional samples")
    task.grid(
        x_long[:100],
        run.path / f"samples_after_{long_run_steps}_steps.png",
        f"after {long_run_steps} further steps",
    )
    progress("class-conditional samples")
    classes = min(task.model.num_classes, GRID_CLASSES)
    y = torch.arange(classes, device=test.x.device).repeat_interleave(10)
    starts = x[torch.arange(len(y), device=x.device) % len(x)]  # a test split may be small
    if task.config.em_conditional:
        conditional = task.generate(len(y), gen, labels=y, progress=bars, guidance=guidance)
    else:
        conditional = task.sampler.sample(
            task.model.conditional(y, guidance), starts, 100, generator=gen, progress=bars
        )
    names = task.train.classes or [str(k) for k in range(classes)]
    task.grid(
        conditional,
        run.path / "samples_conditional.png",
        "p(x | y), one row per class",
        row_labels=list(names[:classes]),
    )
    return result


def sample(setup: Setup, run: RunDirectory, n: int, steps: int, out: Path, seed: int = 0) -> Path:
    """``n`` samples after ``steps`` SGLD steps from the run's chains (Energy Matching:
    its generation from noise, then ``steps`` Langevin steps), as a PNG grid."""
    task: JEMTask = setup.task  # type: ignore[assignment]
    gen = torch.Generator(task.test.x.device).manual_seed(seed)
    if task.config.gen_objective == "em":
        x = task.sampler.sample(task.model, task.generate(n, gen), steps, generator=gen)
        title = f"{n} samples: Energy Matching's generation, then {steps} Langevin steps"
    else:
        x = task.negatives(n, gen, steps)
        title = f"{n} samples, {steps} SGLD steps"
    task.grid(x, out, title, ncol=max(1, int(n**0.5)))
    return out


def log_partition(setup: Setup, method: str, seed: int = 0) -> LogZEstimate:
    """log Z of the density's energy (:attr:`JEMTask.density`: E(x) = -logsumexp_y f(x)[y],
    over eps_max for Energy Matching) over the data's pixel box, by
    tempered SMC in logit coordinates (:func:`ebmlab.partition.box_smc`); ``method``
    auto or smc."""
    _checks.one_of("method", method, ("auto", "smc"))
    task: JEMTask = setup.task  # type: ignore[assignment]
    if task.config.em_conditional:
        raise ArgumentError(
            "a class-conditional Energy Matching run's p(x) is the mixture of its classes' "
            "densities, each with its own log Z: `ebmlab evaluate --nll` estimates "
            "them all and the test log-likelihood"
        )
    gen = torch.Generator(task.test.x.device).manual_seed(seed)
    return _box_log_z(task, task.density, gen, progress="log Z by SMC")


def _box_log_z(
    task: JEMTask, energy: EnergyModel, generator: torch.Generator, progress: bool | str = False
) -> LogZEstimate:
    """log Z of ``energy`` over the data's pixel box by tempered SMC
    (:func:`ebmlab.partition.box_smc`), with its bar if ``progress``."""
    lo, hi = task.train.value_range
    shape = tuple(task.train.x.shape[1:])
    return box_smc(energy, lo, hi, shape, generator=generator, progress=progress)


register(
    Recipe[JEMConfig, JEMTask](
        name="jem",
        help="hybrid classifier/generator EBM (JEM) trained with SGLD negatives",
        config_cls=JEMConfig,
        build=build,
        evaluate=evaluate,
        sample=sample,
        log_partition=log_partition,
        trainer_defaults={
            "epochs": 100,
            "batch_size": 64,
            "lr": 3e-3,
            "optimizer": "adamw",
            "weight_decay": 0.05,
            "lr_schedule": "cosine",
            "warmup_steps": 150,
            "monitor": "val_error",
        },
    )
)
