"""The conditional RBM against a linear autoregression on simulated walking.

Training sequences: ``walking_gaits(40, 200, seed=0)`` (six joint angles); test:
``seed=1``. Both models see the last two frames. The baseline is scikit-learn's
``LinearRegression`` on those windows (the least-squares autoregression of order 2);
the conditional RBM (Taylor et al. 2007) has 8 hidden units, starts from that same
linear fit (W small) and trains 40 epochs of CD-1 with Adam at 0.003 on batches of 100.
Both are scored by the mean squared error of the next frame on the test walkers (the
conditional RBM's exact conditional mean, summing its 2^8 hidden states) and by the
exact conditional log-likelihood per frame (the baseline's with Gaussian residuals of
the training deviations). ``python -m benchmarks.conditional_rbm [PNG]`` prints them
and draws test walkers' knees and hips with the model's next-frame predictions and a
free-running continuation.
"""

from __future__ import annotations

import sys
import time
from functools import cache

import numpy as np
import torch
from sklearn.linear_model import LinearRegression

from benchmarks.harness import MetricCase
from ebmlab.data.motion import JOINTS, walking_gaits
from ebmlab.energies import ConditionalRBM
from ebmlab.losses import conditional_cd_loss
from ebmlab.plotting import save_figure

ORDER, HIDDEN, EPOCHS, LR, BATCH = 2, 8, 40, 0.003, 100
GENERATED = 30  # free-running frames drawn (they leave the walk after 10 to 15)


@cache
def train() -> tuple[ConditionalRBM, dict[str, float]]:
    train_frames = walking_gaits(seed=0).double()
    test_frames = walking_gaits(seed=1).double()
    torch.manual_seed(0)
    model = ConditionalRBM(len(JOINTS), HIDDEN, ORDER, init_std=0.1).double()
    v, x = model.windows(train_frames)
    vt, xt = model.windows(test_frames)
    linear = LinearRegression().fit(x.numpy(), v.numpy())
    residual = v.numpy() - linear.predict(x.numpy())
    sigma = residual.std(0)
    error = vt.numpy() - linear.predict(xt.numpy())
    linear_ll = -(0.5 * (error / sigma) ** 2 + np.log(sigma * np.sqrt(2 * np.pi))).sum(1).mean()
    model.fit_autoregression(v, x)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    generator = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    for _ in range(EPOCHS):
        for idx in torch.randperm(len(v), generator=generator).split(BATCH):
            optimizer.zero_grad()
            conditional_cd_loss(model, v[idx], x[idx], generator=generator).backward()
            optimizer.step()
    seconds = time.perf_counter() - start
    model.requires_grad_(False)
    return model, {
        "crbm_mse": float(((model.predict(xt) - vt) ** 2).mean()),
        "linear_mse": float((error**2).mean()),
        "crbm_ll": float(model.log_likelihood(vt, xt).mean()),
        "linear_ll": float(linear_ll),
        "seconds": seconds,
    }


def cases() -> list[MetricCase]:
    return [
        MetricCase(
            what="simulated walking, next-frame squared error (order 2): conditional RBM",
            run=lambda: (train()[1]["crbm_mse"], train()[1]["linear_mse"]),
            anchor_name="linear autoregression (scikit-learn LinearRegression)",
            unit="squared radians",
            higher_is_better=False,
        )
    ]


def draw(path: str) -> None:
    """Two test walkers' left knee and hip: the truth, the next-frame predictions and a
    30-frame continuation generated from the first two frames by iterated Gibbs
    sampling."""
    import matplotlib.pyplot as plt

    model, _ = train()
    frames = walking_gaits(2, 80, seed=1).double()
    _, history = model.windows(frames)
    predicted = model.predict(history).view(2, -1, len(JOINTS))
    generated = model.generate(
        frames[:, :ORDER], GENERATED, generator=torch.Generator().manual_seed(0)
    )
    fig, axes = plt.subplots(2, 2, figsize=(10, 5), sharex=True)
    t = np.arange(80)
    for row in range(2):
        for col, joint in enumerate((0, 1)):
            ax = axes[row, col]
            ax.plot(t, frames[row, :, joint], "k", lw=2, label="simulated")
            ax.plot(t[ORDER:], predicted[row, :, joint], "C1--", label="next-frame prediction")
            ax.plot(t[ORDER : ORDER + GENERATED], generated[row, :, joint], "C0", alpha=0.8,
                    label="generated")  # fmt: skip
            ax.set_title(f"test walker {row + 1}, {JOINTS[joint]}")
    axes[1, 0].set_xlabel("frame")
    axes[1, 1].set_xlabel("frame")
    axes[0, 0].legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


def main() -> None:
    torch.set_num_threads(1)
    _, r = train()
    print("| model | next-frame MSE | conditional log-likelihood per frame |")
    print("|---|---:|---:|")
    print(f"| linear autoregression | {r['linear_mse']:.5f} | {r['linear_ll']:.3f} |")
    print(f"| conditional RBM | {r['crbm_mse']:.5f} | {r['crbm_ll']:.3f} |")
    print(f"conditional RBM training: {r['seconds']:.1f} s")
    if len(sys.argv) > 1:
        draw(sys.argv[1])


if __name__ == "__main__":
    main()
