"""Integrators of the Langevin and Hamiltonian dynamics the samplers discretise.

The samplers add what makes a kernel of these updates: a Metropolis test, adaptation,
tree building. Every function is batched over chains (rows), takes step sizes as floats
or per-chain ``(B,)`` tensors, and draws its noise from the generator it is given.

- :func:`euler_maruyama`: x' = x - h grad E(x) + sigma eps, the overdamped Langevin
  step (Roberts & Tweedie 1996; Tomczak 2024, eq. 6.24 with sigma free);
- :func:`leapfrog`: the symplectic integrator of H(x, p) = E(x) + p^T M^{-1} p / 2
  (Neal 2011, eqs. 5.18-5.20), with :func:`kinetic_energy`, :func:`velocity` and
  :func:`momentum` for a diagonal inverse mass (a tensor) or a :class:`DenseMass`;
- :func:`underdamped_step`: the BAOAB and OBABO splittings of underdamped Langevin
  dynamics into kicks (B), drifts (A) and an exact Ornstein-Uhlenbeck update of the
  momentum (O) (Leimkuhler & Matthews 2013).
"""

from __future__ import annotations

import math

import torch

from ebmlab.energies.base import EnergyFn, energy_and_grad
from ebmlab.samplers.base import add_scaled, per_chain

Step = float | torch.Tensor  # a step size: one float, or one per chain (B,)


class DenseMass:
    """A dense inverse mass M^{-1} (D, D), symmetric positive definite, for chains of
    flat rows (B, D): Stan's ``dense_e`` metric (Betancourt 2017, §4.2). It whitens a
    posterior whose coordinates are strongly correlated, which no diagonal mass can
    do. Kept with its Cholesky factor L (M^{-1} = L L^T) for drawing momenta.

    Args:
        inv_mass: M^{-1} (D, D).
    """

    def __init__(self, inv_mass: torch.Tensor) -> None:
        self.matrix = inv_mass
        self.chol = torch.linalg.cholesky(inv_mass)

    def velocity(self, p: torch.Tensor) -> torch.Tensor:
        """M^{-1} p for momenta p (..., D)."""
        return p @ self.matrix

    def momentum(self, noise: torch.Tensor) -> torch.Tensor:
        """p ~ N(0, M) from standard normal rows (B, D): noise L^{-1}, whose covariance
        is L^{-T} L^{-1} = M."""
        return torch.linalg.solve_triangular(self.chol, noise, upper=False, left=False)

    def whiten(self, x: torch.Tensor) -> torch.Tensor:
        """L^{-1} x for rows x (B, D): positions in the units in which the mass is the
        identity, |L^{-1} x|^2 = x^T M x."""
        return torch.linalg.solve_triangular(self.chol.mT, x, upper=True, left=False)


Mass = torch.Tensor | DenseMass  # a diagonal inverse mass broadcastable to x, or dense


def velocity(p: torch.Tensor, inv_mass: Mass) -> torch.Tensor:
    """M^{-1} p for momenta p (B, ...), or for stacks of flat momenta (..., D) when the
    mass is dense."""
    return inv_mass.velocity(p) if isinstance(inv_mass, DenseMass) else inv_mass * p


def momentum(noise: torch.Tensor, inv_mass: Mass) -> torch.Tensor:
    """Momenta p ~ N(0, M) from standard normal ``noise`` of the chains' shape."""
    return inv_mass.momentum(noise) if isinstance(inv_mass, DenseMass) else noise / inv_mass.sqrt()


def whiten(x: torch.Tensor, inv_mass: Mass) -> torch.Tensor:
    """Positions (B, ...) in the units in which the mass M is the identity: M^{1/2} x
    for a diagonal mass, L^{-1} x for a dense one (M^{-1} = L L^T)."""
    return inv_mass.whiten(x) if isinstance(inv_mass, DenseMass) else x / inv_mass.sqrt()


def gaussian_noise(like: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Standard normal noise of ``like``'s shape, dtype and device.

    Args:
        generator: source of randomness, a ``torch.Generator`` on the data's device
            (``None``: the global one).
    """
    return torch.randn(like.shape, generator=generator, dtype=like.dtype, device=like.device)


def euler_maruyama(
    x: torch.Tensor, grad: torch.Tensor, step_size: Step, noise_scale: Step, noise: torch.Tensor
) -> torch.Tensor:
    """One overdamped Langevin step x - h grad + sigma noise.

    Args:
        x: chains (B, ...).
        grad: grad E(x), x's shape.
        step_size: h, a float or per chain (B,).
        noise_scale: sigma (sqrt(2 h) for the unadjusted Langevin algorithm).
        noise: standard normal draws, x's shape.

    Returns:
        The new chains, x's shape.
    """
    h, sigma = per_chain(step_size, x), per_chain(noise_scale, x)
    return add_scaled(add_scaled(x, -h, grad), sigma, noise, inplace=True)


def kinetic_energy(p: torch.Tensor, inv_mass: Mass) -> torch.Tensor:
    """p^T M^{-1} p / 2 per chain (B,), for momenta p (B, ...).

    Args:
        inv_mass: diagonal inverse mass M^{-1}, broadcastable to p, or a
            :class:`DenseMass` (p flat, (B, D)).
    """
    if isinstance(inv_mass, DenseMass):
        return 0.5 * (p * inv_mass.velocity(p)).sum(1)
    return 0.5 * (p * p * inv_mass).flatten(1).sum(1)


def leapfrog(
    energy: EnergyFn,
    x: torch.Tensor,
    p: torch.Tensor,
    grad: torch.Tensor,
    step_size: Step,
    n_steps: int,
    inv_mass: Mass,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``n_steps`` leapfrog steps from (x, p), reusing the gradient at x.

    Args:
        energy: E, a callable (B, ...) -> (B,).
        x: positions (B, ...).
        p: momenta, x's shape.
        grad: grad E(x), x's shape (cached from the previous step).
        step_size: epsilon, a float or per chain (B,); negative integrates backwards.
        n_steps: leapfrog steps L >= 1.
        inv_mass: diagonal inverse mass M^{-1}, broadcastable to x, or a
            :class:`DenseMass` (x flat, (B, D)).

    Returns:
        (x, p, E(x), grad E(x)) at the end point, after exactly ``n_steps`` gradient
        evaluations.
    """
    eps = per_chain(step_size, x)
    dense = isinstance(inv_mass, DenseMass)
    p = p - 0.5 * eps * grad
    e = None
    for i in range(n_steps):
        # (eps M^{-1}) p for a diagonal mass, the order its results were fixed in
        x = x + eps * inv_mass.velocity(p) if dense else x + eps * inv_mass * p
        e, grad = energy_and_grad(energy, x)
        p = p - (eps if i < n_steps - 1 else 0.5 * eps) * grad
    return x, p, e, grad


def _ou_coefficients(step: Step, friction: float) -> tuple[Step, Step]:
    """c = exp(-gamma h) and sqrt(1 - c^2): the O step's decay and noise scale."""
    c = (
        torch.exp(-friction * step)
        if isinstance(step, torch.Tensor)
        else math.exp(-friction * step)
    )
    return c, (1 - c * c) ** 0.5


def underdamped_step(
    energy: EnergyFn,
    x: torch.Tensor,
    v: torch.Tensor,
    grad: torch.Tensor,
    step_size: Step,
    friction: float,
    generator: torch.Generator | None,
    scheme: str = "baoab",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step of underdamped Langevin dynamics with unit mass, by splitting
    (Leimkuhler & Matthews 2013).

    ``"baoab"``: half kick, half drift, exact friction and noise over h, half drift,
    half kick; its configurational marginal is exact on Gaussians at any stable step.
    ``"obabo"``: friction and noise over h / 2, a velocity-Verlet step, friction and
    noise over h / 2.

    Args:
        energy: E, a callable (B, ...) -> (B,).
        x: positions (B, ...).
        v: velocities, x's shape.
        grad: grad E(x), x's shape.
        step_size: h, a float or per chain (B,).
        friction: gamma > 0.
        generator: source of the O steps' noise.
        scheme: ``"baoab"`` or ``"obabo"``.

    Returns:
        (x, v, E(x), grad E(x)) after the step: one gradient evaluation.
    """
    h = per_chain(step_size, x)
    if scheme == "obabo":
        c, s = _ou_coefficients(h / 2, friction)
        v = add_scaled(c * v, s, gaussian_noise(v, generator))
        v = add_scaled(v, -h / 2, grad)
        x = add_scaled(x, h, v)
        e, g = energy_and_grad(energy, x)
        v = add_scaled(v, -h / 2, g)
        v = add_scaled(c * v, s, gaussian_noise(v, generator))
        return x, v, e, g
    c, s = _ou_coefficients(h, friction)
    v = add_scaled(v, -h / 2, grad)
    x = add_scaled(x, h / 2, v)
    v = add_scaled(c * v, s, gaussian_noise(v, generator))
    x = add_scaled(x, h / 2, v)
    e, g = energy_and_grad(energy, x)
    v = add_scaled(v, -h / 2, g)
    return x, v, e, g
