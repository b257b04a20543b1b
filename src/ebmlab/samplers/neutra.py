"""Neural transport: sampling in the latent space of a learned map (NeuTra; Hoffman,
Sountsov, Dillon, Langmore, Tran & Vasudevan 2019, "NeuTra-lizing bad geometry in
Hamiltonian Monte Carlo using neural transport").

A hierarchical posterior's funnel couples scales: in the centred eight schools the
school effects spread as tau, so no one mass fits both the funnel's mouth and its neck.
Non-centring the model by hand (theta = mu + tau eta) removes the coupling. NeuTra learns
such a change of variables instead. An inverse autoregressive flow (Kingma et al. 2016)
x = T(z) with z ~ N(0, I) is fitted to exp(-E) by variational inference, maximising a
bound on log Z (Hoffman et al. 2019, eq. 2, importance-weighted as Burda et al. 2016
weight it: :func:`fit_flow`), and the chains then run in z on the pulled-back energy

    E_z(z) = E(T(z)) - log |det dT/dz (z)|,

whose draws T maps back: exact for any T, since E_z is p's density in z. An affine
autoregressive layer sets coordinate i from the coordinates before it, x_i = m_i(z_<i)
+ exp(s_i(z_<i)) z_i (Kingma et al. 2016, eq. 10, with MADE's masks, Germain et al.
2015), so a layer can learn the conditional scale of each school's effect given mu and
tau, which is what non-centring fixes by hand.

The flow is fitted once, at the first step, from the step's generator; its gradient
evaluations (``fit_steps`` x ``fit_batch`` backward passes through E) count in the
run's ``n_grad_evals``. Where the fit leaves a residual funnel (the flow extrapolates
into a neck its draws rarely reached), the inner sampler still meets it: one that
halves its steps there (:class:`~ebmlab.samplers.WALNUTS`, the default) goes on
through it, where NUTS's trajectories end at divergences and its chains leave the neck
out. Even so the chains may visit the neck too rarely, together, which R-hat does not
see: a second seed is the check (docs/results/posteriors.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.energies.base import EnergyFn
from ebmlab.samplers.base import Sampler, SamplerState, StepInfo, diverged_rows
from ebmlab.samplers.walnuts import WALNUTS


class FlowFitError(FloatingPointError):
    """NeuTra's variational fit diverged, or its fitted flow cannot map a chain's start
    to a finite latent position."""


class _MaskedAffine(nn.Module):
    """One affine autoregressive layer: shift and log scale of coordinate i from the
    coordinates before it in ``order``, by a one-hidden-layer MADE (Germain et al. 2015)
    plus a masked linear skip. Both output layers start at zero: the layer starts as
    the identity."""

    def __init__(self, order: torch.Tensor, hidden: int, generator: torch.Generator | None,
                 like: torch.Tensor) -> None:  # fmt: skip
        super().__init__()
        d = len(order)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(d, device=order.device)
        unit = torch.arange(hidden, device=order.device) % max(d - 1, 1)
        kw = {"dtype": like.dtype, "device": like.device}
        self.register_buffer("rank", rank)
        self.register_buffer("mask_in", (unit[:, None] >= rank[None, :]).to(**kw))
        self.register_buffer("mask_out", (rank[:, None] > unit[None, :]).to(**kw).repeat(2, 1))
        self.register_buffer("mask_skip", (rank[:, None] > rank[None, :]).to(**kw).repeat(2, 1))
        bound = 1 / math.sqrt(d)
        init = torch.rand(hidden, d, generator=generator, **kw)
        self.w_in = nn.Parameter((2 * init - 1) * bound)
        self.b_in = nn.Parameter(torch.zeros(hidden, **kw))
        self.w_out = nn.Parameter(torch.zeros(2 * d, hidden, **kw))
        self.b_out = nn.Parameter(torch.zeros(2 * d, **kw))
        self.w_skip = nn.Parameter(torch.zeros(2 * d, d, **kw))

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.tanh(nn.functional.linear(z, self.w_in * self.mask_in, self.b_in))
        out = nn.functional.linear(h, self.w_out * self.mask_out, self.b_out)
        out = out + nn.functional.linear(z, self.w_skip * self.mask_skip)
        shift, log_scale = out.chunk(2, dim=-1)
        return shift, log_scale


class AutoregressiveFlow(nn.Module):
    """x = T(z): a diagonal affine map, then ``layers`` affine autoregressive layers in
    alternating orders (the coordinates' own, then reversed), each the identity at
    first (Kingma et al. 2016, eq. 10). ``forward`` gives x and log |det dT/dz| in one
    pass; ``inverse`` solves z from x, D passes per layer (each pass fixes one more
    coordinate).

    Args:
        dim: the number of coordinates D.
        layers: autoregressive layers after the affine one.
        hidden: hidden units of each layer's MADE.
        generator: the source of the first layers' random weights.
        like: a tensor whose dtype and device the flow takes.
    """

    def __init__(self, dim: int, layers: int, hidden: int, generator: torch.Generator | None,
                 like: torch.Tensor) -> None:  # fmt: skip
        super().__init__()
        kw = {"dtype": like.dtype, "device": like.device}
        self.loc = nn.Parameter(torch.zeros(dim, **kw))
        self.log_scale = nn.Parameter(torch.zeros(dim, **kw))
        order = torch.arange(dim, device=like.device)
        self.steps = nn.ModuleList(
            _MaskedAffine(order.flip(0) if k % 2 else order, hidden, generator, like)
            for k in range(layers)
        )

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.loc + self.log_scale.exp() * z
        log_det = self.log_scale.sum().expand(len(z))
        for step in self.steps:
            shift, log_scale = step(x)
            x = shift + log_scale.exp() * x
            log_det = log_det + log_scale.sum(-1)
        return x, log_det

    def inverse(self, x: torch.Tensor) -> torch.Tensor:
        """z with T(z) = x, for x (B, D). Pass k solves the coordinate of rank k from
        those before it; the coordinates not yet solved are held at zero, since a
        guess there can overflow, and a masked weight times an infinite input is NaN."""
        y = x
        for step in reversed(self.steps):
            z = torch.zeros_like(y)
            for k in range(y.shape[-1]):
                shift, log_scale = step(z)
                solved = (y - shift) * (-log_scale).exp()
                z = torch.where(step.rank <= k, solved, z)
            y = z
        return (y - self.loc) * (-self.log_scale).exp()


def fit_flow(
    energy: EnergyFn,
    flow: AutoregressiveFlow,
    event: torch.Size,
    steps: int,
    batch: int,
    samples: int,
    learning_rate: float,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """Fit ``flow`` to exp(-E) by variational inference: Adam on ``batch`` draws z ~
    N(0, I) per step, the rate annealed by a cosine. The objective is the
    importance-weighted bound (Burda, Grosse & Salakhutdinov 2016, eq. 8) over groups
    of ``samples`` draws, log (1/K) sum_k w_k with log w = -E(T(z)) + log |det dT/dz| -
    log N(z; 0, I); with ``samples`` = 1 it is the evidence lower bound, whose maximum
    minimises KL(q || p) (Hoffman et al. 2019, eq. 2) and tends to leave the target's
    tails out, and more samples make the fitted q cover more of them. Draws whose
    energy is not finite get zero weight. Returns the bound over the last tenth of the
    steps (a 0-d tensor), at most log Z.

    Args:
        energy: E, a callable (B, *event) -> (B,).
        flow: the flow, changed in place.
        event: the shape of one chain's position.
        steps: optimiser steps.
        batch: draws per step, a multiple of ``samples``.
        samples: draws per importance-weighted term (K).
        learning_rate: Adam's initial rate.
        generator: the source of the draws.
    """
    first = flow.loc
    dim = len(first)
    optimiser = torch.optim.Adam(flow.parameters(), lr=learning_rate)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, steps)
    recent = first.new_zeros(())
    tail = max(steps // 10, 1)
    with torch.enable_grad():
        for i in range(steps):
            z = torch.randn(batch, dim, generator=generator, dtype=first.dtype,
                            device=first.device)  # fmt: skip
            x, log_det = flow(z)
            log_q = -0.5 * (z * z).sum(-1) - 0.5 * dim * math.log(2 * math.pi) - log_det
            log_w = -energy(x.view(batch, *event)) - log_q
            finite = log_w.isfinite()
            if i == 0 and not bool(finite.any()):
                raise ArgumentError(
                    f"energy is not finite at any of {batch} draws of the flow's first "
                    f"fit step, e.g. at {x[0].detach().tolist()}: it must be finite "
                    "near the origin"
                )
            log_w = torch.where(finite, log_w, -math.inf).view(-1, samples)
            bound = torch.logsumexp(log_w, 1) - math.log(samples)
            counted = bound.isfinite()
            bound = torch.where(counted, bound, 0.0).sum() / counted.sum().clamp(min=1)
            optimiser.zero_grad(set_to_none=True)
            (-bound).backward()
            # a draw whose energy overflows gives NaN gradients even at zero weight:
            # such a step leaves the weights' gradients at zero (on the device)
            grads = [p.grad for p in flow.parameters() if p.grad is not None]
            ok = torch.stack([g.isfinite().all() for g in grads]).all()
            for g in grads:
                g.copy_(torch.where(ok, g, 0.0))
            optimiser.step()
            schedule.step()
            if i >= steps - tail:
                recent = recent + bound.detach() / tail
    flow.requires_grad_(False)
    if not bool(torch.stack([p.isfinite().all() for p in flow.parameters()]).all()):
        raise FlowFitError(
            "the flow's variational fit diverged (non-finite weights); a smaller "
            "learning_rate keeps it finite"
        )
    return recent


@dataclass(frozen=True)
class NeuTraState(SamplerState):
    """The chains in x (``x``, with E(x) in ``energy``; no gradient: the chains move in
    z), and while they run: the inner sampler's state in the flow's latent space
    (``inner``), the fitted ``flow`` and its bound on log Z (``fit_elbo``), each chain's
    share of the fit's gradient evaluations (``fit_share``, (B,)), the burn-in the inner
    sampler plans for and whether it has ended."""

    inner: SamplerState | None = None
    flow: AutoregressiveFlow | None = None
    fit_elbo: torch.Tensor | None = None
    fit_share: torch.Tensor | None = None
    burn_in: int = 0
    warmed: bool = False

    @property
    def step_size(self) -> float | torch.Tensor | None:
        """The inner sampler's step size (named in stuck-chain warnings)."""
        return getattr(self.inner, "step_size", None)

    @property
    def inv_mass(self) -> torch.Tensor | None:
        """The inner sampler's inverse mass, in the flow's latent space."""
        return getattr(self.inner, "inv_mass", None)

    @property
    def chain_grad_evals(self) -> torch.Tensor | None:
        """Per chain, the gradient evaluations its own transitions used (the inner
        sampler's count) plus its share of the fit's (None before the fit)."""
        if self.inner is None or self.fit_share is None:
            return None
        used = getattr(self.inner, "chain_grad_evals", None)
        return (self.inner.n_grad_evals if used is None else used) + self.fit_share


class NeuTra(Sampler[NeuTraState]):
    """Any sampler run in the latent space of an autoregressive flow fitted to
    exp(-E) by variational inference (Hoffman et al. 2019): for hierarchical
    posteriors whose funnels defeat one mass, as the centred eight schools.

    ``NeuTra().run(energy, x0, 300, burn_in=300, thin=1)`` fits the flow at the first
    step, maps the starts x0 into the latent space, runs the inner sampler there
    (warm-up included) and returns the draws mapped back. The fit costs ``fit_steps``
    x ``fit_batch`` gradients once.

    One autoregressive layer, in the coordinates' own order, is the default: it sets
    each coordinate's scale from those before it, which is what non-centring a model
    whose hyperparameters come first does (theta = mu + tau eta). More layers, in
    alternating orders, can fit more shapes, but on a funnel they learned the scales
    less well and extrapolated them worse into the neck, where the chains then stall
    (docs/results/posteriors.md, "A learned change of variables").

    Args:
        sampler: the sampler run in the latent space (default: :class:`WALNUTS`, whose
            halved steps handle what the flow leaves of a funnel).
        layers: autoregressive layers of the flow.
        hidden: hidden units of each layer.
        fit_steps: Adam steps of the variational fit.
        fit_batch: draws per fit step (a multiple of ``fit_samples``).
        fit_samples: draws per importance-weighted term of the fit's bound (1: the
            evidence lower bound, which tends to leave a funnel's neck out of the
            flow).
        learning_rate: Adam's initial rate (annealed by a cosine to 0).
    """

    def __init__(
        self,
        sampler: Sampler | None = None,
        *,
        layers: int = 1,
        hidden: int = 64,
        fit_steps: int = 4000,
        fit_batch: int = 256,
        fit_samples: int = 8,
        learning_rate: float = 3e-2,
    ) -> None:
        self.sampler = (
            WALNUTS() if sampler is None
            else _checks.instance("sampler", sampler, Sampler, "an ebmlab Sampler")
        )  # fmt: skip
        self.layers = _checks.positive_int("layers", layers)
        self.hidden = _checks.positive_int("hidden", hidden)
        self.fit_steps = _checks.positive_int("fit_steps", fit_steps)
        self.fit_batch = _checks.positive_int("fit_batch", fit_batch)
        self.fit_samples = _checks.positive_int("fit_samples", fit_samples)
        if fit_batch % fit_samples:
            raise ArgumentError(
                f"fit_batch must be a multiple of fit_samples ({fit_samples}), got {fit_batch}"
            )
        self.learning_rate = _checks.positive("learning_rate", learning_rate)

    def init(self, x0: torch.Tensor, energy: EnergyFn) -> NeuTraState:
        x = x0.detach().clone()
        with torch.no_grad():
            e = energy(x)
        return NeuTraState.start(x, e, None, 0)

    def begin_warmup(self, state: NeuTraState, n_steps: int) -> NeuTraState:
        return state.replace(burn_in=n_steps)

    def end_warmup(self, state: NeuTraState) -> NeuTraState:
        if state.inner is not None:
            return state.replace(inner=self.sampler.end_warmup(state.inner), warmed=True)
        return state.replace(warmed=True)

    def pulled_back(self, energy: EnergyFn, flow: AutoregressiveFlow,
                    event: torch.Size) -> EnergyFn:  # fmt: skip
        """E_z(z) = E(T(z)) - log |det dT/dz|, the energy the inner sampler runs on.

        Args:
            energy: E, a callable (B, *event) -> (B,).
            flow: the fitted flow T.
            event: the shape of one chain's position.
        """

        def latent(z: torch.Tensor) -> torch.Tensor:
            x, log_det = flow(z)
            return energy(x.view(len(z), *event)) - log_det

        return latent

    def step(
        self, state: NeuTraState, energy: EnergyFn, generator: torch.Generator | None = None
    ) -> NeuTraState:
        event = state.x.shape[1:]
        if state.inner is None:
            state = self._fitted(state, energy, generator)
        assert state.inner is not None and state.flow is not None
        latent = self.pulled_back(energy, state.flow, event)
        inner = self.sampler.step(state.inner, latent, generator)
        with torch.no_grad():
            x, log_det = state.flow(inner.x)
        most = -(-self.fit_steps * self.fit_batch // len(x))  # the largest fit share
        info = inner.info
        return state.replace(
            x=x.view_as(state.x),
            energy=inner.energy + log_det,
            accepted=inner.accepted,
            divergent=inner.divergent,
            n_grad_evals=inner.n_grad_evals + most,
            t=state.t + 1,
            info=StepInfo(state.energy, info.log_ratio, info.divergent_flags) if info else None,
            inner=inner,
        )

    def _fit_share(self, chains: int, device: torch.device) -> torch.Tensor:
        """The fit's gradient evaluations spread over the chains, (B,): they sum to
        ``fit_steps * fit_batch``."""
        total = self.fit_steps * self.fit_batch
        share = torch.full((chains,), total // chains, dtype=torch.long, device=device)
        return share + (torch.arange(chains, device=device) < total % chains)

    def _fitted(
        self, state: NeuTraState, energy: EnergyFn, generator: torch.Generator | None
    ) -> NeuTraState:
        """``state`` with the flow fitted and the inner sampler started from the
        chains' positions mapped into the latent space (its warm-up planned, and
        ended if the outer one has)."""
        flat = state.x.flatten(1)
        flow = AutoregressiveFlow(flat.shape[1], self.layers, self.hidden, generator, flat)
        loss = fit_flow(energy, flow, state.x.shape[1:], self.fit_steps, self.fit_batch,
                        self.fit_samples, self.learning_rate, generator)  # fmt: skip
        with torch.no_grad():
            z0 = flow.inverse(flat)
        lost = diverged_rows(z0).nonzero().flatten()
        if len(lost):
            i = int(lost[0])
            raise FlowFitError(
                f"the fitted flow maps chain {i}'s start {flat[i].tolist()} to a non-finite "
                "latent position; start the chains nearer the posterior's bulk"
            )
        latent = self.pulled_back(energy, flow, state.x.shape[1:])
        inner = self.sampler.begin_warmup(self.sampler.init(z0, latent), state.burn_in)
        if state.warmed:
            inner = self.sampler.end_warmup(inner)
        share = self._fit_share(len(flat), flat.device)
        return state.replace(inner=inner, flow=flow, fit_elbo=loss, fit_share=share)
