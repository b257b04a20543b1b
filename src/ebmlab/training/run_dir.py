"""The run directory: everything a training run leaves behind.

RUN_DIR/config.json        recipe name and every setting
RUN_DIR/metrics.jsonl      one JSON record per logged step or validation
RUN_DIR/summary.json       status, counters, final and best metrics
RUN_DIR/curves.png         training curves
RUN_DIR/checkpoints/last.pt, best.pt
RUN_DIR/samples/*.png      sample grids written by recipes
RUN_DIR/.lock              host and pid of the training writing it, while it runs

One training writes a run directory at a time: :meth:`RunDirectory.owned` takes the
lock file or refuses with the owner's host and pid. A lock left by a process that is
gone (same host, pid not running) is taken over with a warning; one from another host
cannot be checked and must be removed by hand.

A directory that holds a run (:meth:`RunDirectory.holds_run`) is never trained into
from scratch by accident: the trainer continues it (resume) or, when asked to
overwrite it, first removes every file of the old run (:meth:`RunDirectory.clear`), so
no stale evaluation or picture is left beside the new run's.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ebmlab._checks import ArgumentError
from ebmlab.plotting import plot_curves


def jsonable(value: Any) -> Any:
    """``value`` with non-finite floats as ``null``: valid JSON for every reader (jq,
    JavaScript, ``json.loads``), unlike Python's Infinity and NaN. Where a key can be
    infinite, the evaluation keys page (docs/guides/evaluation.md) says what its
    ``null`` means (a missing bound, an unconverged estimate)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def write_json(path: str | os.PathLike, data: Any) -> None:
    """Write JSON atomically (temp file + rename)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(jsonable(data), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


class RunDirectoryBusyError(ArgumentError):
    """Another live training writes this run directory."""


class RunDirectoryInUseError(ArgumentError):
    """The run directory holds a run that a fresh training would overwrite."""


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        pass
    return True


class RunDirectory:
    """Paths and writers of one run's directory.

    Args:
        path: the run's directory (created if missing).
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.checkpoints = self.path / "checkpoints"
        self.samples = self.path / "samples"

    def create(self) -> RunDirectory:
        """Make the directory and its sub-folders; returns the run directory."""
        for d in (self.path, self.checkpoints, self.samples):
            d.mkdir(parents=True, exist_ok=True)
        return self

    @property
    def lock(self) -> Path:
        return self.path / ".lock"

    @contextlib.contextmanager
    def owned(self) -> Iterator[RunDirectory]:
        """Hold the directory's lock file for the duration (see the module's docstring)."""
        self.path.mkdir(parents=True, exist_ok=True)
        me = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}
        while True:
            try:
                fd = os.open(self.lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                break
            except FileExistsError:
                self._take_over_if_stale(me["host"])
        with os.fdopen(fd, "w") as fh:
            json.dump(me, fh)
        try:
            yield self
        finally:
            with contextlib.suppress(FileNotFoundError):
                if json.loads(self.lock.read_text()).get("pid") == me["pid"]:
                    self.lock.unlink()

    def _take_over_if_stale(self, host: str) -> None:
        try:
            owner = json.loads(self.lock.read_text())
        except FileNotFoundError:
            return  # released meanwhile: try again
        except ValueError:
            owner = {}  # half written by a process that died: stale
        pid, owner_host = owner.get("pid"), owner.get("host")
        if owner and (owner_host != host or _running(int(pid))):
            started = time.strftime("%Y-%m-%d %H:%M", time.localtime(owner.get("since", 0)))
            raise RunDirectoryBusyError(
                f"run directory {self.path} is being written by pid {pid} on {owner_host} "
                f"(since {started}); use another --out, or remove {self.lock} if that job "
                "is gone"
            )
        print(
            f"ebmlab: taking over the lock of {self.path} from pid {pid} on {owner_host}, "
            "which is no longer running",
            file=sys.stderr,
        )
        with contextlib.suppress(FileNotFoundError):
            self.lock.unlink()

    def holds_run(self) -> bool:
        """Whether a training has written here: its config, metrics or a checkpoint."""
        return (
            (self.path / "config.json").is_file()
            or self.metrics_file.is_file()
            or (self.checkpoints.is_dir() and any(self.checkpoints.iterdir()))
        )

    def clear(self) -> None:
        """Remove every file and folder of the run directory but its lock."""
        if not self.path.is_dir():
            return
        for entry in self.path.iterdir():
            if entry == self.lock:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()

    def refuse_fresh_start(self, resume: str, overwrite: str) -> None:
        """Raise :class:`RunDirectoryInUseError` if this directory holds a run, naming
        how to continue it (``resume``) or replace it (``overwrite``)."""
        if not self.holds_run():
            return
        summary = self.path / "summary.json"
        status = ""
        if summary.is_file():
            with contextlib.suppress(ValueError, OSError):
                done = json.loads(summary.read_text())
                status = f" ({done.get('status')} at step {done.get('step')})"
        raise RunDirectoryInUseError(
            f"{self.path} holds a run{status}; continue it with {resume}, or replace it "
            f"with {overwrite} (deletes every file of the old run)"
        )

    @property
    def last(self) -> Path:
        return self.checkpoints / "last.pt"

    @property
    def best(self) -> Path:
        return self.checkpoints / "best.pt"

    @property
    def metrics_file(self) -> Path:
        return self.path / "metrics.jsonl"

    def file(self, name: str) -> Path:
        """A path for an artefact inside the run directory; refuses names that escape it.

        Args:
            name: a file name relative to the run directory.
        """
        target = (self.path / name).resolve()
        if self.path.resolve() not in target.parents:
            raise ArgumentError(
                f"artefact name {name!r} points outside the run directory {self.path}"
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        return target

    def write_config(self, config: dict[str, Any]) -> None:
        """Write ``config.json`` (atomically)."""
        write_json(self.path / "config.json", config)

    def read_config(self) -> dict[str, Any]:
        """The settings stored in ``config.json``; a clear error when this is not a run
        directory."""
        path = self.path / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{self.path} is not a run directory (no config.json)")
        return json.loads(path.read_text())

    def write_summary(self, summary: dict[str, Any]) -> None:
        """Write ``summary.json`` (atomically)."""
        write_json(self.path / "summary.json", summary)

    def append_metrics(self, record: dict[str, Any]) -> None:
        """Append one record to ``metrics.jsonl``."""
        with open(self.metrics_file, "a") as fh:
            fh.write(json.dumps(jsonable(record)) + "\n")

    def read_metrics(self) -> list[dict[str, Any]]:
        """Every record of ``metrics.jsonl``, in order."""
        if not self.metrics_file.is_file():
            return []
        lines = self.metrics_file.read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def truncate_metrics(self, n_records: int) -> None:
        """Keep the first ``n_records`` records (used when resuming from a checkpoint)."""
        records = self.read_metrics()[:n_records]
        tmp = self.metrics_file.with_name(".metrics.jsonl.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
        os.replace(tmp, self.metrics_file)

    def plot_curves(self) -> None:
        """Draw the training curves of ``metrics.jsonl`` into ``curves.png``."""
        plot_curves(self.read_metrics(), self.path / "curves.png")
