"""Energy Matching and flow matching on the 2-D toys against torchebm's, scored by
exact likelihoods.

``python -m benchmarks.energy_matching [--method em|fm] [--toys 8gaussians,moons]
[--out energy_matching.json]`` trains, on each toy, the same network (MLP 128-128-128)
with the same data, batches of 256 and Adam at 2e-3, for the same time. With ``--method
em`` (the default) the first 30 % of it is the OT flow warm-up:

- **ebmlab**: ``ebmlab train density --method em`` with the recipe's defaults, then
  ``ebmlab evaluate``; its training time is the budget;
- **torchebm 0.8.9** ``EnergyMatchingLoss`` with its defaults (``lambda_cd`` 0 in the
  warm-up, then 2; ``epsilon_max`` 0.15; 200 Langevin steps of 0.01 per negative, half
  from the source; the clamp and the trimmed mean), as many steps as fit in the budget,
  then its generation sweep as its docstring gives it.

With ``--method fm`` both libraries regress OT-coupled flow-matching velocities (Lipman
et al. 2023, eq. 23; Tong et al. 2024): ebmlab's ``--method fm`` with -grad V of a
potential, torchebm's ``FlowMatchingLoss`` (its defaults, with the OT coupling) once on
the same -grad V and once on its usual time-conditioned velocity network v(x, t) (an MLP
of the same widths on (x, t)). Generation is 50 Euler steps of the field from the
source for all three; the velocity network has no density, so its row has no NLL.

Potentials are scored alike: the test NLL of exp(-V / eps_max) with log Z by
quadrature on the toy's box (512^2 points), its gap to the true density's NLL, and the
MMD^2 of 5000 points generated from the source against the test split. ``moons`` is
carried from ``8gaussians``, as in Balcerak et al. (2025), the other toys from standard
normal noise. Also: the training seconds on one thread. torchebm is optional
(``pip install --no-deps torchebm==0.8.9``); without it the table has ebmlab's rows only.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from ebmlab.cli import main as ebmlab_main
from ebmlab.data import load_dataset, make_toy
from ebmlab.energies import MLPEnergy
from ebmlab.energies.mlp import FeedForward
from ebmlab.evaluation.metrics import mmd2
from ebmlab.losses.flow_matching import potential_velocity
from ebmlab.partition import quadrature_log_partition

RESULTS = Path(__file__).parent / "results"
TOYS = ("8gaussians", "25gaussians", "checkerboard", "rings", "pinwheel", "moons")
SOURCES = {"moons": "8gaussians"}  # the paper's 8 Gaussians -> two moons
BATCH, LR, WARMUP, HIDDEN = 256, 2e-3, 0.3, (128, 128, 128)
N_GENERATED, GRID, FLOW_STEPS = 5000, 512, 50


def run_ebmlab(toy: str, workdir: Path, method: str) -> dict[str, Any]:
    out = workdir / f"ebmlab-{method}-{toy}"
    source = ["--source", SOURCES[toy]] if toy in SOURCES else []
    train = ["train", "density", "--data", toy, "--method", method, "--threads", "1",
             "--no-progress", "--out", str(out), *source]  # fmt: skip
    if ebmlab_main(train) != 0:
        raise RuntimeError(f"ebmlab training failed on {toy}")
    ebmlab_main(["evaluate", str(out)])
    result = json.loads((out / "evaluation.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    return {
        "test_nll": result["test_nll"],
        "nll_gap": result["nll_gap"],
        "mmd2_generated": result["mmd2_generated"],
        "seconds": summary["seconds"],
        "steps": summary["step"],
        "eps_max": json.loads((out / "config.json").read_text())["config"]["eps_max"],
    }


def train_for(
    toy: str,
    model: torch.nn.Module,
    budget: float,
    loss_of: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor],
) -> tuple[float, int, Callable[[int], torch.Tensor]]:
    """Adam on ``loss_of(x1, x0, elapsed share of the budget)`` over batches of the toy
    and of its source for ``budget`` seconds, from seed 0; returns the seconds, the
    steps, and a draw of n source points for generation."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    train = load_dataset(toy, "train").x
    source = make_toy(SOURCES[toy]) if toy in SOURCES else None

    def starts(n: int) -> torch.Tensor:
        return torch.randn(n, 2, generator=g) if source is None else source.sample(n, g)

    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    start, steps = time.perf_counter(), 0
    while (elapsed := time.perf_counter() - start) < budget:
        steps += 1
        x1 = train[torch.randint(len(train), (BATCH,), generator=g)]
        loss = loss_of(x1, starts(BATCH), elapsed / budget)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    return time.perf_counter() - start, steps, starts


def run_torchebm_em(toy: str, budget: float, eps_max: float) -> dict[str, Any]:
    from torchebm.core import BaseModel, TemperatureScheduler
    from torchebm.losses import EnergyMatchingLoss
    from torchebm.samplers import LangevinDynamics

    class Potential(BaseModel):
        def __init__(self) -> None:
            super().__init__()
            self.net = MLPEnergy(2, hidden=HIDDEN)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

    model = Potential()
    loss_fn = EnergyMatchingLoss(model=model, lambda_cd=0.0)

    def loss_of(x1: torch.Tensor, x0: torch.Tensor, share: float) -> torch.Tensor:
        loss_fn.lambda_cd = 2.0 if share > WARMUP else 0.0
        return loss_fn.training_losses(x1, x0=x0)["loss"]

    seconds, steps, starts = train_for(toy, model, budget, loss_of)
    temperature = TemperatureScheduler(loss_fn.epsilon_max, loss_fn.tau_star, n_steps=200,
                                       t_end=1.0)  # fmt: skip
    sweep = LangevinDynamics(model=model, step_size=0.01, noise_scale=temperature)
    generated = sweep.sample(x=starts(N_GENERATED), n_steps=200).detach()
    scores = score(model.net, loss_fn.epsilon_max, toy, generated)
    return {**scores, "seconds": seconds, "steps": steps}


class GradientField(torch.nn.Module):
    """The velocity -grad V(x) of a potential, called as ``model(x, t)`` (t unused)."""

    def __init__(self) -> None:
        super().__init__()
        self.potential = MLPEnergy(2, hidden=HIDDEN)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return potential_velocity(self.potential)(x, t)


class TimeVelocity(torch.nn.Module):
    """A velocity network v(x, t): an MLP of the potential's widths on (x, t)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = FeedForward([3, *HIDDEN, 2], "silu")

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([x, t.reshape(-1, 1).to(x.dtype)], dim=1))


def run_torchebm_fm(toy: str, budget: float, eps_max: float, field: str) -> dict[str, Any]:
    """torchebm's ``FlowMatchingLoss`` (OT coupling) on ``field`` ("potential": -grad V,
    "velocity": v(x, t)) for ``budget`` seconds, then 50 Euler steps of its
    ``FlowSampler`` from the source; the potential is scored at ``eps_max``."""
    from torchebm.losses import FlowMatchingLoss
    from torchebm.samplers import FlowSampler

    model = GradientField() if field == "potential" else TimeVelocity()
    loss_fn = FlowMatchingLoss(model=model, coupling="ot")
    seconds, steps, starts = train_for(toy, model, budget,
                                       lambda x1, x0, _: loss_fn(x1, x0=x0))  # fmt: skip
    sampler = FlowSampler(model, integrator="euler")
    generated = sampler.sample(x=starts(N_GENERATED), n_steps=FLOW_STEPS).detach()
    if field == "potential":
        scores = score(model.potential, eps_max, toy, generated)
    else:
        test = load_dataset(toy, "test").x
        scores = {"test_nll": None, "nll_gap": None,
                  "mmd2_generated": float(mmd2(generated, test[:N_GENERATED]))}  # fmt: skip
    return {**scores, "seconds": seconds, "steps": steps}


PEERS = {
    "em": {"torchebm": run_torchebm_em},
    "fm": {
        "torchebm, -grad V": partial(run_torchebm_fm, field="potential"),
        "torchebm, v(x, t)": partial(run_torchebm_fm, field="velocity"),
    },
}


def score(potential: torch.nn.Module, eps_max: float, toy: str, generated: torch.Tensor) -> dict:
    """Test NLL of exp(-V / eps_max) by quadrature, its gap to the truth, and MMD^2 of
    the generated points against the test split."""
    target, test = make_toy(toy), load_dataset(toy, "test").x

    def energy(x: torch.Tensor) -> torch.Tensor:
        return potential(x) / eps_max

    log_z = quadrature_log_partition(energy, target.bounds, GRID).log_z
    with torch.no_grad():
        nll = float(energy(test).mean()) + log_z
    true_nll = float(-target.log_prob(test).mean())
    return {
        "test_nll": nll,
        "nll_gap": nll - true_nll,
        "mmd2_generated": float(mmd2(generated[:N_GENERATED], test[:N_GENERATED])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--method", choices=tuple(PEERS), default="em")
    parser.add_argument("--toys", default=",".join(TOYS))
    parser.add_argument("--out", help="file under benchmarks/results (default: by method)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    try:
        import torchebm  # noqa: F401
    except ImportError:  # pragma: no cover - the peer is optional
        peer = False
    else:
        peer = True
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for toy in args.toys.split(","):
            source = SOURCES.get(toy, "gaussian")
            ours = run_ebmlab(toy, Path(workdir), args.method)
            rows.append({"toy": toy, "source": source, "library": "ebmlab", **ours})
            print(json.dumps(rows[-1]), flush=True)
            for library, run in PEERS[args.method].items() if peer else ():
                theirs = run(toy, ours["seconds"], ours["eps_max"])
                rows.append({"toy": toy, "source": source, "library": library, **theirs})
                print(json.dumps(rows[-1]), flush=True)
    RESULTS.mkdir(exist_ok=True)
    out = args.out or ("energy_matching.json" if args.method == "em" else "flow_matching.json")
    (RESULTS / out).write_text(json.dumps(rows, indent=1) + "\n")
    print("| toy | library | test NLL | gap | MMD² generated | steps | seconds |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        nll = "— | —" if r["test_nll"] is None else f"{r['test_nll']:.3f} | {r['nll_gap']:.3f}"
        print(f"| {r['toy']} | {r['library']} | {nll} | {r['mmd2_generated']:.4f} | "
              f"{r['steps']} | {r['seconds']:.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
