"""Graceful preemption: what training does when a scheduler asks it to stop.

Cluster schedulers (slurm, Kubernetes) send SIGTERM, people press Ctrl-C (SIGINT),
and both allow a grace period before the kill. While training runs,
:class:`Preemption` turns either signal into a request the trainer honours at the next
step boundary: it records the interruption in ``metrics.jsonl``, writes
``checkpoints/last.pt`` and ends with status 128 + the signal's number (143 for
SIGTERM, 130 for SIGINT), so that ``--resume`` (or ``--auto-resume`` in a resubmitted
job) continues exactly where it stopped. If no step boundary comes within ``grace``
seconds, or a second signal arrives, the process exits at once with that status and
the previous checkpoint, which atomic writes keep intact.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preemption:
    """A context that catches SIGTERM and SIGINT in the main thread; ``received`` holds
    the first signal's number (None until one arrives)."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.hint = ""  # how to continue, said when the process stops
        self.received: int | None = None
        self._previous: dict[int, Any] = {}
        self._timer: threading.Timer | None = None

    def __enter__(self) -> Preemption:
        self.received = None
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        if self._timer is not None:
            self._timer.cancel()

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received else ""

    @property
    def exit_status(self) -> int:
        return 128 + (self.received or 0)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None:
            self._exit(f"a second {signal.Signals(signum).name}: stopping now")
        self.received = signum
        print(
            f"ebmlab: {self.name} received; saving a checkpoint at the end of this step "
            f"(grace {self.grace:g} s)",
            file=sys.stderr,
            flush=True,
        )
        self._timer = threading.Timer(self.grace, self._exit, ["no step ended within the grace"])
        self._timer.daemon = True
        self._timer.start()

    def _exit(self, why: str) -> None:
        hint = f"; {self.hint}" if self.hint else ""
        print(
            f"ebmlab: {why}; exiting with the previous checkpoint (status {self.exit_status})"
            f"{hint}",
            file=sys.stderr,
            flush=True,
        )
        os._exit(self.exit_status)
