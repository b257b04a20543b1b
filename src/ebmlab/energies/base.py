"""The energy interface: p(x) = exp(-E(x)) / Z (Tomczak 2024, eq. 6.1).

Everything in ebmlab that needs an energy accepts either an :class:`EnergyModel`
or any plain callable mapping a batch ``(B, *event_shape)`` to energies ``(B,)``.
:func:`as_energy_fn` turns both into the callable form and checks the output
shape on use.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, Union

import torch
from torch import nn

from ebmlab import hardware
from ebmlab._checks import ArgumentError

EnergyFn = Callable[[torch.Tensor], torch.Tensor]
EnergyLike = Union["EnergyModel", EnergyFn]


class EnergyModel(nn.Module):
    """Base class of energy functions E(x); lower energy means more likely.

    Subclasses implement :meth:`energy` for a batch ``(B, *event_shape)`` and
    return ``(B,)``. ``forward`` is the energy, so a model is itself an energy
    callable.

    ``grad_dtype`` (default ``None``: the input's dtype) computes the gradients that
    samplers request in reduced precision, e.g. ``torch.bfloat16``, several times
    faster on CPUs with bf16 matrix units. The energies returned with them are then
    approximate too: use it with unadjusted Langevin/SGLD, not with samplers whose
    Metropolis test compares energies.
    """

    grad_dtype: torch.dtype | None = None

    def energy(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        """Energies of a batch: ``x`` (B, ...) -> (B,); lower is more likely."""
        raise NotImplementedError

    def forward(self, *args: torch.Tensor, **kwargs: torch.Tensor | None) -> torch.Tensor:
        """The energies, as :meth:`energy` with the same arguments (the inputs, and the
        conditioning or latent variables of the models that take them): calling the
        module evaluates it."""
        return self.energy(*args, **kwargs)

    def unnormalized_log_prob(self, x: torch.Tensor) -> torch.Tensor:
        """log p(x) + log Z = -E(x)."""
        return -self.energy(x)

    def score(self, x: torch.Tensor) -> torch.Tensor:
        """The score grad_x log p(x) = -grad_x E(x); Z does not depend on x."""
        return score(self, x)

    def log_ratio(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        """log p(x1)/p(x2) = E(x2) - E(x1): Z cancels (Song & Kingma 2021, §2)."""
        return self.energy(x2) - self.energy(x1)

    def energy_and_grad(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(E(x), grad_x E(x)), both detached. Subclasses with a closed-form or hand-fused
        gradient override this; samplers call it for every gradient they need."""
        if self.grad_dtype is None:
            return _autograd_energy_and_grad(self.energy, x)
        with hardware.autocast(x.device, self.grad_dtype):
            e, g = _autograd_energy_and_grad(self.energy, x)
        return e.to(x.dtype), g.to(x.dtype)


class EnergyFunction:
    """A callable ``x -> (B,)`` that checks its output shape, with a gradient method.

    Made by :func:`as_energy_fn`; ``value_and_grad`` uses the model's own
    ``energy_and_grad`` when the energy is an :class:`EnergyModel` (closed-form or
    fused gradients), autograd otherwise.
    """

    def __init__(self, fn: EnergyFn, model: EnergyModel | None = None) -> None:
        self.fn = fn
        self.model = model

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        e = self.fn(x)
        if not isinstance(e, torch.Tensor) or e.shape != x.shape[:1]:
            shape = tuple(e.shape) if isinstance(e, torch.Tensor) else type(e).__name__
            raise ArgumentError(
                f"energy must return one value per sample, shape ({x.shape[0]},), got {shape}"
            )
        return e

    def value_and_grad(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.model is not None:
            return self.model.energy_and_grad(x)
        return _autograd_energy_and_grad(self, x)


def as_energy_fn(energy: EnergyLike) -> EnergyFunction:
    """Return a checked callable ``x -> (B,)`` for an :class:`EnergyModel` or plain callable.

    Args:
        energy: an energy module or a callable (B, ...) -> (B,).
    """
    if isinstance(energy, EnergyFunction):
        return energy
    if isinstance(energy, EnergyModel):
        return EnergyFunction(energy.energy, energy)
    if not callable(energy):
        raise ArgumentError(
            f"energy must be an EnergyModel or a callable x -> (B,), got {type(energy).__name__}"
        )
    return EnergyFunction(energy)


EVAL_CHUNK = 1024  # rows per forward pass when a whole split is evaluated


def in_chunks(fn: Callable[..., Any], x: torch.Tensor, chunk: int = EVAL_CHUNK) -> Any:
    """``fn(x)`` computed ``chunk`` rows at a time and concatenated (a tensor, or a tuple
    of tensors), so that evaluating a large network on a whole split never holds more
    than one chunk's activations."""
    parts = [fn(part) for part in x.split(chunk)]
    if isinstance(parts[0], tuple):
        return tuple(torch.cat(column) for column in zip(*parts, strict=True))
    return torch.cat(parts)


def energy_device(energy: Any, default: torch.device | str = "cpu") -> torch.device:
    """Where an energy's parameters live (``default`` for a parameter-free callable):
    the device on which estimators that make their own points (grids, base samples)
    make them."""
    if isinstance(energy, EnergyFunction) and energy.model is not None:
        energy = energy.model
    if isinstance(energy, nn.Module):
        for t in itertools.chain(energy.parameters(), energy.buffers()):
            return t.device
    return torch.device(default)


class NoGradientError(ArgumentError):
    """An energy whose value does not depend on x through autograd."""


def _autograd_energy_and_grad(
    energy: EnergyFn, x: torch.Tensor, create_graph: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.enable_grad():
        xg = x.detach().requires_grad_(True)
        e = energy(xg)
        g = None
        if e.requires_grad:
            (g,) = torch.autograd.grad(e.sum(), xg, create_graph=create_graph, allow_unused=True)
    if g is None:
        raise NoGradientError(
            "the energy does not depend on x through autograd, so it has no gradient: "
            "compute it from x with torch operations (not under torch.no_grad(), and "
            "without .detach(), .item() or NumPy)"
        )
    if create_graph:
        return e, g
    return e.detach(), g.detach()


def energy_and_grad(
    energy: EnergyFn, x: torch.Tensor, *, create_graph: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(E(x), grad_x E(x))``.

    Uses the energy's own ``value_and_grad`` when it has one (see :class:`EnergyFunction`),
    else one autograd backward pass. With ``create_graph`` the result stays differentiable
    (needed when a loss differentiates through the gradient, e.g. score matching), and
    autograd is always used.
    """
    if not create_graph and isinstance(energy, EnergyFunction):
        return energy.value_and_grad(x)
    return _autograd_energy_and_grad(energy, x, create_graph)


def score(energy: EnergyLike, x: torch.Tensor) -> torch.Tensor:
    """The score -grad_x E(x) of any energy."""
    return -energy_and_grad(as_energy_fn(energy), x)[1]
