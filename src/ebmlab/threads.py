"""How many CPU threads ebmlab's work should use, and whether the CPUs are busy.

PyTorch sizes its thread pool by the machine's cores, not by the CPUs a process may
use: in a container whose cgroup quota gives it 2 CPUs of a 64-core host, or under
``taskset``, it starts 32 threads that time-share 2 CPUs, and every parallel kernel
waits for its slowest thread. When other processes load the CPUs the same happens on
any machine: a step that takes 0.15 s on idle cores takes seconds. The remedy is
fewer threads, down to one on a machine whose cores are all busy.
:func:`usable_cpus` reads what the process may use (its affinity mask and its cgroup
CPU quota, v2 or v1), :func:`resolve_threads` turns a setting into a thread count,
and :func:`busy_warning` words the hint a user needs when the load is above the CPUs.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch

from ebmlab._checks import ArgumentError


def _cgroup_quota() -> float | None:
    """CPUs allowed by the cgroup's CPU quota (v2 ``cpu.max``, v1 ``cfs_quota_us``), or
    None where there is none or it cannot be read."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        v1 = Path("/sys/fs/cgroup/cpu")
        quota = int((v1 / "cpu.cfs_quota_us").read_text())
        period = int((v1 / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 else quota / period
    except (OSError, ValueError):
        return None


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask, capped by its cgroup's CPU
    quota (rounded up), at least 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cpus = os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None:
        cpus = min(cpus, math.ceil(quota))
    return max(1, cpus)


def load_average() -> float | None:
    """The one-minute load average (runnable processes), or None where there is none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def resolve_threads(threads: int, name: str = "threads") -> int:
    """The thread count for a setting: ``threads`` itself, or for 0 PyTorch's current
    count capped at :func:`usable_cpus` (which honours ``OMP_NUM_THREADS``).

    Args:
        threads: a count from 1 to the usable CPUs, or 0 for the default.
        name: the setting's name in the error message (``--threads``, ``threads``).
    """
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise ArgumentError(f"{name} must be an integer >= 0 (0: automatic), got {threads!r}")
    cpus = usable_cpus()
    if threads > cpus:
        raise ArgumentError(
            f"{name} {threads} is more than the {cpus} CPUs this process may use "
            "(affinity and cgroup quota); threads beyond them only wait for each other"
        )
    return threads or min(torch.get_num_threads(), cpus)


def apply_threads(threads: int, name: str = "threads") -> int:
    """Set PyTorch's intra-op thread count to :func:`resolve_threads` (only where it
    differs, so a process that set its own count keeps it); returns the count."""
    count = resolve_threads(threads, name)
    if count != torch.get_num_threads():
        torch.set_num_threads(count)
    return count


def busy_warning(threads: int) -> str | None:
    """A one-line hint when the load average is above the usable CPUs by a whole
    runnable process (work with ``threads`` threads then runs many times slower than on
    idle CPUs; the margin spares the minute the average takes to fall after a job ends),
    else None."""
    load, cpus = load_average(), usable_cpus()
    if load is None or load < cpus + 1:
        return None
    fewer = "; --threads 1 wastes less of them" if threads > 1 else ""
    return (
        f"the CPUs are busy (load average {load:.1f} on {cpus} CPUs): steps will be "
        f"slower than on an idle machine{fewer}"
    )
