"""Bernoulli RBMs 784 x 500 on the full binarised Fashion-MNIST (60,000 training and
10,000 test images), scored by the same AIS and RAISE.

``python -m benchmarks.fashion_rbm [--epochs 5]`` trains ebmlab's BernoulliRBM by CD-1
and CD-25 (the centred update, momentum 0.9, a learning rate of 0.05 falling linearly
to zero) and by PCD-1 (100 persistent chains, centred, no momentum, which would
amplify the chains' lag, and a learning rate of 0.02 falling to zero), and
scikit-learn's BernoulliRBM (its PCD-1, learning rate 0.1), all with mini-batches of 100
for the same number of epochs.
Every model is scored on the test images by the same estimators: log Z by AIS from the
training data's base rates (Salakhutdinov & Murray 2008: 14,500 temperatures, 100
chains; its standard error is that of the mean test log-likelihood, whose own sampling
error is far smaller) and by RAISE (Burda et al. 2015) from 100 chains of 1000 Gibbs
sweeps started at test images, which bounds log Z from above in expectation (so the
log-likelihood from below) when the chains sample the model. The data come from
``$EBMLAB_DATA``, ``/usr/share/datasets`` or the shared folder next to the checkout.
Writes ``results/fashion_rbm.json`` and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.rbm import scored_as_ours
from ebmlab.data import load_dataset
from ebmlab.partition import raise_, rbm_ais
from ebmlab.partition.ais import salakhutdinov_schedule
from ebmlab.sklearn import BernoulliRBM

SHARED = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "fashion-mnist"
RESULTS = Path(__file__).parent / "results" / "fashion_rbm.json"
CD = {"centering": True, "momentum": 0.9, "learning_rate": 0.05, "lr_decay": True}
PCD = {"centering": True, "momentum": 0.0, "learning_rate": 0.02, "lr_decay": True}


def binarised(split: str) -> np.ndarray:
    root = os.environ.get("EBMLAB_DATA") or (SHARED if SHARED.is_dir() else None)
    data = load_dataset("fashion-mnist", split, root=root, transform="binary")
    return data.x.numpy().astype(np.float32)


def fits(train: np.ndarray, epochs: int) -> dict[str, tuple[BernoulliRBM, float]]:
    """Each method's fitted estimator and its training seconds."""
    from sklearn.neural_network import BernoulliRBM as SkRBM

    makers = {
        "ebmlab CD-1": lambda: BernoulliRBM(500, k=1, persistent=False, **CD),
        "ebmlab CD-25": lambda: BernoulliRBM(500, k=25, persistent=False, **CD),
        "ebmlab PCD-1 (100 chains)": lambda: BernoulliRBM(500, n_chains=100, **PCD),
    }
    out = {}
    for name, make in makers.items():
        model = make().set_params(batch_size=100, n_iter=epochs, random_state=0)
        start = time.perf_counter()
        model.fit(train)
        out[name] = (model, time.perf_counter() - start)
        print(f"trained {name} in {out[name][1]:.0f} s", flush=True)
    theirs = SkRBM(500, learning_rate=0.1, batch_size=100, n_iter=epochs, random_state=0)
    start = time.perf_counter()
    theirs.fit(train.astype(np.float64))
    seconds = time.perf_counter() - start
    out["scikit-learn BernoulliRBM (PCD-1)"] = (scored_as_ours(theirs, train[:1000]), seconds)
    print(f"trained scikit-learn in {seconds:.0f} s", flush=True)
    return out


def score(model: BernoulliRBM, train: np.ndarray, test: np.ndarray) -> dict[str, float]:
    """Mean test log-likelihood with log Z by AIS (and its standard error) and by RAISE."""
    rbm = model.rbm_.double()
    data = torch.from_numpy(train)  # float32 rows: the base rates are summed exactly
    rows = torch.as_tensor(test, dtype=torch.float64)
    with torch.no_grad():
        free = float(rbm.free_energy(rows).mean())
        gen = torch.Generator().manual_seed(0)
        start = rows[torch.randperm(len(rows), generator=gen)[:100]]
        samples = rbm.gibbs(start, 1000, gen)
    forward = rbm_ais(rbm, schedule=salakhutdinov_schedule(), data=data, generator=0)
    reverse = raise_(rbm, samples=samples, schedule=salakhutdinov_schedule(), data=data,
                     generator=0)  # fmt: skip
    return {
        "test_ll_ais": -free - forward.log_z,
        "stderr": forward.stderr,
        "test_ll_raise": -free - reverse.log_z,
        "log_z_ais": forward.log_z,
        "log_z_raise": reverse.log_z,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    train, test = binarised("train"), binarised("test")
    rows = []
    for name, (model, seconds) in fits(train, args.epochs).items():
        rows.append({"method": name, "train_seconds": seconds, **score(model, train, test)})
        print(json.dumps(rows[-1]), flush=True)
    machine = f"{platform.processor() or platform.machine()}, torch {torch.__version__}"
    RESULTS.write_text(json.dumps({"epochs": args.epochs, "machine": machine,
                                   "threads": torch.get_num_threads(), "rows": rows},
                                  indent=1) + "\n")  # fmt: skip
    print(f"\n{args.epochs} epochs, batch 100, {torch.get_num_threads()} threads\n")
    print("| method | test log-likelihood (AIS) | RAISE | train time (s) |")
    print("|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['method']} | {r['test_ll_ais']:.2f} ± {r['stderr']:.2f} | "
              f"{r['test_ll_raise']:.2f} | {r['train_seconds']:.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
