"""``ebmlab mcmc``: sample a posterior written in a Python file, as Stan's command line
does for a model, and say whether to trust the draws.

The target is ``FILE.py:NAME``, a function of chains x (B, D) returning the energy
E(x) (B,), or the log density with ``--log-density``. Chains start uniformly in (-2, 2)
on every coordinate, as Stan starts them on the unconstrained scale (``--init-radius R``:
in (-R, R), as Stan's ``init=R``; 0 starts every chain at zero); NUTS (or WALNUTS or
AdaptiveHMC) warms up as Stan does, with a diagonal or a dense mass (``--mass``; by
default the one that pays, chosen at each window's end), and keeps ``--draws`` steps;
SoftAbsHMC's metric follows the Hessian, so it tunes step sizes only; NeuTra runs
WALNUTS in the latent space of a flow it fits first.
The command prints a JSON summary: the checks of Vehtari et al. (2021) (R-hat, bulk ESS,
divergences, stuck chains) with every failed one also printed as a warning, the mass
used, and each coordinate's mean and sd with their Monte Carlo errors. With ``--out`` it
also writes the draws (``draws.npz``, (draws, chains, D)), the summary and a trace plot
of the first coordinates.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.devices import resolve_device
from ebmlab.plotting import save_figure, subplots
from ebmlab.samplers import (
    NUTS,
    WALNUTS,
    AdaptiveHMC,
    NeuTra,
    Sampler,
    SampleRun,
    SoftAbsHMC,
)
from ebmlab.samplers.diagnostics import (
    Diagnostics,
    SamplingWarning,
    monte_carlo_errors,
    summarize,
)
from ebmlab.samplers.integrators import DenseMass

# walnuts: NUTS whose steps halve where the curvature needs it (funnels, centred
# hierarchical models), at the cost of more gradients there; softabs-hmc: momenta
# scaled by the Hessian at each point (the same posteriors; D + 1 backward passes a
# Hessian); neutra: WALNUTS in the latent space of a flow fitted to the posterior
# (the same posteriors; the fit costs a million gradients once)
SAMPLERS: dict[str, Callable[..., Sampler]] = {
    "nuts": NUTS,
    "walnuts": WALNUTS,
    "adaptive-hmc": AdaptiveHMC,
    "softabs-hmc": SoftAbsHMC,
    "neutra": lambda **options: NeuTra(WALNUTS(**options)),
}
METRIC_SAMPLERS = {"softabs-hmc"}  # no mass to choose: the metric follows the position
TREE_SAMPLERS = {"nuts", "walnuts"}  # --compile: their tree steps, by torch.compile
MASSES = {"auto": "auto", "diagonal": False, "dense": True}  # --mass: the samplers' dense_mass
TRACED = 4  # coordinates drawn in trace.png


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """The ``mcmc`` command and its own options."""
    p = sub.add_parser(
        "mcmc",
        help="sample a posterior from a Python file; prints diagnostics as JSON",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("target", help="FILE.py:NAME, a function x (B, D) -> energy (B,)")
    p.add_argument("--dim", type=int, required=True, help="D, the number of coordinates")
    p.add_argument(
        "--log-density",
        action="store_true",
        help="NAME returns the log density (up to a constant), not the energy",
    )
    p.add_argument("--sampler", choices=list(SAMPLERS), default="nuts")
    p.add_argument(
        "--chains", type=int, default=32, help="chains run side by side (default: %(default)s)"
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=300,
        help="adaptation steps of each chain (default: %(default)s)",
    )
    p.add_argument(
        "--draws",
        type=int,
        default=300,
        help="kept draws of each chain; R-hat <= 1.01 takes about 50 effective draws in "
        "each half-chain, so fewer, longer chains pass it sooner (default: %(default)s)",
    )
    p.add_argument(
        "--target-accept",
        type=float,
        default=0.8,
        help="the step size's acceptance target (default: %(default)s)",
    )
    p.add_argument(
        "--mass",
        choices=list(MASSES),
        default="auto",
        help="the inverse mass to adapt: dense (Stan's dense_e, for correlated "
        "coordinates), diagonal (Stan's default), or auto: dense where it makes the "
        "posterior nearly round or the diagonal leaves a narrow ridge, unless the "
        "posterior changes shape across the draws",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="compile each tree step of nuts or walnuts with torch.compile (a C++ compiler "
        "on the CPU): tens of seconds first, then 0.4-0.6 times the time per step; "
        "pays in runs of thousands of steps",
    )
    p.add_argument(
        "--init-radius",
        type=float,
        default=2.0,
        help="chains start uniformly in (-R, R) on every coordinate (Stan's init=R; 0: at zero)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | auto")
    p.add_argument("--float32", action="store_true", help="single precision (default double)")
    p.add_argument("--out", default=None, help="folder for draws.npz, summary.json, trace.png")
    return p


def load_target(spec: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The function ``NAME`` of ``FILE.py:NAME``, from the user's own file."""
    path_text, sep, name = spec.rpartition(":")
    if not sep or not path_text or not name:
        raise ArgumentError(f"target must be FILE.py:NAME, got {spec!r}")
    path = Path(path_text)
    if not path.is_file():
        raise FileNotFoundError(f"target file {path} does not exist")
    module_spec = importlib.util.spec_from_file_location(f"ebmlab_target_{path.stem}", path)
    if module_spec is None or module_spec.loader is None:
        raise ArgumentError(f"target file {path} is not a Python module")
    module = importlib.util.module_from_spec(module_spec)
    # registered as imported modules are, so that torch.compile can find its globals
    sys.modules[module_spec.name] = module
    module_spec.loader.exec_module(module)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ArgumentError(f"{path} has no function {name!r}")
    return fn


def chain_moments(draws: torch.Tensor) -> dict[str, list[float]]:
    """Each coordinate's mean and sd over draws (T, C, D), with their Monte Carlo
    standard errors (:func:`~ebmlab.samplers.diagnostics.monte_carlo_errors`)."""
    flat = draws.reshape(-1, draws.shape[-1])
    of_mean, of_sd = monte_carlo_errors(draws)
    return {
        "mean": flat.mean(0).tolist(),
        "sd": flat.std(0).tolist(),
        "mcse_mean": of_mean.tolist(),
        "mcse_sd": of_sd.tolist(),
    }


def trace_plot(draws: np.ndarray, path: Path) -> None:
    """The first coordinates' chains against the step, one panel each."""
    shown = min(TRACED, draws.shape[-1])
    fig, axes = subplots(shown, 1, figsize=(8, 1.8 * shown), squeeze=False, sharex=True)
    for d in range(shown):
        ax = axes[d, 0]
        ax.plot(draws[:, :, d], linewidth=0.4, alpha=0.6)
        ax.set_ylabel(f"x[{d}]")
    axes[-1, 0].set_xlabel("kept step")
    save_figure(fig, path)


def cmd_mcmc(args: argparse.Namespace) -> int:
    """Run the command (exit status 0 once it ran; ``passed`` in the summary says
    whether every check did)."""
    for name in ("dim", "chains", "draws"):
        _checks.positive_int(f"--{name}", getattr(args, name))
    _checks.positive_int("--warmup", args.warmup, allow_zero=True)
    _checks.positive("--init-radius", args.init_radius, allow_zero=True)
    if args.sampler in METRIC_SAMPLERS and args.mass != "auto":
        raise ArgumentError(
            f"--mass {args.mass} does not apply to --sampler {args.sampler}: its metric is "
            "made from the Hessian at each point"
        )
    if args.compile and args.sampler not in TREE_SAMPLERS:
        raise ArgumentError(
            f"--compile applies to --sampler {' or '.join(sorted(TREE_SAMPLERS))}, not "
            f"{args.sampler}"
        )
    fn = load_target(args.target)
    device = resolve_device(args.device)
    dtype = torch.float32 if args.float32 else torch.float64
    sign = -1.0 if args.log_density else 1.0

    def energy(x: torch.Tensor) -> torch.Tensor:
        return sign * fn(x)

    generator = torch.Generator(device).manual_seed(args.seed)
    x0 = torch.rand(args.chains, args.dim, generator=generator, dtype=dtype, device=device)
    x0 = args.init_radius * (2 * x0 - 1)
    probe = energy(x0)
    if not isinstance(probe, torch.Tensor) or probe.shape != (args.chains,):
        got = tuple(probe.shape) if isinstance(probe, torch.Tensor) else type(probe).__name__
        raise ArgumentError(
            f"{args.target} must map chains ({args.chains}, {args.dim}) to one value per "
            f"chain, shape ({args.chains},); got {got}"
        )
    options: dict = {"target_accept": args.target_accept}
    if args.sampler not in METRIC_SAMPLERS:
        options["dense_mass"] = MASSES[args.mass]
    if args.compile:
        options["compile"] = True
    sampler = SAMPLERS[args.sampler](**options)
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SamplingWarning)
        run = sampler.run(energy, x0, args.draws, burn_in=args.warmup, thin=1,
                          generator=generator)  # fmt: skip
    seconds = time.perf_counter() - start
    diagnostics = summarize(run, warn=False)
    said = [str(w.message) for w in caught if issubclass(w.category, SamplingWarning)]
    summary = summary_of(run, args, seconds, diagnostics, said)
    print(json.dumps(summary, indent=2))
    for line in said + diagnostics.problems:
        print(f"ebmlab: warning: {line}", file=sys.stderr)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        draws = run.samples.double().cpu().numpy()
        np.savez_compressed(out / "draws.npz", draws=draws)
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        trace_plot(draws, out / "trace.png")
    return 0


def mass_used(run: SampleRun, sampler: str) -> str:
    """The mass a run ended with: dense, diagonal (saying so where the warm-up refused a
    dense one), or the position's own metric."""
    if sampler in METRIC_SAMPLERS:
        return "softabs metric"
    mass = "dense" if isinstance(run.final.inv_mass, DenseMass) else "diagonal"
    refused = getattr(run.final, "refused_spread", None)
    if refused is not None:
        mass += f" (dense refused: the posterior changes shape, spread {refused:.0f})"
    # NeuTra's chains, and their mass, live in its flow's latent space
    return f"{mass}, in the flow's latent space" if sampler == "neutra" else mass


def summary_of(
    run: SampleRun,
    args: argparse.Namespace,
    seconds: float,
    diagnostics: Diagnostics,
    said: list[str],
) -> dict:
    """The printed summary of a run: its settings, the checks (``diagnostics``, and the
    sampler's own warnings ``said``) and the moments."""
    draws = run.samples.double().cpu()
    return {
        "target": args.target,
        "sampler": args.sampler,
        "chains": args.chains,
        "warmup": args.warmup,
        "draws": args.draws,
        "init_radius": args.init_radius,
        "seconds": round(seconds, 3),
        "max_rhat": diagnostics.max_rhat,
        "min_bulk_ess": diagnostics.min_ess,
        "min_tail_ess": diagnostics.min_tail_ess,
        "divergent": run.info["n_divergent"],
        "acceptance_rate": run.info["acceptance_rate"],
        "stuck_chains": run.info["stuck_chains"],
        "n_grad_evals": run.info["n_grad_evals"],
        "n_grad_evals_used": run.info["n_grad_evals_used"],
        "mass": mass_used(run, args.sampler),
        "passed": not diagnostics.problems,
        "problems": diagnostics.problems + said,
        **chain_moments(draws),
    }
