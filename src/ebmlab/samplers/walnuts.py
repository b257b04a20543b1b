"""WALNUTS: the No-U-Turn Sampler with a step size that adapts within the trajectory
(Bou-Rabee, Carpenter, Kleppe & Liu 2025, "The within-orbit adaptive leapfrog no-U-turn
sampler", arXiv 2506.18746).

One step size cannot fit a posterior whose curvature changes by orders of magnitude
from place to place, such as a hierarchical model's funnel: tuned to the bulk, the
leapfrog diverges in the neck; tuned to the neck, it crawls through the bulk. WALNUTS
keeps NUTS's trajectory of macro steps of size h and integrates each macro step by
2^k leapfrog micro steps of size h / 2^k, with k the smallest level whose energy
error |H(end) - H(start)| over the macro step is at most ``max_error``. Such a choice
depends on the direction of travel, so each macro step is checked to be reversible:
from its end, with the momentum reversed, no coarser level may keep the error within
``max_error``, or the reverse step would take another path. A macro step that no
level up to ``max_halvings`` integrates (counted as a divergence) or that is not
reversible ends the doubling it belongs to, as a U-turn does; the trajectory's points
and their weights exp(-H) are those of the macro steps, so the multinomial sampling,
the U-turn criterion and the per-chain trees are NUTS's (:mod:`ebmlab.samplers.nuts`).

The macro step size adapts during warm-up to the acceptance statistic
exp(-|H(end) - H(start)|) of each macro step's coarsest level (one leapfrog step), as
in the authors' implementation: where one step suffices the sampler is NUTS with that
step size. A chain pays extra gradients only where the curvature needs them: a macro
step of level k costs 2^(k+1) - 1 gradients forwards and 2^k - 1 for the reverse check.
Each chain's macro step is a small state machine (its level, micro step and phase in a
register tensor), advanced by one leapfrog micro step of the batch at a time, so a chain
deep in a funnel's neck does not hold up the chains around it: the trees move on for
the chains whose macro step ended, and each chain counts the gradients it used.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from ebmlab import _checks
from ebmlab.energies.base import EnergyFn
from ebmlab.samplers.base import where_rows
from ebmlab.samplers.integrators import Mass, kinetic_energy, leapfrog
from ebmlab.samplers.nuts import NUTS, Move, _Layout, _layouts, host_checks


class WALNUTS(NUTS):
    """NUTS whose every macro step is split into as many leapfrog micro steps as keep
    its energy error within ``max_error`` (Bou-Rabee et al. 2025), reversibly.

    For posteriors whose curvature varies strongly, such as the centred eight schools
    or Neal's funnel: a chain entering a region of strong curvature halves its step
    there rather than diverging or forcing a small step everywhere. Elsewhere it costs
    what NUTS costs.

    Args:
        step_size: initial macro step size (tuned during burn-in, as NUTS's step).
        max_error: the largest energy error |H(end) - H(start)| a macro step may make
            (the authors' default, 0.5).
        max_halvings: the finest level tried: a macro step of at most 2^max_halvings
            micro steps.
        nuts_options: :class:`~ebmlab.samplers.NUTS`'s keyword arguments
            (``max_depth``, ``target_accept``, ``dense_mass``, ...).
    """

    def __init__(
        self,
        step_size: float = 0.1,
        *,
        max_error: float = 0.5,
        max_halvings: int = 8,
        **nuts_options: Any,
    ) -> None:
        super().__init__(step_size, **nuts_options)
        self.max_error = _checks.positive("max_error", max_error)
        self.max_halvings = _checks.positive_int("max_halvings", max_halvings)

    def _idle_steps(self, tip: torch.Tensor) -> torch.Tensor:
        return tip.new_zeros(len(tip), _macro_layout(tip.shape[1] // 3).width)

    def _advance(
        self,
        energy: EnergyFn,
        point: torch.Tensor,
        step: torch.Tensor,
        inv_mass: Mass,
        live: torch.Tensor,
        steps: torch.Tensor | None,
    ) -> tuple[Move, torch.Tensor]:
        """Leapfrog micro steps of every chain's macro step under way, or of a new one
        from ``point`` for live chains without one, until some chain's macro step ends:
        on the CPU the trees' bookkeeping waits meanwhile; elsewhere, and in a compiled
        step, one micro step, so that nothing is read back to the host."""
        assert steps is not None
        M = _macro_layout(point.shape[1] // 3)
        begin = live & (M(steps, "phase") == _IDLE)
        host = host_checks(point)
        starting = None if host and not bool(begin.any()) else begin
        evals = 0
        while True:
            move, steps = self._micro_step(energy, point, step, inv_mass, starting, steps)
            evals += 1
            # one host read: some macro step ended, or none is under way
            if not host or bool(move.ready.any() | (M(steps, "phase") == _IDLE).all()):
                return move._replace(evals=evals), steps
            starting = None  # every live chain began at the first micro step

    def _micro_step(
        self,
        energy: EnergyFn,
        point: torch.Tensor,
        step: torch.Tensor,
        inv_mass: Mass,
        begin: torch.Tensor | None,
        steps: torch.Tensor,
    ) -> tuple[Move, torch.Tensor]:
        """One leapfrog micro step of every chain's macro step under way, and of a new
        one from ``point`` for the chains in ``begin`` (None: none): at the end of a
        level, the forward search moves to the next finer level or, once the error
        holds, to the reverse check of the coarser levels; the macro steps that end are
        ``ready``."""
        d = point.shape[1] // 3
        P, M = _layouts(d)[0], _macro_layout(d)
        if begin is not None:
            h = P(point, "energy") + kinetic_energy(P(point, "p"), inv_mass)
            fresh = M.pack(point, start=point, current=point, end=point, h_start=h, h_end=0.0,
                           level=0.0, micro=0.0, chosen=0.0, phase=_FORWARD, coarse=0.0,
                           grads=0.0)  # fmt: skip
            steps = where_rows(begin, fresh, steps)
        phase, level = M(steps, "phase"), M(steps, "level")
        active, reverse = phase != _IDLE, phase == _REVERSE
        n_micro = level.exp2()  # micro steps of the level under way
        micro_step = torch.where(reverse, -step, step) / n_micro
        current = M(steps, "current")
        x1, p1, e1, g1 = leapfrog(energy, P(current, "x"), P(current, "p"), P(current, "grad"),
                                  micro_step, 1, inv_mass)  # fmt: skip
        now = P.pack(point, x=x1, p=p1, grad=g1, energy=e1)
        micro, grads = M(steps, "micro") + 1, M(steps, "grads") + active
        level_done = active & (micro >= n_micro)
        h_from = torch.where(reverse, M(steps, "h_end"), M(steps, "h_start"))
        h1 = e1 + kinetic_energy(p1, inv_mass)
        error = torch.nan_to_num((h1 - h_from).abs(), nan=math.inf)
        held = error <= self.max_error
        searched, checked = level_done & ~reverse, level_done & reverse
        coarse = torch.where(searched & (level == 0), error, M(steps, "coarse"))
        found = searched & held
        finer = searched & ~held & (level < self.max_halvings)
        diverged = searched & ~held & ~finer
        to_check = found & (level > 0)  # a halved step: check the coarser levels backwards
        irreversible = checked & held
        check_on = checked & ~held & (level + 1 < M(steps, "chosen"))
        ready = (found & ~to_check) | diverged | irreversible | (checked & ~held & ~check_on)
        end = where_rows(found, now, M(steps, "end"))
        restart = torch.where(finer.unsqueeze(-1), M(steps, "start"), end)
        stepped = M.pack(
            point,
            start=M(steps, "start"),
            current=where_rows(finer | to_check | check_on, restart, now),
            end=end,
            h_start=M(steps, "h_start"),
            h_end=torch.where(found, h1, M(steps, "h_end")),
            level=torch.where(to_check, 0.0, level + (finer | check_on)),
            micro=torch.where(level_done, 0.0, micro),
            chosen=torch.where(to_check, level, M(steps, "chosen")),
            phase=torch.where(ready, _IDLE, torch.where(to_check, _REVERSE, phase)),
            coarse=coarse,
            grads=grads,
        )
        steps = where_rows(active, stepped, steps)
        end = where_rows(diverged, now, end)
        move = Move(P(end, "x"), P(end, "p"), P(end, "energy"), P(end, "grad"), grads=grads,
                    ready=ready, log_accept=-coarse, diverged=diverged,
                    irreversible=irreversible)  # fmt: skip
        return move, steps


_IDLE, _FORWARD, _REVERSE = 0.0, 1.0, 2.0  # the phases of a macro step


@functools.lru_cache(maxsize=16)
def _macro_layout(d: int) -> _Layout:
    """The registers of a chain's macro step under way, for positions of d numbers: its
    start, the current micro point and the end found (each a point of 3D + 1 numbers),
    the Hamiltonians at start and end, the level tried (2^level micro steps), the micro
    steps taken at that level, the level chosen, the phase (idle, forward search,
    reverse check), the coarsest level's energy error and the gradients used."""
    point = _layouts(d)[0].width
    return _Layout(start=point, current=point, end=point, h_start=None, h_end=None,
                   level=None, micro=None, chosen=None, phase=None, coarse=None,
                   grads=None)  # fmt: skip
