"""GPU throughput, each row measured side by side in one run on one CUDA GPU.

``python -m benchmarks.gpu [--mnist-root DIR] [--out benchmarks/results/gpu.json]``
writes the rows with the GPU's name (every time is taken between two device
synchronisations). Without CUDA there is nothing to measure and no row.
The file is rewritten after each group of rows (``--rows``, all by default), so a run
cut short keeps what it measured; a later run of some groups replaces only their rows
on the same GPU, rows of other GPUs stay, and ``devices`` gives, per GPU, torch's
version, whether every group has been measured (``complete``) and the peak rates its
probes measured. Each row gives its useful FLOPs, achieved rate and fraction of the
probe's peak in its dtype (:mod:`benchmarks.roofline`).
``--smoke`` runs every row at toy sizes on any device (``--device cpu``) and writes
nothing: a check that the benchmark itself runs, not a measurement.

1. JEM training step (Grathwohl et al. 2019): a WRN-28-10 on 3x32x32 inputs, batch 64,
   20 SGLD steps from a replay buffer, against a plain transcription of the reference
   loop in float32; images/s and SGLD steps/s for ebmlab in float32, bfloat16 and
   bfloat16 with ``torch.compile``.
2. Langevin, 1024 chains x 128 dimensions x 200 steps on an MLP energy, its gradients
   in float32 and in bfloat16, against a hand-written loop and torchebm's sampler (when
   installed), both in float32.
3. RBM CD-1, 784 x 500, one epoch of mnist10k (batch 128), against learnergy's RBM.
4. AIS log Z of a 784 x 500 RBM, 14,500 temperatures x 100 chains: seconds.
5. Scaling: the JEM step with one and with two processes, where two GPUs exist.
7. Energy Matching's training step (Balcerak et al. 2025) on 1x28x28 images with the
   U-Net/ViT potential of ``configs/jem_fashion_em_gpu.toml``, batch 128: the OT flow
   warm-up alone and the joint step (with 20-step generation negatives, half started at
   the data), against a plain transcription of the reference loop in float32; ebmlab
   in float32 and in bfloat16 (``torch.compile`` cannot differentiate twice).
6. The CIFAR-10 configuration's full training step (``configs/jem_cifar10.toml``) on
   CIFAR-shaped data memory-mapped from an ``.npz``, read by the trainer's loader with
   no and with several workers, against the same step with the data already in GPU
   memory: images/s, and whether loading keeps up with the GPU; and the step with the
   GPU settings of the images guide (bfloat16, channels-last, ``torch.compile``).

The peers' rows need torchebm 0.8.9 and learnergy 2.0.2, and row 3 the MNIST test
split's files (``--mnist-root``). On a host without internet, fetch the wheels elsewhere
(``pip download --no-deps torchebm==0.8.9 learnergy==2.0.2 -d wheels``), bring them
and the MNIST folder along, and ``pip install --no-deps wheels/*.whl`` there.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from benchmarks.data_loading import write_image_npz
from benchmarks.roofline import count_flops, peak_bandwidth, peak_flops, peak_name, roofline
from ebmlab.data import load_dataset
from ebmlab.energies import BernoulliRBM, ClassifierEnergy, ImageEnergy, MLPEnergy, UNetViT
from ebmlab.energies import WideResNet as EbmlabWideResNet
from ebmlab.learning.rbm import ContrastiveDivergence
from ebmlab.losses import energy_matching_loss
from ebmlab.partition import rbm_ais, salakhutdinov_schedule
from ebmlab.samplers import HMC, MALA, Langevin, ReplayBuffer, uniform_init
from ebmlab.training import Trainer
from ebmlab.training.ema import WeightAverage
from ebmlab.training.recipes import data_splits, get_recipe
from ebmlab.training.trainer import compile_networks

SGLD_STEP, SGLD_NOISE = 1.0, 0.01  # the reference loop's sgld_lr and sgld_std
CONFIGS = Path(__file__).resolve().parents[1] / "configs"
CIFAR_CONFIG = CONFIGS / "jem_cifar10.toml"


@dataclass(frozen=True)
class Sizes:
    """The problem sizes of every row: the issue's by default, toys for ``--smoke``."""

    depth: int = 28
    widen: int = 10
    batch: int = 64
    sgld_steps: int = 20
    buffer: int = 10_000
    chains: int = 1024
    dim: int = 128
    langevin_steps: int = 200
    hidden: int = 512
    rbm_hidden: int = 500
    rbm_rows: int = 0  # 0: mnist10k's training split; else that many random binary rows
    ais_temperatures: int = 0  # 0: Salakhutdinov & Murray's 14,500
    ais_chains: int = 100
    images: int = 5_000
    loader_steps: int = 20
    fashion_steps: int = 100
    workers: int = 4
    repeats: int = 3
    compile: bool = True
    em_width: int = 128
    em_embed: int = 256
    em_batch: int = 128
    em_steps: int = 20


SMOKE = Sizes(depth=10, widen=1, batch=4, sgld_steps=2, buffer=32, chains=16, dim=8,
              langevin_steps=5, hidden=16, rbm_hidden=8, rbm_rows=64, ais_temperatures=20,
              ais_chains=4, images=48, loader_steps=2, fashion_steps=2, workers=1, repeats=1,
              compile=False, em_width=8, em_embed=16, em_batch=4, em_steps=2)  # fmt: skip
EM_EPS, EM_TAU, EM_DT, EM_TRIM, EM_CLAMP = 0.01, 0.9, 0.01, 0.1, 0.02  # the paper's CIFAR-10


class WideBlock(nn.Module):
    """A pre-activation residual block of a wide ResNet, without normalisation, as JEM
    trains it (batch norm spoils SGLD), with leaky ReLUs."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1)
        self.skip = nn.Conv2d(cin, cout, 1, stride) if stride != 1 or cin != cout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.leaky_relu(x, 0.2))
        h = self.conv2(F.leaky_relu(h, 0.2))
        return h + (x if self.skip is None else self.skip(x))


class WideResNet(nn.Module):
    """The reference's WRN-depth-width (Zagoruyko & Komodakis 2016) for 3x32x32 inputs."""

    def __init__(self, depth: int, width: int, num_classes: int = 10) -> None:
        super().__init__()
        n = (depth - 4) // 6
        widths = [16, 16 * width, 32 * width, 64 * width]
        layers: list[nn.Module] = [nn.Conv2d(3, widths[0], 3, 1, 1)]
        for stage in range(3):
            for i in range(n):
                cin = widths[stage] if i == 0 else widths[stage + 1]
                layers.append(WideBlock(cin, widths[stage + 1], 2 if i == 0 and stage else 1))
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(widths[3], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.leaky_relu(self.body(x.view(-1, 3, 32, 32)), 0.2)
        return self.head(F.adaptive_avg_pool2d(h, 1).flatten(1))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median seconds of ``fn`` on ``device`` after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def _row(what: str, unit: str, ours: float, anchor: str, theirs: float) -> dict:
    return {"what": what, "unit": unit, "ebmlab": ours, "anchor_name": anchor,
            "anchor": theirs, "ratio": theirs / ours}  # fmt: skip


def jem_update(logits: torch.Tensor, y: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
    """One step on the JEM loss from the logits of the labelled batch and then of the
    samples: cross-entropy minus (mean log sum exp f on data - on samples)."""
    batch = len(y)
    data, samples = logits[:batch].logsumexp(1), logits[batch:].logsumexp(1)
    loss = F.cross_entropy(logits[:batch], y) - (data.mean() - samples.mean())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def reference_jem_step(device: torch.device, s: Sizes) -> Callable[[], None]:
    """The reference JEM update as its authors' script does it: a buffer of uniform
    starts (5% re-initialised), SGLD on log sum_y exp f(x)[y] with autograd, then the
    cross-entropy plus the contrastive term, Adam, all in float32. One labelled batch
    serves both terms here and in ebmlab's step (the script draws a second, unlabelled
    batch for the contrastive term: one more forward pass of 64 images)."""
    torch.manual_seed(0)
    net = WideResNet(s.depth, s.widen).to(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-4)
    buffer = torch.rand(s.buffer, 3, 32, 32, device=device) * 2 - 1
    x = torch.rand(s.batch, 3, 32, 32, device=device) * 2 - 1
    y = torch.randint(10, (s.batch,), device=device)

    def step() -> None:
        idx = torch.randint(s.buffer, (s.batch,), device=device)
        fresh = (torch.rand(s.batch, device=device) < 0.05).float()[:, None, None, None]
        x_k = fresh * (torch.rand_like(buffer[idx]) * 2 - 1) + (1 - fresh) * buffer[idx]
        net.eval()
        for _ in range(s.sgld_steps):
            x_k.requires_grad_(True)
            (grad,) = torch.autograd.grad(net(x_k).logsumexp(1).sum(), [x_k])
            x_k = (x_k + SGLD_STEP * grad + SGLD_NOISE * torch.randn_like(x_k)).detach()
        net.train()
        buffer[idx] = x_k
        jem_update(net(torch.cat([x, x_k])), y, optimizer)

    return step


def ebmlab_jem_step(
    device: torch.device, s: Sizes, precision: str, compiled: bool
) -> Callable[[], None]:
    """The same update with ebmlab's parts, as ``--arch wrn`` builds them: its
    WideResNet (no normalisation, leaky ReLU) in a ClassifierEnergy, ReplayBuffer and
    Langevin (E = -f, so the step on E is the reference's ascent on f), whose 20 steps
    replay the network's gradient from the CUDA graphs the model keeps across steps."""
    torch.manual_seed(0)
    net = EbmlabWideResNet((3, 32, 32), 10, s.depth, s.widen, activation="leaky_relu")
    model = ClassifierEnergy(net, 10).to(device).to(memory_format=torch.channels_last)
    low = precision == "bfloat16"
    model.grad_dtype = torch.bfloat16 if low else None
    if compiled:
        compile_networks(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    gen = torch.Generator(device).manual_seed(0)
    buffer = ReplayBuffer(s.buffer, uniform_init((3 * 32 * 32,)), 0.05, gen)
    sampler = Langevin(SGLD_STEP, SGLD_NOISE)
    x = torch.rand(s.batch, 3 * 32 * 32, device=device) * 2 - 1
    y = torch.randint(10, (s.batch,), device=device)

    def step() -> None:
        starts, slots = buffer.sample(s.batch, gen)
        x_k = sampler.sample(model, starts, s.sgld_steps, generator=gen)
        buffer.push(x_k, slots)
        with torch.autocast(device.type, torch.bfloat16, enabled=low):
            logits = model.logits(torch.cat([x, x_k])).float()
        jem_update(logits, y, optimizer)

    return step


def jem_rows(device: torch.device, s: Sizes) -> list[dict]:
    what = f"JEM step, WRN-{s.depth}-{s.widen}, batch {s.batch}, {s.sgld_steps} SGLD steps"
    reference_step = reference_jem_step(device, s)
    flops = count_flops(reference_step)  # the same products in every variant
    reference = _timed(reference_step, device, s.repeats)
    variants = [("float32", False), ("bfloat16", False)] + [("bfloat16", True)] * s.compile
    rows = []
    for precision, compiled in variants:
        ours = _timed(ebmlab_jem_step(device, s, precision, compiled), device, s.repeats)
        label = precision + (" + compile" if compiled else "")
        rows.append(_row(f"{what}, {label}", "s", ours, "reference loop, float32", reference))
        rows[-1]["images_per_s"] = s.batch / ours
        rows[-1]["sgld_steps_per_s"] = s.sgld_steps / ours
        rows[-1].update(roofline(flops, ours, device, getattr(torch, precision),
                                 tf32=torch.backends.cudnn.allow_tf32))  # fmt: skip
    return rows


def langevin_rows(device: torch.device, s: Sizes) -> list[dict]:
    """``chains`` x ``dim`` x ``langevin_steps`` on an MLP energy: ebmlab with its steps
    replayed as CUDA graphs (the default) and run eagerly, against a hand-written loop
    and torchebm's sampler; then MALA and HMC, replayed against eager."""
    torch.manual_seed(0)
    model = MLPEnergy(s.dim, hidden=(s.hidden, s.hidden)).to(device)
    x0 = torch.randn(s.chains, s.dim, device=device)
    gen = torch.Generator(device).manual_seed(0)
    h = 1e-3

    def hand_written() -> None:
        x = x0
        for _ in range(s.langevin_steps):
            x = x.detach().requires_grad_(True)
            (g,) = torch.autograd.grad(model.energy(x).sum(), x)
            x = x - h * g + math.sqrt(2 * h) * torch.randn(x.shape, device=device, generator=gen)

    def ours(sampler=None, graphs: bool = True) -> Callable[[], object]:
        sampler = sampler or Langevin(h)
        return lambda: sampler.sample(model, x0, s.langevin_steps, generator=gen, graphs=graphs)

    what = (f"Langevin {s.chains}x{s.dim}x{s.langevin_steps}, "
            f"MLP {s.dim}-{s.hidden}-{s.hidden}-1")  # fmt: skip
    flops = count_flops(ours(graphs=False))
    timed = {}
    for graphs in (True, False):
        timed["float32", graphs] = _timed(ours(graphs=graphs), device, s.repeats)
        model.grad_dtype = torch.bfloat16
        timed["bfloat16", graphs] = _timed(ours(graphs=graphs), device, s.repeats)
        model.grad_dtype = None
    hand = _timed(hand_written, device, s.repeats)
    anchors = [("hand-written loop", hand)]
    torchebm = _torchebm_langevin(model.energy, x0, h, s.langevin_steps)
    if torchebm is not None:
        anchors.append(("torchebm", _timed(torchebm, device, s.repeats)))
    rows = []
    for (precision, graphs), seconds in timed.items():
        label = what + (", gradients in bfloat16" if precision == "bfloat16" else "")
        label += ", CUDA graphs" if graphs else ", eager"
        dtype = getattr(torch, precision)
        for name, theirs in anchors:
            rows.append(_row(label, "s", seconds, name, theirs))
            rows[-1].update(roofline(flops, seconds, device, dtype))
    for name, sampler in (("MALA", MALA(h)), ("HMC, 5 leapfrog steps", HMC(h, 5))):
        replayed = _timed(ours(sampler), device, s.repeats)
        eager = _timed(ours(sampler, graphs=False), device, s.repeats)
        label = what.replace("Langevin", name)
        rows.append(_row(f"{label}, CUDA graphs", "s", replayed, "the same steps, eager", eager))
        rows[-1].update(roofline(count_flops(ours(sampler, False)), replayed, device,
                                 torch.float32))  # fmt: skip
    return rows


def _torchebm_langevin(
    energy, x0: torch.Tensor, h: float, steps: int
) -> Callable[[], object] | None:
    """torchebm's Langevin sampler on the same energy, whichever of its releases'
    constructor spellings is installed; None without torchebm."""
    try:
        from torchebm.core import BaseModel
        from torchebm.samplers import LangevinDynamics
    except ImportError:
        return None

    class Wrapped(BaseModel):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return energy(x)

    names = inspect.signature(LangevinDynamics).parameters
    target = "model" if "model" in names else "energy_function"
    sampler = LangevinDynamics(**{target: Wrapped(device=x0.device)}, step_size=h,
                               noise_scale=math.sqrt(2 * h), device=x0.device)  # fmt: skip
    return lambda: sampler.sample(x=x0, n_steps=steps)


def rbm_rows(device: torch.device, s: Sizes, mnist: torch.Tensor | None) -> list[dict]:
    """CD-1 over one epoch of ``mnist`` (mnist10k's binarised training rows; random bits
    at toy sizes), and AIS with the paper's 14,500 temperatures."""
    if mnist is None:
        data = (torch.rand(s.rbm_rows, 784, device=device) < 0.5).float()
    else:
        data = mnist.to(device)
    torch.manual_seed(0)
    rbm = BernoulliRBM(784, s.rbm_hidden).to(device)
    cd = ContrastiveDivergence(rbm, 1, persistent=False)
    optimizer = torch.optim.SGD(rbm.parameters(), lr=0.1)
    gen = torch.Generator(device).manual_seed(0)

    def epoch() -> None:
        for batch in data[torch.randperm(len(data), device=device, generator=gen)].split(128):
            cd.accumulate(batch, gen)
            optimizer.step()

    rows = []
    learnergy = _learnergy_epoch(data, device, s.rbm_hidden)
    if learnergy is not None:
        seconds = _timed(epoch, device, s.repeats)
        rows.append(_row(f"RBM CD-1 784x{s.rbm_hidden}, one epoch of {len(data)} rows", "s",
                         seconds, "learnergy", _timed(learnergy, device, s.repeats)))  # fmt: skip
        rows[-1].update(roofline(count_flops(epoch), seconds, device, torch.float32))
    schedule = salakhutdinov_schedule() if not s.ais_temperatures else None
    n_temperatures = len(schedule) if schedule is not None else s.ais_temperatures
    seconds = _timed(
        lambda: rbm_ais(rbm, n_chains=s.ais_chains, n_temperatures=s.ais_temperatures or None,
                        schedule=schedule, generator=0),
        device, s.repeats,
    )  # fmt: skip
    what = f"AIS 784x{s.rbm_hidden}, {n_temperatures:,} temperatures x {s.ais_chains} chains"
    rows.append(_row(what, "s", seconds, "", math.nan))
    # per temperature two products of the chains with W (v W and h W^T), replayed as
    # CUDA graphs, which a FLOP counter does not see
    flops = 2 * 2 * s.ais_chains * 784 * s.rbm_hidden * n_temperatures
    rows[-1].update(roofline(flops, seconds, device, torch.float32))
    return rows


def _learnergy_epoch(
    data: torch.Tensor, device: torch.device, hidden: int
) -> Callable[[], None] | None:
    try:
        from learnergy.models.bernoulli import RBM
    except ImportError:
        return None
    model = RBM(n_visible=784, n_hidden=hidden, steps=1, learning_rate=0.1,
                use_gpu=device.type == "cuda")  # fmt: skip
    dataset = torch.utils.data.TensorDataset(data.cpu(), torch.zeros(len(data)))
    return lambda: model.fit(dataset, batch_size=128, epochs=1)


# the GPU settings the images guide adds to the CIFAR-10 configuration's command line
FAST = {"train_dtype": "bfloat16", "sampler_dtype": "bfloat16", "channels_last": True}


def _config_trainer(config: Path, settings: dict, in_memory: bool) -> Trainer:
    """The JEM trainer of the configuration file ``config`` with ``settings`` on top,
    its data in memory or read by the trainer's loader."""
    merged = {**tomllib.loads(config.read_text()), "progress": False, **settings}
    recipe = get_recipe("jem")
    jem_config, trainer_config = recipe.configs(merged)
    setup = recipe.build(jem_config, trainer_config)
    train = setup.task.train if in_memory else data_splits(jem_config, in_memory=False)[0]
    return Trainer(setup.task, (train.x, train.y), trainer_config)


def _cifar_trainer(folder: Path, device: torch.device, s: Sizes, in_memory: bool,
                   workers: int, fast: bool = False) -> Trainer:  # fmt: skip
    """The CIFAR-10 configuration's task and trainer on the data in ``folder``, with
    the guide's GPU settings (and ``torch.compile`` where the sizes ask for it) if
    ``fast``."""
    settings = dict(data=str(folder), wrn_depth=s.depth, wrn_widen=s.widen,
                    batch_size=s.batch, buffer_size=s.buffer, device=str(device),
                    num_workers=workers)  # fmt: skip
    if fast:
        settings.update(FAST, compile=s.compile)
    return _config_trainer(CIFAR_CONFIG, settings, in_memory)


def _steps_per_s(trainer: Trainer, device: torch.device, steps: int) -> float:
    """Full training steps (loading, sampling, update) per second, after two warm-up
    steps, over ``steps`` consecutive batches of one epoch."""
    data = trainer._epoch_data(trainer._batches(0))
    for _ in range(2):
        trainer._train_step(*next(data))
    _sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        trainer._train_step(*next(data))
    _sync(device)
    return steps / (time.perf_counter() - start)


def loader_rows(device: torch.device, s: Sizes) -> list[dict]:
    """The CIFAR-10 configuration's step with data memory-mapped from disk, read with
    no and with ``workers`` loader processes, against the data in device memory."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_image_npz(Path(tmp), s.images, (3, 32, 32))
        resident = _steps_per_s(_cifar_trainer(folder, device, s, True, 0), device,
                                s.loader_steps)  # fmt: skip
        rows = []
        for workers in (0, s.workers):
            disk = _steps_per_s(_cifar_trainer(folder, device, s, False, workers), device,
                                s.loader_steps)  # fmt: skip
            rows.append(_row(
                f"jem_cifar10.toml step (WRN-{s.depth}-{s.widen}), data memory-mapped, "
                f"{workers} loader workers", "s", 1 / disk, "data in device memory",
                1 / resident))  # fmt: skip
            rows[-1]["images_per_s"] = s.batch * disk
            rows[-1]["anchor_images_per_s"] = s.batch * resident
        fast = _steps_per_s(_cifar_trainer(folder, device, s, False, s.workers, True), device,
                            s.loader_steps)  # fmt: skip
        label = "bfloat16, channels-last" + (", compile" if s.compile else "")
        rows.append(_row(
            f"jem_cifar10.toml step (WRN-{s.depth}-{s.widen}), {label}, data memory-mapped, "
            f"{s.workers} loader workers", "s", 1 / fast, "float32, data in device memory",
            1 / resident))  # fmt: skip
        rows[-1]["images_per_s"] = s.batch * fast
    return rows


def fashion_rows(device: torch.device, s: Sizes, root: str | None) -> list[dict]:
    """The full training step of each Fashion-MNIST configuration, its data in device
    memory: seconds per step and images per second after two warm-up steps
    (``torch.compile``'s included)."""
    settings = {"device": str(device), "data_root": root or "", "num_workers": 0}
    if s.rbm_rows:  # toy sizes: random images of the shape, the networks scaled down
        settings.update(data=str(_toy_images(s)), wrn_depth=s.depth, wrn_widen=s.widen,
                        buffer_size=s.buffer, batch_size=s.batch, compile=False)  # fmt: skip
    rows = []
    for name in ("jem_fashion_gpu", "jem_fashion_cpu"):
        trainer = _config_trainer(CONFIGS / f"{name}.toml", settings, in_memory=True)
        steps_per_s = _steps_per_s(trainer, device, s.fashion_steps)
        rows.append(_row(f"Fashion-MNIST, {name}.toml full step", "s", 1 / steps_per_s, "",
                         math.nan))  # fmt: skip
        rows[-1]["images_per_s"] = steps_per_s * trainer.config.batch_size
    return rows


def _em_network(device: torch.device, s: Sizes) -> nn.Module:
    """The GPU configuration's potential (U-Net with a patch-transformer head), seeded."""
    torch.manual_seed(0)
    net = UNetViT((1, 28, 28), 1, s.em_width, (1, 2, 2), 2, 4, s.em_embed, 4, 2)
    return net.to(device)


def reference_em_step(device: torch.device, s: Sizes, joint: bool) -> Callable[[], None]:
    """The reference loop's update, transcribed: standard normal noise paired with the
    images by an exact OT assignment on the host, the linear path at uniform times,
    -grad V by autograd with the graph kept, the flow MSE (weighted by the time cutoff
    in the joint phase); in the joint phase V(data) minus the trimmed mean V of
    negatives from a time sweep of Langevin steps (half started at the data, at
    t = 1), scaled and clamped; Adam, gradient clipping at 1 and an EMA, in float32."""
    from scipy.optimize import linear_sum_assignment

    net = _em_network(device, s)
    optimizer = torch.optim.Adam(net.parameters(), lr=8e-4, betas=(0.9, 0.95))
    ema = [p.detach().clone() for p in net.parameters()]
    x = torch.rand(s.em_batch, 1, 28, 28, device=device) * 2 - 1
    half = s.em_batch // 2

    def potential(z: torch.Tensor) -> torch.Tensor:
        return net(z)[:, 0]

    def grad_v(z: torch.Tensor, keep: bool) -> torch.Tensor:
        z = z if z.requires_grad else z.detach().requires_grad_(True)
        return torch.autograd.grad(potential(z).sum(), z, create_graph=keep)[0]

    def step() -> None:
        x0 = torch.randn_like(x)
        cost = torch.cdist(x0.flatten(1), x.flatten(1)).square().cpu().numpy()
        rows, cols = linear_sum_assignment(cost)
        x0 = x0[torch.as_tensor(rows[cols.argsort()], device=device)]
        t = torch.rand(s.em_batch, 1, 1, 1, device=device)
        xt = ((1 - t) * x0 + t * x).requires_grad_(True)
        weight = ((1 - t) / (1 - EM_TAU)).clamp(max=1).flatten() if joint else 1.0
        loss = (weight * (-grad_v(xt, True) - (x - x0)).square().mean((1, 2, 3))).mean()
        if joint:
            z = torch.cat([x[:half], torch.randn_like(x[half:])])
            time = torch.cat([torch.ones(half, device=device),
                              torch.zeros(s.em_batch - half, device=device)])  # fmt: skip
            for _ in range(s.em_steps):
                eps = EM_EPS * ((time - EM_TAU) / (1 - EM_TAU)).clamp(0, 1)
                noise = (2 * eps * EM_DT).sqrt()[:, None, None, None] * torch.randn_like(z)
                z = (z - EM_DT * grad_v(z, False) + noise).detach()
                time = time + EM_DT
            negative = potential(z).sort().values[: s.em_batch - int(EM_TRIM * s.em_batch)]
            loss = loss + (potential(x).mean() - negative.mean()).clamp(min=-EM_CLAMP)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        optimizer.step()
        with torch.no_grad():
            torch._foreach_lerp_(ema, list(net.parameters()), 1e-4)

    return step


def ebmlab_em_step(
    device: torch.device, s: Sizes, joint: bool, precision: str
) -> Callable[[], None]:
    """The same update with ebmlab's parts: :func:`~ebmlab.losses.energy_matching_loss`
    on the same network (in the configuration's NCHW layout: GroupNorm has no
    channels-last CUDA kernel, so that layout costs a copy per normalisation; under
    autocast in bfloat16), the fused Adam, the trainer's
    clipping and :class:`~ebmlab.training.ema.WeightAverage`."""
    model = ImageEnergy(_em_network(device, s))
    optimizer = torch.optim.Adam(
        model.parameters(), lr=8e-4, betas=(0.9, 0.95), fused=device.type == "cuda"
    )
    ema = WeightAverage(model, 0.9999)
    gen = torch.Generator(device).manual_seed(0)
    x = torch.rand(s.em_batch, 1, 28, 28, device=device) * 2 - 1
    low = precision == "bfloat16"

    def step() -> None:
        with torch.autocast(device.type, torch.bfloat16, enabled=low):
            loss, _ = energy_matching_loss(
                model, x, tau_star=EM_TAU, eps_max=EM_EPS, phase="joint" if joint else "flow",
                steps=s.em_steps, dt=EM_DT, trim=EM_TRIM, clamp=EM_CLAMP, generator=gen,
            )  # fmt: skip
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        ema.update()

    return step


def em_rows(device: torch.device, s: Sizes) -> list[dict]:
    rows = []
    for joint in (False, True):
        phase = f"joint, {s.em_steps} negative steps" if joint else "flow warm-up"
        what = f"Energy Matching step, U-Net/ViT width {s.em_width}, batch {s.em_batch}, {phase}"
        reference_step = reference_em_step(device, s, joint)
        flops = count_flops(reference_step)
        reference = _timed(reference_step, device, s.repeats)
        for precision in ("float32", "bfloat16"):
            ours = _timed(ebmlab_em_step(device, s, joint, precision), device, s.repeats)
            rows.append(_row(f"{what}, {precision}", "s", ours, "reference loop, float32",
                             reference))  # fmt: skip
            rows[-1]["images_per_s"] = s.em_batch / ours
            rows[-1].update(roofline(flops, ours, device, getattr(torch, precision),
                                     tf32=torch.backends.cudnn.allow_tf32))  # fmt: skip
    return rows


def _toy_images(s: Sizes) -> Path:
    """A folder of random 1x28x28 images with ten labels, for the smoke run."""
    folder = Path(tempfile.mkdtemp())
    return write_image_npz(folder, s.images, (1, 28, 28))


def scaling_rows() -> list[dict]:
    """The JEM recipe's training throughput with one and with two processes (one GPU
    each), as ``ebmlab train jem --nproc N --device cuda`` runs it."""
    if torch.cuda.device_count() < 2:
        return [{"what": "JEM step scaling, --nproc 2 against 1", "skipped": "fewer than 2 GPUs"}]
    steps, seconds = 200, {}
    with tempfile.TemporaryDirectory() as tmp:
        for nproc in (1, 2):
            start = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "ebmlab", "train", "jem", "--out", f"{tmp}/{nproc}",
                 "--nproc", str(nproc), "--device", "cuda", "--epochs", "100",
                 "--max-steps", str(steps), "--no-progress"],
                check=True, capture_output=True,
            )  # fmt: skip
            seconds[nproc] = time.perf_counter() - start
    row = _row("JEM recipe, 200 steps, --nproc 2 against 1", "s", seconds[2], "--nproc 1",
               seconds[1])  # fmt: skip
    return [row]


GROUPS = ("jem", "langevin", "rbm", "loader", "fashion", "em", "scaling")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mnist-root", default=None, help="directory holding the MNIST files")
    parser.add_argument("--fashion-root", default=None,
                        help="directory holding the Fashion-MNIST files")  # fmt: skip
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "gpu.json"))
    parser.add_argument("--device", default="cuda", help="the device (cuda unless --smoke)")
    parser.add_argument(
        "--rows",
        default=",".join(GROUPS),
        help=f"comma-separated groups of rows to measure, of {', '.join(GROUPS)}",
    )
    parser.add_argument("--smoke", action="store_true",
                        help="every row at toy sizes, printed and not written")  # fmt: skip
    args = parser.parse_args(argv)
    groups = args.rows.split(",")
    if unknown := sorted(set(groups) - set(GROUPS)):
        parser.error(f"--rows: unknown group {unknown[0]!r}; expected some of {', '.join(GROUPS)}")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU here: nothing to measure")
        return
    if device.type != "cuda" and not args.smoke:
        parser.error("measurements are taken on CUDA only; use --smoke to check another device")
    sizes = SMOKE if args.smoke else Sizes()
    # read first, so that missing MNIST files stop the run before any row is measured
    mnist = None if sizes.rbm_rows or "rbm" not in groups else load_dataset(
        "mnist10k", "train", transform="binary", root=args.mnist_root).x  # fmt: skip
    measure = {"jem": lambda: jem_rows(device, sizes),
               "langevin": lambda: langevin_rows(device, sizes),
               "rbm": lambda: rbm_rows(device, sizes, mnist),
               "loader": lambda: loader_rows(device, sizes),
               "fashion": lambda: fashion_rows(device, sizes, args.fashion_root),
               "em": lambda: em_rows(device, sizes),
               "scaling": lambda: scaling_rows() if not args.smoke else []}  # fmt: skip
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    out = Path(args.out)
    report = json.loads(out.read_text()) if out.is_file() and not args.smoke else {}
    # rows of other GPUs stay; this GPU's rows of the groups measured now are replaced
    kept = [row for row in report.get("rows", [])
            if row.get("gpu") != gpu or row.get("group") not in groups]  # fmt: skip
    devices = report.get("devices", {})
    if not args.smoke:
        devices[gpu] = {"torch": torch.__version__, **device_peaks(device)}
    for group in groups:
        rows = [{"group": group, "gpu": gpu, **row} for row in measure[group]()]
        for row in rows:
            print(json.dumps(row), flush=True)
        kept += rows
        if not args.smoke:  # after every group, so that a run cut short keeps its rows
            measured = {row["group"] for row in kept if row.get("gpu") == gpu}
            devices[gpu]["complete"] = measured == set(GROUPS)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps({"devices": devices, "rows": kept}, indent=2) + "\n")


def device_peaks(device: torch.device) -> dict:
    """The probes' rates on ``device``, against which rows give their fraction."""
    return {
        "float32_tflop_per_s": peak_flops(device, torch.float32) / 1e12,
        "tf32_tflop_per_s": peak_flops(device, torch.float32, True) / 1e12,
        "bfloat16_tflop_per_s": peak_flops(device, torch.bfloat16) / 1e12,
        "copy_tb_per_s": peak_bandwidth(device) / 1e12,
        "probes": f"{peak_name(device, torch.float32)}, {peak_name(device, torch.float32, True)}, "
        f"{peak_name(device, torch.bfloat16)}, "
        "1 GiB device-to-device copy (bytes read and written)",
    }


if __name__ == "__main__":
    main()
