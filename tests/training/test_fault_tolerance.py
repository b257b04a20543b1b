"""A training process killed with SIGKILL resumes to the same parameters as an uninterrupted run."""

import os
import signal
import subprocess
import sys
import time

import torch

from ebmlab.training import load_checkpoint

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


def test_kill_9_mid_epoch_then_resume_matches_uninterrupted(tmp_path):
    full = train(tmp_path / "full")
    victim = train(tmp_path / "victim")
    last = tmp_path / "victim" / "checkpoints" / "last.pt"
    deadline = time.time() + 120
    while time.time() < deadline and victim.poll() is None:
        if last.is_file() and load_checkpoint(last)["trainer"]["step"] >= 10:
            break
        time.sleep(0.05)
    assert victim.poll() is None, "training finished before it could be interrupted"
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    step_at_kill = load_checkpoint(last)["trainer"]["step"]
    assert 0 < step_at_kill < 300
    assert train(tmp_path / "victim", "--resume").wait(timeout=300) == 0
    assert full.wait(timeout=300) == 0
    a = load_checkpoint(tmp_path / "full" / "checkpoints" / "last.pt")["model"]
    b = load_checkpoint(last)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


DIE_MID_WRITE = """
import os, signal, sys
import torch
from ebmlab.cli import main

real_save, calls = torch.save, []


def dying_save(state, fh, *args, **kwargs):
    calls.append(1)
    if len(calls) == 3:  # the third checkpoint: half written, then SIGKILL
        fh.write(b"PK partial checkpoint")
        fh.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    real_save(state, fh, *args, **kwargs)


torch.save = dying_save
sys.exit(main(sys.argv[1:]))
"""


def test_kill_9_mid_checkpoint_write_keeps_the_previous_one_and_resumes_exactly(tmp_path):
    full = train(tmp_path / "full")
    run = tmp_path / "victim"
    cmd = [sys.executable, "-c", DIE_MID_WRITE, "train", "density", "--out", str(run), *ARGS]
    victim = subprocess.run(cmd, capture_output=True, timeout=300)
    assert victim.returncode == -signal.SIGKILL
    assert list((run / "checkpoints").glob(".last.pt.*.tmp")), "the kill did not hit a write"
    last = load_checkpoint(run / "checkpoints" / "last.pt")  # the previous one, intact
    assert last["trainer"]["step"] == 10
    assert train(run, "--resume").wait(timeout=300) == 0
    assert full.wait(timeout=300) == 0
    a = load_checkpoint(tmp_path / "full" / "checkpoints" / "last.pt")["model"]
    b = load_checkpoint(run / "checkpoints" / "last.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
