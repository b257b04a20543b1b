"""Progress of long evaluations, told on stderr.

An evaluation runs for minutes (thousands of sampler steps, OOD scores, sample
metrics) and prints its JSON only at the end. :class:`Stages` says on stderr which part
runs and how long the job has taken so far, one line per stage, so that a user sees the
job move and the JSON on stdout stays clean for a pipe.
"""

from __future__ import annotations

import sys
import time


class Stages:
    """Call with a stage's name as it starts: ``ebmlab <job>: <stage> (12 s)``.

    Args:
        job: what runs (``evaluate``).
    """

    def __init__(self, job: str) -> None:
        self.job = job
        self.start = time.perf_counter()

    def __call__(self, stage: str) -> None:
        elapsed = time.perf_counter() - self.start
        print(f"ebmlab {self.job}: {stage} ({elapsed:.0f} s)", file=sys.stderr, flush=True)


def quiet(stage: str) -> None:
    """A progress callback that says nothing (the default of library calls)."""
