"""Gibbs sampling for binary variables.

:class:`Gibbs` updates one site at a time from its exact conditional,
p(x_i = 1 | x_-i) = sigmoid(E(x_i = 0) - E(x_i = 1)). That works for any energy on
{0, 1}^D at the cost of two energy evaluations per site. A pairwise energy
E(x) = -x^T W x - b^T x (W symmetric with zero diagonal: a Boltzmann machine, seed
002 eq. 6.32) offers ``couplings() -> (W, b)``, and then the log-odds are
2 W_i . x + b_i, one product per site; the sweep's uniform draws are turned into
log-odds thresholds in one pass, so a site costs a product and a comparison.
:class:`BlockGibbs` alternates h ~ p(h | v), v ~ p(v | h)
for bipartite models (RBMs, Tomczak 2024, eqs. 6.38-6.39); the hidden logits computed
for the free energy are reused by the next step, so a step costs two products
with W.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.energies.base import EnergyFn
from ebmlab.samplers.base import Sampler, SamplerState


def _check_binary(x0: torch.Tensor) -> torch.Tensor:
    if not ((x0 == 0) | (x0 == 1)).all():
        raise ArgumentError("x0 must be binary: every value 0 or 1")
    return x0.detach().clone()


class Gibbs(Sampler[SamplerState]):
    """Single-site Gibbs sampling on {0, 1}^D; one step is one sweep of D updates.

    Args:
        scan: ``"sequential"`` visits sites 0..D-1 in order; ``"random"`` draws D
            sites uniformly with replacement.
        model: optional pairwise model with ``couplings() -> (W, b)`` (the energy
            being sampled must be its energy; in ``ParallelTempering`` keep
            ``scale_steps=True``, which hands the kernel each replica's beta); without
            it the conditional comes from energy differences of the energy being sampled.
    """

    def __init__(self, scan: str = "sequential", model: object | None = None) -> None:
        self.scan = _checks.one_of("scan", scan, ["sequential", "random"])
        if model is not None and not hasattr(model, "couplings"):
            raise ArgumentError("model must provide couplings() -> (W, b)")
        self.model = model
        self.beta: torch.Tensor | None = None  # per-chain inverse temperatures (tempered)

    def tempered(self, beta: torch.Tensor) -> Gibbs:
        """Sites drawn from the conditionals of beta E (the model's log-odds times beta)."""
        return self._with(beta=beta)

    @staticmethod
    def _energy_log_odds(flat: torch.Tensor, shape, i: int, energy: EnergyFn) -> torch.Tensor:
        """E(x_i = 0) - E(x_i = 1): two energy evaluations."""
        on, off = flat.clone(), flat.clone()
        on[:, i] = 1.0
        off[:, i] = 0.0
        return energy(off.view(shape)) - energy(on.view(shape))

    def replayable(self, state: SamplerState) -> bool:
        """Sweeps from any ``state`` alike (a random scan draws its sites on the device)."""
        return True

    def init(self, x0: torch.Tensor, energy: EnergyFn) -> SamplerState:
        x = _check_binary(x0)
        with torch.no_grad():
            e = energy(x)
        return SamplerState.start(x, e, None, n_grad_evals=0)

    def step(
        self, state: SamplerState, energy: EnergyFn, generator: torch.Generator | None = None
    ) -> SamplerState:
        shape = state.x.shape
        flat = state.x.reshape(shape[0], -1).clone()
        d = flat.shape[1]
        # the sites in visiting order: Python ints, or (random scan) 0-d tensors on the
        # device, so that the order is never read back to the host
        random_sites = (
            None
            if self.scan == "sequential"
            else torch.randint(d, (d,), generator=generator, device=flat.device)
        )
        sites = range(d) if random_sites is None else random_sites.unbind()
        with torch.no_grad():
            # x_i = 1 with probability sigmoid(logit) <=> logit(u) < logit, u ~ U(0, 1)
            u = torch.rand(d, shape[0], generator=generator, dtype=flat.dtype, device=flat.device)
            thresholds = torch.logit(u)
            if self.model is not None:
                w, b = self.model.couplings()
                if random_sites is not None:
                    w, b = w[random_sites], b[random_sites]
                rows = 2 * w.to(flat.dtype)  # the log-odds' weights, site by site
                if self.beta is not None:  # beta (2 W_i . x + b_i) > logit(u)
                    thresholds /= self.beta.to(flat.dtype)
                thresholds -= b.to(flat.dtype)[:, None]
                units = flat.t().contiguous()  # a site's values are a contiguous row
                for i, row, threshold in zip(sites, rows, thresholds, strict=True):
                    _set_row(units, i, torch.mv(units.t(), row) > threshold)
                flat = units.t().contiguous()
            else:
                for k, i in enumerate(sites):
                    value = self._energy_log_odds(flat, shape, i, energy) > thresholds[k]
                    _set_row(flat.t(), i, value)
            x = flat.view(shape)
            e = energy(x)
        return state.taken(x=x, energy=e)


def _set_row(x: torch.Tensor, i: int | torch.Tensor, value: torch.Tensor) -> None:
    """x[i] = value, for a site given as an int or as a 0-d tensor on x's device."""
    if isinstance(i, int):
        x[i] = value
    else:
        x.index_copy_(0, i.view(1), value.to(x.dtype).unsqueeze(0))


@dataclass(frozen=True)
class BlockGibbsState(SamplerState):
    """Visible states with the hidden logits c + v^T W cached for the next step."""

    hidden_logits: torch.Tensor | None = None


class BlockGibbs(Sampler[BlockGibbsState]):
    """Alternating block Gibbs for a bipartite model with Bernoulli hidden units.

    ``model`` provides ``hidden_logits(v)``, ``sample_visible(h, generator)`` and
    ``free_energy_from_logits(v, hidden_logits)`` (e.g. :class:`~ebmlab.energies.BernoulliRBM`);
    the chain's energy is the model's free energy, whatever energy is passed in.
    """

    def __init__(self, model: object) -> None:
        for method in ("hidden_logits", "sample_visible", "free_energy_from_logits"):
            if not hasattr(model, method):
                raise ArgumentError(f"model must provide {method}(...) for block Gibbs")
        self.model = model

    def replayable(self, state: BlockGibbsState) -> bool:
        """Steps from any ``state`` alike."""
        return True

    def init(self, x0: torch.Tensor, energy: EnergyFn) -> BlockGibbsState:
        v = _check_binary(x0)
        with torch.no_grad():
            logits = self.model.hidden_logits(v)
            e = self.model.free_energy_from_logits(v, logits)
        start = SamplerState.start(v, e, None, n_grad_evals=0)
        return start.as_kind(BlockGibbsState, hidden_logits=logits)

    def step(
        self, state: BlockGibbsState, energy: EnergyFn, generator: torch.Generator | None = None
    ) -> BlockGibbsState:
        logits = state.hidden_logits
        with torch.no_grad():
            u = torch.rand(
                logits.shape, generator=generator, dtype=logits.dtype, device=logits.device
            )
            h = (u < torch.sigmoid(logits)).to(logits.dtype)
            v = self.model.sample_visible(h, generator).view(state.x.shape)
            logits = self.model.hidden_logits(v)
            e = self.model.free_energy_from_logits(v, logits)
        return state.taken(x=v, energy=e, hidden_logits=logits)
