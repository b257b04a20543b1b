"""The No-U-Turn Sampler (Hoffman & Gelman 2014), batched over chains that each build
their own trees.

Each transition draws a momentum p ~ N(0, M) and doubles a leapfrog trajectory,
forwards or backwards in time at random, until the trajectory starts to turn back on
itself or reaches ``2^max_depth - 1`` leapfrog steps. The next state is drawn from all
points of the trajectory, so no step is ever rejected outright:

- multinomial sampling with weights exp(-H) (Betancourt 2017, appendix A.3): uniform
  progressive sampling among the points of a new subtree, then biased progressive
  sampling when the subtree joins the tree (it wins with probability
  min(1, w_subtree / w_tree));
- the generalised no-U-turn criterion on the summed momentum rho (Betancourt 2013): a
  stretch of trajectory turns when M^{-1} p_first . rho <= 0 or M^{-1} p_last . rho <= 0.
  It is checked for every aligned, power-of-two stretch of a new subtree as its last
  point is computed, and for the whole tree after each doubling. Where two halves A, B
  join, A plus the first point of B and B plus the last point of A are checked too
  (Stan's extra checks): without them a near-periodic trajectory, as on a Gaussian
  whose scales the mass has equalised, can miss its U-turn and run to the depth limit;
- a new subtree that turns inside, or whose energy error exceeds
  ``divergence_threshold`` (a divergence), is discarded and ends the chain's transition.

**Per-chain trees.** The batch advances one leapfrog step at a time, and every chain is
at its own place in its own tree (:class:`_Trees`: which doubling, which step of it).
A chain whose tree ends starts its next one at the next leapfrog step rather than
waiting for the deepest tree of the batch: it may finish up to ``run_ahead``
transitions ahead and queue them, and ``step`` returns each chain's oldest queued
transition. A step then costs the batch about the chains' mean tree size rather than
the largest of B (``run(...).info["n_grad_evals"]`` counts the batch's evaluations,
``info["n_grad_evals_used"]`` those each chain's own trees used, the count Stan and
BlackJAX report). While warming up, each chain adapts its step size as its own trees
end, so a queued transition never runs on a stale step size; the ends of the
adaptation windows, the end of warm-up and any change to the state between steps (a
restart, a swap of parallel tempering) drop the queued transitions and continue from
the state's positions. Tempered chains, and a pooled step size while it adapts, keep
``run_ahead`` at 1.

During burn-in the step size and the mass adapt as in Stan
(:class:`~ebmlab.samplers.adaptation.WarmupTuning`): a step-size search per chain, then
dual averaging of each chain's step size towards a mean acceptance statistic (the
average of min(1, exp(H_0 - H)) over the new points), the mass re-estimated at the ends
of doubling windows (diagonal, or dense where that makes the posterior nearly round),
and chains that stay stuck restarted at the windows' ends.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.energies.base import EnergyFn, EnergyFunction, energy_and_grad
from ebmlab.samplers.adaptation import DualAveraging, TunedState, WarmupTuning
from ebmlab.samplers.base import Sampler, SamplerState, StepInfo, replaced, where_rows
from ebmlab.samplers.integrators import (
    DenseMass,
    Mass,
    gaussian_noise,
    kinetic_energy,
    leapfrog,
    momentum,
    velocity,
)

# Up to this many chains NUTS queues 4 finished transitions per chain by default, beyond
# it 8 (``run_ahead``; the measurements are in docs/results/posteriors.md).
FEW_CHAINS = 64


class _Layout:
    """Named column ranges of a per-chain register tensor (B, width): the chains' tree
    state lives in a few such tensors, so that a masked update of a whole record is
    one ``torch.where`` rather than one per field. A field is a vector of the given
    width, read as (B, width), or a number (width ``None``), read as (B,)."""

    def __init__(self, **widths: int | None) -> None:
        self.slices: dict[str, slice] = {}
        self.columns: dict[str, int | slice] = {}
        start = 0
        for name, width in widths.items():
            self.slices[name] = slice(start, start + (width or 1))
            self.columns[name] = start if width is None else self.slices[name]
            start += width or 1
        self.width = start

    def __call__(self, registers: torch.Tensor, name: str) -> torch.Tensor:
        return registers[:, self.columns[name]]

    def pack(self, like: torch.Tensor, **values: torch.Tensor | float) -> torch.Tensor:
        """The registers holding ``values`` (every field, in any order; (B,) tensors,
        (B, width) tensors or floats), in ``like``'s dtype. Each run of (B,) tensors
        is one stack, each run of equal floats one constant block, and ``torch.cat``
        promotes bool and integer fields: a record costs a handful of tensor
        operations, not a few per field (the layouts put their numbers together)."""
        n = like.shape[0]
        parts: list[torch.Tensor | list] = []  # tensors, and [value, width] constant blocks
        numbers: list[torch.Tensor] = []  # the run of (B,) fields under way
        for name, cut in self.slices.items():
            value, width = values[name], cut.stop - cut.start
            if isinstance(value, torch.Tensor) and value.ndim == 1:
                numbers.append(value)
                continue
            if numbers:
                parts.append(torch.stack(numbers, -1))
                numbers = []
            if isinstance(value, torch.Tensor):
                parts.append(value)
            elif parts and isinstance(parts[-1], list) and parts[-1][0] == value:
                parts[-1][1] += width
            else:
                parts.append([value, width])
        if numbers:
            parts.append(torch.stack(numbers, -1))
        blocks = [p if isinstance(p, torch.Tensor) else like.new_full((n, p[1]), p[0])
                  for p in parts]  # fmt: skip
        packed = torch.cat(blocks, -1)
        return packed if packed.dtype == like.dtype else packed.to(like.dtype)


class _FlatEnergy(EnergyFunction):
    """An energy of chains (B, *event) evaluated on flattened rows (B, D), with its own
    gradient if it has one."""

    def __init__(self, energy: EnergyFn, event: torch.Size) -> None:
        super().__init__(lambda z: energy(z.view(-1, *event)))
        self.inner, self.event = energy, event

    def value_and_grad(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        e, g = energy_and_grad(self.inner, z.view(-1, *self.event))
        return e, g.flatten(1)


def _halves_turning(
    a_first: torch.Tensor,
    a_last: torch.Tensor,
    rho_a: torch.Tensor,
    b_first: torch.Tensor,
    b_last: torch.Tensor,
    rho_b: torch.Tensor,
    inv_mass: Mass,
) -> torch.Tensor:
    """The generalised no-U-turn criterion (Betancourt 2013) for stretch A then B of a
    trajectory, given the first and last momenta and summed momentum of each half
    (flat, (..., D)): the whole stretch turns, or A plus the first point of B, or the
    last point of A plus B (Stan's extra checks across the join). A stretch turns when
    M^{-1} p_first . rho <= 0 or M^{-1} p_last . rho <= 0."""
    # six dot products of velocities with summed momenta, without stacking the (..., D)
    # operands: at a hundred chains of a hundred numbers the stacks cost six times more
    va_first, va_last = velocity(a_first, inv_mass), velocity(a_last, inv_mass)
    vb_first, vb_last = velocity(b_first, inv_mass), velocity(b_last, inv_mass)
    whole, a_join, b_join = rho_a + rho_b, rho_a + b_first, rho_b + a_last
    dot = torch.linalg.vecdot
    dots = [dot(va_first, whole), dot(vb_last, whole), dot(va_first, a_join),
            dot(vb_first, a_join), dot(va_last, b_join), dot(vb_last, b_join)]  # fmt: skip
    return torch.stack(torch.broadcast_tensors(*dots)).le(0).any(0)


def host_checks(like: torch.Tensor) -> bool:
    """Whether a tree step may read masks back to the host to skip the parts no chain
    needs: on the CPU, unless torch.compile is tracing the step, which then runs every
    part, masked, as on an accelerator."""
    return like.device.type == "cpu" and not torch.compiler.is_compiling()


@functools.cache
def _compiled_tree_step() -> Callable[..., tuple[_Trees, int]]:
    """:meth:`NUTS._tree_step` compiled by torch.compile, made at the first compiled
    step (nothing is compiled at import); one compiled graph per batch shape and kind
    of step (warming up or not, diagonal or dense mass)."""
    return torch.compile(NUTS._tree_step, dynamic=False)


def _cpp_compiler() -> str | None:
    """The C++ compiler torch.compile would build CPU kernels with, if there is one."""
    names = [os.environ.get("CXX"), "g++", "clang++", "c++", "cl"]
    return next((found for name in names if name and (found := shutil.which(name))), None)


def _traced_gradients(compiled: bool) -> contextlib.AbstractContextManager:
    """For ``compiled`` steps, a context in which torch.compile traces
    ``torch.autograd.grad`` into its graph (the energy's gradient inside a tree step),
    where this PyTorch can; elsewhere the gradient runs eagerly between two compiled
    parts. Nothing for eager steps."""
    config = torch._dynamo.config
    if compiled and hasattr(config, "trace_autograd_ops"):
        return config.patch(trace_autograd_ops=True)
    return contextlib.nullcontext()


def _log_uniform(like: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    return torch.rand(like.shape, generator=generator, dtype=like.dtype, device=like.device).log()


@functools.lru_cache(maxsize=16)
def _layouts(d: int) -> tuple[_Layout, _Layout, _Layout]:
    """The layouts of a point, a tree and a doubling for positions of d numbers."""
    point = _Layout(x=d, p=d, grad=d, energy=None)
    # the vectors first and the numbers after them, so that a record's numbers pack as
    # one stack
    tree = _Layout(left=point.width, right=point.width, proposal=point.width, rho=d,
                   step=None, h0=None, log_weight=None, depth=None, moved=None,
                   divergent=None, accept_sum=None, n_points=None, n_grads=None)  # fmt: skip
    doubling = _Layout(point=point.width, first_p=d, rho=d, proposal=point.width,
                       forward=None, i=None, log_weight=None, valid=None, divergent=None,
                       accept_sum=None, n_points=None, n_grads=None)  # fmt: skip
    return point, tree, doubling


@dataclass(frozen=True)
class _Trees:
    """Every chain's tree in the making, in flat registers (positions flattened to D
    columns; a point packs position, momentum, gradient and energy in 3D + 1):

    - ``tree`` (:func:`_layouts`): the trajectory so far, its step size
      (fixed when it starts), its start's Hamiltonian, both ends, the proposal, the log
      of its summed weights exp(H_0 - H), the summed momentum rho, the depth of the
      doubling under way, and the transition's outcome (moved, divergent, the
      acceptance statistic's sum over new points, their number);
    - ``doubling``: the subtree of 2^depth steps being added: its direction, the steps
      taken (``i``), its last point, first momentum, summed momentum, log weight,
      proposal, whether it may still join, its divergence and acceptance terms;
    - ``slots`` (B, max_depth + 1, 3D): slot k holds, for the latest point whose index
      is a multiple of 2^k, its momentum, the momentum of the point before it and the
      running rho before it: the start of the aligned stretch of length 2^k that ends
      when the index + 1 is a multiple of 2^k, whose halves start at slots k and k - 1;
    - ``draws`` (B, capacity, 3D + 5): a ring of finished transitions per chain (the
      point, moved, divergent, the acceptance sum, the number of points), ``head`` and
      ``count``;
    - ``tip`` and ``next_step``: the point and step size the chain's next tree starts
      with; ``dual``: the chains' step-size adapter while they warm up (each chain
      adapts as its trees end); ``building`` and ``pending``: which chains have a tree
      under way and which start a new doubling at the next step; ``anchor``: the
      positions of the state these trees belong to, so a state changed from outside is
      recognised (None while a step advances the trees); ``below``: 2^k - 1 for
      k = 0 ... max_depth; ``macro``: the registers of a step that spans several leapfrog
      steps of the batch (None where every step is one leapfrog step).
    """

    tree: torch.Tensor
    doubling: torch.Tensor
    slots: torch.Tensor
    draws: torch.Tensor
    head: torch.Tensor
    count: torch.Tensor
    tip: torch.Tensor
    next_step: torch.Tensor
    dual: DualAveraging | None
    building: torch.Tensor
    pending: torch.Tensor
    anchor: torch.Tensor | None
    below: torch.Tensor
    macro: torch.Tensor | None = None


class Move(NamedTuple):
    """One step of every chain along its trajectory, from its last point: the new
    position, momentum, energy and gradient, the gradients each chain's step used
    (``grads``, a count or (B,)) and the batch computed (``evals``). A step that may
    take several leapfrog steps (:class:`~ebmlab.samplers.WALNUTS`) also says which
    chains finished it (``ready``; None: all), each step's log acceptance statistic
    (``log_accept``, (B,); else the tree's min(0, H_0 - H) is used), the chains whose
    step no size could integrate (``diverged``) and those whose step is not the one the
    reverse step would take (``irreversible``): both end the chain's doubling."""

    x: torch.Tensor
    p: torch.Tensor
    energy: torch.Tensor
    grad: torch.Tensor
    grads: torch.Tensor | int = 1
    evals: int = 1
    ready: torch.Tensor | None = None
    log_accept: torch.Tensor | None = None
    diverged: torch.Tensor | None = None
    irreversible: torch.Tensor | None = None


@dataclass(frozen=True)
class NUTSState(TunedState):
    """A tuned chain state with the chains' trees under way and queued transitions
    (``None`` before the first step and after warm-up's window ends)."""

    trees: _Trees | None = None


class NUTS(Sampler[NUTSState]):
    """No-U-Turn Sampler with multinomial proposals, batched over chains that each build
    their own trees.

    Use with ``burn_in`` (a few hundred steps) so that the step size and mass
    adapt: ``NUTS().sample(energy, x0, n, burn_in=500)``. A step moves a chain unless
    every point it drew was outweighed by the start; ``run(...).info["acceptance_rate"]``
    is the fraction of steps that moved, and each state's ``info.accept_prob`` the
    acceptance statistic the step size is tuned on.

    Args:
        step_size: initial leapfrog step size.
        max_depth: most tree doublings per step (at most 2^max_depth - 1 gradients).
        target_accept: mean acceptance statistic the step size is tuned to (0.95 for
            posteriors with strong curvature, such as hierarchical models).
        adapt_mass: tune the inverse mass during burn-in.
        pool_step_size: one step size for all chains, tuned on their mean acceptance;
            by default each chain tunes its own, so that a chain in a region of
            strong curvature does not set (or take) the others' step.
        divergence_threshold: energy error beyond which a subtree is divergent.
        run_ahead: how many finished transitions a chain may queue ahead of the step
            being returned, so that it need not wait for deeper trees (1: every chain
            waits for the deepest tree of the batch, as in lockstep); each queued
            transition holds 3D + 5 numbers per chain. By default 4 for up to 64
            chains and 8 for more, where the slowest of many chains would keep the
            others waiting longer (docs/results/posteriors.md, "How many transitions
            a chain queues").
        dense_mass: the inverse mass to adapt: True for a dense one (the draws'
            covariance, Stan's ``dense_e``; chains of flat rows (B, D)), False for a
            diagonal one (Stan's default), ``"auto"`` for the one that pays at each
            window's end: dense where it makes the posterior nearly round and the
            diagonal does not (strongly correlated coordinates) or the diagonal
            leaves a narrow ridge, unless the posterior changes shape across the
            window's draws (:meth:`~ebmlab.samplers.adaptation.WindowStats.chosen_mass`),
            else diagonal.
        compile: run each step of the trees, the energy's gradient included, as one
            graph compiled by ``torch.compile`` (at the first step of each batch shape
            and kind of step: tens of seconds on a CPU, which needs a C++ compiler),
            in place of a few hundred small operations. On small posteriors a step then
            costs 0.4-0.6 times as much (docs/results/posteriors.md, "Compiled trees"),
            which pays in runs of several thousand steps. The random numbers are the
            eager run's; the draws agree with it statistically, not bit for bit.
    """

    def __init__(
        self,
        step_size: float = 0.1,
        *,
        max_depth: int = 10,
        target_accept: float = 0.8,
        adapt_mass: bool = True,
        pool_step_size: bool = False,
        divergence_threshold: float = 1000.0,
        run_ahead: int | None = None,
        dense_mass: bool | str = "auto",
        compile: bool = False,
    ) -> None:
        self.step_size = _checks.positive("step_size", step_size)
        self.max_depth = _checks.positive_int("max_depth", max_depth)
        self.tuning = WarmupTuning(target_accept, adapt_mass, pool_step_size, dense_mass)
        self.divergence_threshold = _checks.positive("divergence_threshold", divergence_threshold)
        self.run_ahead = None if run_ahead is None else _checks.positive_int("run_ahead", run_ahead)
        self.compile = _checks.instance("compile", compile, bool, "True or False")

    def _queue(self, chains: int) -> int:
        """Finished transitions each of ``chains`` chains may queue (``run_ahead``)."""
        if self.run_ahead is not None:
            return self.run_ahead
        return 4 if chains <= FEW_CHAINS else 8

    def init(self, x0: torch.Tensor, energy: EnergyFn) -> NUTSState:
        if self.compile and x0.device.type == "cpu" and not _cpp_compiler():
            raise ArgumentError(
                "compile=True needs a C++ compiler for torch.compile on the CPU (g++, "
                "clang++ or cl on the PATH, or one named by $CXX); install one or use "
                "compile=False"
            )
        start = SamplerState.start(x0.detach().clone(), None, None, 0).evaluated(energy)
        used = torch.ones(len(x0), dtype=torch.long, device=x0.device)
        return self.tuning.initial(start, self.step_size, NUTSState, chain_grad_evals=used)

    def begin_warmup(self, state: NUTSState, n_steps: int) -> NUTSState:
        return self.tuning.begin(state, n_steps, search=True)

    def end_warmup(self, state: NUTSState) -> NUTSState:
        # the kept transitions start afresh with the final step size
        return self.tuning.finish(state).replace(trees=None)

    def tempered(self, beta: torch.Tensor) -> NUTS:
        """This kernel for per-chain tempered energies beta E: each temperature's chains
        get their own mass, 1 / beta at first, then adapted from their own variance."""
        return self._with(tuning=self.tuning.tempered(beta))

    def _start(self, state: NUTSState, dual: DualAveraging | None) -> _Trees:
        """No tree under way and no queued transition: each chain's next tree starts at
        ``state``'s position with its step size, adapted by ``dual`` if given."""
        x = state.x.flatten(1)
        n, d = x.shape
        point, tree, doubling = _layouts(d)
        tip = point.pack(x, x=x, p=0.0, grad=state.grad.flatten(1), energy=state.energy)
        counts = torch.zeros(n, dtype=torch.long, device=x.device)
        no = counts.bool()
        if dual is not None and not isinstance(dual.count, torch.Tensor):
            # each chain counts its own updates: the count per chain from the start
            dual = replaced(dual, count=counts + dual.count)
        step = torch.as_tensor(state.step_size, dtype=x.dtype, device=x.device).expand(n)
        return _Trees(
            x.new_zeros(n, tree.width),
            x.new_zeros(n, doubling.width),
            x.new_zeros(n, self.max_depth + 1, 3 * d),
            x.new_zeros(n, self._queue(n), point.width + 5),
            counts,
            counts.clone(),  # not the head's tensor: a compiled step would guard on that
            tip,
            step.clone(),
            dual,
            no,
            no.clone(),
            state.x,
            2 ** torch.arange(self.max_depth + 1, device=x.device) - 1,
            self._idle_steps(tip),
        )

    def step(
        self, state: NUTSState, energy: EnergyFn, generator: torch.Generator | None = None
    ) -> NUTSState:
        if state.search_due:
            state = self.tuning.search_step_size(state, energy, generator)
        warming = self.tuning.warming(state)
        # tempered chains swap positions between steps, which would void queued
        # transitions; a pooled step size adapts on every chain's latest transition
        lockstep = self.tuning.groups is not None or (warming and self.tuning.pool_step_size)
        trees = state.trees
        # in lockstep no transition is queued between steps, and the step size tuned on
        # the last one (pooled, or per tempered chain) must reach the next trees
        if trees is None or lockstep or trees.anchor is not state.x:
            trees = self._start(state, state.dual if warming and not lockstep else None)
        trees = replaced(trees, anchor=None)
        capacity = 1 if lockstep else trees.draws.shape[1]  # the ring _start made
        flat_energy = energy if state.x.ndim == 2 else _FlatEnergy(energy, state.x.shape[1:])
        mass = state.inv_mass  # flat: (D,), (B, D) per chain when tempered, or dense
        if isinstance(mass, DenseMass):
            inv_mass: Mass = mass
        elif mass.ndim == state.x.ndim:
            inv_mass = mass.reshape(len(mass), -1)
        else:
            inv_mass = mass.flatten()
        n_leapfrogs = 0
        with _traced_gradients(self.compile):
            while not bool((trees.count > 0).all()):
                trees, evals = self._leapfrog_step(trees, flat_energy, inv_mass, capacity,
                                                   generator)  # fmt: skip
                n_leapfrogs += evals
        trees, draw = self._pop(trees)
        new = state.replace(
            x=draw["x"].view_as(state.x),
            energy=draw["energy"],
            grad=draw["grad"].view_as(state.x),
            accepted=state.accepted + draw["moved"].long(),
            divergent=state.divergent + draw["divergent"].long(),
            n_grad_evals=state.n_grad_evals + n_leapfrogs,
            chain_grad_evals=state.chain_grad_evals + draw["n_grads"].long(),
            t=state.t + 1,
            info=StepInfo(state.energy, draw["mean_accept"].log(), draw["divergent"] > 0),
        )
        new = new.replace(trees=replaced(trees, anchor=new.x))
        if trees.dual is not None:
            new = new.replace(dual=trees.dual, step_size=trees.next_step)
        new = self.tuning.update(state, new, step_adapted=trees.dual is not None)
        # the end of a window (a new adapter, perhaps restarts or a new mass) voids the
        # transitions under way
        checked = new.windows is not None and new.t in new.windows.checks
        return new.replace(trees=None) if checked or new.search_due else new

    def _pop(self, trees: _Trees) -> tuple[_Trees, dict[str, torch.Tensor]]:
        """Each chain's oldest queued transition (every chain has one), and the queues
        without them."""
        rows = torch.arange(len(trees.head), device=trees.head.device)
        oldest = trees.draws[rows, trees.head]
        point = _layouts(trees.tip.shape[1] // 3)[0]
        w = point.width
        draw = {name: point(oldest, name) for name in ("x", "energy", "grad")}
        draw["moved"], draw["divergent"] = oldest[:, w], oldest[:, w + 1]
        draw["n_points"], draw["n_grads"] = oldest[:, w + 3], oldest[:, w + 4]
        draw["mean_accept"] = oldest[:, w + 2] / draw["n_points"].clamp(min=1)
        capacity = trees.draws.shape[1]
        return replaced(trees, head=(trees.head + 1) % capacity,
                        count=trees.count - 1), draw  # fmt: skip

    def _idle_steps(self, tip: torch.Tensor) -> torch.Tensor | None:
        """The registers of steps that span several leapfrog steps, none under way
        (NUTS: none; every step is one leapfrog step)."""
        return None

    def _advance(
        self,
        energy: EnergyFn,
        point: torch.Tensor,
        step: torch.Tensor,
        inv_mass: Mass,
        live: torch.Tensor,
        steps: torch.Tensor | None,
    ) -> tuple[Move, torch.Tensor | None]:
        """One leapfrog step of ``step`` (per chain, signed by the direction) from each
        chain's last point (packed registers, :func:`_layouts`); ``steps`` and the
        second result are the registers of steps under way (:meth:`_idle_steps`)."""
        P = _layouts(point.shape[1] // 3)[0]
        return Move(*leapfrog(energy, P(point, "x"), P(point, "p"), P(point, "grad"), step, 1,
                              inv_mass)), steps  # fmt: skip

    def _leapfrog_step(
        self,
        trees: _Trees,
        energy: EnergyFn,
        inv_mass: Mass,
        capacity: int,
        generator: torch.Generator | None,
    ) -> tuple[_Trees, int]:
        """One step of every chain in its own tree, and the gradients the batch
        computed (:meth:`_tree_step`, compiled if the sampler is). The step's random
        numbers are drawn here, eagerly, whether or not a part of the step uses them:
        every device, and the compiled step, draw the same chains from a seed."""
        tip, n = trees.tip, len(trees.tip)
        noise = gaussian_noise(_layouts(tip.shape[1] // 3)[0](tip, "x"), generator)
        forward = torch.rand(n, generator=generator, device=tip.device) < 0.5
        log_u = _log_uniform(torch.empty(2, n, dtype=tip.dtype, device=tip.device), generator)
        tree_step = _compiled_tree_step() if self.compile else NUTS._tree_step
        return tree_step(self, trees, energy, inv_mass, capacity, noise, forward, log_u)

    def _tree_step(
        self,
        trees: _Trees,
        energy: EnergyFn,
        inv_mass: Mass,
        capacity: int,
        noise: torch.Tensor,
        forward: torch.Tensor,
        log_u: torch.Tensor,
    ) -> tuple[_Trees, int]:
        """One step of every chain in its own tree, from the step's random numbers:
        chains with room in their queue start a tree, then each building chain takes
        the next step of its doubling (or goes on with a step that spans several
        leapfrog steps); a doubling that ends joins its tree, and a tree that ends
        queues its transition. On the CPU, checks on the host skip the parts no chain
        needs; on an accelerator, and compiled, every part runs, masked, so that the
        loop in :meth:`step` reads one flag per leapfrog step and nothing else."""
        tip, tree, dbl, slots = trees.tip, trees.tree, trees.doubling, trees.slots
        host = host_checks(tip)

        def needed(mask: torch.Tensor) -> bool:
            return bool(mask.any()) if host else True

        d = tip.shape[1] // 3
        P, T, S = _layouts(d)
        live = trees.building
        # new trees, from the tip with a fresh momentum
        start = ~trees.building & (trees.count < capacity)
        if needed(start):
            p0 = momentum(noise, inv_mass)
            tip = P.pack(tip, x=P(tip, "x"), p=p0, grad=P(tip, "grad"), energy=P(tip, "energy"))
            h0 = P(tip, "energy") + kinetic_energy(p0, inv_mass)
            fresh = T.pack(tip, step=trees.next_step, h0=h0, left=tip, right=tip, proposal=tip,
                           log_weight=0.0, rho=p0, depth=0.0, moved=0.0, divergent=0.0,
                           accept_sum=0.0, n_points=0.0, n_grads=0.0)  # fmt: skip
            tree = where_rows(start, fresh, tree)
            live = live | start
        # new doublings, from an end of the tree in a random direction
        begin = start | trees.pending
        if needed(begin):
            edge = where_rows(forward, T(tree, "right"), T(tree, "left"))
            begun = S.pack(tip, forward=forward, i=0.0, point=edge, first_p=P(edge, "p"),
                           rho=0.0, log_weight=-math.inf, proposal=edge, valid=1.0,
                           divergent=0.0, accept_sum=0.0, n_points=0.0, n_grads=0.0)  # fmt: skip
            dbl = where_rows(begin, begun, dbl)
        # one step each
        step, forward = T(tree, "step"), S(dbl, "forward") > 0
        point = S(dbl, "point")
        signed = torch.where(forward, step, -step)
        move, macro = self._advance(energy, point, signed, inv_mass, live, trees.macro)
        x1, p1, e1, g1 = move.x, move.p, move.energy, move.grad
        stepping = live
        if move.ready is not None:  # steps that span several: only those that ended go on
            stepping = live & move.ready
            if not needed(stepping):
                waiting = replaced(trees, tip=tip, tree=tree, doubling=dbl,
                                   building=live, pending=torch.zeros_like(live),
                                   macro=macro)  # fmt: skip
                return waiting, move.evals
        new_point = P.pack(tip, x=x1, p=p1, grad=g1, energy=e1)
        log_w = torch.nan_to_num(T(tree, "h0") - e1 - kinetic_energy(p1, inv_mass), nan=-math.inf)
        diverged = log_w < -self.divergence_threshold
        if move.diverged is not None:
            diverged = diverged | move.diverged
        log_accept = log_w.clamp(max=0) if move.log_accept is None else move.log_accept
        i, depth, rho = S(dbl, "i").long(), T(tree, "depth").long(), S(dbl, "rho")
        below, i1 = trees.below, i + 1  # i % 2^k == 0 as a bit test, not a division
        marks = stepping[:, None] & ((i[:, None] & below) == 0)
        mark = torch.cat([p1, P(point, "p"), rho], -1).unsqueeze(1)
        slots = torch.where(marks.unsqueeze(-1), mark, slots)
        rho = rho + p1
        total = torch.logaddexp(S(dbl, "log_weight"), log_w)
        take = ~diverged & (log_u[0] < log_w - total)
        # U-turns of the aligned stretches that end at this point
        # stretches of 2^k <= 2^depth steps: 2^k - 1 >> depth == 0
        ends = ((below[1:] >> depth[:, None]) == 0) & ((i1[:, None] & below[1:]) == 0)
        m = ends.shape[1]
        if host:  # only up to the longest stretch that ends here for some chain
            hits = ends.any(0).nonzero()
            m = int(hits[-1]) + 1 if len(hits) else 0
        first_p, prev_p, rho_before = slots[..., :d], slots[..., d : 2 * d], slots[..., 2 * d :]
        per_chain_mass = isinstance(inv_mass, torch.Tensor) and inv_mass.ndim > 1
        slot_mass = inv_mass.unsqueeze(1) if per_chain_mass else inv_mass
        turned = ends[:, :m] & _halves_turning(first_p[:, 1 : m + 1], prev_p[:, :m],
                                               rho_before[:, :m] - rho_before[:, 1 : m + 1],
                                               first_p[:, :m], p1.unsqueeze(1),
                                               rho.unsqueeze(1) - rho_before[:, :m],
                                               slot_mass)  # fmt: skip
        stopped = turned.any(1)
        if move.irreversible is not None:
            stopped = stopped | move.irreversible
        stepped = S.pack(
            tip,
            forward=forward,
            i=i1,
            point=new_point,
            first_p=torch.where((i == 0).unsqueeze(-1), p1, S(dbl, "first_p")),
            rho=rho,
            log_weight=total,
            proposal=where_rows(take, new_point, S(dbl, "proposal")),
            valid=(S(dbl, "valid") > 0) & ~(diverged | stopped),
            divergent=(S(dbl, "divergent") > 0) | diverged,
            accept_sum=S(dbl, "accept_sum") + log_accept.exp(),
            n_points=S(dbl, "n_points") + 1,
            n_grads=S(dbl, "n_grads") + move.grads,
        )
        dbl = where_rows(stepping, stepped, dbl)
        # doublings that end join their tree if valid (in time order A then B going
        # forwards, else B then A)
        valid = S(dbl, "valid") > 0
        ended = stepping & (~valid | ((i1 >> depth) == 1))  # i + 1 == 2^depth
        done = replaced(trees, tip=tip, tree=tree, doubling=dbl, slots=slots,
                        building=live, pending=torch.zeros_like(live),
                        macro=macro)  # fmt: skip
        if not needed(ended):
            return done, move.evals
        joined = self._join(done, ended, valid & ended, P, T, S, inv_mass, log_u[1], needed)
        return joined, move.evals

    def _join(
        self,
        trees: _Trees,
        ended: torch.Tensor,
        join: torch.Tensor,
        P: _Layout,
        T: _Layout,
        S: _Layout,
        inv_mass: Mass,
        log_u: torch.Tensor,
        needed: Callable[[torch.Tensor], bool],
    ) -> _Trees:
        """The ``ended`` chains' doublings joined to their trees where they may
        (``join``): biased progressive sampling of the proposal, the tree's U-turn
        checked across the join (``log_u``: a log uniform per chain); trees that end
        queue their transition and, while warming up, adapt their chain's step size."""
        tree, dbl = trees.tree, trees.doubling
        tree_weight, sub_weight = T(tree, "log_weight"), S(dbl, "log_weight")
        wins = join & (log_u < sub_weight - tree_weight)
        forward = S(dbl, "forward") > 0
        f = forward.unsqueeze(-1)
        left, right, end = T(tree, "left"), T(tree, "right"), S(dbl, "point")
        left_p, right_p, end_p = P(left, "p"), P(right, "p"), P(end, "p")
        first_p, tree_rho, sub_rho = S(dbl, "first_p"), T(tree, "rho"), S(dbl, "rho")
        turned = _halves_turning(
            torch.where(f, left_p, end_p),
            torch.where(f, right_p, first_p),
            torch.where(f, tree_rho, sub_rho),
            torch.where(f, first_p, left_p),
            torch.where(f, end_p, right_p),
            torch.where(f, sub_rho, tree_rho),
            inv_mass,
        )
        depth = T(tree, "depth")
        finished = ended & (~join | turned | (depth + 1 >= self.max_depth))
        merged = T.pack(
            tree,
            step=T(tree, "step"),
            h0=T(tree, "h0"),
            left=where_rows(join & ~forward, end, left),
            right=where_rows(join & forward, end, right),
            proposal=where_rows(wins, S(dbl, "proposal"), T(tree, "proposal")),
            log_weight=torch.where(join, torch.logaddexp(tree_weight, sub_weight), tree_weight),
            rho=where_rows(join, tree_rho + sub_rho, tree_rho),
            depth=depth + 1,
            moved=(T(tree, "moved") > 0) | wins,
            divergent=(T(tree, "divergent") > 0) | (S(dbl, "divergent") > 0),
            accept_sum=T(tree, "accept_sum") + S(dbl, "accept_sum"),
            n_points=T(tree, "n_points") + S(dbl, "n_points"),
            n_grads=T(tree, "n_grads") + S(dbl, "n_grads"),
        )
        tree = where_rows(ended, merged, tree)
        trees = replaced(trees, tree=tree, building=trees.building & ~finished,
                         pending=ended & ~finished)  # fmt: skip
        if not needed(finished):
            return trees
        # queue the finished transitions
        proposal = T(tree, "proposal")
        outcome = [T(tree, k) for k in ("moved", "divergent", "accept_sum", "n_points", "n_grads")]
        draw = torch.cat([proposal, torch.stack(outcome, -1)], -1)
        capacity = trees.draws.shape[1]
        slot = (trees.head + trees.count) % capacity
        into = finished[:, None] & (torch.arange(capacity, device=slot.device) == slot[:, None])
        draws = torch.where(into.unsqueeze(-1), draw.unsqueeze(1), trees.draws)
        trees = replaced(trees, draws=draws, count=trees.count + finished,
                         tip=where_rows(finished, proposal, trees.tip))  # fmt: skip
        if trees.dual is not None:
            accept = T(tree, "accept_sum") / T(tree, "n_points").clamp(min=1)
            dual, adapted = trees.dual.update(accept, finished)
            step = torch.where(finished, adapted, trees.next_step)
            trees = replaced(trees, dual=dual, next_step=step)
        return trees
