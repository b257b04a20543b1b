"""Approximate inference on pairwise discrete energies: annealed Gibbs, ICM, mean field.

A batch of answers y in {0, ..., K-1}^D has energy

    E(y) = sum_i U[i, y_i] + sum_{i < j} P[i, j, y_i, y_j],

with unary energies U (B, D, K) that may depend on the input X, and pairwise energies
P (D, D, K, K) shared by the batch (P[i, j, a, b] = P[j, i, b, a], zero blocks on the
diagonal). Chains (:func:`~ebmlab.inference.viterbi` solves them exactly) and Boltzmann
machines over binary answers (Tomczak 2024, eq. 6.32) are special cases. When D is too
large to enumerate and the graph has loops, the argmin of LeCun et al. (2006, §6) is
approximated by

- :func:`annealed_gibbs`: single-site Gibbs sweeps at inverse temperatures rising from
  ``beta_start`` to ``beta_end`` (simulated annealing), keeping the lowest energy seen;
- :func:`icm`: iterated conditional modes (Besag 1986), coordinate descent to a state
  that no single-site change improves;
- :func:`mean_field`: the factorised q(y) = prod_i q_i(y_i) minimising the variational
  free energy at inverse temperature beta, by sequential coordinate updates; the answer
  is the mode of each q_i.

Each site update needs the conditional energies E(y_i = a | y_-i) = U[i, a] +
sum_j P[i, j, a, y_j], one small matrix product per site.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.convergence import RESOLUTION_ULPS, warn_unconverged, working_tol


class PairwiseMRF:
    """A batch of pairwise energies over D discrete variables with K states each.

    Args:
        unary: the energy of each state of each variable, (B, D, K).
        pairwise: P[i, j, a, b], the energy of variables i, j in states a, b, (D, D, K, K),
            symmetric (P[i, j, a, b] = P[j, i, b, a]).
    """

    def __init__(self, unary: torch.Tensor, pairwise: torch.Tensor) -> None:
        _checks.tensor("unary", unary, ndim=3, floating=True)
        _, d, k = unary.shape
        _checks.tensor("pairwise", pairwise, ndim=4, floating=True)
        if pairwise.shape != (d, d, k, k):
            raise ArgumentError(
                f"pairwise must have shape {(d, d, k, k)}, got {tuple(pairwise.shape)}"
            )
        if not torch.allclose(pairwise, pairwise.permute(1, 0, 3, 2), atol=1e-6):
            raise ArgumentError("pairwise must be symmetric: P[i, j, a, b] == P[j, i, b, a]")
        self.unary = unary
        self.pairwise = pairwise
        # M[(i, a), (j, b)] = P[i, j, a, b], symmetric: site i's conditional energies are
        # q M[:, i K:(i + 1) K], and the pairwise energy is q M q^T / 2
        self._matrix = pairwise.permute(0, 2, 1, 3).reshape(d * k, d * k)

    @property
    def n_sites(self) -> int:
        return self.unary.shape[1]

    @property
    def n_states(self) -> int:
        return self.unary.shape[2]

    @classmethod
    def from_chain(cls, unary: torch.Tensor, transition: torch.Tensor) -> PairwiseMRF:
        """The chain energy sum_t U[t, y_t] + sum_t T[y_{t-1}, y_t] (see ``inference.chain``).

        Args:
            unary: U, the energy of each state at each position, (B, T, K).
            transition: the energy of each pair of consecutive states, (K, K).
        """
        _checks.tensor("unary", unary, ndim=3, floating=True)
        _, t, k = unary.shape
        _checks.tensor("transition", transition, ndim=2, last_dims=(k, k), floating=True)
        pairwise = unary.new_zeros(t, t, k, k)
        steps = torch.arange(t - 1, device=unary.device)
        pairwise[steps, steps + 1] = transition
        pairwise[steps + 1, steps] = transition.T
        return cls(unary, pairwise)

    @classmethod
    def from_binary(cls, field: torch.Tensor, coupling: torch.Tensor) -> PairwiseMRF:
        """E(y) = -(y^T W y + b^T y) on {0, 1}^D (eq. 6.32), W symmetric with zero diagonal,
        with a field b (B, D) per example.

        Args:
            coupling: W (D, D).
        """
        _checks.tensor("field", field, ndim=2, floating=True)
        d = field.shape[1]
        _checks.tensor("coupling", coupling, ndim=2, last_dims=(d, d), floating=True)
        unary = torch.stack([torch.zeros_like(field), -field], 2)
        pairwise = field.new_zeros(d, d, 2, 2)
        pairwise[:, :, 1, 1] = -2 * (coupling - torch.diag(torch.diagonal(coupling)))
        return cls(unary, pairwise)

    def detach(self) -> PairwiseMRF:
        """The same energy cut from the autograd graph (for inference inside training)."""
        return PairwiseMRF(self.unary.detach(), self.pairwise.detach())

    def augmented(self, y: torch.Tensor, margin: float) -> PairwiseMRF:
        """E(y') - margin * Hamming(y', y): its argmin is the most offending answer of the
        margin-rescaled hinge loss."""
        penalty = margin * (1 - F.one_hot(y.long(), self.n_states).to(self.unary.dtype))
        return PairwiseMRF(self.unary - penalty, self.pairwise)

    def energy(self, y: torch.Tensor) -> torch.Tensor:
        """E(y) for answers ``y`` (B, D) of integer states; differentiable in U and P."""
        onehot = F.one_hot(y.long(), self.n_states).to(self.unary.dtype)
        return self.expected_energy(onehot)

    def expected_energy(self, q: torch.Tensor) -> torch.Tensor:
        """E under a factorised q (B, D, K) (one-hot q gives E(y)), (B,)."""
        flat = q.flatten(1)
        return (self.unary * q).sum((1, 2)) + 0.5 * ((flat @ self._matrix) * flat).sum(1)

    def site_energies(self, q: torch.Tensor, i: int) -> torch.Tensor:
        """Energies (B, K) of each state of site i given the others (one-hot or q)."""
        k = self.n_states
        return self.unary[:, i] + q.flatten(1) @ self._matrix[:, i * k : (i + 1) * k]

    def _start(self, y0: torch.Tensor | None) -> torch.Tensor:
        if y0 is None:
            return self.unary.argmin(2)
        _checks.tensor("y0", y0, ndim=2, last_dims=(self.n_sites,))
        if y0.shape[0] != self.unary.shape[0]:
            raise ArgumentError(f"y0 must have {self.unary.shape[0]} rows, got {y0.shape[0]}")
        return y0.long()


def annealed_gibbs(
    mrf: PairwiseMRF,
    n_sweeps: int = 50,
    *,
    beta_start: float = 0.1,
    beta_end: float = 10.0,
    y0: torch.Tensor | None = None,
    generator: torch.Generator | int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Approximate argmin by simulated annealing with Gibbs sweeps.

    Sweep s samples every site from p(y_i | y_-i) proportional to exp(-beta_s E(y_i | y_-i)),
    with beta rising geometrically from ``beta_start`` to ``beta_end``; the lowest-energy
    state visited by each chain is returned with its energy ((B, D), (B,)). With
    ``beta_start == beta_end == 1`` it is plain Gibbs sampling from exp(-E) (returning the
    last state instead of the best).

    Args:
        mrf: the pairwise model (a :class:`PairwiseMRF`).
        n_sweeps: Gibbs sweeps, at inverse temperatures rising geometrically.
        y0: starting states (B, D) (default: random).
        generator: source of randomness, a ``torch.Generator`` on the data's device
            (``None``: the global one).
    """
    _checks.positive_int("n_sweeps", n_sweeps)
    _checks.positive("beta_start", beta_start)
    _checks.positive("beta_end", beta_end)
    gen = _checks.generator("generator", generator, mrf.unary.device)
    sampling = beta_start == beta_end == 1.0
    ratio = (beta_end / beta_start) ** (1 / max(1, n_sweeps - 1))
    with torch.no_grad():
        y = mrf._start(y0).clone()
        q = F.one_hot(y, mrf.n_states).to(mrf.unary.dtype)
        best, best_e = y.clone(), mrf.energy(y)
        for s in range(n_sweeps):
            beta = beta_start * ratio**s
            for i in range(mrf.n_sites):
                logits = -beta * mrf.site_energies(q, i)
                u = torch.rand(
                    logits.shape, generator=gen, dtype=logits.dtype, device=logits.device
                )
                _set_site(y, q, i, (logits - torch.log(-torch.log(u.clamp_min(1e-30)))).argmax(1))
            if not sampling:
                e = mrf.energy(y)
                better = e < best_e
                best[better], best_e = y[better], torch.where(better, e, best_e)
        return (y, mrf.energy(y)) if sampling else (best, best_e)


def _set_site(y: torch.Tensor, q: torch.Tensor, i: int, states: torch.Tensor) -> None:
    """Set site i of the answers and of their one-hot codes."""
    y[:, i] = states
    q[:, i] = F.one_hot(states, q.shape[2]).to(q.dtype)


def icm(
    mrf: PairwiseMRF, *, y0: torch.Tensor | None = None, max_sweeps: int = 100
) -> tuple[torch.Tensor, torch.Tensor]:
    """Iterated conditional modes: set each site to its lowest-energy state given the
    others, sweeping until nothing changes (a local minimum under single-site moves) or
    ``max_sweeps``. Starts from ``y0`` or the unary argmin; returns (answers, energies).

    Args:
        mrf: the pairwise model (a :class:`PairwiseMRF`).
    """
    _checks.positive_int("max_sweeps", max_sweeps)
    with torch.no_grad():
        y = mrf._start(y0).clone()
        q = F.one_hot(y, mrf.n_states).to(mrf.unary.dtype)
        for _ in range(max_sweeps):
            changed = False
            for i in range(mrf.n_sites):
                local = mrf.site_energies(q, i)
                current = local.gather(1, y[:, i : i + 1]).squeeze(1)
                value, arg = local.min(1)
                # a gain within rounding noise is a tie: no move, on every CPU alike
                noise = RESOLUTION_ULPS * torch.finfo(local.dtype).eps * current.abs().clamp_min(1)
                move = value < current - noise
                if move.any():
                    changed = True
                    _set_site(y, q, i, torch.where(move, arg, y[:, i]))
            if not changed:
                break
        return y, mrf.energy(y)


def mean_field(
    mrf: PairwiseMRF,
    *,
    beta: float = 1.0,
    n_iter: int = 100,
    tol: float = 1e-6,
    q0: torch.Tensor | None = None,
) -> torch.Tensor:
    """Naive mean field at inverse temperature beta: q_i proportional to
    exp(-beta (U[i] + sum_j P[i, j] q_j)), updated site by site (each update lowers the
    variational free energy) until the largest change is below ``tol`` (raised to the
    dtype's resolution, :func:`ebmlab.convergence.working_tol`; a
    :class:`~ebmlab.convergence.ConvergenceWarning` when ``n_iter`` ends first). Returns q
    (B, D, K); ``q.argmax(2)`` is the answer, ``q`` approximates the marginals.

    Args:
        mrf: the pairwise model (a :class:`PairwiseMRF`).
        n_iter: most iterations.
        q0: starting marginals (D, S) (default: uniform).
    """
    _checks.positive("beta", beta)
    _checks.positive_int("n_iter", n_iter)
    with torch.no_grad():
        q = (
            torch.softmax(-beta * mrf.unary, 2)
            if q0 is None
            else _checks.tensor("q0", q0, ndim=3, last_dims=mrf.unary.shape[1:]).clone()
        )
        limit = working_tol(tol, q.dtype)  # marginals lie in [0, 1]
        for _ in range(n_iter):
            delta = 0.0
            for i in range(mrf.n_sites):
                new = torch.softmax(-beta * mrf.site_energies(q, i), 1)
                delta = max(delta, float((new - q[:, i]).abs().max()))
                q[:, i] = new
            if delta < limit:
                break
        else:
            warn_unconverged("mean field", n_iter, delta, limit)
    return q


def mean_field_free_energy(mrf: PairwiseMRF, q: torch.Tensor, beta: float = 1.0) -> torch.Tensor:
    """Variational free energy E_q[E] - H(q)/beta, an upper bound on -(1/beta) log Z, (B,).

    Args:
        mrf: the pairwise model (a :class:`PairwiseMRF`).
    """
    entropy = -(q * q.clamp_min(1e-30).log()).sum((1, 2))
    return mrf.expected_energy(q) - entropy / beta
