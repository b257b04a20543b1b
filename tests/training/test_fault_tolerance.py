"""A training process killed with SIGKILL resumes to the same parameters as an
uninterrupted run; SIGTERM and SIGINT stop it at a step boundary with a checkpoint, a
record in metrics.jsonl and status 128 + signal, and --auto-resume then finishes it
exactly as an uninterrupted run; damaged checkpoints fall back to the previous one; a
run directory has one writer at a time."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

from ebmlab.cli import main
from ebmlab.training import CheckpointError, load_checkpoint

ARGS = [
    "--epochs",
    "3",
    "--hidden",
    "16",
    "--depth",
    "2",
    "--sampler-steps",
    "20",
    "--buffer-size",
    "500",
    "--quadrature-points",
    "32",
    "--batch-size",
    "100",
    "--checkpoint-every",
    "5",
    "--no-progress",
    "--seed",
    "4",
]


def train(out, *extra):
    cmd = [sys.executable, "-m", "ebmlab", "train", "density", "--out", str(out), *ARGS, *extra]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The final parameters of the run every interrupted one must reproduce."""
    out = tmp_path_factory.mktemp("full") / "run"
    assert train(out).wait(timeout=300) == 0
    return load_checkpoint(out / "checkpoints" / "last.pt")["model"]


def assert_same_parameters(run, expected):
    got = load_checkpoint(run / "checkpoints" / "last.pt")["model"]
    assert all(torch.equal(got[k], expected[k]) for k in expected)


def test_kill_9_mid_epoch_then_resume_matches_uninterrupted(tmp_path, uninterrupted):
    victim = train(tmp_path / "victim")
    last = tmp_path / "victim" / "checkpoints" / "last.pt"
    wait_for_step(tmp_path / "victim", victim, 10)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    step_at_kill = load_checkpoint(last)["trainer"]["step"]
    assert 0 < step_at_kill < 300
    assert train(tmp_path / "victim", "--resume").wait(timeout=300) == 0
    assert_same_parameters(tmp_path / "victim", uninterrupted)


DIE_MID_WRITE = """
import os, signal, sys, tempfile
from ebmlab.cli import main
from ebmlab.training import checkpoint

real_write, calls = checkpoint._write_temporary, []


def dying_write(data, path):
    if path.suffix == ".pt":
        calls.append(1)
        if len(calls) == 3:  # the third checkpoint: half written, then SIGKILL
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            os.write(fd, data[: len(data) // 2])
            os.kill(os.getpid(), signal.SIGKILL)
    return real_write(data, path)


checkpoint._write_temporary = dying_write
sys.exit(main(sys.argv[1:]))
"""


def test_kill_9_mid_checkpoint_write_keeps_the_previous_one_and_resumes_exactly(
    tmp_path, uninterrupted
):
    run = tmp_path / "victim"
    cmd = [sys.executable, "-c", DIE_MID_WRITE, "train", "density", "--out", str(run), *ARGS]
    victim = subprocess.run(cmd, capture_output=True, timeout=300)
    assert victim.returncode == -signal.SIGKILL
    assert list((run / "checkpoints").glob(".last.pt.*.tmp")), "the kill did not hit a write"
    last = load_checkpoint(run / "checkpoints" / "last.pt")  # the previous one, intact
    assert last["trainer"]["step"] == 10
    assert train(run, "--resume").wait(timeout=300) == 0
    assert_same_parameters(run, uninterrupted)


def wait_for_step(run, process, step):
    last = run / "checkpoints" / "last.pt"
    deadline = time.time() + 120
    while time.time() < deadline and process.poll() is None:
        with contextlib.suppress(CheckpointError):  # caught mid-write: look again
            if last.is_file() and load_checkpoint(last)["trainer"]["step"] >= step:
                return
        time.sleep(0.05)
    raise AssertionError("training ended before it could be interrupted")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_checkpoints_then_auto_resume_matches_uninterrupted(tmp_path, signum, uninterrupted):
    run = tmp_path / "victim"
    victim = train(run)
    wait_for_step(run, victim, 10)
    victim.send_signal(signum)
    assert victim.wait(timeout=60) == 128 + signum
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    stop = [r for r in records if r["split"] == "interrupted"]
    assert len(stop) == 1 and stop[0]["signal"] == signal.Signals(signum).name
    saved = load_checkpoint(run / "checkpoints" / "last.pt")["trainer"]["step"]
    assert saved == stop[0]["step"] >= 10  # the checkpoint is the step the signal ended
    assert train(run, "--auto-resume").wait(timeout=300) == 0
    assert_same_parameters(run, uninterrupted)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["split"] for r in records].count("interrupted") == 1  # kept across the resume


def test_auto_resume_without_a_checkpoint_starts_fresh(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "ebmlab",
            "train",
            "density",
            "--out",
            str(tmp_path / "new"),
            *ARGS,
            "--epochs",
            "1",
            "--auto-resume",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0 and json.loads(out.stdout)["status"] == "completed"


SLOW_STEP = """
import sys, time
import torch
from ebmlab.training import StepResult, Task, Trainer, TrainerConfig

class Slow(Task):
    def __init__(self):
        self.model, self.calls = torch.nn.Linear(1, 1), 0

    def training_step(self, batch, generator):
        self.calls += 1
        if self.calls > 1:  # every step after the first is slow
            open(sys.argv[2], "w").close()
            time.sleep(30)
        return StepResult(self.model(batch[0]).sum(), {})

config = TrainerConfig(epochs=1, batch_size=1, preempt_grace=0.5, progress=False)
Trainer(Slow(), (torch.zeros(100, 1),), config, sys.argv[1]).fit()
"""


def test_a_step_longer_than_the_grace_exits_at_once_with_the_previous_checkpoint(tmp_path):
    run = tmp_path / "slow"
    marker = tmp_path / "in-slow-step"
    victim = subprocess.Popen(
        [sys.executable, "-c", SLOW_STEP, str(run), str(marker)], stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 60
    while not marker.exists() and time.time() < deadline:
        time.sleep(0.05)
    start = time.time()
    victim.send_signal(signal.SIGTERM)
    assert victim.wait(timeout=20) == 143
    assert time.time() - start < 10
    assert "no step ended within the grace" in victim.stderr.read()
    assert not (run / "checkpoints" / "last.pt").exists()  # no checkpoint was due yet


def test_truncated_last_checkpoint_resumes_from_the_previous_and_says_so(tmp_path, uninterrupted):
    run = tmp_path / "cut"
    assert train(run, "--max-steps", "12").wait(timeout=300) == 0  # checkpoints at 5, 10, 12
    last = run / "checkpoints" / "last.pt"
    data = last.read_bytes()
    last.write_bytes(data[: len(data) // 3])
    cmd = [sys.executable, "-m", "ebmlab", "train", "density", "--out", str(run), *ARGS]
    resume = [*cmd, "--resume", "--max-steps", "0"]  # lift the first run's step limit
    out = subprocess.run(resume, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "corrupt or truncated" in out.stderr and "resuming from last-1.pt" in out.stderr
    assert_same_parameters(run, uninterrupted)


def write_lock(run, pid, host=None):
    run.mkdir(parents=True, exist_ok=True)
    owner = {"host": host or socket.gethostname(), "pid": pid, "since": time.time()}
    (run / ".lock").write_text(json.dumps(owner))


def test_a_second_writer_is_refused_naming_the_owner(tmp_path, capsys):
    run = tmp_path / "busy"
    write_lock(run, os.getpid())  # a live process (this one) holds it
    code = main(["train", "density", "--out", str(run), *ARGS, "--epochs", "1"])
    err = capsys.readouterr().err
    assert code == 2 and f"being written by pid {os.getpid()}" in err and err.count("\n") == 1
    write_lock(run, 1, host="another-host")  # liveness cannot be checked there: refused
    assert main(["train", "density", "--out", str(run), *ARGS, "--epochs", "1"]) == 2
    assert "on another-host" in capsys.readouterr().err


def test_a_stale_lock_is_taken_over_with_a_warning_and_released(tmp_path, capsys):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    run = tmp_path / "stale"
    write_lock(run, gone.pid)
    assert main(["train", "density", "--out", str(run), *ARGS, "--epochs", "1"]) == 0
    assert f"taking over the lock of {run} from pid {gone.pid}" in capsys.readouterr().err
    assert not (run / ".lock").exists()
