"""Recipe ``density``: learn a density from data (CD, PCD, score matching, NCE, energy
discrepancy, diffusion recovery likelihood, or a potential by Energy Matching,
Equilibrium Matching or flow matching): a 2-D toy, or the user's feature vectors.

The energy is an MLP trained by the chosen principle: the CD surrogate (Song & Kingma
2021, §3) with negatives from persistent Langevin chains kept in a replay buffer (PCD,
Tieleman 2008) or from short runs started in noise (CD), exact, sliced or denoising
score matching, NCE, energy discrepancy or recovery likelihood. The transport methods
learn a potential V that carries noise to the data (``em``: Energy Matching, Balcerak et
al. 2025, its OT flow warm-up then the contrastive phase, by default with negatives
drawn from exp(-V / eps_max) by tempered SMC and without the flow term, so that the
phase is maximum likelihood and corrects the modes' weights; ``eqm``: Equilibrium
Matching, Wang & Du 2025; ``fm``: flow matching of -grad V); their density is the
Boltzmann density exp(-V / eps_max), scored like the others. In one or two
dimensions log Z is computed by quadrature, so the run reports an exact test NLL; on a
toy also the true density's (its entropy, the floor no model can beat) and KL(true ||
model) on the grid. In more dimensions log Z comes from tempered SMC (Del Moral, Doucet
& Jasra 2006) with its standard error. Every run reports the kernel MMD^2 between model
samples and test data and the kernel Stein discrepancy of the test data.

A user's data (an ``.npy``/``.npz`` file or a folder of split files, rows of features)
are standardised feature by feature with the training split's mean and standard
deviation, the scale the defaults (step sizes, noise levels) are set for; NLLs are
reported in the data's own units (the standardisation's log-Jacobian added back) and
pictures show the first two features in those units.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from ebmlab import _checks
from ebmlab.data import (
    TOYS,
    VALIDATION_FRACTION,
    check_data,
    check_validation_fraction,
    make_toy,
    run_splits,
)
from ebmlab.devices import widen
from ebmlab.energies import (
    DiagonalGaussian,
    GaussianMixture,
    MLPEnergy,
    NoiseConditionalEnergy,
    TemperedEnergy,
)
from ebmlab.evaluation.likelihood import log_likelihood
from ebmlab.evaluation.metrics import mmd2
from ebmlab.evaluation.progress import quiet
from ebmlab.evaluation.stein import kernel_stein_discrepancy
from ebmlab.losses import (
    contrastive_divergence_loss,
    denoising_score_matching_loss,
    diffusion_recovery_likelihood_loss,
    energy_discrepancy_loss,
    energy_matching_loss,
    equilibrium_matching_loss,
    flow_matching_loss,
    nce_loss,
    score_matching_loss,
    sliced_score_matching_loss,
)
from ebmlab.losses.energy_matching import NEGATIVES, boltzmann_negatives
from ebmlab.losses.flow_matching import potential_velocity
from ebmlab.partition import grid_points, quadrature_log_partition, quadrature_sample, smc
from ebmlab.plotting import density_panels, scatter_panels
from ebmlab.samplers import (
    HMC,
    EnergyMatchingSampler,
    EquilibriumDescent,
    Langevin,
    uniform_init,
)
from ebmlab.samplers.recovery import noise_schedule
from ebmlab.training.recipes import BufferTask, Recipe, Setup, register
from ebmlab.training.run_dir import RunDirectory
from ebmlab.training.trainer import StepResult, TrainerConfig
from ebmlab.transport import odeint

METHODS = ("pcd", "cd", "sm", "ssm", "dsm", "nce", "ed", "drl", "em", "eqm", "fm")
TRANSPORT = ("em", "eqm", "fm")  # the methods that learn a potential V, density exp(-V/eps)
SECOND_ORDER = ("sm", "ssm", "dsm", *TRANSPORT)  # losses that hold input gradients of E
# Trainer settings that differ by method (Recipe.config_defaults). NCE's, one-level
# recovery likelihood's and SMC-negative Energy Matching's gradients are noisy (a fresh
# noise sample, one recovery per data point, a few hundred resampled particles): they
# converge with more epochs and a learning rate that decays to zero.
METHOD_TRAINING: dict[str, dict[str, Any]] = {
    "nce": {"epochs": 200, "lr": 0.01, "lr_schedule": "cosine"},
    "drl": {"epochs": 150, "lr_schedule": "cosine"},
    "em": {"epochs": 160, "lr_schedule": "cosine"},
}
NCE_NOISES = ("gaussian", "kde")
SOURCES = ("gaussian", *TOYS)  # where the transport methods' paths start
SOURCE_POOL = 100_000  # exact draws of a toy source, drawn once per run
LOG_Z_METHODS = ("auto", "quadrature", "smc")
Box = tuple[tuple[float, float], tuple[float, float]]  # a picture's (x range, y range)
QUADRATURE_DIMS = 2  # the most dimensions log Z is integrated on a grid in
MARGIN = 1.0  # standard deviations around a user's standardised data in the sampling box
# SMC for log Z above two features: from N(0, 1.5^2 I), wider than the standardised data,
# with HMC moves of 10 leapfrog steps of 0.1
SMC_BASE_STD, SMC_STEP, SMC_LEAPFROG = 1.5, 0.1, 10


@dataclass
class DensityConfig:
    """Settings of the ``density`` recipe.

    Attributes:
        data: a 2-D toy (8gaussians, 25gaussians, checkerboard, rings, pinwheel), or
            an .npy/.npz file or a folder of split files of feature vectors.
        validation_fraction: share of the training split held out for validation where
            the data have no validation split (0: validate on the test split).
        hidden: width of the energy MLP.
        depth: hidden layers of the energy MLP.
        sampler_steps: Langevin steps per training step (pcd, cd).
        step_size: Langevin step size.
        buffer_size: persistent chains (pcd).
        reinit_prob: share of persistent chains restarted from noise each step (pcd).
        l2: weight of the E^2 penalty on data and samples (pcd, cd).
        quadrature_points: grid points per axis for the exact log Z.
        log_z: how log Z is computed: by quadrature (1 or 2 features), by tempered SMC
            from a Gaussian, or auto (quadrature where it applies).
        method: the training principle: persistent or plain contrastive divergence,
            exact, sliced or denoising score matching, NCE, energy discrepancy or
            diffusion recovery likelihood.
        sigma: noise scale of denoising score matching.
        nce_noise_ratio: noise samples per data point (nce).
        nce_noise: NCE's noise: one Gaussian fitted to the data, or a kernel density
            estimate.
        ed_scale: standard deviation of energy discrepancy's perturbation.
        ed_negatives: contrasting points per data point (ed).
        ed_w: energy discrepancy's stabilising weight w.
        drl_levels: noise levels of diffusion recovery likelihood.
        drl_first: its first (smallest) noise level; they rise geometrically to 0.99.
        drl_steps: Langevin steps of each recovery (drl).
        drl_step_scale: recovery step as a fraction of the conditional variance (drl).
        drl_candidates: importance-resampled starts of each recovery (drl; 1: none),
            which draw a recovery conditional with several modes (wide noise levels,
            with small steps: docs/results/methods.md).
        drl_adjusted: Metropolis-adjusted recovery steps (drl), which refuse the
            steps that would overshoot a sharp well of the energy.
        eps_max: the temperature of the density exp(-V / eps_max) of the transport
            methods' potential V (em, eqm, fm); Energy Matching's Langevin temperature.
        em_warmup: the share of the training steps spent in Energy Matching's flow
            warm-up before its contrastive phase (em).
        tau_star: where the generation temperature starts to rise, in [0, 1) (em).
        flow_steps: generation steps from noise to data (em, eqm, fm), also those of
            Energy Matching's negatives.
        flow_dt: their step size (em, eqm; fm integrates t from 0 to 1).
        em_noise_starts: share of Energy Matching's negatives started at noise (em).
        em_negatives: Energy Matching's negatives: its generation schedule from the data
            and the source (the paper's), or draws of exp(-V / eps_max) by tempered SMC,
            which also correct the modes' weights (em).
        em_flow_weight: the weight of Energy Matching's flow term in its contrastive
            phase (em; the paper's is 1, which holds the Boltzmann density 0.5 nats or
            more from the data's on the toys).
        em_flow_decay: weight Energy Matching's flow term by w(t), falling from 1 at
            tau_star to 0 at the data, in its contrastive phase (em).
        eqm_momentum: Nesterov look-ahead of Equilibrium Matching's descent (eqm).
        source: where the transport methods' paths and generation start: standard
            normal noise, or a 2-D toy (e.g. 8gaussians, to carry eight Gaussians to two
            moons as Balcerak et al. 2025 do).
    """

    CHOICES: ClassVar[dict[str, Sequence[str]]] = {
        "method": METHODS,
        "nce_noise": NCE_NOISES,
        "log_z": LOG_Z_METHODS,
        "source": SOURCES,
        "em_negatives": NEGATIVES,
    }

    data: str = "8gaussians"
    validation_fraction: float = VALIDATION_FRACTION
    hidden: int = 128
    depth: int = 3
    sampler_steps: int = 40
    step_size: float = 0.002
    buffer_size: int = 10_000
    reinit_prob: float = 0.05
    l2: float = 0.001
    quadrature_points: int = 128
    log_z: str = "auto"
    method: str = "pcd"
    sigma: float = 0.1
    nce_noise_ratio: int = 4
    nce_noise: str = "kde"
    ed_scale: float = 1.0
    ed_negatives: int = 16
    ed_w: float = 1.0
    drl_levels: int = 1
    drl_first: float = 0.5
    drl_steps: int = 5
    drl_step_scale: float = 0.01
    drl_candidates: int = 256
    drl_adjusted: bool = True
    eps_max: float = 0.2
    em_warmup: float = 0.3
    tau_star: float = 0.8
    flow_steps: int = 50
    flow_dt: float = 0.02
    em_noise_starts: float = 0.5
    em_negatives: str = "smc"
    em_flow_weight: float = 0.0
    em_flow_decay: bool = True
    eqm_momentum: float = 0.3
    source: str = "gaussian"

    def __post_init__(self) -> None:
        _checks.choices(self)
        self.data = check_data(self.data, TOYS)
        check_validation_fraction(self.validation_fraction)
        _checks.positive("sigma", self.sigma)
        _checks.positive_int("nce_noise_ratio", self.nce_noise_ratio)
        _checks.positive("ed_scale", self.ed_scale)
        _checks.positive_int("ed_negatives", self.ed_negatives)
        _checks.positive("ed_w", self.ed_w, allow_zero=True)
        _checks.positive_int("drl_levels", self.drl_levels)
        if not 0 < self.drl_first < 0.99:
            raise _checks.ArgumentError(f"drl_first must be in (0, 0.99), got {self.drl_first}")
        _checks.positive_int("drl_steps", self.drl_steps)
        _checks.positive("drl_step_scale", self.drl_step_scale)
        _checks.positive_int("drl_candidates", self.drl_candidates)
        _checks.positive_int("hidden", self.hidden)
        _checks.positive_int("depth", self.depth)
        _checks.positive_int("sampler_steps", self.sampler_steps)
        _checks.positive("step_size", self.step_size)
        _checks.positive_int("buffer_size", self.buffer_size)
        _checks.probability("reinit_prob", self.reinit_prob)
        _checks.positive("l2", self.l2, allow_zero=True)
        _checks.positive_int("quadrature_points", self.quadrature_points)
        _checks.positive("eps_max", self.eps_max)
        _checks.probability("em_warmup", self.em_warmup)
        _checks.below_one("tau_star", self.tau_star)
        _checks.positive_int("flow_steps", self.flow_steps)
        _checks.positive("flow_dt", self.flow_dt)
        _checks.probability("em_noise_starts", self.em_noise_starts)
        _checks.positive("em_flow_weight", self.em_flow_weight, allow_zero=True)
        _checks.positive("eqm_momentum", self.eqm_momentum, allow_zero=True)
        if self.source != "gaussian" and self.method not in TRANSPORT:
            raise _checks.ArgumentError(
                f"source {self.source!r} applies to the transport methods {TRANSPORT}, "
                f"not to method {self.method!r}"
            )


KDE_POINTS = 1000
KDE_WIDE_WEIGHT = 0.1


def nce_noise(kind: str, train: torch.Tensor) -> GaussianMixture | DiagonalGaussian:
    """The NCE noise density fitted to the training data.

    ``gaussian``: a diagonal Gaussian twice as wide as the data. ``kde``: a kernel
    density estimate on 1000 training points (Scott's bandwidth, n^(-1/(d+4)) times the
    data's standard deviation) mixed with that wide Gaussian at weight 0.1, so that the
    noise is close to the data (NCE is most efficient when the classification is hard)
    yet still covers the space between the modes.
    """
    mean, std = train.mean(0), train.std(0)
    wide = DiagonalGaussian(mean, 2 * std)
    if kind == "gaussian":
        return wide
    points = train[:KDE_POINTS]
    n, d = points.shape
    bandwidth = std * n ** (-1 / (d + 4))
    means = torch.cat([points, mean[None]])
    covariances = torch.diag_embed(torch.cat([bandwidth.expand(n, d), wide.std[None]]) ** 2)
    weights = torch.cat(
        [torch.full((n,), (1 - KDE_WIDE_WEIGHT) / n), torch.tensor([KDE_WIDE_WEIGHT])]
    )
    return GaussianMixture.normalized(weights, means, covariances)


class DensityTask(BufferTask):
    """A toy density learned by one of several principles, validated by exact NLL.

    ``pcd``: contrastive divergence with persistent Langevin chains (replay buffer);
    ``cd``: short-run Langevin chains from uniform noise every step; ``sm`` / ``ssm`` /
    ``dsm``: exact, sliced or denoising score matching (noise ``sigma``); ``nce``:
    noise-contrastive estimation with a learnable log-normaliser against ``nce_noise``
    (see :func:`nce_noise`); ``ed``: energy discrepancy with Gaussian perturbations of
    standard deviation ``ed_scale`` (large enough for the perturbed points to reach
    across the gaps between the data's modes, or the mass there goes unconstrained),
    ``ed_negatives`` contrasting points and stabiliser ``ed_w``; ``drl``: diffusion
    recovery likelihood over ``drl_levels`` noise levels (a noise-conditional network
    whose level 0 is the density), ``drl_steps`` Langevin steps per recovery. Its
    defaults recover from one wide level (0.5, which reaches across the gaps between
    modes as ``ed_scale`` must), each chain started from the importance-resampled pick
    of 256 draws and moved by 5 Metropolis-adjusted steps; the 8-level schedule of Gao
    et al. (2021) is ``drl_levels=8, drl_first=0.05, drl_steps=30, drl_step_scale=0.1,
    drl_candidates=1, drl_adjusted=False`` (docs/results/methods.md compares them).
    """

    def __init__(self, config: DensityConfig, seed: int) -> None:
        self.config = config
        self.toy = make_toy(config.data) if config.data in TOYS else None
        raw, val, test = (
            split.x
            for split in run_splits(
                config.data,
                transform="raw",
                in_memory=True,
                validation_fraction=config.validation_fraction,
            )
        )
        if self.toy is None:  # standardise the user's features (a toy keeps its units)
            self.shift, self.scale = raw.mean(0), raw.std(0)
            if not bool((self.scale > 0).all()):
                constant = int((self.scale <= 0).nonzero()[0])
                raise _checks.ArgumentError(
                    f"data {config.data!r}: feature {constant} is constant in the training "
                    "split, so it has no density; drop it"
                )
        else:
            self.shift, self.scale = torch.zeros(raw.shape[1]), torch.ones(raw.shape[1])
        self.train = self.standardized(raw)
        self.dim = self.train.shape[1]
        if config.log_z == "quadrature" and self.dim > QUADRATURE_DIMS:
            raise _checks.ArgumentError(
                f"log_z 'quadrature' integrates 1 or 2 features, the data have {self.dim}: use smc"
            )
        if self.toy is not None:
            self.bounds = self.toy.bounds
        else:
            low, high = self.train.min(0).values - MARGIN, self.train.max(0).values + MARGIN
            self.bounds = tuple(zip(low.tolist(), high.tolist(), strict=True))
        torch.manual_seed(seed)
        hidden = (config.hidden,) * config.depth
        if config.method == "drl":
            self.sigmas = noise_schedule(config.drl_levels, config.drl_first)
            self.model = NoiseConditionalEnergy(self.dim, config.drl_levels, hidden=hidden)
        elif config.method in TRANSPORT:  # the density exp(-V / eps_max) of a potential V
            self.model = TemperedEnergy(MLPEnergy(self.dim, hidden=hidden), config.eps_max)
        else:
            self.model = MLPEnergy(self.dim, hidden=hidden)
        init = uniform_init((self.dim,), [b[0] for b in self.bounds], [b[1] for b in self.bounds])
        self.buffer = self._replay_buffer(config.buffer_size, init, config.reinit_prob, seed)
        self.data_extent = max(abs(b) for bounds in self.bounds for b in bounds)
        self.init = init
        self.sampler = Langevin(config.step_size)
        self.val, self.test = self.standardized(val), self.standardized(test)
        if config.source != "gaussian":
            if self.dim != 2:
                raise _checks.ArgumentError(
                    f"source {config.source!r} is a 2-D toy, the data have {self.dim} features"
                )
            gen = torch.Generator().manual_seed(seed)
            self.source_pool = make_toy(config.source).sample(SOURCE_POOL, gen)
        if config.method == "nce":
            self.noise = nce_noise(config.nce_noise, self.train)
            self.model.log_normalizer = nn.Parameter(torch.zeros(()))

    def source(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """``n`` starts of the transport methods' paths: standard normal draws, or
        draws from the run's pool of exact samples of a toy source."""
        device, dtype = generator.device, self.train.dtype
        if self.config.source == "gaussian":
            return torch.randn(n, self.dim, generator=generator, device=device, dtype=dtype)
        self.source_pool = self.source_pool.to(device, dtype)  # moved once
        rows = torch.randint(len(self.source_pool), (n,), generator=generator, device=device)
        return self.source_pool[rows]

    def standardized(self, x: torch.Tensor) -> torch.Tensor:
        """Stored features in the model's units."""
        return (x - self.shift.to(x.device)) / self.scale.to(x.device)

    def in_data_units(self, x: torch.Tensor) -> torch.Tensor:
        """Model-unit points back in the data's units."""
        return x * self.scale.to(x.device) + self.shift.to(x.device)

    @property
    def log_jacobian(self) -> float:
        """sum_i log scale_i: what the standardisation adds to an NLL in data units."""
        return float(self.scale.log().sum())

    @property
    def box(self) -> Box:
        """The sampling box over the first two features, in the data's units (one
        feature: beside [-1, 1])."""
        corners = self.in_data_units(torch.tensor(self.bounds).T)  # (2, D): low, high
        ranges = [(float(corners[0, i]), float(corners[1, i])) for i in range(min(self.dim, 2))]
        return ranges[0], (ranges[1] if self.dim > 1 else (-1.0, 1.0))

    def plane(self, x: torch.Tensor) -> torch.Tensor:
        """The first two features of model-unit points in data units (one feature:
        beside zeros), to draw in :attr:`box`."""
        x = self.in_data_units(x.detach())
        return torch.cat([x, torch.zeros_like(x)], 1) if self.dim == 1 else x[:, :2]

    def training_step(
        self, batch: tuple[torch.Tensor, ...], generator: torch.Generator
    ) -> StepResult:
        (x,) = batch
        c = self.config
        phase = self.em_phase()
        if c.method in TRANSPORT:
            return StepResult(*self._transport_loss(x, phase, generator))
        if c.method == "sm":
            return StepResult(*score_matching_loss(self.model, x))
        if c.method == "ssm":
            return StepResult(*sliced_score_matching_loss(self.model, x, generator=generator))
        if c.method == "dsm":
            return StepResult(
                *denoising_score_matching_loss(self.model, x, c.sigma, generator=generator)
            )
        if c.method == "drl":
            return StepResult(
                *diffusion_recovery_likelihood_loss(
                    self.model,
                    x,
                    self.sigmas,
                    langevin_steps=c.drl_steps,
                    step_scale=c.drl_step_scale,
                    candidates=c.drl_candidates,
                    adjusted=c.drl_adjusted,
                    generator=generator,
                )
            )
        if c.method == "ed":
            return StepResult(
                *energy_discrepancy_loss(
                    self.model,
                    x,
                    scale=c.ed_scale,
                    n_negatives=c.ed_negatives,
                    w=c.ed_w,
                    generator=generator,
                )
            )
        if c.method == "nce":
            noise = self.noise.sample(c.nce_noise_ratio * x.shape[0], generator)
            log_c = self.model.log_normalizer
            return StepResult(*nce_loss(self.model, log_c, x, noise, self.noise.log_prob))
        if c.method == "cd":
            starts = self.init(x.shape[0], generator)
            negatives = self.sampler.sample(
                self.model, starts, c.sampler_steps, generator=generator
            )
        else:
            starts, slots = self.buffer.sample(x.shape[0], generator)
            negatives = self.sampler.sample(
                self.model, starts, c.sampler_steps, generator=generator
            )
            self.buffer.push(negatives, slots)
        return StepResult(*contrastive_divergence_loss(self.model, x, negatives, l2=c.l2))

    def _transport_loss(
        self, x: torch.Tensor, phase: str, generator: torch.Generator
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss of the potential V by the run's transport method (``phase``: Energy
        Matching's)."""
        c, potential = self.config, self.model.potential
        x0 = self.source(len(x), generator)
        if c.method == "fm":
            return flow_matching_loss(potential, x, x0=x0, coupling="ot", potential=True,
                                      generator=generator)  # fmt: skip
        if c.method == "eqm":
            return equilibrium_matching_loss(potential, x, x0=x0, generator=generator)
        return energy_matching_loss(
            potential, x, x0=x0, tau_star=c.tau_star, eps_max=c.eps_max, phase=phase,
            steps=c.flow_steps, dt=c.flow_dt, noise_starts=c.em_noise_starts,
            negatives=c.em_negatives, flow_weight=c.em_flow_weight,
            flow_decay=c.em_flow_decay, generator=generator,
        )  # fmt: skip

    def generate(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """``n`` points generated as the transport method does. Energy Matching trained
        as a density (``em_negatives="smc"``) draws them from exp(-V / eps_max) by the
        tempered SMC of its negatives, from the Gaussian of the training data's moments:
        without the flow term V is no longer a transport potential, and its flow misses
        modes. With the paper's negatives it follows the paper's schedule from the
        source (the flow, then as many Langevin steps at eps_max). Equilibrium Matching
        takes Nesterov descent from the source, flow matching the flow -grad V from t = 0
        to 1."""
        c, potential = self.config, self.model.potential
        if self.generates_by_smc:
            device = generator.device
            rows = torch.randint(len(self.train), (n,), generator=generator, device=device)
            reference = self.train[rows.to(self.train.device)]
            return boltzmann_negatives(potential, reference, eps_max=c.eps_max, generator=generator)
        noise = self.source(n, generator)
        if c.method == "em":
            sampler = EnergyMatchingSampler(c.flow_dt, tau_star=c.tau_star, eps_max=c.eps_max,
                                            flow_steps=c.flow_steps)  # fmt: skip
            return sampler.sample(potential, noise, 2 * c.flow_steps, generator=generator)
        if c.method == "eqm":
            descent = EquilibriumDescent(c.flow_dt, c.eqm_momentum)
            return descent.sample(potential, noise, c.flow_steps, generator=generator)
        return odeint(potential_velocity(potential), noise, method="euler", n_steps=c.flow_steps)

    @property
    def differentiates_twice(self) -> bool:  # type: ignore[override]
        return self.config.method in SECOND_ORDER

    @property
    def generates_by_smc(self) -> bool:
        """Whether :meth:`generate` draws the density by SMC (Energy Matching trained
        as a density) rather than following a transport from the source."""
        return self.config.method == "em" and self.config.em_negatives == "smc"

    @property
    def quadrature(self) -> bool:
        """Whether log Z is a quadrature (else tempered SMC)."""
        return self.config.log_z != "smc" and self.dim <= QUADRATURE_DIMS

    def log_z(
        self,
        n_points: int | None = None,
        generator: torch.Generator | None = None,
        method: str = "auto",
    ):
        """log Z of the model (in its units): by quadrature on the box with ``n_points``
        per axis, or by tempered SMC (Del Moral et al. 2006) from N(0, 1.5^2 I) with HMC
        moves, whose spread over 8 runs gives the standard error; ``method`` auto takes
        the run's ``log_z`` setting."""
        _checks.one_of("method", method, LOG_Z_METHODS)
        if method == "quadrature" and self.dim > QUADRATURE_DIMS:
            raise _checks.ArgumentError(
                f"quadrature integrates 1 or 2 features, the data have {self.dim}: use smc"
            )
        if method == "quadrature" or (method == "auto" and self.quadrature):
            return quadrature_log_partition(
                self.model, self.bounds, n_points or self.config.quadrature_points
            )
        device = self.train.device if generator is None else generator.device
        ones = torch.ones(self.dim, device=device)
        base = DiagonalGaussian(0 * ones, SMC_BASE_STD * ones)
        return smc(self.model, base, HMC(SMC_STEP, SMC_LEAPFROG), generator=generator)

    def nll(self, x: torch.Tensor, log_z: float) -> float:
        with torch.no_grad():
            return float(self.model(x).mean()) + log_z

    def validate(self, generator: torch.Generator) -> dict[str, float]:
        log_z = self.log_z(generator=generator).log_z
        return {"val_nll": self.nll(self.val, log_z) + self.log_jacobian}

    def on_epoch_end(
        self, run: RunDirectory | None, epoch: int, generator: torch.Generator
    ) -> None:
        if run is not None:
            pts = self.plane(self.buffer.buffer[:2000])
            scatter_panels(
                [(f"replay buffer, epoch {epoch}", pts)],
                run.samples / "buffer.png",
                bounds=self.box,
            )


def build(config: DensityConfig, trainer: TrainerConfig) -> Setup:
    task = DensityTask(config, trainer.seed)
    task.plan_warmup(config.em_warmup, trainer, len(task.train))
    return Setup(task, (task.train,))


KSD_SAMPLES = 1000  # test points in the Stein discrepancy (its cost grows as n^2)
GRID = 256  # points per axis of the density pictures and of KL on the grid


def evaluate(
    setup: Setup,
    run: RunDirectory,
    n_samples: int = 5000,
    sample_steps: int = 500,
    progress: Callable[[str], None] = quiet,
) -> dict[str, Any]:
    """Test NLL in the data's units with its standard error (log Z by quadrature or SMC),
    MMD^2 to test data of Langevin samples from the chains (a measure of model and
    sampler together) beside the floor of the validation data, and the kernel Stein
    discrepancy of the test data against the model with its test of fit. Where log Z is
    a quadrature, also MMD^2 of exact model samples drawn on the grid (a measure of the
    model alone); on a toy, also the true density's NLL (the floor) and KL(true ||
    model) on the grid."""
    task: DensityTask = setup.task  # type: ignore[assignment]
    device = task.val.device
    test = task.test
    gen = torch.Generator(device).manual_seed(1234)
    progress("log Z and the test NLL")
    est = task.log_z(512, generator=gen)
    fit = log_likelihood(task.model, test, est)
    result: dict[str, Any] = {
        "data": task.config.data,
        "test_nll": -fit.mean + task.log_jacobian,
        "test_nll_stderr": fit.total_stderr,
        "log_z": est.to_dict(),
    }
    compared, panels = {}, [("test data", test[:n_samples])]
    if task.quadrature:
        exact = quadrature_sample(task.model, task.bounds, n_samples, generator=gen)
        compared["mmd2"] = exact
        panels.append(("exact model samples (grid)", exact))
    progress(f"{n_samples} samples by {sample_steps} Langevin steps")
    starts, _ = task.buffer.sample(n_samples, gen)
    samples = task.sampler.sample(task.model, starts, sample_steps, generator=gen)
    compared.update(mmd2_langevin=samples, mmd2_floor=task.val)
    panels.append((f"model samples ({sample_steps} Langevin steps)", samples))
    if task.config.method in TRANSPORT:
        generated = task.generate(n_samples, gen)
        compared["mmd2_generated"] = generated
        c = task.config
        start = "noise" if c.source == "gaussian" else c.source
        how = "drawn by SMC" if task.generates_by_smc else f"generated from {start}"
        panels.append((f"{how} ({c.method})", generated))
    if task.toy is not None:
        true_nll = float(-task.toy.log_prob(test.cpu()).mean())
        result.update(true_nll=true_nll, nll_gap=result["test_nll"] - true_nll)
    if task.quadrature and task.dim == 2:
        result.update(_densities(task, est.log_z, run))
    for name, x in compared.items():
        result[name], result[f"{name}_stderr"] = mmd2(
            x[:n_samples], test[:n_samples], return_stderr=True
        )
    progress("MMD to the test data and the kernel Stein discrepancy")
    result["ksd"] = kernel_stein_discrepancy(
        test[:KSD_SAMPLES], task.model, generator=gen
    ).to_dict()
    scatter_panels(
        [(title, task.plane(x)) for title, x in panels], run.path / "samples.png", bounds=task.box
    )
    return result


def log_partition(setup: Setup, method: str, seed: int = 0):
    """log Z of the trained energy in the model's units (standardised features): auto
    as the run's ``log_z`` setting (quadrature for 1 or 2 features, else SMC),
    ``quadrature`` or ``smc``."""
    task: DensityTask = setup.task  # type: ignore[assignment]
    gen = torch.Generator(task.val.device).manual_seed(seed)
    return task.log_z(generator=gen, method=method)


def _densities(task: DensityTask, log_z: float, run: RunDirectory) -> dict[str, float]:
    """The model's density on a 256 x 256 grid over the box of two features, beside the
    toy's true density and with KL(true || model) when the data are a toy, drawn in
    ``density.png`` (axes in the data's units)."""
    device = task.val.device
    with torch.no_grad():
        grid, cell = grid_points(task.bounds, GRID)
        points = grid.float().to(device)
        log_p_model = -widen(task.model(points)) - log_z
        panels = [("model density", log_p_model.exp())]
        result = {}
        if task.toy is not None:
            log_p_true = widen(task.toy.log_prob(grid.float()).to(device))
            p_true = log_p_true.exp() * cell
            mask = p_true > 0
            kl = (p_true[mask] * (log_p_true[mask] - log_p_model[mask])).sum()
            result["kl_true_model"] = float(kl)
            panels.insert(0, ("true density", log_p_true.exp()))
    density_panels(
        [(title, p.reshape(GRID, GRID)) for title, p in panels],
        run.path / "density.png",
        bounds=task.box,
    )
    return result


def sample(setup: Setup, run: RunDirectory, n: int, steps: int, out: Path, seed: int = 0) -> Path:
    """A scatter plot of ``n`` model samples after ``steps`` Langevin steps from the
    chains (the first two features, in the data's units)."""
    task: DensityTask = setup.task  # type: ignore[assignment]
    gen = torch.Generator(task.val.device).manual_seed(seed)
    starts, _ = task.buffer.sample(n, gen)
    x = task.sampler.sample(task.model, starts, steps, generator=gen)
    scatter_panels([(f"{n} samples, {steps} Langevin steps", task.plane(x))], out, bounds=task.box)
    return out


register(
    Recipe[DensityConfig, DensityTask](
        name="density",
        help="learn a density (a 2-D toy or your features) by PCD, CD, score matching, NCE, "
        "energy discrepancy, recovery likelihood, Energy or Equilibrium Matching or flow "
        "matching; NLL with log Z by quadrature or SMC",
        config_cls=DensityConfig,
        build=build,
        evaluate=evaluate,
        sample=sample,
        log_partition=log_partition,
        trainer_defaults={"epochs": 60, "batch_size": 256, "lr": 2e-3, "monitor": "val_nll"},
        config_defaults=lambda config: METHOD_TRAINING.get(config.method, {}),
    )
)
