"""The Trainer against the plain PyTorch loop a user would write for the same model."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.harness import Case
from ebmlab.data import load_dataset
from ebmlab.training import StepResult, Task, Trainer, TrainerConfig

EPOCHS = 3
BATCH = 64


def make_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.SiLU(), nn.Linear(256, 10))


class Classify(Task):
    def __init__(self) -> None:
        self.model = make_net()

    def training_step(self, batch, generator):
        x, y = batch
        return StepResult(nn.functional.cross_entropy(self.model(x), y))


def plain_loop(x: torch.Tensor, y: torch.Tensor) -> None:
    net = make_net()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for epoch in range(EPOCHS):
        perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch))
        for idx in perm.split(BATCH):
            loss = nn.functional.cross_entropy(net(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()


def sklearn_mlp(x: torch.Tensor, y: torch.Tensor) -> None:
    """scikit-learn's MLPClassifier with the same layer sizes, optimiser, batch and epochs."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPClassifier

    clf = MLPClassifier(
        hidden_layer_sizes=(256,),
        batch_size=BATCH,
        max_iter=EPOCHS,
        learning_rate_init=1e-3,
        random_state=0,
        tol=0.0,
        n_iter_no_change=EPOCHS + 1,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(x.numpy(), y.numpy())


def cases() -> list[Case]:
    data = load_dataset("digits", "train")
    config = TrainerConfig(epochs=EPOCHS, batch_size=BATCH, progress=False, log_every=50)
    return [
        Case(
            what=f"Trainer, digits MLP 64-256-10 classifier, {EPOCHS} epochs",
            ebmlab=lambda: Trainer(Classify(), (data.x, data.y), config).fit(),
            anchor=lambda: sklearn_mlp(data.x, data.y),
            anchor_name="scikit-learn MLPClassifier",
        ),
        Case(
            what=f"Trainer, digits MLP classifier, {EPOCHS} epochs (no run directory)",
            ebmlab=lambda: Trainer(Classify(), (data.x, data.y), config).fit(),
            anchor=lambda: plain_loop(data.x, data.y),
            anchor_name="plain PyTorch loop",
        ),
    ]
