"""Tempered SMC log Z against exact answers, and against AIS at the same cost.

Targets with a known log Z:

- Gaussian mixtures (4 unit-variance components, means ~ N(0, 4 I)) in 2, 10 and 50
  dimensions, and Neal's funnel in 10 dimensions, from a broad Gaussian base with HMC
  moves (on the funnel with step sizes spread log-uniformly over two decades, 4096
  particles in waste-free chains of 64 kept states and an ESS fraction of 0.95);
- a 64 x 16 Bernoulli RBM trained on the binarised digits (exact log Z by enumerating
  the 2^16 hidden states), from the data's base-rate model with Gibbs-with-Gradients
  moves.

AIS (``ebmlab.partition.ais``) runs with the same base, the same kernel and as many
energy evaluations of the target (counted, gradients included; the temperatures,
spaced evenly, are set from a short probe run's cost). Errors are root-mean-square
over seeds (``--seeds``, default 5); coverage is the fraction of 50 seeds whose
interval ``LogZEstimate.interval(k)`` holds the truth (Student's t with n_runs - 1
degrees of freedom at the coverage of a normal +/- k stderr: 95.45 % for k = 2, 99.73 %
for k = 3), beside that of plain log_z +/- k stderr.
BlackJAX's adaptive tempered SMC (``pip install blackjax``; left out when absent) runs
on the mixtures with the same base (as its prior), HMC moves, ESS target and total
number of particles in one population, and so does ebmlab's SMC with
``n_runs=1, variance="genealogy"`` (its standard error from the population's
ancestry; not on the funnel, whose waste-free chains have none).
``python -m benchmarks.smc`` prints the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable
from functools import cache

import numpy as np
import torch
from sklearn.datasets import load_digits

from benchmarks.harness import MetricCase
from ebmlab.energies import Funnel, Gaussian, GaussianMixture, IndependentBernoulli
from ebmlab.energies.boltzmann import base_rate_logits
from ebmlab.partition import ais, exact_log_partition, smc
from ebmlab.partition.ais import BASE_RATE_SMOOTHING
from ebmlab.samplers import HMC, GibbsWithGradients
from ebmlab.sklearn import BernoulliRBM as RBMEstimator

SEEDS = 5
COVERAGE_SEEDS = 50
COVERAGE_PROBLEMS = ("Gaussian mixture, 10-d", "Neal's funnel, 10-d", "RBM 64 x 16 (digits)")


class Counted(torch.nn.Module):
    """The target's energy, counting the rows it is evaluated on (a module, so that the
    estimators freeze the target's parameters while they sample)."""

    def __init__(self, energy: torch.nn.Module) -> None:
        super().__init__()
        self.energy, self.rows = energy, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.rows += x.shape[0]
        return self.energy(x)


def mixture(d: int) -> GaussianMixture:
    means = torch.randn(4, d, generator=torch.Generator().manual_seed(123)) * 2
    return GaussianMixture.isotropic(means, 1.0)


@cache
def digits_rbm():
    bits = (load_digits().data >= 8).astype(np.float64)
    estimator = RBMEstimator(16, learning_rate=0.05, batch_size=20, n_iter=30, random_state=0)
    rbm = estimator.fit(bits).rbm_
    base = IndependentBernoulli(
        base_rate_logits(torch.as_tensor(bits), BASE_RATE_SMOOTHING).float()
    )
    return rbm, base


def problems() -> dict[str, dict]:
    """Name -> target, base, kernel, SMC settings and the true log Z."""
    out = {}
    for d, particles in ((2, 256), (10, 512), (50, 1024)):
        target = mixture(d)
        out[f"Gaussian mixture, {d}-d"] = {
            "target": target,
            "base": Gaussian(torch.zeros(d), torch.eye(d) * 9),
            "kernel": HMC(0.3, 5),
            "particles": particles,
            "steps": 5,
            "truth": float(target.log_partition()),
        }
    funnel = Funnel(10)
    out["Neal's funnel, 10-d"] = {
        "target": funnel,
        "base": Gaussian(torch.zeros(10), torch.eye(10) * 9),
        "kernel": HMC(0.1, 10, step_spread=10.0),
        "particles": 4096,
        "steps": 2,
        "chain_length": 64,
        "ess_fraction": 0.95,
        "ais_chains": 4096,
        "ais_steps": 10,
        "truth": float(funnel.log_partition()),
    }
    rbm, base = digits_rbm()
    out["RBM 64 x 16 (digits)"] = {
        "target": rbm,
        "base": base,
        "kernel": GibbsWithGradients(),
        "particles": 512,
        "steps": 20,
        "truth": exact_log_partition(rbm).log_z,
    }
    return out


def run_smc(p: dict, seed: int, one_population: bool = False):
    """8 independent runs of the problem's particles, or (``one_population``) one run
    of all of them with the genealogy's standard error."""
    counted = Counted(p["target"])
    runs = 1 if one_population else 8
    estimate = smc(
        counted,
        p["base"],
        p["kernel"],
        n_particles=p["particles"] * 8 // runs,
        n_runs=runs,
        variance="genealogy" if one_population else "runs",
        ess_fraction=p.get("ess_fraction", 0.8),
        steps_per_stage=p["steps"],
        chain_length=p.get("chain_length", 1),
        generator=seed,
    )
    return estimate, counted.rows


def run_ais(p: dict, seed: int, budget: int):
    """AIS with 8 x particles chains (or the problem's ``ais_chains`` and ``ais_steps``)
    and as many temperatures as ``budget`` target evaluations allow, the cost of one
    temperature measured on a short probe run."""
    chains = p.get("ais_chains", 8 * p["particles"])

    def anneal(temperatures: int):
        counted = Counted(p["target"])
        estimate = ais(
            counted,
            base=p["base"],
            kernel=p["kernel"],
            n_chains=chains,
            n_temperatures=temperatures,
            steps_per_temperature=p.get("ais_steps", p["steps"]),
            generator=seed,
        )
        return estimate, counted.rows

    _, probe_rows = anneal(4)
    return anneal(max(2, round(4 * budget / probe_rows)))


@cache
def figures(seeds: int = SEEDS) -> dict[str, dict]:
    out = {}
    for name, p in problems().items():
        smc_errors, ais_errors, stderrs, budgets, ais_budgets = [], [], [], [], []
        for seed in range(seeds):
            estimate, rows = run_smc(p, seed)
            smc_errors.append(estimate.log_z - p["truth"])
            stderrs.append(estimate.stderr)
            budgets.append(rows)
            other, other_rows = run_ais(p, seed, rows)
            ais_errors.append(other.log_z - p["truth"])
            ais_budgets.append(other_rows)
        out[name] = {
            "smc_rmse": rms(smc_errors),
            "ais_rmse": rms(ais_errors),
            "smc_stderr": sum(stderrs) / seeds,
            "evaluations": sum(budgets) / seeds,
            "ais_evaluations": sum(ais_budgets) / seeds,
        }
        if p.get("chain_length", 1) == 1:
            one = [run_smc(p, seed, one_population=True)[0] for seed in range(seeds)]
            out[name]["one_rmse"] = rms([e.log_z - p["truth"] for e in one])
            out[name]["one_stderr"] = sum(e.stderr for e in one) / seeds
    return out


def rms(errors: list[float]) -> float:
    return math.sqrt(sum(e * e for e in errors) / len(errors))


@cache
def coverage_runs(name: str) -> list:
    """The estimates of ``COVERAGE_SEEDS`` independent runs."""
    p = problems()[name]
    return [run_smc(p, seed)[0] for seed in range(100, 100 + COVERAGE_SEEDS)]


def coverage(name: str, k: float, plain: bool = False) -> float:
    """The fraction of runs whose reported interval ``interval(k)`` (``plain``: log_z
    +/- k stderr) holds the truth."""
    truth = problems()[name]["truth"]
    runs = coverage_runs(name)
    if plain:  # the same estimates read as if their stderr were exact
        runs = [dataclasses.replace(estimate, dof=math.inf) for estimate in runs]
    intervals = [estimate.interval(k) for estimate in runs]
    return sum(low <= truth <= high for low, high in intervals) / COVERAGE_SEEDS


def blackjax_log_z(p: dict, seed: int) -> float | None:
    """log Z of a Gaussian-mixture problem by BlackJAX's adaptive tempered SMC, or None
    without BlackJAX."""
    try:
        import blackjax
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None
    target, kernel = p["target"], p["kernel"]
    means = jnp.asarray(target.means.numpy())
    log_w = jnp.asarray(torch.log(target.weights).numpy())
    d = means.shape[1]
    var = float(p["base"].covariance[0, 0])

    def log_prior(x):
        return -0.5 * jnp.sum(x**2) / var - 0.5 * d * jnp.log(2 * jnp.pi * var)

    def log_likelihood(x):
        return jax.scipy.special.logsumexp(log_w - 0.5 * jnp.sum((x - means) ** 2, -1)) - log_prior(
            x
        )

    parameters = {
        "step_size": jnp.array([kernel.step_size]),
        "inverse_mass_matrix": jnp.ones((1, d)),
        "num_integration_steps": jnp.array([kernel.n_leapfrog]),
    }
    sampler = blackjax.adaptive_tempered_smc(
        log_prior,
        log_likelihood,
        blackjax.hmc.build_kernel(),
        blackjax.hmc.init,
        parameters,
        blackjax.smc.resampling.systematic,
        0.8,
        num_mcmc_steps=p["steps"],
    )
    key = jax.random.PRNGKey(seed)
    key, sub = jax.random.split(key)
    state = sampler.init(jax.random.normal(sub, (8 * p["particles"], d)) * var**0.5)
    step = jax.jit(sampler.step)
    log_z = 0.0
    while state.tempering_param < 1:
        key, sub = jax.random.split(key)
        state, info = step(sub, state)
        log_z += float(info.log_likelihood_increment)
    return log_z


@cache
def blackjax_figures(seeds: int = SEEDS) -> dict[str, float]:
    """RMS error of BlackJAX's log Z over the seeds, per mixture problem."""
    out = {}
    for name, p in problems().items():
        if not name.startswith("Gaussian mixture"):
            continue
        errors = [blackjax_log_z(p, seed) for seed in range(seeds)]
        if errors[0] is None:
            return {}
        out[name] = rms([e - p["truth"] for e in errors])
    return out


def _error_case(
    name: str, anchor: Callable[[], float], anchor_name: str, variant: str = "smc"
) -> MetricCase:
    """SMC's RMS error on problem ``name`` (8 runs, or ``variant="one"``: one
    population) beside ``anchor()``'s."""
    how = ", one population" if variant == "one" else ""
    return MetricCase(
        what=f"tempered SMC log Z, {name}{how}: RMS error over {SEEDS} seeds",
        run=lambda: (figures()[name][f"{variant}_rmse"], anchor()),
        anchor_name=anchor_name,
        unit="nats",
        higher_is_better=False,
    )


def _coverage_case(name: str, k: float, nominal: float) -> MetricCase:
    def run() -> tuple[float, float]:
        return coverage(name, k), nominal

    return MetricCase(
        what=f"tempered SMC, {name}: coverage of interval({k:g}) over {COVERAGE_SEEDS} seeds",
        run=run,
        anchor_name="nominal",
        unit="fraction",
    )


def cases() -> list[MetricCase]:
    names: list[str] = list(problems())
    rows = [
        _error_case(
            n, lambda n=n: figures()[n]["ais_rmse"], "AIS, same base, kernel and energy evaluations"
        )
        for n in names
    ]
    rows += [
        _error_case(
            n,
            lambda n=n: blackjax_figures().get(n, float("nan")),
            "BlackJAX adaptive tempered SMC, same prior, HMC moves and particles",
            variant,
        )
        for n in names
        if n.startswith("Gaussian mixture")
        for variant in ("smc", "one")
    ]
    covered = [
        _coverage_case(name, k, nominal)
        for name in COVERAGE_PROBLEMS
        for k, nominal in ((2.0, 0.95), (3.0, 0.997))
    ]
    return [*rows, *covered]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Tempered SMC log Z against exact answers.")
    parser.add_argument("--seeds", type=int, default=SEEDS, help="seeds per RMS error")
    seeds = parser.parse_args(argv).seeds
    torch.set_num_threads(1)
    print("problem | SMC RMSE | SMC mean stderr | AIS RMSE | evaluations (SMC, AIS)")
    for name, f in figures(seeds).items():
        print(
            f"{name} | {f['smc_rmse']:.4f} | {f['smc_stderr']:.4f} | {f['ais_rmse']:.4f} | "
            f"{f['evaluations']:.0f}, {f['ais_evaluations']:.0f}"
        )
    for name, f in figures(seeds).items():
        if "one_rmse" in f:
            print(
                f"{name}, one population (genealogy stderr) | RMSE {f['one_rmse']:.4f} | "
                f"mean stderr {f['one_stderr']:.4f}"
            )
    for name, rmse in blackjax_figures(seeds).items():
        print(f"BlackJAX adaptive tempered SMC, {name}: RMSE {rmse:.4f}")
    for name in COVERAGE_PROBLEMS:
        at = ", ".join(
            f"{coverage(name, k):.2f} (plain {coverage(name, k, plain=True):.2f}) at {k:g}"
            for k in (2.0, 3.0)
        )
        print(f"coverage over {COVERAGE_SEEDS} seeds, {name}: {at}")


if __name__ == "__main__":
    main()
