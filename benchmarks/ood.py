"""OOD detection on the digits: the AUROC of the default JEM's log p(x) against what a user
would fit instead, scikit-learn's Gaussian mixture on the same 1000 training digits.

JEM: the recipe's defaults (100 epochs, seed 0) in mixed precision, trained once (about
4 minutes on one thread). The mixture has full covariances; its number of components and
covariance floor are those with the highest mean log-likelihood on the validation split
(a kernel density estimate tuned the same way picks its smallest bandwidth and ranks the
flips far worse, so it is left out). The OOD sets are those of ``ebmlab evaluate``:
uniform noise, permuted pixels and flipped test digits.
"""

from __future__ import annotations

from functools import cache

import torch
from sklearn.mixture import GaussianMixture

from benchmarks.harness import MetricCase
from ebmlab.evaluation import auroc
from ebmlab.training import Trainer
from ebmlab.training.recipes import get_recipe
from ebmlab.training.recipes.jem import JEMTask, ood_sets

COMPONENTS = (1, 2, 5, 10, 20)
COVARIANCE_FLOORS = (0.01, 0.03, 0.1)


@cache
def trained_jem() -> JEMTask:
    recipe = get_recipe("jem")
    settings = {"sampler_dtype": "bfloat16", "train_dtype": "bfloat16", "seed": 0}
    config, trainer = recipe.configs({**settings, "progress": False})
    setup = recipe.build(config, trainer)
    Trainer(setup.task, setup.train_data, trainer).fit()
    setup.task.model.eval()
    return setup.task  # type: ignore[return-value]


@cache
def mixture() -> GaussianMixture:
    """The Gaussian mixture with the highest mean validation log-likelihood."""
    task = trained_jem()
    train, val = task.train.x.double().numpy(), task.val.x.double().numpy()
    fitted = [
        GaussianMixture(k, reg_covar=floor, random_state=0).fit(train)
        for k in COMPONENTS
        for floor in COVARIANCE_FLOORS
    ]
    return max(fitted, key=lambda m: m.score_samples(val).mean())


@cache
def test_and_ood_sets() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The test digits and the OOD sets, built once for all cases."""
    task = trained_jem()
    return task.test.x, ood_sets(task)


def aurocs(ood: str) -> tuple[float, float]:
    """AUROC of JEM's log p(x) and of the mixture's log-density, test digits against ``ood``."""
    task = trained_jem()
    x_in, sets = test_and_ood_sets()
    x_out = sets[ood]
    with torch.no_grad():
        ours = auroc(-task.model.energy(x_in), -task.model.energy(x_out))
    model = mixture()
    theirs = auroc(
        torch.from_numpy(model.score_samples(x_in.double().numpy())),
        torch.from_numpy(model.score_samples(x_out.double().numpy())),
    )
    return ours, theirs


def cases() -> list[MetricCase]:
    return [
        MetricCase(
            what=f"digits OOD AUROC of log p(x), test digits against {ood} (default JEM, seed 0)",
            run=lambda ood=ood: aurocs(ood),
            anchor_name="scikit-learn GaussianMixture, tuned on the validation split",
            unit="AUROC",
        )
        for ood in ("flip_lr", "flip_ud", "permuted", "uniform_noise")
    ]
