"""A training process killed with SIGKILL resumes to the same parameters as an
uninterrupted run; SIGTERM and SIGINT stop it at a step boundary with a checkpoint, a
record in metrics.jsonl and status 128 + signal, and --auto-resume then finishes it
exactly as an uninterrupted run; damaged checkpoints fall back to the previous one; a
run directory has one writer at a time."""

import contextlib
import errno
import json
import math
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

from ebmlab.cli import main
from ebmlab.training import CheckpointError, RunDirectory, Trainer, checkpoint, load_checkpoint
from ebmlab.training.recipes import get_recipe
from ebmlab.training.trainer import RESEED

ARGS = [
    "--epochs",
    "2",
    "--hidden",
    "16",
    "--depth",
    "2",
    "--sampler-steps",
    "10",
    "--buffer-size",
    "500",
    "--quadrature-points",
    "32",
    "--batch-size",
    "200",
    "--checkpoint-every",
    "5",
    "--no-progress",
    "--seed",
    "4",
]


def train(out, *extra, stderr=subprocess.DEVNULL):
    cmd = [sys.executable, "-m", "ebmlab", "train", "density", "--out", str(out), *ARGS, *extra]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=stderr, text=True)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The final parameters of the run every interrupted one must reproduce."""
    out = tmp_path_factory.mktemp("full") / "run"
    assert train(out).wait(timeout=300) == 0
    return load_checkpoint(out / "checkpoints" / "last.pt")["model"]


def assert_same_parameters(run, expected):
    got = load_checkpoint(run / "checkpoints" / "last.pt")["model"]
    assert all(torch.equal(got[k], expected[k]) for k in expected)


@pytest.mark.fault(
    "kill -9 mid-epoch",
    "--resume ends on the uninterrupted run's parameters, bit for bit",
)
def test_kill_9_mid_epoch_then_resume_matches_uninterrupted(tmp_path, uninterrupted):
    victim = train(tmp_path / "victim")
    last = tmp_path / "victim" / "checkpoints" / "last.pt"
    wait_for_step(tmp_path / "victim", victim, 10)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    step_at_kill = load_checkpoint(last)["trainer"]["step"]
    assert 0 < step_at_kill < 100  # two epochs of 50 steps
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


@pytest.mark.fault(
    "kill -9 during a checkpoint write",
    "the previous checkpoint is intact; --resume matches bit for bit",
)
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


def signal_case(signum: signal.Signals) -> pytest.param:
    checked = (f"checkpoint at the next step, record in metrics.jsonl, exit {128 + signum}; "
               "--auto-resume matches bit for bit")  # fmt: skip
    scenario = f"{signum.name} at a random step"
    return pytest.param(signum, marks=pytest.mark.fault(scenario, checked), id=signum.name)


@pytest.mark.parametrize("signum", [signal_case(signal.SIGTERM), signal_case(signal.SIGINT)])
def test_signal_checkpoints_then_auto_resume_matches_uninterrupted(tmp_path, signum, uninterrupted):
    run = tmp_path / "victim"
    victim = train(run, stderr=subprocess.PIPE)
    step = random.randint(5, 40)  # a different step on every run: any step must do
    wait_for_step(run, victim, step)
    victim.send_signal(signum)
    assert victim.wait(timeout=60) == 128 + signum
    # the last line says how to go on: the same command with --resume
    said = victim.stderr.read().strip().splitlines()[-1]
    assert said.startswith("ebmlab: stopped at step") and said.endswith(
        shlex.join(["ebmlab", "train", "density", "--out", str(run), *ARGS, "--resume"])
    )
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    stop = [r for r in records if r["split"] == "interrupted"]
    assert len(stop) == 1 and stop[0]["signal"] == signal.Signals(signum).name
    saved = load_checkpoint(run / "checkpoints" / "last.pt")["trainer"]["step"]
    assert saved == stop[0]["step"] >= step  # the checkpoint is the step the signal ended
    assert train(run, "--auto-resume").wait(timeout=300) == 0
    assert_same_parameters(run, uninterrupted)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["split"] for r in records].count("interrupted") == 1  # kept across the resume


def test_auto_resume_without_a_checkpoint_starts_fresh(tmp_path, capsys):
    args = ["train", "density", "--out", str(tmp_path / "new"), *ARGS, "--epochs", "1"]
    assert main([*args, "--auto-resume"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "completed"


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


@pytest.mark.fault(
    "SIGTERM in a step longer than the grace",
    "exit 143 within the grace, previous checkpoint kept",
)
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


@pytest.mark.fault(
    "truncated checkpoint",
    "--resume falls back to last-1.pt, says so, and matches bit for bit",
)
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


@pytest.mark.fault(
    "two writers on one run directory",
    "the second is refused in one line naming the owner's host and pid",
)
def test_a_second_writer_is_refused_naming_the_owner(tmp_path, capsys):
    run = tmp_path / "busy"
    write_lock(run, os.getpid())  # a live process (this one) holds it
    code = main(["train", "density", "--out", str(run), *ARGS, "--epochs", "1"])
    err = capsys.readouterr().err
    assert code == 2 and f"being written by pid {os.getpid()}" in err and err.count("\n") == 1
    write_lock(run, 1, host="another-host")  # liveness cannot be checked there: refused
    assert main(["train", "density", "--out", str(run), *ARGS, "--epochs", "1"]) == 2
    assert "on another-host" in capsys.readouterr().err


@pytest.mark.fault(
    "stale lock of a dead process",
    "taken over with a warning, released at the end",
)
def test_a_stale_lock_is_taken_over_with_a_warning_and_released(tmp_path, capsys):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    run = tmp_path / "stale"
    write_lock(run, gone.pid)
    assert main(["train", "density", "--out", str(run), *ARGS, "--epochs", "1"]) == 0
    assert f"taking over the lock of {run} from pid {gone.pid}" in capsys.readouterr().err
    assert not (run / ".lock").exists()


PLANTED = {
    "density": {"hidden": 16, "depth": 2, "sampler_steps": 5, "buffer_size": 200,
                "quadrature_points": 16, "batch_size": 100},
    "jem": {"arch": "mlp", "hidden": (32,), "sampler_steps": 3, "buffer_size": 60,
            "batch_size": 32},
    "rbm": {"n_hidden": 8, "batch_size": 50},
}  # fmt: skip


def runaway_chains(task):
    """The chains a checkpoint will carry and a state they can run off to: the buffer's
    Langevin chains far past the data (finite, so the sampler still starts from them),
    or non-finite persistent Gibbs chains."""
    if hasattr(task, "buffer"):
        return task.buffer.buffer, 1e30
    return task.cd.chains, math.nan


def divergence_case(name: str) -> pytest.param:
    checked = ("restart from the last good checkpoint with run-away chains reset, a fresh "
               "stream and half the learning rate; finite result")  # fmt: skip
    scenario = f"planted divergence in the {name} recipe"
    return pytest.param(name, marks=pytest.mark.fault(scenario, checked), id=name)


@pytest.mark.parametrize("name", [divergence_case(name) for name in sorted(PLANTED)])
def test_a_planted_divergence_restarts_with_reset_chains_and_a_fresh_stream(tmp_path, name):
    """Five chains run off by the checkpoint at step 2 and the energy blows up at
    step 3 (a weight turns infinite): the run reloads step 2, resets exactly those
    chains, reseeds its stream, halves the learning rate and finishes finite."""
    recipe = get_recipe(name)
    config, trainer_config = recipe.configs(
        {**PLANTED[name], "max_steps": 6, "checkpoint_every": 2, "divergence_restarts": 1,
         "progress": False, "seed": 3}
    )  # fmt: skip
    setup = recipe.build(config, trainer_config)
    task, step, calls = setup.task, setup.task.training_step, []

    def planted(batch, generator):
        calls.append(1)
        if len(calls) == 3:
            with torch.no_grad():
                next(task.model.parameters()).view(-1)[0] = math.inf
        result = step(batch, generator)
        if len(calls) == 2:
            chains, value = runaway_chains(task)
            chains[:5] = value
        return result

    task.training_step = planted
    trainer = Trainer(task, setup.train_data, trainer_config, tmp_path / name)
    summary = trainer.fit()
    assert summary["status"] == "max_steps" and summary["step"] == 6 and summary["restarts"] == 1
    records = RunDirectory(tmp_path / name).read_metrics()
    restart = [r for r in records if r["split"] == "restart"]
    assert restart == [{"split": "restart", "epoch": 0, "step": 2, "lr_scale": 0.5,
                        "chains_reset": 5}]  # fmt: skip
    assert trainer.generator.initial_seed() == 3 + RESEED
    assert all(torch.isfinite(p).all() for p in task.model.parameters())
    chains, _ = runaway_chains(task)
    assert torch.isfinite(chains).all() and chains.abs().max() < 1e3


def disk_fills_at(monkeypatch, nth):
    """Checkpoint writes fail with ENOSPC from the ``nth`` on, as on a full disk, until
    the returned callable frees the space."""
    real, calls, full = checkpoint._write_temporary, [], [True]

    def write(data, path):
        if path.suffix == ".pt":
            calls.append(1)
            if len(calls) >= nth and full[0]:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(data, path)

    monkeypatch.setattr(checkpoint, "_write_temporary", write)
    return lambda: full.clear() or full.append(False)


@pytest.mark.fault(
    "disk full during a checkpoint write",
    "one line, exit 1, previous checkpoint intact; --resume matches bit for bit",
)
def test_a_full_disk_stops_training_with_the_previous_checkpoint_intact(
    tmp_path, monkeypatch, capsys, uninterrupted
):
    run = tmp_path / "full-disk"
    free = disk_fills_at(monkeypatch, 3)
    assert main(["train", "density", "--out", str(run), *ARGS]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "training stopped at step 15" in err
    assert "No space left on device" in err and "still the last complete checkpoint" in err
    assert load_checkpoint(run / "checkpoints" / "last.pt")["trainer"]["step"] == 10
    assert not list((run / "checkpoints").glob(".*.tmp"))
    free()
    assert train(run, "--resume").wait(timeout=300) == 0
    assert_same_parameters(run, uninterrupted)


@pytest.mark.fault(
    "disk full with on_save_error = continue",
    "each failed write recorded in metrics.jsonl; training completes",
)
def test_a_full_disk_can_be_recorded_and_trained_through(tmp_path, monkeypatch, capsys):
    run = tmp_path / "go-on"
    disk_fills_at(monkeypatch, 2)
    args = ["--on-save-error", "continue", "--max-steps", "12"]
    assert main(["train", "density", "--out", str(run), *ARGS, *args]) == 0
    assert "training goes on (on_save_error = continue)" in capsys.readouterr().err
    failed = [r for r in RunDirectory(run).read_metrics() if r["split"] == "save_failed"]
    assert [r["step"] for r in failed] == [10, 12]
    assert load_checkpoint(run / "checkpoints" / "last.pt")["trainer"]["step"] == 5


@pytest.mark.fault(
    "evaluate and sample during training",
    "each reads a complete checkpoint of a later step; no fallback needed",
)
def test_evaluate_and_sample_during_training_read_complete_checkpoints(tmp_path, capsys):
    """Readers race a writer that replaces last.pt at every step: each reads a whole
    checkpoint (verified against its checksum) and reports its step."""
    run = tmp_path / "busy"
    cmd = [sys.executable, "-m", "ebmlab", "train", "rbm", "--out", str(run), "--epochs", "50",
           "--n-hidden", "8", "--checkpoint-every", "1", "--no-progress"]  # fmt: skip
    writer = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_step(run, writer, 1)
        steps = []
        for _ in range(3):
            assert main(["evaluate", str(run)]) == 0
            steps.append(json.loads((run / "evaluation.json").read_text())["step"])
            out = tmp_path / "sample.png"
            assert main(["sample", str(run), "--n", "4", "--steps", "2", "--out", str(out)]) == 0
        assert writer.poll() is None, "training ended before the readers were done"
    finally:
        writer.kill()
        writer.wait()
    assert steps == sorted(steps) and steps[-1] > steps[0] >= 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "instead" not in err  # no fallback was ever needed


REQUIRED = [
    "SIGTERM at a random step", "SIGINT at a random step", "kill -9 mid-epoch",
    "kill -9 during a checkpoint write", "a rank killed under torchrun --max-restarts 1",
    "disk full during a checkpoint write", "truncated checkpoint",
    "corrupt checkpoint (one flipped byte)", "checkpoint of another format",
    "two writers on one run directory", "evaluate and sample during training",
    "changed data on resume", "planted divergence in the jem recipe",
    "planted divergence in the density recipe", "planted divergence in the rbm recipe",
]  # fmt: skip
FAULT_MODULES = {"test_fault_tolerance.py", "test_checkpoint.py", "test_trainer.py",
                 "test_distributed.py"}  # fmt: skip


def test_the_fault_table_names_every_required_scenario(request):
    """The scenarios of this run's fault-injection tests (marked ``fault``; their results
    close the test report) include every one required; needs all of them collected."""
    items = request.session.items
    if not {item.path.name for item in items} >= FAULT_MODULES:
        pytest.skip("run with every fault-injection module to check the table")
    table = {m.args: item.nodeid for item in items for m in item.iter_markers("fault")}
    print("\nfault-injection scenarios:")
    for (scenario, checked), nodeid in table.items():
        print(f"  {scenario}: {checked}  [{nodeid}]")
    missing = set(REQUIRED) - {scenario for scenario, _ in table}
    assert not missing and len(table) >= 12, f"no test for {sorted(missing)}"
