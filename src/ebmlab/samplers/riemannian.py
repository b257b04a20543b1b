"""Riemannian manifold HMC with the SoftAbs metric (Girolami & Calderhead 2011;
Betancourt 2013, "A General Metric for Riemannian Manifold Hamiltonian Monte Carlo").

Euclidean HMC and NUTS move with one mass everywhere. Where the curvature of E changes
by orders of magnitude from place to place, as between the neck and the mouth of the
centred eight schools' funnel, no one mass fits: a step small enough for the neck
crawls through the mouth, and one that suits the mouth diverges in the neck. Riemannian
manifold HMC lets the momentum's covariance follow the position, p ~ N(0, G(x)), with
the Hamiltonian (Girolami & Calderhead 2011, eq. 13, without its constant)

    H(x, p) = E(x) + log det G(x) / 2 + p^T G(x)^{-1} p / 2.

The SoftAbs metric is made from the Hessian of E: with Hess E(x) = Q diag(lambda) Q^T,
G = Q diag(lambda coth(alpha lambda)) Q^T (Betancourt 2013, eq. 6). Each eigenvalue is
replaced by a smooth absolute value, |lambda| where |alpha lambda| >> 1 and 1 / alpha
near lambda = 0, so G is positive definite also where E is not convex; on a Gaussian it
is the inverse covariance, and every trajectory sees a target that is locally round.

H is not separable, so the integrator is the generalised leapfrog (Girolami & Calderhead
2011, eqs. 16-18): a half step in p implicit in the new p, solved by fixed-point
iteration at fixed x; a full step in x implicit in the new x (the metric at both ends),
solved the same way; an explicit half step in p. Both solves run ``fixed_point_steps``
iterations, a fixed count, so no step reads anything back to the host. As in Girolami &
Calderhead's and Betancourt's samplers, a solve that has not converged by then is used
as it is: the Metropolis test corrects its energy error, but the step is then only
nearly reversible, which can bias the draws a little. Given a ``tolerance``, a
trajectory whose last iteration still moved x or p by more than that (relative) is
counted as divergent and rejected instead, which trades mixing for exactness
(docs/results/posteriors.md). A trajectory whose energy error exceeds
``divergence_threshold``, or whose Hessian or position is not finite, is divergent and
rejected.

dH/dx needs the derivative of the metric. By the Daleckii-Krein formula,
dG/dx_i = Q (J o (Q^T (dHess/dx_i) Q)) Q^T with J the divided differences of
f(lambda) = lambda coth(alpha lambda) (Betancourt 2013, eqs. 10-12), so both metric
terms of dH/dx_i are tr(A dHess/dx_i) for one matrix A (:meth:`SoftAbsMetric.force_weights`):
one backward pass through the Hessian's graph gives them for every i.

Costs, counted as backward passes in ``n_grad_evals``: a Hessian is D + 1 of them (the
gradient, then one per row), so a transition costs D + 1 at its start and k (D + 2) + 1
per leapfrog step with k fixed-point iterations. Second-order passes cost more than a
gradient, and the count grows with D: the sampler is for posteriors of tens of
coordinates whose geometry defeats Euclidean HMC, not for images.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.energies.base import EnergyFn
from ebmlab.samplers.adaptation import TunedState, WarmupTuning
from ebmlab.samplers.base import Sampler, SamplerState, metropolis_update
from ebmlab.samplers.integrators import gaussian_noise

FlatEnergy = Callable[[torch.Tensor], torch.Tensor]  # chains (B, D) -> (B,)


def softabs(lam: torch.Tensor, alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """f(lambda) = lambda coth(alpha lambda) and f'(lambda) = coth(a) - a / sinh(a)^2,
    a = alpha lambda (Betancourt 2013, eq. 6), elementwise.

    Near a = 0 both come from their Taylor series (f = (1 + a^2/3 - a^4/45 + 2a^6/945)
    / alpha, f' = 2a/3 - 4a^3/45 + 4a^5/315), where the closed forms cancel
    catastrophically; beyond |a| = 0.1 from the closed forms.
    """
    a = alpha * lam
    small = a.abs() < 0.1
    safe = torch.where(small, torch.ones_like(a), a)
    a2 = a * a
    f_series = (1 + a2 * (1 / 3 + a2 * (-1 / 45 + a2 * 2 / 945))) / alpha
    fp_series = a * (2 / 3 + a2 * (-4 / 45 + a2 * 4 / 315))
    coth = 1 / torch.tanh(safe)
    f = torch.where(small, f_series, lam * coth)
    fp = torch.where(small, fp_series, coth - safe / torch.sinh(safe).square())
    return f, fp


@dataclass(frozen=True)
class SoftAbsMetric:
    """The SoftAbs metric G = Q diag(f(lambda)) Q^T at a batch of positions: the
    Hessians' eigenvalues ``lam`` (B, D) and vectors ``vectors`` (B, D, D), f and f'
    there, and which Hessians were finite (``finite``, (B,); the others are replaced
    by the identity so that the batch's eigendecomposition goes on)."""

    lam: torch.Tensor
    vectors: torch.Tensor
    f: torch.Tensor
    fp: torch.Tensor
    finite: torch.Tensor
    alpha: float

    @classmethod
    def of(cls, hessian: torch.Tensor, alpha: float) -> SoftAbsMetric:
        """The metric of Hessians (B, D, D) with SoftAbs sharpness ``alpha``."""
        hessian = hessian.detach()
        finite = hessian.isfinite().flatten(1).all(1)
        eye = torch.eye(hessian.shape[-1], dtype=hessian.dtype, device=hessian.device)
        hessian = torch.where(finite[:, None, None], hessian, eye)
        lam, vectors = torch.linalg.eigh((hessian + hessian.mT) / 2)
        f, fp = softabs(lam, alpha)
        return cls(lam, vectors, f, fp, finite, alpha)

    def rotated(self, p: torch.Tensor) -> torch.Tensor:
        """Q^T p for p (B, D)."""
        return (self.vectors.mT @ p.unsqueeze(-1)).squeeze(-1)

    def back(self, u: torch.Tensor) -> torch.Tensor:
        """Q u for u (B, D) in the eigenbasis."""
        return (self.vectors @ u.unsqueeze(-1)).squeeze(-1)

    def velocity(self, p: torch.Tensor) -> torch.Tensor:
        """G^{-1} p (B, D)."""
        return self.back(self.rotated(p) / self.f)

    def momentum(self, noise: torch.Tensor) -> torch.Tensor:
        """p = G^{1/2} noise ~ N(0, G) for standard normal ``noise`` (B, D)."""
        return self.back(self.f.sqrt() * noise)

    def hamiltonian_terms(self, p: torch.Tensor) -> torch.Tensor:
        """log det G / 2 + p^T G^{-1} p / 2 (B,): H without E."""
        return 0.5 * (self.f.log() + self.rotated(p).square() / self.f).sum(-1)

    @functools.cached_property
    def divided_differences(self) -> torch.Tensor:
        """J_ij = (f_i - f_j) / (lambda_i - lambda_j), f' at the midpoint where the two
        eigenvalues are within eps^(1/3) of each other (relative to their size or
        1 / alpha): there the quotient loses its digits, and the midpoint's f' is as
        close as the quotient's rounding, eps^(2/3) (B, D, D). Computed once per metric:
        every force at one position (each fixed-point iteration in p) shares it."""
        lam_i, lam_j = self.lam.unsqueeze(-1), self.lam.unsqueeze(-2)
        gap = lam_i - lam_j
        scale = torch.maximum(lam_i.abs(), lam_j.abs()).clamp(min=1 / self.alpha)
        close = gap.abs() <= torch.finfo(gap.dtype).eps ** (1 / 3) * scale
        quotient = (self.f.unsqueeze(-1) - self.f.unsqueeze(-2)) / torch.where(close, 1, gap)
        _, fp_mid = softabs((lam_i + lam_j) / 2, self.alpha)
        return torch.where(close, fp_mid, quotient)

    def force_weights(self, p: torch.Tensor) -> torch.Tensor:
        """A (B, D, D) such that d/dx_i (log det G / 2 + p^T G^{-1} p / 2) =
        tr(A dHess/dx_i) at fixed p: A = Q (diag(f'/f) - J o v v^T) Q^T / 2 with
        v = Q^T G^{-1} p = Q^T p / f (Betancourt 2013, eqs. 10-12)."""
        v = self.rotated(p) / self.f
        inner = torch.diag_embed(self.fp / self.f) - self.divided_differences * (
            v.unsqueeze(-1) * v.unsqueeze(-2)
        )
        return 0.5 * self.vectors @ inner @ self.vectors.mT


@dataclass(frozen=True)
class Geometry:
    """E, its gradient and Hessian at positions ``x`` (B, D) with the metric there.
    Built for forces, ``x`` requires grad and the Hessian keeps its graph, for one
    backward pass per force (:meth:`force`)."""

    x: torch.Tensor
    energy: torch.Tensor
    grad: torch.Tensor
    hessian: torch.Tensor
    metric: SoftAbsMetric

    @classmethod
    def at(cls, energy: FlatEnergy, x: torch.Tensor, alpha: float, graph: bool) -> Geometry:
        """The geometry at ``x`` (B, D) by D + 1 backward passes; ``graph`` keeps the
        Hessian's graph for :meth:`force`."""
        d = x.shape[1]
        with torch.enable_grad():
            x = x.detach().requires_grad_(True)
            e = energy(x)
            (g,) = torch.autograd.grad(e.sum(), x, create_graph=True)
            if g.requires_grad:  # else E is linear and its Hessian zero
                rows = [
                    torch.autograd.grad(g[:, i].sum(), x, create_graph=graph, retain_graph=True,
                                        allow_unused=True, materialize_grads=True)[0]
                    for i in range(d)
                ]  # fmt: skip
                hessian = torch.stack(rows, 1)
            else:
                hessian = x.new_zeros((len(x), d, d))
        return cls(x, e.detach(), g.detach(), hessian, SoftAbsMetric.of(hessian, alpha))

    def force(self, p: torch.Tensor) -> torch.Tensor:
        """dH/dx at (x, p) (B, D): grad E plus the metric's terms, tr(A dHess/dx_i), by one
        backward pass through the Hessian (none where it has no graph: a constant one)."""
        if not self.hessian.requires_grad:
            return self.grad
        weights = self.metric.force_weights(p)
        (terms,) = torch.autograd.grad((self.hessian * weights).sum(), self.x, retain_graph=True,
                                       allow_unused=True, materialize_grads=True)  # fmt: skip
        return self.grad + terms

    def hamiltonian(self, p: torch.Tensor) -> torch.Tensor:
        """H(x, p) (B,)."""
        return self.energy + self.metric.hamiltonian_terms(p)


def _moved(new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """The largest change of a fixed-point iteration per chain, relative to 1 + |new| (B,)."""
    return ((new - old).abs() / (1 + new.abs())).amax(1).nan_to_num(math.inf)


class SoftAbsHMC(Sampler[TunedState]):
    """Riemannian manifold HMC with the SoftAbs metric (Betancourt 2013): momenta with
    the covariance of the energy's smoothed absolute Hessian at each position,
    integrated by the generalised leapfrog.

    For posteriors of tens of coordinates whose curvature changes from place to place,
    such as a centred hierarchical model or a funnel, where no one mass (NUTS,
    AdaptiveHMC) fits: the metric rescales each direction where the chain is. The
    energy must be twice differentiable by autograd. Each chain's step size is tuned by
    dual averaging through the whole burn-in (no mass: the metric replaces it), and
    chains that stay stuck or far behind are restarted at the window ends, as NUTS's
    (:class:`~ebmlab.samplers.adaptation.WarmupTuning`).

    Args:
        step_size: initial step size (in the metric's units, where a Gaussian target has
            unit scale, so about 1 fits most targets).
        n_leapfrog: generalised leapfrog steps per trajectory.
        softabs: alpha, the SoftAbs sharpness: eigenvalues of the Hessian are replaced by
            lambda coth(alpha lambda), about |lambda| beyond 1 / alpha, and at least
            1 / alpha (how far a flat or concave direction may be stepped).
        fixed_point_steps: iterations of each implicit update (at least 2).
        tolerance: if given, the largest relative change of an implicit update's last
            iteration for the trajectory to count as solved (else it is divergent and
            rejected); None uses every solve as it ends.
        target_accept: mean acceptance probability each chain's step size is tuned to
            (higher: fewer divergent trajectories, shorter ones; on the centred eight
            schools 0.8 mixes best, docs/results/posteriors.md).
        jitter: each chain's step size is drawn uniformly in step_size [1 - jitter,
            1 + jitter] every step, which avoids periodic trajectories.
        divergence_threshold: energy error beyond which a trajectory is divergent.
    """

    def __init__(
        self,
        step_size: float = 0.5,
        n_leapfrog: int = 8,
        *,
        softabs: float = 10.0,
        fixed_point_steps: int = 6,
        tolerance: float | None = None,
        target_accept: float = 0.8,
        jitter: float = 0.1,
        divergence_threshold: float = 1000.0,
    ) -> None:
        self.step_size = _checks.positive("step_size", step_size)
        self.n_leapfrog = _checks.positive_int("n_leapfrog", n_leapfrog)
        self.alpha = _checks.positive("softabs", softabs)
        self.fixed_point_steps = _checks.positive_int("fixed_point_steps", fixed_point_steps)
        if fixed_point_steps < 2:
            raise ArgumentError(
                "fixed_point_steps must be >= 2 (one to step, one to check), got "
                f"{fixed_point_steps}"
            )
        self.tolerance = None if tolerance is None else _checks.positive("tolerance", tolerance)
        self.jitter = _checks.below_one("jitter", jitter)
        self.divergence_threshold = _checks.positive("divergence_threshold", divergence_threshold)
        self.tuning = WarmupTuning(target_accept, adapt_mass=False, keep_step_average=True)

    def init(self, x0: torch.Tensor, energy: EnergyFn) -> TunedState:
        start = SamplerState.start(x0.detach().clone(), None, None, 0).evaluated(energy)
        return self.tuning.initial(start, self.step_size, TunedState)

    def begin_warmup(self, state: TunedState, n_steps: int) -> TunedState:
        if n_steps == 0:
            return state
        return self.tuning.begin(self.tuning.finite_starts(state), n_steps)

    def end_warmup(self, state: TunedState) -> TunedState:
        return self.tuning.finish(state)

    def tempered(self, beta: torch.Tensor) -> SoftAbsHMC:
        """This kernel for per-chain tempered energies beta E: the metric follows beta E
        by itself; the tuning groups the chains by beta (no restarts across them)."""
        return self._with(tuning=self.tuning.tempered(beta))

    def grad_evals_per_step(self, dim: int) -> int:
        """Backward passes per transition for chains of ``dim`` coordinates: D + 1 at the
        start, k (D + 2) + 1 per leapfrog step."""
        return dim + 1 + self.n_leapfrog * (self.fixed_point_steps * (dim + 2) + 1)

    def leapfrog(
        self, energy: FlatEnergy, start: Geometry, p: torch.Tensor, step: torch.Tensor
    ) -> tuple[Geometry, torch.Tensor, torch.Tensor]:
        """One generalised leapfrog step of size ``step`` (B, 1) from ``start`` with
        momentum ``p`` (B, D) (Girolami & Calderhead 2011, eqs. 16-18): the end's
        geometry, its momentum, and the chains (B,) whose step failed (a position or
        Hessian not finite, or given a ``tolerance``, an implicit update not solved to
        it).

        Args:
            energy: E of flat chains, (B, D) -> (B,).
        """
        half = step / 2
        p_half = p - half * start.force(p)
        for _ in range(self.fixed_point_steps - 1):
            p_last, p_half = p_half, p - half * start.force(p_half)
        x = start.x.detach()
        v0 = start.metric.velocity(p_half)
        x_new = x + step * v0  # the first iteration: the metric at x_new = x
        failed = torch.zeros_like(x[:, 0], dtype=torch.bool)
        for _ in range(self.fixed_point_steps - 1):
            metric = Geometry.at(energy, x_new, self.alpha, graph=False).metric
            failed = failed | ~metric.finite
            x_last, x_new = x_new, x + half * (v0 + metric.velocity(p_half))
        if self.tolerance is not None:
            unsolved = torch.maximum(_moved(p_half, p_last), _moved(x_new, x_last))
            failed = failed | (unsolved > self.tolerance)
        failed = failed | ~x_new.isfinite().all(1)
        x_new = torch.where(failed[:, None], x, x_new)  # keeps the batch finite
        end = Geometry.at(energy, x_new, self.alpha, graph=True)
        p_new = p_half - half * end.force(p_half)
        return end, p_new, failed | ~end.metric.finite

    def step(
        self, state: TunedState, energy: EnergyFn, generator: torch.Generator | None = None
    ) -> TunedState:
        x = state.x
        shape = x.shape

        def flat(z: torch.Tensor) -> torch.Tensor:
            return energy(z.view(len(z), *shape[1:]))

        n = len(x)
        u = torch.rand(n, generator=generator, device=x.device, dtype=x.dtype)
        base = torch.as_tensor(state.step_size, dtype=x.dtype, device=x.device).expand(n)
        step = (base * (1 + self.jitter * (2 * u - 1))).unsqueeze(1)
        here = Geometry.at(flat, x.flatten(1), self.alpha, graph=True)
        p = here.metric.momentum(gaussian_noise(here.x.detach(), generator))
        h0 = here.hamiltonian(p)
        geometry, failed = here, ~here.metric.finite
        for _ in range(self.n_leapfrog):
            geometry, p, broke = self.leapfrog(flat, geometry, p, step)
            failed = failed | broke
        h1 = geometry.hamiltonian(p)
        divergent = failed | ~torch.isfinite(h1) | (h1 - h0 > self.divergence_threshold)
        log_ratio = torch.where(divergent, -math.inf, h0 - h1)
        new = metropolis_update(
            state, geometry.x.detach().view(shape), geometry.energy, geometry.grad.view(shape),
            log_ratio, generator, n_grad_evals=self.grad_evals_per_step(x[0].numel()),
            divergent=divergent,
        )  # fmt: skip
        return self.tuning.update(state, new)
