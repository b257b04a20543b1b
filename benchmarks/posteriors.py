"""Samplers on real-world posteriors, started where Stan starts them.

``python -m benchmarks.posteriors [--chains 32] [--warmup 300] [--draws 300]`` runs
ebmlab's ``NUTS``, ``WALNUTS`` and ``AdaptiveHMC`` and, when ``jax`` and ``blackjax``
are installed, BlackJAX's window-adapted NUTS and its ChEES-HMC (AdaptiveHMC's peer) on
every posterior of :mod:`benchmarks.posterior_models`: float64, chains from
uniform(-2, 2) on the unconstrained scale, default settings but ``target_accept`` where
the posterior names one (their mass chosen by ``dense_mass="auto"``; ``--diagonal``
adds both with ``dense_mass=False``, ``--dense`` with ``dense_mass=True`` and
BlackJAX's NUTS with a dense mass, ``--lockstep`` NUTS with ``run_ahead=1``,
``--compile`` NUTS with ``compile=True``, ``--softabs`` SoftAbsHMC, at its default
target of 0.8, ``--neutra`` NeuTra: WALNUTS in the latent space of a flow fitted by
variational inference). Each row gives the worst split
R-hat, the divergent share of kept transitions, the chains stuck after warm-up, the min
bulk ESS per 1000 gradient evaluations (warm-up included) and per second, and the
worst |z| of the means and sds against the reference (closed forms or quadrature, or
long BlackJAX runs in ``results/posterior_references.json``, made by
:mod:`benchmarks.blackjax_runner`), the Monte Carlo errors of both counted. Writes
``results/posteriors.json`` (a run of some posteriors or samplers replaces their rows
there and keeps the others) and prints a Markdown table.
"""

from __future__ import annotations

import json
import time
import warnings
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.posterior_models import POSTERIORS, Posterior, run_arguments
from ebmlab.samplers import NUTS, WALNUTS, AdaptiveHMC, NeuTra, Sampler, SoftAbsHMC
from ebmlab.samplers.diagnostics import effective_sample_size, monte_carlo_errors, split_rhat

RESULTS = Path(__file__).parent / "results"


def reference(posterior: Posterior) -> dict[str, Any]:
    """Means and sds (with the reference's min ESS; infinite for closed forms)."""
    if posterior.exact is not None:
        return {**posterior.exact(), "min_bulk_ess": float("inf")}
    return json.loads((RESULTS / "posterior_references.json").read_text())[posterior.name]


def scores(draws: np.ndarray, ref: dict[str, Any]) -> dict[str, float]:
    """R-hat, min bulk ESS and the worst |z| of means and sds for draws (T, C, D): the
    draws' Monte Carlo errors as ``monte_carlo_errors`` gives them (the sd's from the
    fourth moment, so heavy tails count), the reference's from its min ESS."""
    t = torch.as_tensor(draws)
    ess = effective_sample_size(t).numpy()
    of_mean, of_sd = (e.numpy() for e in monte_carlo_errors(t))
    flat = draws.reshape(-1, draws.shape[-1])
    mean, sd = flat.mean(0), flat.std(0, ddof=1)
    ref_mean, ref_sd = np.asarray(ref["mean"]), np.asarray(ref["sd"])
    ref_ess = ref["min_bulk_ess"]
    z_mean = (mean - ref_mean) / np.sqrt(of_mean**2 + ref_sd**2 / ref_ess)
    z_sd = (sd - ref_sd) / np.sqrt(of_sd**2 + ref_sd**2 / (2 * ref_ess))
    return {
        "max_rhat": float(split_rhat(t).max()),
        "min_bulk_ess": float(ess.min()),
        "worst_z_mean": float(np.abs(z_mean).max()),
        "worst_z_sd": float(np.abs(z_sd).max()),
        # which coordinates: the column of each worst z
        "worst_mean_at": int(np.abs(z_mean).argmax()),
        "worst_sd_at": int(np.abs(z_sd).argmax()),
    }


def run_ebmlab(
    sampler: Sampler,
    posterior: Posterior,
    chains: int,
    warmup: int,
    draws: int,
    device: str = "cpu",
    seed: int = 0,
) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    x0 = torch.as_tensor(rng.uniform(-2.0, 2.0, (chains, posterior.dim)), device=device)

    def energy(x: torch.Tensor) -> torch.Tensor:
        return -posterior.log_density(x, torch)

    compiling = _compile_seconds()
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = sampler.run(energy, x0, draws, burn_in=warmup, thin=1, generator=seed)
        if x0.device.type == "cuda":
            torch.cuda.synchronize(x0.device)
    seconds = time.perf_counter() - start
    compiling = _compile_seconds() - compiling
    restarted = [str(w.message) for w in caught if "restarted" in str(w.message)]
    return {
        "draws": run.samples.cpu().numpy(),
        "n_grad_evals": run.info["n_grad_evals_used"],
        "n_grad_evals_computed": run.info["n_grad_evals"],
        "n_divergent": run.info["n_divergent"],
        "stuck": len(run.info["stuck_chains"]),
        "restarts": len(restarted),
        "seconds": seconds,
        **({"compile_seconds": compiling} if compiling else {}),
        "device": torch.cuda.get_device_name(x0.device) if x0.device.type == "cuda" else "cpu",
    }


def _compile_seconds() -> float:
    """The seconds torch.compile has spent compiling in this process so far (its own
    record, whose name may change between PyTorch versions: 0 where it is missing)."""
    from torch._dynamo.utils import compilation_time_metrics

    return sum(compilation_time_metrics.get("_compile.compile_inner", []))


def row(name: str, posterior: Posterior, out: dict[str, Any], chains: int, draws: int) -> dict:
    result = scores(out["draws"], reference(posterior))
    ess = result["min_bulk_ess"]
    return {
        "posterior": posterior.name,
        "sampler": name,
        **result,
        "divergent_share": out["n_divergent"] / (chains * draws),
        "stuck": out.get("stuck", 0),
        "restarts": out.get("restarts", 0),
        "ess_per_1000_grads": 1000 * ess / out["n_grad_evals"],
        # gradients the batch computed per gradient the chains' own transitions used
        "computed_per_used": out.get("n_grad_evals_computed", out["n_grad_evals"])
        / out["n_grad_evals"],
        "ess_per_second": ess / out["seconds"],
        "seconds": out["seconds"],
        **({"compile_seconds": out["compile_seconds"]} if "compile_seconds" in out else {}),
        **({"device": out["device"]} if "device" in out else {}),
    }


def main() -> None:
    args = run_arguments(__doc__, chains=32, warmup=300, draws=300)
    torch.set_default_dtype(torch.float64)
    try:
        import blackjax  # noqa: F401

        from benchmarks.blackjax_runner import run_chees, run_nuts
    except ImportError:  # pragma: no cover - the peer is optional
        run_nuts = run_chees = None
    rows = []
    for posterior in POSTERIORS:
        if args.only and args.only not in posterior.name:
            continue
        accept = posterior.target_accept
        samplers = {
            "ebmlab NUTS": NUTS(target_accept=accept),
            "ebmlab WALNUTS": WALNUTS(target_accept=accept),
            "ebmlab AdaptiveHMC": AdaptiveHMC(target_accept=accept),
        }
        if args.lockstep:
            samplers["ebmlab NUTS, lockstep"] = NUTS(target_accept=accept, run_ahead=1)
        if args.compile:
            samplers["ebmlab NUTS, compiled"] = NUTS(target_accept=accept, compile=True)
        if args.softabs:
            samplers["ebmlab SoftAbsHMC"] = SoftAbsHMC()  # its default target, 0.8, everywhere
        if args.neutra:
            samplers["ebmlab NeuTra"] = NeuTra(WALNUTS(target_accept=accept))
        for asked, mass, dense in ((args.diagonal, "diagonal", False), (args.dense, "dense", True)):
            if asked:
                for kind in (NUTS, AdaptiveHMC):
                    sampler = kind(target_accept=accept, dense_mass=dense)
                    samplers[f"ebmlab {kind.__name__}, {mass} mass"] = sampler
        for name, sampler in samplers.items():
            if args.sampler and args.sampler not in name:
                continue
            out = run_ebmlab(sampler, posterior, args.chains, args.warmup, args.draws,
                             args.device, args.seed)  # fmt: skip
            rows.append(row(name, posterior, out, args.chains, args.draws))
            print(json.dumps(rows[-1]), flush=True)
        if run_nuts is not None and args.device == "cpu":
            sizes = (posterior, args.chains, args.warmup, args.draws)
            peers = {"BlackJAX NUTS": partial(run_nuts, *sizes, seed=args.seed),
                     "BlackJAX ChEES-HMC": partial(run_chees, *sizes, seed=args.seed)}  # fmt: skip
            if args.dense:
                peers["BlackJAX NUTS, dense mass"] = partial(
                    run_nuts, *sizes, seed=args.seed, dense=True
                )
            for name, peer in peers.items():
                if args.sampler and args.sampler not in name:
                    continue
                rows.append(row(name, posterior, peer(), args.chains, args.draws))
                print(json.dumps(rows[-1]), flush=True)
    path = RESULTS / args.out
    path.write_text(json.dumps(merged(path, rows), indent=1) + "\n")
    print(markdown(rows, args))


def merged(path: Path, rows: list[dict]) -> list[dict]:
    """The rows already in ``path`` with those of the same posterior and sampler
    replaced by ``rows`` (in place) and the others of ``rows`` appended: a run of some
    posteriors or samplers updates their rows and keeps the rest."""
    fresh = {(r["posterior"], r["sampler"]): r for r in rows}
    old = json.loads(path.read_text()) if path.exists() else []
    kept = [fresh.pop((r["posterior"], r["sampler"]), r) for r in old]
    return kept + list(fresh.values())


def markdown(rows: list[dict], args: Any) -> str:
    lines = [
        f"{args.chains} chains from uniform(-2, 2), {args.warmup} warm-up + {args.draws} kept "
        "steps, float64",
        "",
        "| posterior | sampler | R-hat | divergent | stuck | ESS/1k grads | ESS/s | "
        "worst z mean | worst z sd |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['posterior']} | {r['sampler']} | {r['max_rhat']:.3f} | "
            f"{r['divergent_share']:.1%} | {r['stuck']} | {r['ess_per_1000_grads']:.2f} | "
            f"{r['ess_per_second']:.0f} | {r['worst_z_mean']:.1f} | {r['worst_z_sd']:.1f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
