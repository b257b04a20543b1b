"""BlackJAX's NUTS with Stan's window adaptation on the benchmark posteriors: the second
implementation the posterior benchmark compares with and takes its reference moments
from.

``python -m benchmarks.blackjax_runner`` (with ``pip install "jax[cpu]" blackjax`` in the
benchmark environment) writes
``benchmarks/results/posterior_references.json``: per posterior, the mean and sd of each
parameter from long runs (8 chains, 1000 warm-up and 4000 kept steps, from uniform(-2, 2)
starts), with their R-hat, min bulk ESS and divergences; posteriors whose moments are
known exactly (eight schools, the funnel) are left out.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.posterior_models import POSTERIORS, Posterior, run_arguments

REFERENCES = Path(__file__).parent / "results" / "posterior_references.json"


def run_nuts(
    posterior: Posterior,
    n_chains: int,
    n_warmup: int,
    n_draws: int,
    seed: int,
    target_accept: float | None = None,
    dense: bool = False,
) -> dict[str, Any]:
    """``n_chains`` chains of BlackJAX NUTS (window adaptation per chain, as Stan; a
    dense mass with ``dense``) from uniform(-2, 2) starts: the draws (n_draws,
    n_chains, D), the gradient evaluations of warm-up and sampling together, the
    divergent kept steps, and the seconds of a second, compiled run."""
    import blackjax
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)

    def logdensity(theta):
        return posterior.log_density(theta, jnp)

    accept = posterior.target_accept if target_accept is None else target_accept
    warmup = blackjax.window_adaptation(
        blackjax.nuts,
        logdensity,
        is_mass_matrix_diagonal=not dense,
        target_acceptance_rate=accept,
    )

    def chain(key, x0):
        warm_key, sample_key = jax.random.split(key)
        (state, parameters), info = warmup.run(warm_key, x0, num_steps=n_warmup)
        step = blackjax.nuts(logdensity, **parameters).step

        def one(state, key):
            state, info = step(key, state)
            return state, (state.position, info.num_integration_steps, info.is_divergent)

        keys = jax.random.split(sample_key, n_draws)
        _, (draws, steps, divergent) = jax.lax.scan(one, state, keys)
        grads = info.info.num_integration_steps.sum() + steps.sum()
        return draws, grads, divergent.sum()

    keys = jax.random.split(jax.random.PRNGKey(seed), n_chains)
    (draws, grads, divergent), seconds = _timed(jax.jit(jax.vmap(chain)), keys, posterior,
                                                n_chains, seed)  # fmt: skip
    return {
        "draws": draws.transpose(1, 0, 2),
        "n_grad_evals": int(grads.sum()),
        "n_divergent": int(divergent.sum()),
        "seconds": seconds,
    }


def _timed(run: Any, keys: Any, posterior: Posterior, n_chains: int, seed: int) -> tuple:
    """The jitted ``run(keys, x0)`` from ``n_chains`` uniform(-2, 2) starts drawn from
    ``seed``: run once to compile, then once timed. Its outputs as NumPy arrays, and the
    seconds of the timed run."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(seed)
    x0 = jnp.asarray(rng.uniform(-2.0, 2.0, (n_chains, posterior.dim)))
    jax.block_until_ready(run(keys, x0))  # compile
    start = time.perf_counter()
    out = jax.block_until_ready(run(keys, x0))
    return tuple(np.array(o) for o in out), time.perf_counter() - start


def run_chees(
    posterior: Posterior,
    n_chains: int,
    n_warmup: int,
    n_draws: int,
    seed: int,
) -> dict[str, Any]:
    """``n_chains`` chains of BlackJAX's ChEES-HMC (Hoffman, Radul & Sountsov 2021), the
    peer of ebmlab's AdaptiveHMC: one step size and one jittered trajectory length
    tuned across all chains, with BlackJAX's ensemble estimate of a diagonal mass
    (``mass_matrix_estimation="diagonal"``, and its trajectory-length floor), Adam as in
    the paper (learning rate 0.025, beta1 0, beta2 0.95), the posterior's target
    acceptance, from uniform(-2, 2) starts. Returns what :func:`run_nuts` returns."""
    import blackjax
    import jax
    import jax.numpy as jnp
    import optax

    jax.config.update("jax_enable_x64", True)

    def logdensity(theta):
        return posterior.log_density(theta, jnp)

    warmup = blackjax.chees_adaptation(
        logdensity,
        n_chains,
        target_acceptance_rate=posterior.target_accept,
        mass_matrix_estimation="diagonal",
    )
    optim = optax.adam(0.025, b1=0.0, b2=0.95)

    def ensemble(key, x0):
        warm_key, sample_key = jax.random.split(key)
        (states, parameters), info = warmup.run(warm_key, x0, 0.1, optim, n_warmup,
                                                max_sampling_steps=n_draws)  # fmt: skip
        step = jax.vmap(blackjax.dynamic_hmc(logdensity, **parameters).step)

        def one(states, key):
            states, info = step(jax.random.split(key, n_chains), states)
            return states, (states.position, info.num_integration_steps, info.is_divergent)

        keys = jax.random.split(sample_key, n_draws)
        _, (draws, steps, divergent) = jax.lax.scan(one, states, keys)
        grads = info.info.num_integration_steps.sum() + steps.sum()
        return draws, grads, divergent.sum()

    (draws, grads, divergent), seconds = _timed(jax.jit(ensemble), jax.random.PRNGKey(seed),
                                                posterior, n_chains, seed)  # fmt: skip
    return {
        "draws": draws,  # (n_draws, n_chains, D) already
        "n_grad_evals": int(grads),
        "n_divergent": int(divergent),
        "seconds": seconds,
    }


def main() -> None:
    args = run_arguments(__doc__, chains=8, warmup=1000, draws=4000)
    import torch

    from ebmlab.samplers.diagnostics import effective_sample_size, split_rhat

    references = json.loads(REFERENCES.read_text()) if REFERENCES.exists() else {}
    for posterior in POSTERIORS:
        if posterior.exact is not None or (args.only and args.only not in posterior.name):
            continue
        out = run_nuts(posterior, args.chains, args.warmup, args.draws, seed=2024)
        draws = out["draws"]
        flat = draws.reshape(-1, posterior.dim)
        references[posterior.name] = {
            "names": list(posterior.names),
            "mean": flat.mean(0).tolist(),
            "sd": flat.std(0, ddof=1).tolist(),
            "min_bulk_ess": float(effective_sample_size(torch.tensor(draws)).min()),
            "max_rhat": float(split_rhat(torch.tensor(draws)).max()),
            "n_divergent": out["n_divergent"],
            "draws": f"{args.chains} chains x {args.draws} after {args.warmup} warm-up",
        }
        row = references[posterior.name]
        print(posterior.name, row["max_rhat"], row["min_bulk_ess"], row["n_divergent"], flush=True)
    REFERENCES.write_text(json.dumps(references, indent=1) + "\n")


if __name__ == "__main__":
    main()
