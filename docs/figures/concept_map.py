"""Draw the concept map of ebmlab (docs/images/concept_map.png).

Run ``python docs/figures/concept_map.py [OUT.png]``; the README and the documentation
home page show the picture it writes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

STAGES = [
    (
        "energy",
        "E(x), E(x, y)",
        "ebmlab.energies",
        "MLPEnergy, ConvEnergy,\nClassifierEnergy, RBMs,\nyour nn.Module",
    ),
    (
        "sampler",
        "x ~ exp(-E)/Z",
        "ebmlab.samplers",
        "Langevin, MALA, HMC,\nNUTS, Gibbs, GWG,\ntempering, SMC moves",
    ),
    (
        "loss",
        "what learning\nminimises",
        "ebmlab.losses",
        "contrastive divergence,\nscore matching, NCE,\nLeCun et al.'s family",
    ),
    (
        "log Z",
        "the normaliser",
        "ebmlab.partition",
        "exact, quadrature,\nAIS, SMC, RAISE,\nBethe, TRW",
    ),
    (
        "evaluation",
        "is it any good?",
        "ebmlab.evaluation",
        "NLL, AUROC, ECE,\nMMD², Stein\ndiscrepancy",
    ),
]
COLOURS = ["#4c72b0", "#55a868", "#c44e52", "#8172b2", "#ccb974"]


def draw(out: Path) -> Path:
    """Write the concept map to ``out`` and return the path."""
    fig, ax = plt.subplots(figsize=(12, 4.2), dpi=110)
    ax.set_xlim(0, 13)
    ax.set_ylim(0, 4.2)
    ax.axis("off")
    width, gap = 2.1, 0.5
    for i, ((name, what, module, examples), colour) in enumerate(zip(STAGES, COLOURS, strict=True)):
        x = 0.2 + i * (width + gap)
        ax.add_patch(
            FancyBboxPatch(
                (x, 1.25),
                width,
                2.6,
                boxstyle="round,pad=0.05",
                fc=colour,
                alpha=0.15,
                ec=colour,
                lw=2,
            )
        )
        ax.text(
            x + width / 2,
            3.55,
            name,
            ha="center",
            va="center",
            fontsize=15,
            weight="bold",
            color=colour,
        )
        ax.text(x + width / 2, 3.05, what, ha="center", va="center", fontsize=10, style="italic")
        ax.text(
            x + width / 2, 2.55, module, ha="center", va="center", fontsize=9, family="monospace"
        )
        ax.text(x + width / 2, 1.8, examples, ha="center", va="center", fontsize=8.5)
        if i + 1 < len(STAGES):
            ax.add_patch(
                FancyArrowPatch(
                    (x + width + 0.05, 2.55),
                    (x + width + gap - 0.05, 2.55),
                    arrowstyle="-|>",
                    mutation_scale=18,
                    lw=1.5,
                    color="#444444",
                )
            )
    ax.add_patch(
        FancyBboxPatch(
            (0.2, 0.15), 12.5, 0.8, boxstyle="round,pad=0.05", fc="#eeeeee", ec="#888888", lw=1.2
        )
    )
    ax.text(
        6.45,
        0.55,
        "ebmlab.training: Trainer + Task (one step: sample, loss, update), "
        "recipes behind `ebmlab train`\nebmlab.data (digits, image sets, your files)  ·  "
        "ebmlab.inference (argmin over y)  ·  ebmlab.sklearn",
        ha="center",
        va="center",
        fontsize=9.5,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, bbox_inches="tight")
    plt.close(fig)
    return out


if __name__ == "__main__":
    target = (
        Path(sys.argv[1])
        if len(sys.argv) > 1
        else Path(__file__).parents[1] / "images" / "concept_map.png"
    )
    print(draw(target))
