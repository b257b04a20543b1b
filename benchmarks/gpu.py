"""GPU throughput, each row measured side by side in one run on one CUDA GPU.

``python -m benchmarks.gpu [--mnist-root DIR] [--out benchmarks/results/gpu.json]``
writes the rows with the GPU's name (every time is taken between two CUDA
synchronisations). Without CUDA there is nothing to measure and no row.

1. JEM training step (Grathwohl et al. 2019): a WRN-28-10 on 3x32x32 inputs, batch 64,
   20 SGLD steps from a replay buffer, against a plain transcription of the reference
   loop in float32; images/s and SGLD steps/s for ebmlab in float32, bfloat16 and
   bfloat16 with ``torch.compile``.
2. Langevin, 1024 chains x 128 dimensions x 200 steps on an MLP energy, against a
   hand-written loop and torchebm's sampler (when installed).
3. RBM CD-1, 784 x 500, one epoch of mnist10k (batch 128), against learnergy's RBM.
4. AIS log Z of a 784 x 500 RBM, 14,500 temperatures x 100 chains: seconds.
5. Scaling: the JEM step with one and with two processes, where two GPUs exist.
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
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from ebmlab.energies import BernoulliRBM, ClassifierEnergy, MLPEnergy
from ebmlab.learning.rbm import ContrastiveDivergence
from ebmlab.partition import rbm_ais, salakhutdinov_schedule
from ebmlab.samplers import Langevin, ReplayBuffer, uniform_init
from ebmlab.training.trainer import compile_networks

BATCH, SGLD_STEPS, BUFFER = 64, 20, 10_000
SGLD_STEP, SGLD_NOISE = 1.0, 0.01  # the reference loop's sgld_lr and sgld_std


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
    """WRN-depth-width (Zagoruyko & Komodakis 2016) for 3x32x32 inputs, flat or not."""

    def __init__(self, depth: int = 28, width: int = 10, num_classes: int = 10) -> None:
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


def _timed(fn: Callable[[], object], repeats: int = 5) -> float:
    """Median seconds of ``fn`` on the GPU after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def jem_update(logits: torch.Tensor, y: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
    """One step on the JEM loss from the logits of the labelled batch and then of the
    samples: cross-entropy minus (mean log sum exp f on data - on samples)."""
    data, samples = logits[:BATCH].logsumexp(1), logits[BATCH:].logsumexp(1)
    loss = F.cross_entropy(logits[:BATCH], y) - (data.mean() - samples.mean())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def reference_jem_step(device: torch.device) -> Callable[[], None]:
    """The reference JEM update as its authors' script does it: a buffer of uniform
    starts (5% re-initialised), SGLD on log sum_y exp f(x)[y] with autograd, then the
    cross-entropy plus the contrastive term, Adam, all in float32."""
    torch.manual_seed(0)
    net = WideResNet().to(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-4)
    buffer = torch.rand(BUFFER, 3, 32, 32, device=device) * 2 - 1
    x = torch.rand(BATCH, 3, 32, 32, device=device) * 2 - 1
    y = torch.randint(10, (BATCH,), device=device)

    def step() -> None:
        idx = torch.randint(BUFFER, (BATCH,), device=device)
        fresh = (torch.rand(BATCH, device=device) < 0.05).float()[:, None, None, None]
        x_k = fresh * (torch.rand_like(buffer[idx]) * 2 - 1) + (1 - fresh) * buffer[idx]
        net.eval()
        for _ in range(SGLD_STEPS):
            x_k.requires_grad_(True)
            (grad,) = torch.autograd.grad(net(x_k).logsumexp(1).sum(), [x_k])
            x_k = (x_k + SGLD_STEP * grad + SGLD_NOISE * torch.randn_like(x_k)).detach()
        net.train()
        buffer[idx] = x_k
        jem_update(net(torch.cat([x, x_k])), y, optimizer)

    return step


def ebmlab_jem_step(device: torch.device, precision: str, compiled: bool) -> Callable[[], None]:
    """The same update with ebmlab's parts: ClassifierEnergy, ReplayBuffer, Langevin
    (E = -f, so the step on E is the reference's ascent on f)."""
    torch.manual_seed(0)
    model = ClassifierEnergy(WideResNet(), 10).to(device).to(memory_format=torch.channels_last)
    low = precision == "bfloat16"
    model.grad_dtype = torch.bfloat16 if low else None
    if compiled:
        compile_networks(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, fused=True)
    gen = torch.Generator(device).manual_seed(0)
    buffer = ReplayBuffer(BUFFER, uniform_init((3 * 32 * 32,)), 0.05, gen)
    sampler = Langevin(SGLD_STEP, SGLD_NOISE)
    x = torch.rand(BATCH, 3 * 32 * 32, device=device) * 2 - 1
    y = torch.randint(10, (BATCH,), device=device)

    def step() -> None:
        starts, slots = buffer.sample(BATCH, gen)
        x_k = sampler.sample(model, starts, SGLD_STEPS, generator=gen)
        buffer.push(x_k, slots)
        with torch.autocast(device.type, torch.bfloat16, enabled=low):
            logits = model.logits(torch.cat([x, x_k])).float()
        jem_update(logits, y, optimizer)

    return step


def langevin_rows(device: torch.device) -> list[dict]:
    """1024 chains x 128 dimensions x 200 steps on an MLP energy."""
    torch.manual_seed(0)
    model = MLPEnergy(128, hidden=(512, 512)).to(device)
    x0 = torch.randn(1024, 128, device=device)
    gen = torch.Generator(device).manual_seed(0)
    h = 1e-3

    def hand_written() -> None:
        x = x0
        for _ in range(200):
            x = x.detach().requires_grad_(True)
            (g,) = torch.autograd.grad(model.energy(x).sum(), x)
            x = x - h * g + math.sqrt(2 * h) * torch.randn(x.shape, device=device, generator=gen)

    ours = _timed(lambda: Langevin(h).sample(model, x0, 200, generator=gen))
    rows = [_row("Langevin 1024x128x200, MLP 128-512-512-1", "s", ours, "hand-written loop",
                 _timed(hand_written))]  # fmt: skip
    torchebm = _torchebm_langevin(model.energy, x0, h)
    if torchebm is not None:
        rows.append(_row("Langevin 1024x128x200, MLP 128-512-512-1", "s", ours, "torchebm",
                         _timed(torchebm)))  # fmt: skip
    return rows


def _torchebm_langevin(energy, x0: torch.Tensor, h: float) -> Callable[[], object] | None:
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
    sampler = LangevinDynamics(**{target: Wrapped()}, step_size=h, noise_scale=math.sqrt(2 * h))
    return lambda: sampler.sample(x=x0, n_steps=200)


def rbm_rows(device: torch.device, mnist_root: str | None) -> list[dict]:
    """CD-1 784 x 500 over one epoch of mnist10k (batch 128), and AIS with the paper's
    14,500 temperatures."""
    from ebmlab.data import load_dataset

    data = load_dataset("mnist10k", "train", transform="binary", root=mnist_root).x.to(device)
    torch.manual_seed(0)
    rbm = BernoulliRBM(784, 500).to(device)
    cd = ContrastiveDivergence(rbm, 1, persistent=False)
    optimizer = torch.optim.SGD(rbm.parameters(), lr=0.1)
    gen = torch.Generator(device).manual_seed(0)

    def epoch() -> None:
        for batch in data[torch.randperm(len(data), device=device, generator=gen)].split(128):
            cd.accumulate(batch, gen)
            optimizer.step()

    rows = []
    learnergy = _learnergy_epoch(data, device)
    if learnergy is not None:
        rows.append(_row("RBM CD-1 784x500, one epoch of mnist10k", "s", _timed(epoch, 3),
                         "learnergy", _timed(learnergy, 3)))  # fmt: skip
    schedule = salakhutdinov_schedule()
    seconds = _timed(lambda: rbm_ais(rbm, n_chains=100, schedule=schedule, generator=0), 3)
    rows.append(_row("AIS 784x500, 14,500 temperatures x 100 chains", "s", seconds, "", math.nan))
    return rows


def _learnergy_epoch(data: torch.Tensor, device: torch.device) -> Callable[[], None] | None:
    try:
        from learnergy.models.bernoulli import RBM
    except ImportError:
        return None
    model = RBM(n_visible=784, n_hidden=500, steps=1, learning_rate=0.1,
                use_gpu=device.type == "cuda")  # fmt: skip
    dataset = torch.utils.data.TensorDataset(data.cpu(), torch.zeros(len(data)))
    return lambda: model.fit(dataset, batch_size=128, epochs=1)


def jem_rows(device: torch.device) -> list[dict]:
    reference = _timed(reference_jem_step(device), 3)
    rows = []
    for precision, compiled in (("float32", False), ("bfloat16", False), ("bfloat16", True)):
        ours = _timed(ebmlab_jem_step(device, precision, compiled), 3)
        label = precision + (" + compile" if compiled else "")
        rows.append(_row(f"JEM step, WRN-28-10, batch 64, 20 SGLD steps, {label}", "s", ours,
                         "reference loop, float32", reference))  # fmt: skip
        rows[-1]["images_per_s"] = BATCH / ours
        rows[-1]["sgld_steps_per_s"] = SGLD_STEPS / ours
    return rows


def _row(what: str, unit: str, ours: float, anchor: str, theirs: float) -> dict:
    return {"what": what, "unit": unit, "ebmlab": ours, "anchor_name": anchor,
            "anchor": theirs, "ratio": theirs / ours}  # fmt: skip


def scaling_rows() -> list[dict]:
    """The JEM recipe's training throughput with one and with two processes (one GPU
    each), as ``ebmlab train jem --nproc N --device cuda`` runs it."""
    if torch.cuda.device_count() < 2:
        return [{"what": "JEM step scaling, --nproc 2 against 1", "skipped": "one GPU"}]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mnist-root", default=None, help="directory holding the MNIST files")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "gpu.json"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA GPU here: nothing to measure")
        return
    device = torch.device("cuda")
    rows = [*jem_rows(device), *langevin_rows(device), *rbm_rows(device, args.mnist_root)]
    rows += scaling_rows()
    report = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
