"""JEM: one training epoch of ebmlab's recipe against a faithful plain-PyTorch
transcription of the book's listing (Tomczak, Deep Generative Modeling, Listing 6.1) at identical
hyperparameters: MLP 64-512-512-512-10 with ELU, uniform-noise starts, 20 Langevin
steps with alpha = 1 and sigma = 0.01, Adamax with learning rate 1e-3, batch 64."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.harness import Case
from ebmlab.data import load_dataset
from ebmlab.training import Trainer, TrainerConfig
from ebmlab.training.recipes.jem import JEMConfig, JEMTask

ALPHA, SIGMA, STEPS, BATCH, LR = 1.0, 0.01, 20, 64, 1e-3


class BookEBM(nn.Module):
    """The listing's EBM class, transcribed as written (including its autograd habits)."""

    def __init__(self, energy_net: nn.Module, alpha: float, sigma: float, ld_steps: int, D: int):
        super().__init__()
        self.energy_net = energy_net
        self.nll = nn.NLLLoss(reduction="none")
        self.D = D
        self.sigma = sigma
        self.alpha = torch.FloatTensor([alpha])
        self.ld_steps = ld_steps

    def class_loss(self, f_xy, y):
        y_pred = torch.softmax(f_xy, 1)
        return self.nll(torch.log(y_pred), y)

    def gen_loss(self, x, f_xy):
        x_sample = self.sample(x=None, batch_size=x.shape[0])
        f_x_sample_y = self.energy_net(x_sample)
        return -(torch.logsumexp(f_xy, 1) - torch.logsumexp(f_x_sample_y, 1))

    def forward(self, x, y):
        f_xy = self.energy_net(x)
        return (self.class_loss(f_xy, y) + self.gen_loss(x, f_xy)).mean()

    def energy_gradient(self, x):
        self.energy_net.eval()
        x_i = torch.FloatTensor(x.data)
        x_i.requires_grad = True
        x_i_grad = torch.autograd.grad(
            torch.logsumexp(self.energy_net(x_i), 1).sum(), [x_i], retain_graph=True
        )[0]
        self.energy_net.train()
        return x_i_grad

    def langevine_dynamics_step(self, x_old, alpha):
        grad_energy = self.energy_gradient(x_old)
        epsilon = torch.randn_like(grad_energy) * self.sigma
        return x_old + alpha * grad_energy + epsilon

    def sample(self, batch_size=64, x=None):
        x_sample = 2.0 * torch.rand([batch_size, self.D]) - 1.0
        for _ in range(self.ld_steps):
            x_sample = self.langevine_dynamics_step(x_sample, alpha=self.alpha)
        return x_sample


def book_net() -> nn.Module:
    return nn.Sequential(
        nn.Linear(64, 512),
        nn.ELU(),
        nn.Linear(512, 512),
        nn.ELU(),
        nn.Linear(512, 512),
        nn.ELU(),
        nn.Linear(512, 10),
    )


def book_epoch(x: torch.Tensor, y: torch.Tensor) -> None:
    torch.manual_seed(0)
    model = BookEBM(book_net(), ALPHA, SIGMA, STEPS, 64)
    opt = torch.optim.Adamax(model.parameters(), lr=LR)
    for idx in torch.randperm(len(x)).split(BATCH):
        loss = model(x[idx], y[idx])
        opt.zero_grad()
        loss.backward(retain_graph=True)
        opt.step()


def ebmlab_epoch(sampler_dtype: str = "float32", train_dtype: str = "float32") -> None:
    config = JEMConfig(
        arch="mlp",
        hidden=(512, 512, 512),
        activation="elu",
        init="uniform",
        sampler_steps=STEPS,
        step_size=ALPHA,
        noise=SIGMA,
        data_noise=0.0,
        shift_augment=0.0,
        rotate_augment=0.0,
        scale_augment=0.0,
        energy_l2=0.0,
        clamp=False,
        sampler_dtype=sampler_dtype,
        train_dtype=train_dtype,
        calibrate=False,
    )
    task = JEMTask(config, seed=0)
    trainer = TrainerConfig(epochs=1, batch_size=BATCH, lr=LR, optimizer="adamax", progress=False)
    Trainer(task, (task.train.x, task.train.y), trainer).fit()


def cases() -> list[Case]:
    data = load_dataset("digits", "train")
    variants = [
        (
            "JEM epoch on digits (1000 images), the book listing's hyperparameters",
            "float32",
            "float32",
        ),
        ("JEM epoch as above, SGLD gradients in bfloat16", "bfloat16", "float32"),
        (
            "JEM epoch as above, SGLD and the training step in bfloat16 (mixed precision)",
            "bfloat16",
            "bfloat16",
        ),
    ]
    return [
        Case(
            what=what,
            ebmlab=lambda sampler=sampler, train=train: ebmlab_epoch(sampler, train),
            anchor=lambda: book_epoch(data.x, data.y),
            anchor_name="the book's listing (plain PyTorch)",
            repeats=3,
            dtype=getattr(torch, sampler),
        )
        for what, sampler, train in variants
    ]
