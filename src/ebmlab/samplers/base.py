"""The sampler interface: ``init`` / ``step`` on an explicit, immutable state.

A sampler draws x ~ exp(-E(x)) / Z for any energy callable ``x -> (B,)``; each
batch row is an independent chain. ``init(x0, energy)`` makes the first state, which
caches the energy and gradient at x0 (Langevin leaves them to its first step: see
:meth:`SamplerState.evaluated`); ``step(state, energy, generator)`` returns the next
state, whose ``info`` (:class:`StepInfo`) says what that step did in each chain:
its acceptance probability, whether it diverged, the energy it started from.
``sample`` and ``run`` loop over steps (``run(..., trace=True)`` stacks every step's
info), and while they run the parameters of an ``nn.Module`` energy are excluded from
autograd (no parameter gradients are built), then restored.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

import torch
from torch import nn
from tqdm.auto import tqdm

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.devices import widen
from ebmlab.energies.base import (
    EnergyFn,
    EnergyLike,
    NoGradientError,
    as_energy_fn,
    energy_and_grad,
    energy_device,
)
from ebmlab.samplers import graphs as _graphs  # run() has a parameter named graphs
from ebmlab.samplers.diagnostics import SamplingWarning, rarely_moving

S = TypeVar("S", bound="SamplerState")
K = TypeVar("K", bound="Sampler")
D = TypeVar("D")


@functools.cache
def _field_names(kind: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(kind))


def replaced(record: D, **changes: Any) -> D:
    """A copy of the frozen dataclass ``record`` with the given fields changed: what
    :func:`dataclasses.replace` gives for these records (no ``__post_init__``, no
    init-only fields), without its call of ``__init__``, which sets every field through
    ``object.__setattr__``. A sampler step makes several such copies, and with small
    chains on a CPU their Python time is a share of the step's. Traced by
    ``torch.compile``, it is :func:`dataclasses.replace`, which the tracer knows."""
    if torch.compiler.is_compiling():
        return dataclasses.replace(record, **changes)
    names = _field_names(type(record))
    if not changes.keys() <= names:
        raise TypeError(f"{type(record).__name__} has no field {sorted(changes.keys() - names)}")
    twin = object.__new__(type(record))
    object.__setattr__(twin, "__dict__", {**record.__dict__, **changes})
    return twin


@dataclass(frozen=True)
class StepInfo:
    """What one step did in each chain, as (B,) tensors on the chains' device.

    ``energy`` is the energy E(x) of the chains at the step's start; ``log_ratio`` the
    log acceptance ratio of the step's proposal (``None``: a move that is always taken,
    as unadjusted Langevin's or Gibbs'); ``divergent_flags`` marks diverging trajectories
    (``None``: none). The derived :attr:`accept_prob` and :attr:`divergent` are computed
    when read, so a step that nobody inspects pays only for holding three references.
    """

    energy: torch.Tensor
    log_ratio: torch.Tensor | None = None
    divergent_flags: torch.Tensor | None = None

    TRACED: ClassVar[tuple[str, ...]] = ("accept_prob", "divergent", "energy")

    @property
    def accept_prob(self) -> torch.Tensor:
        """min(1, exp(log_ratio)) per chain (NaN counts as 0; 1 for moves always taken;
        for NUTS the mean over the trajectory's new points, as in Stan)."""
        if self.log_ratio is None:
            return torch.ones_like(self.energy)
        return self.log_ratio.clamp(max=0).exp().nan_to_num(0.0)

    @property
    def divergent(self) -> torch.Tensor:
        """Whether each chain's trajectory diverged, (B,) bool."""
        if self.divergent_flags is None:
            return torch.zeros_like(self.energy, dtype=torch.bool)
        return self.divergent_flags

    def first(self, n: int) -> StepInfo:
        """The info of the first ``n`` chains (parallel tempering's cold replicas)."""
        return StepInfo(
            self.energy[:n],
            None if self.log_ratio is None else self.log_ratio[:n],
            None if self.divergent_flags is None else self.divergent_flags[:n],
        )


@dataclass(frozen=True)
class SamplerState:
    """Chains' positions with their cached energy and gradient, and running counts.

    ``x`` holds the chains (B, ...), ``energy`` E(x) (B,), ``grad`` grad E(x) (x's
    shape). ``accepted`` counts accepted proposals per chain, ``divergent`` counts
    divergent trajectories per chain (Hamiltonian samplers); ``n_grad_evals``
    counts gradient evaluations per chain; ``t`` is the number of steps taken.
    ``grad`` is ``None`` for samplers that never use it. ``energy`` and ``grad`` are
    both ``None`` while they are left for later: a Langevin step needs the gradient at
    its start only, so it evaluates it there and n steps cost n gradients, not n + 1.
    ``info`` describes the step that made this state (``None`` before the first).
    """

    x: torch.Tensor
    energy: torch.Tensor | None
    grad: torch.Tensor | None
    accepted: torch.Tensor
    divergent: torch.Tensor
    n_grad_evals: int = 0
    t: int = 0
    info: StepInfo | None = None

    @classmethod
    def start(
        cls,
        x: torch.Tensor,
        energy: torch.Tensor | None,
        grad: torch.Tensor | None,
        n_grad_evals: int,
    ) -> SamplerState:
        """A fresh state at ``x`` (B, ...) with zero counts, its ``energy`` (B,) and
        ``grad`` (x's shape) if evaluated, and the ``n_grad_evals`` that cost."""
        zeros = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
        return cls(x, energy, grad, zeros, zeros.clone(), n_grad_evals, 0, None)

    def replace(self: S, **changes: Any) -> S:
        """A copy of the state with the given fields changed (states are immutable)."""
        return replaced(self, **changes)

    def evaluated(self: S, energy: EnergyFn) -> S:
        """This state with its energy and gradient at ``x`` filled in if they were left
        for later (one gradient evaluation), else the state itself."""
        if self.energy is not None:
            return self
        e, g = energy_and_grad(energy, self.x)
        return self.replace(energy=e, grad=g, n_grad_evals=self.n_grad_evals + 1)

    def as_kind(self, kind: type[S], **fields: Any) -> S:
        """This state's common fields as a ``kind`` state (a subclass adding fields)
        with the further ``fields``."""
        common = {f.name: getattr(self, f.name) for f in dataclasses.fields(SamplerState)}
        return kind(**common, **fields)

    def taken(self: S, **changes: Any) -> S:
        """The state after a move every chain takes (Gibbs, unadjusted dynamics): one
        step and one acceptance counted, the step's :class:`StepInfo` recorded;
        ``changes`` sets the moved fields."""
        return self.replace(
            accepted=self.accepted + 1, t=self.t + 1, info=StepInfo(self.energy), **changes
        )


@dataclass
class SampleRun:
    """Result of :meth:`Sampler.run`.

    ``samples`` holds the kept states (T, B, ...), ``final`` the last state, ``info``
    the run's summary (acceptance rate and divergences of the kept steps, gradient
    evaluations computed (``n_grad_evals``) and those the chains' own transitions used
    (``n_grad_evals_used``: fewer for NUTS, whose batch also steps chains that wait),
    steps, kept steps, and the chains that were stuck in them: a
    :class:`~ebmlab.samplers.diagnostics.SamplingWarning` names them). With
    ``run(..., trace=True)``, ``trace`` maps each :class:`StepInfo` field to a
    (burn_in + n_steps, B) tensor, one row per step.
    """

    samples: torch.Tensor
    final: SamplerState
    info: dict[str, Any] = field(default_factory=dict)
    trace: dict[str, torch.Tensor] | None = None


def check_device(energy: Any, x: torch.Tensor, name: str = "x0") -> None:
    """Raise before any step when an ``nn.Module`` energy's parameters live on another
    device than the chains ``x``.

    Args:
        name: the argument name the error message uses.
    """
    device = energy_device(energy, x.device)
    if not _checks.same_device(device, x.device):
        raise ArgumentError(
            f"{name} is on {x.device} and the energy's parameters on {device}: "
            f"move them to one device first (e.g. {name}.to({str(device)!r}))"
        )


@contextmanager
def frozen_parameters(energy: Any) -> Iterator[None]:
    """Exclude an ``nn.Module`` ``energy``'s parameters from autograd for the duration
    (other energies pass through)."""
    if not isinstance(energy, nn.Module):
        yield
        return
    params = [p for p in energy.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


class NonFiniteChainError(ValueError):
    """A chain reached a NaN or infinite state; the message names the step and chain."""


class _FiniteWatch:
    """Records on the device, step by step, the chains' row sums, and tests them every
    ``every`` steps, so a diverging run stops early, naming the first chain to turn
    non-finite and the step, without a host synchronisation per step. A step costs one
    row sum written in place (:func:`~ebmlab.samplers.graphs.row_sums`). Each recorded
    step also advances the progress bar ``bar``, if given."""

    every = 64

    def __init__(self, x0: torch.Tensor, bar: tqdm | None = None) -> None:
        dtype = _graphs.row_sum_dtype(x0)
        self.sums = torch.zeros(self.every, x0.shape[0], dtype=dtype, device=x0.device)
        self.rows = 0  # steps recorded since the last check
        self.first_t = 0  # the step of the first recorded row
        self.bar = bar

    def update(self, state: SamplerState) -> None:
        """Record the chains of ``state``, one step's (there is always a free row: a
        full record is checked and emptied at once)."""
        _graphs.row_sums(state.x, self.sums[self.rows])
        self._recorded(1, state.t)

    def record(self, sums: torch.Tensor, t: int) -> None:
        """Record ``sums`` (m, B), the chains' row sums after each of the m steps that
        end at step ``t`` (a replayed chunk of them)."""
        m = len(sums)
        if self.rows + m > len(self.sums):
            self.check(t - m)
        if m > len(self.sums):
            self.sums = torch.zeros_like(sums)
        self.sums[self.rows : self.rows + m] = sums
        self._recorded(m, t)

    def _recorded(self, m: int, t: int) -> None:
        """Count the m rows just written, for the steps that end at step ``t``."""
        if self.rows == 0:
            self.first_t = t - m + 1
        self.rows += m
        if self.bar is not None:
            self.bar.update(m)
        if self.rows >= self.every:
            self.check(t)

    def check(self, t: int) -> None:
        """Raise NonFiniteChainError if a chain turned non-finite since the last check;
        ``t`` is the current step."""
        finite, self.rows = self.sums[: self.rows].isfinite(), 0
        if len(finite) == 0 or bool(finite.all()):
            return
        # per chain, the first recorded step at which it was non-finite (len: never)
        steps = torch.arange(len(finite), device=finite.device)[:, None]
        first = torch.where(finite, len(finite), steps).amin(0)
        chain = int(first.argmin())
        raise NonFiniteChainError(
            f"chain {chain} became non-finite (NaN or inf) at step "
            f"{self.first_t + int(first[chain])} of {t}; a smaller step_size, or an energy "
            "bounded below on the sampled region, keeps it finite"
        )


class Sampler(Generic[S]):
    """Base class: subclasses implement ``init`` and ``step``."""

    # a kernel that compiles its steps with torch.compile (``NUTS(compile=True)``)
    # traces the energy's gradient into them, where no CUDA graph may replay it
    compile: bool = False

    def _with(self: K, **attributes: Any) -> K:
        """A copy of this kernel with ``attributes`` set (how ``tempered`` derives kernels)."""
        kernel = copy.copy(self)
        kernel.__dict__.update(attributes)
        return kernel

    def _rescaled(self, attribute: str, beta: torch.Tensor, power: float) -> Sampler:
        """A copy whose ``attribute`` becomes a per-chain tensor value / beta**power."""
        value = getattr(self, attribute) / widen(beta).pow(power).float()
        return self._with(**{attribute: value})

    def init(self, x0: torch.Tensor, energy: EnergyFn) -> S:  # pragma: no cover - abstract
        """The first state: chains at ``x0`` with whatever the first step needs.

        Args:
            x0: starting chains (B, ...), one row per chain.
            energy: E, a callable (B, ...) -> (B,).

        Returns:
            The state at step 0 (``info`` is ``None``).
        """
        raise NotImplementedError

    def step(self, state: S, energy: EnergyFn, generator: torch.Generator | None = None) -> S:
        """One transition of every chain, leaving p(x) = exp(-E(x)) / Z invariant (or
        approximately so, for unadjusted samplers).

        Args:
            state: the chains' current state (from ``init`` or a previous ``step``).
            energy: E, a callable (B, ...) -> (B,).
            generator: source of the step's randomness, on the chains' device.

        Returns:
            The next state; its ``info`` (:class:`StepInfo`) says what the step did.
        """
        raise NotImplementedError  # pragma: no cover - abstract

    def begin_warmup(self, state: S, n_steps: int) -> S:
        """Called before ``n_steps`` burn-in steps; adaptive samplers plan their tuning here.

        Args:
            state: the state from ``init``.
            n_steps: the number of burn-in steps to come.

        Returns:
            The state to start burn-in from.
        """
        return state

    def tempered(self, beta: torch.Tensor) -> Sampler:
        """This kernel with its step sizes rescaled for the per-chain tempered energies beta E.

        Parallel tempering uses it so hot replicas take steps matched to their wider
        distributions. The default returns the kernel unchanged.
        """
        return self

    def end_warmup(self, state: S) -> S:
        """Called once after the burn-in steps; adaptive samplers freeze their tuning here.

        Args:
            state: the state after the last burn-in step.

        Returns:
            The state to sample from, with the tuning fixed.
        """
        return state

    def replayable(self, state: S) -> bool:
        """Whether the steps from ``state`` do the same device work at every step, so
        that a chunk of them captured once as a CUDA graph can be replayed
        (:mod:`~ebmlab.samplers.graphs`): no step size that follows the step index, no
        decision taken on the host. The default is False; kernels that are say so.

        Args:
            state: the chains' state the steps would start from.
        """
        return False

    def run(
        self,
        energy: EnergyLike,
        x0: torch.Tensor,
        n_steps: int,
        *,
        burn_in: int = 0,
        thin: int | None = None,
        generator: torch.Generator | int | None = None,
        trace: bool = False,
        graphs: bool = True,
        progress: bool | str = False,
    ) -> SampleRun:
        """Run ``burn_in + n_steps`` steps; keep every ``thin``-th of the last ``n_steps``.

        Args:
            energy: an energy callable x -> (B,) or an ``nn.Module``.
            x0: starting chains (B, ...), one row per chain.
            n_steps: steps after burn-in.
            burn_in: steps first, in which adaptive samplers tune; their states are
                not kept.
            thin: keep every ``thin``-th state of the ``n_steps``; without it only the
                final state is kept (``samples`` has T = 1).
            generator: a ``torch.Generator`` on x0's device, or an int seed.
            trace: also stack every step's :class:`StepInfo` into ``SampleRun.trace``
                (per-step acceptance, divergences and energies, burn-in included).
            graphs: on a CUDA device, unless a trace is asked for, replay chunks of
                steps as CUDA graphs where the kernel's steps are :meth:`replayable`
                and the phase (burn-in, kept steps) has 64 steps or more (one launch
                per chunk instead of a dozen per step; reproducible from the seed,
                statistically the eager steps); for other kernels (NUTS, AdaptiveHMC)
                in runs of 64 steps or more, replay each gradient evaluation of a batch
                shape met before (:class:`~ebmlab.samplers.graphs.ReplayedGradient`:
                the same values). In shorter runs an ``nn.Module`` energy replays its
                gradient from graphs kept across runs (a training loop's negatives:
                its optimiser updates the parameters in place, where the graphs read
                them). False runs every step eagerly, as does a kernel that compiles its
                own steps (``NUTS(compile=True)``).
            progress: show a progress bar of the steps on stderr (a string is its
                label), for runs of minutes; it reads nothing from the device.

        Returns:
            A :class:`SampleRun`.
        """
        _checks.tensor("x0", x0, min_ndim=2, floating=True, finite=True)
        _checks.positive_int("n_steps", n_steps, allow_zero=True)
        _checks.positive_int("burn_in", burn_in, allow_zero=True)
        if thin is not None:
            _checks.positive_int("thin", thin)
        gen = _checks.generator("generator", generator, x0.device)
        check_device(energy, x0)
        fn = as_energy_fn(energy)
        kept: list[torch.Tensor] | None = None if thin is None else []
        infos: list[StepInfo] | None = [] if trace else None
        label = progress if isinstance(progress, str) else "sampling"
        bar = tqdm(total=burn_in + n_steps, desc=label, unit="step", leave=False,
                   disable=not progress)  # fmt: skip
        watch = _FiniteWatch(x0, bar if progress else None)  # no call per step unshown
        replay = graphs and not trace and not self.compile and _graphs.capturable(x0.device)
        with frozen_parameters(energy), bar:
            try:
                state = self.begin_warmup(self.init(x0, fn), burn_in)
            except NoGradientError:  # the energy's fault, whatever x0
                raise
            except ArgumentError as err:  # the energy's own check, put in the caller's terms
                raise ArgumentError(f"x0 does not fit the energy: {err}") from err
            long = burn_in + n_steps >= _graphs.MIN_STEPS
            if replay and not long and isinstance(energy, nn.Module):
                fn = _graphs.module_gradients(energy, fn, x0.device)  # kept across runs
            elif replay and long and not self.replayable(state):
                fn = _graphs.replayed_gradients(fn, x0.device)  # each gradient instead
            state = self._steps(state, fn, gen, burn_in, watch, replay, infos=infos)
            state = self.end_warmup(state)
            warm = state
            state = self._steps(state, fn, gen, n_steps, watch, replay, thin, kept, infos)
        watch.check(state.t)
        samples = torch.cat(kept) if kept else state.x.unsqueeze(0)
        # acceptance and divergences of the kept phase; gradient evaluations of the whole run
        kept_steps = max(state.t - warm.t, 1)
        moved = (state.accepted - warm.accepted).float() / kept_steps
        info = {
            "acceptance_rate": float(moved.mean()),
            "n_divergent": int((state.divergent - warm.divergent).sum()),
            "n_grad_evals": int(state.n_grad_evals * x0.shape[0]),
            "n_grad_evals_used": _used_grad_evals(state),
            "n_steps": state.t,
            "n_kept_steps": state.t - warm.t,
            "stuck_chains": _stuck_chains(state, moved, state.t - warm.t),
        }
        traced = None
        if infos is not None:
            traced = {
                name: torch.stack([getattr(i, name) for i in infos])
                if infos
                else x0.new_zeros((0, x0.shape[0]))
                for name in StepInfo.TRACED
            }
        return SampleRun(samples=samples, final=state, info=info, trace=traced)

    def _steps(
        self,
        state: S,
        energy: EnergyFn,
        generator: torch.Generator | None,
        n: int,
        watch: _FiniteWatch,
        replay: bool,
        thin: int | None = None,
        kept: list[torch.Tensor] | None = None,
        infos: list[StepInfo] | None = None,
    ) -> S:
        """``n`` steps from ``state``, each recorded by ``watch``, every ``thin``-th
        position appended to ``kept`` as a (1, B, ...) block, each step's info to
        ``infos``; with ``replay`` and at least ``graphs.MIN_STEPS`` of them, the steps
        after the first ``thin`` (or the first one) run as replayed chunks where
        :meth:`replayable`."""
        size = _graphs.chunk_size(n, thin)
        every = thin or 1
        replay = replay and n >= _graphs.MIN_STEPS
        i = 0
        while i < n:
            if replay and i > 0 and i % every == 0 and n - i >= 3 * size:
                replay = False  # one attempt per phase
                if self.replayable(state):
                    state, ran = self._replayed(state, energy, generator, n - i, size, thin,
                                                watch, kept)  # fmt: skip
                    i += ran
                    continue
            state = self.step(state, energy, generator)
            i += 1
            watch.update(state)
            if infos is not None:
                infos.append(state.info)
            if kept is not None and i % every == 0:
                kept.append(state.x.unsqueeze(0))
        return state

    def _replayed(
        self,
        state: S,
        energy: EnergyFn,
        generator: torch.Generator | None,
        n: int,
        size: int,
        thin: int | None,
        watch: _FiniteWatch,
        kept: list[torch.Tensor] | None,
    ) -> tuple[S, int]:
        """The whole chunks of ``size`` steps that fit in ``n``, captured once and
        replayed (:class:`~ebmlab.samplers.graphs.ChunkedSteps`): the state after them
        and how many steps ran (fewer if the state's layout changed in a chunk)."""
        chunks = _graphs.ChunkedSteps(self, energy, generator, state, size, thin, capture=True)
        ran = 0
        while n - ran >= size:
            moved = chunks.run()
            ran += size
            after = chunks.state() if moved else chunks.broken
            watch.record(chunks.sums, after.t)
            if kept is not None:
                kept.append(chunks.kept.clone())
            if not moved:
                return after, ran
        return chunks.state(), ran

    def sample(
        self,
        energy: EnergyLike,
        x0: torch.Tensor,
        n_steps: int,
        *,
        burn_in: int = 0,
        thin: int | None = None,
        generator: torch.Generator | int | None = None,
        graphs: bool = True,
        progress: bool | str = False,
    ) -> torch.Tensor:
        """Draw samples: :meth:`run` without its summary.

        Args:
            energy: an energy callable x -> (B,) or an ``nn.Module``.
            x0: starting chains (B, ...).
            n_steps: steps after burn-in.
            burn_in: steps first, not kept (adaptive samplers tune in them).
            thin: keep every ``thin``-th state of the ``n_steps``.
            generator: a ``torch.Generator`` on x0's device, or an int seed.
            graphs: replay chunks of steps as CUDA graphs where they can be (see :meth:`run`).
            progress: show a progress bar of the steps (a string is its label).

        Returns:
            The final states (B, ...), or the kept trajectory (T, B, ...) given ``thin``.
        """
        result = self.run(energy, x0, n_steps, burn_in=burn_in, thin=thin, generator=generator,
                          graphs=graphs, progress=progress)  # fmt: skip
        return result.samples if thin is not None else result.samples[0]


def _used_grad_evals(state: SamplerState) -> int:
    """The gradient evaluations the chains' own transitions used, summed over chains:
    a kernel whose batch computes more than each chain needs (NUTS) counts them per
    chain in ``chain_grad_evals``; for the others it is every evaluation."""
    used = getattr(state, "chain_grad_evals", None)
    return int(state.n_grad_evals * len(state.x)) if used is None else int(used.sum())


def _stuck_chains(state: SamplerState, moved: torch.Tensor, n_kept: int) -> list[int]:
    """The chains that rarely moved in the kept steps
    (:func:`~ebmlab.samplers.diagnostics.rarely_moving`), named in a
    :class:`~ebmlab.samplers.diagnostics.SamplingWarning` with their step size and
    acceptance."""
    stuck = rarely_moving(moved, n_kept).nonzero().flatten().tolist()
    if stuck:
        steps = getattr(state, "step_size", None)
        shown = stuck[:8]
        sizes = ""
        if isinstance(steps, torch.Tensor) and steps.ndim == 1:
            sizes = f", step sizes {[round(float(steps[i]), 4) for i in shown]}"
        warnings.warn(
            f"chain(s) {shown}{' ...' if len(stuck) > 8 else ''} moved on "
            f"{[round(float(moved[i]), 3) for i in shown]} of the {n_kept} kept steps "
            f"(median chain {float(moved.median()):.3f}){sizes}: they are stuck",
            SamplingWarning,
            stacklevel=3,
        )
    return stuck


def categorical(log_probs: torch.Tensor, n: int, generator: torch.Generator | None) -> torch.Tensor:
    """``n`` independent draws (..., n) of indices from ``log_probs``, normalised log
    probabilities over the last dimension, by inverting the cumulative distribution (no
    host synchronisation).

    Args:
        generator: source of randomness, a ``torch.Generator`` on the data's device
            (``None``: the global one).
    """
    cdf = log_probs.exp().cumsum(-1)
    u = torch.rand(
        (*log_probs.shape[:-1], n), generator=generator, dtype=log_probs.dtype,
        device=log_probs.device,
    )  # fmt: skip
    draws = torch.searchsorted(cdf, u * cdf[..., -1:], right=True)
    return draws.clamp_max_(log_probs.shape[-1] - 1)


def per_chain(value: torch.Tensor | float, like: torch.Tensor) -> torch.Tensor | float:
    """Broadcast a per-chain (B,) tensor over the event dimensions of ``like``; floats pass.

    Args:
        value: a float, or a (B,) tensor of per-chain values.
    """
    if isinstance(value, torch.Tensor) and value.ndim == 1:
        return value.view(-1, *([1] * (like.ndim - 1))).to(like.dtype)
    return value


def add_scaled(
    x: torch.Tensor, scale: torch.Tensor | float, y: torch.Tensor, *, inplace: bool = False
) -> torch.Tensor:
    """x + scale * y in one pass (``scale`` a float or broadcastable, e.g. from
    :func:`per_chain`); ``inplace`` writes into ``x``."""
    if isinstance(scale, torch.Tensor):
        return x.addcmul_(scale, y) if inplace else torch.addcmul(x, scale, y)
    return x.add_(y, alpha=scale) if inplace else torch.add(x, y, alpha=scale)


def accept(log_ratio: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Metropolis test per chain: True with probability min(1, exp(log_ratio)); NaN
    rejects (every comparison with NaN is False).

    Args:
        generator: source of randomness, a ``torch.Generator`` on the data's device
            (``None``: the global one).
    """
    u = torch.rand(
        log_ratio.shape, generator=generator, dtype=log_ratio.dtype, device=log_ratio.device
    )
    return u.log_() < log_ratio


def where_rows(mask: torch.Tensor, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """Row-wise select: ``new[i]`` where ``mask[i]`` else ``old[i]``, for any event shape."""
    return torch.where(mask.view(-1, *([1] * (new.ndim - 1))), new, old)


def diverged_rows(x: torch.Tensor, bound: float | None = None) -> torch.Tensor:
    """Which chains (rows of ``x``, (B, ...)) hold a NaN or infinite entry or, given
    ``bound``, an entry beyond +-bound: a (B,) bool tensor, computed on the device."""
    flat = x.flatten(1)
    bad = ~flat.isfinite().all(1)
    return bad if bound is None else bad | flat.abs().gt(bound).any(1)


def metropolis_update(
    state: S,
    proposal: torch.Tensor,
    energy: torch.Tensor,
    grad: torch.Tensor | None,
    log_ratio: torch.Tensor | None,
    generator: torch.Generator | None,
    *,
    n_grad_evals: int = 1,
    divergent: torch.Tensor | None = None,
    **changes: Any,
) -> S:
    """The state after a Metropolis test of ``proposal`` (with its ``energy`` and
    ``grad``; ``None`` for samplers without gradients) at log acceptance ratio
    ``log_ratio`` per chain (``None``: every proposal is taken), the step's
    :class:`StepInfo` recorded; ``changes`` sets further fields.

    Args:
        generator: source of the test's uniform draws, on the chains' device.
        n_grad_evals: gradient evaluations the proposal cost per chain.
        divergent: the chains whose trajectory diverged (B,), counted in the state.
    """
    ok = (
        torch.ones_like(energy, dtype=torch.bool)
        if log_ratio is None
        else accept(log_ratio, generator)
    )
    return state.replace(
        x=where_rows(ok, proposal, state.x),
        energy=torch.where(ok, energy, state.energy),
        grad=None if grad is None else where_rows(ok, grad, state.grad),
        accepted=state.accepted + ok,
        divergent=state.divergent if divergent is None else state.divergent + divergent,
        n_grad_evals=state.n_grad_evals + n_grad_evals,
        t=state.t + 1,
        info=StepInfo(state.energy, log_ratio, divergent),
        **changes,
    )
