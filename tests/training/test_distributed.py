"""Data-parallel training with two gloo processes against a single process."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ebmlab.cli import main
from ebmlab.training import load_checkpoint

WORKER = Path(__file__).with_name("ddp_worker.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def run_worker(out: Path, nproc: int, *extra: str) -> dict:
    launcher = (
        ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
        if nproc > 1
        else []
    )
    cmd = [sys.executable, *launcher, str(WORKER), str(out), *extra]
    subprocess.run(cmd, check=True, env=ENV, timeout=180, capture_output=True)
    result = torch.load(out)
    # leaving the group stops its threads: left running, they can abort the process at exit
    assert not [name for name in result["threads_after_shutdown"] if "gloo" in name]
    return result


def test_two_processes_match_one_on_the_same_global_batches(tmp_path):
    one = run_worker(tmp_path / "one.pt", 1)
    two = run_worker(tmp_path / "two.pt", 2)
    assert two["world_size"] == 2 and len(one["grads"]) == len(two["grads"]) == 12
    for step_one, step_two in zip(one["grads"], two["grads"], strict=True):
        for a, b in zip(step_one, step_two, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(one["params"], two["params"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # the logged loss is the global batch mean, reduced across ranks
    torch.testing.assert_close(torch.tensor(one["losses"]), torch.tensor(two["losses"]))


@pytest.mark.fault(
    "divergence on one rank of two",
    "every rank stops with that rank's message",
)
def test_a_fault_on_one_rank_stops_every_rank_with_its_message(tmp_path):
    result = run_worker(tmp_path / "fault.pt", 2, "--diverge-on-rank", "1")
    assert result["error"].startswith("training diverged at step 2: planted fault on rank 1")


JEM = [
    "--arch", "mlp", "--hidden", "32", "--sampler-steps", "3", "--buffer-size", "51",
    "--epochs", "1", "--batch-size", "32", "--checkpoint-every", "3", "--no-progress",
    "--lr-schedule", "constant",  # a schedule that --max-steps leaves alone
]  # fmt: skip


def train(out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "ebmlab", "train", "jem", "--out", str(out), *JEM, *extra]
    return subprocess.run(cmd, env=ENV, timeout=300, capture_output=True, text=True)


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """Six JEM steps in two processes, uninterrupted."""
    out = tmp_path_factory.mktemp("jem2") / "full"
    result = train(out, "--nproc", "2", "--max-steps", "6")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["step"] == 6  # one summary: only rank 0 prints
    return out


def test_jem_with_two_processes_resumes_exactly_and_loads_as_one(tmp_path, capsys, full):
    part = train(tmp_path / "part", "--nproc", "2", "--max-steps", "3")
    assert part.returncode == 0, part.stderr
    resumed = train(tmp_path / "part", "--nproc", "2", "--max-steps", "6", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    a = load_checkpoint(full / "checkpoints" / "last.pt")
    b = load_checkpoint(tmp_path / "part" / "checkpoints" / "last.pt")
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    # each rank's share of the replay buffer is saved, merged in rank order (26 + 25 chains)
    assert a["task"]["buffer"]["buffer"].shape == (51, 64)
    assert torch.equal(a["task"]["buffer"]["buffer"], b["task"]["buffer"]["buffer"])
    assert [len(r["generator"]) for r in a["rng_by_rank"]] == [len(a["rng"]["generator"])] * 2
    records = [json.loads(line) for line in (full / "metrics.jsonl").open()]
    steps = [r["step"] for r in records if r["split"] == "train"]
    assert steps == sorted(set(steps))  # written once, by rank 0
    # a single process cannot resume it exactly, and says so
    single = ["train", "jem", "--out", str(full), *JEM, "--max-steps", "9", "--resume"]
    assert main(single) == 2
    assert "resume with --nproc 2" in capsys.readouterr().err
    # but evaluation tools load the merged state as one process
    out = tmp_path / "grid.png"
    assert main(["sample", str(full), "--n", "4", "--steps", "2", "--out", str(out)]) == 0
    assert out.is_file()


KILL_RANK_1 = """
import os, signal, sys
from ebmlab.cli import main
from ebmlab.training import Trainer

step = Trainer._train_step


def dying(self, batch, weight):  # rank 1 dies in step 5 of the first attempt
    first = os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
    if self.step == 4 and os.environ["RANK"] == "1" and first:
        os.kill(os.getpid(), signal.SIGKILL)
    return step(self, batch, weight)


Trainer._train_step = dying
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.fault(
    "a rank killed under torchrun --max-restarts 1",
    "all ranks resume from the last checkpoint and end on the uninterrupted run, to float rounding",
)
def test_a_rank_killed_under_torchrun_restarts_all_from_the_last_checkpoint(tmp_path, full):
    """torchrun --max-restarts 1 restarts both ranks after rank 1 is killed; they resume
    from step 3's checkpoint (one step of work lost) and end where the uninterrupted run
    ends, to float rounding."""
    script = tmp_path / "dying.py"
    script.write_text(KILL_RANK_1)
    run = tmp_path / "restarted"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "--max-restarts=1", "--monitor-interval=0.1", str(script), "train", "jem",
           "--out", str(run), *JEM, "--max-steps", "6"]  # fmt: skip
    result = subprocess.run(cmd, env=ENV, timeout=300, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "Signals.SIGKILL" in result.stderr or "-9" in result.stderr  # rank 1 did die
    a = load_checkpoint(full / "checkpoints" / "last.pt")
    b = load_checkpoint(run / "checkpoints" / "last.pt")
    assert b["trainer"]["step"] == 6
    for k in a["model"]:
        torch.testing.assert_close(b["model"][k], a["model"][k], rtol=1e-5, atol=1e-6)
    steps = [r["step"] for r in map(json.loads, (run / "metrics.jsonl").open())]
    assert steps == sorted(steps)  # the lost step's records were dropped on resume


@pytest.mark.parametrize("nproc", ["0", "-2"])
def test_bad_nproc_is_a_usage_error(tmp_path, capsys, nproc):
    assert main(["train", "jem", "--out", str(tmp_path / "bad"), *JEM, "--nproc", nproc]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "--nproc" in err
    assert not (tmp_path / "bad").exists()


def test_dbm_and_dbn_recipes_train_with_two_processes(tmp_path):
    """Each rank keeps its share of the persistent chains (a DBN's bottom layer is the
    Bernoulli RBM's)."""
    for model, epochs in (("dbm", "1"), ("dbn", "2")):
        out = tmp_path / model
        cmd = [sys.executable, "-m", "ebmlab", "train", "rbm", "--model", model, "--nproc", "2",
               "--epochs", epochs, "--n-hidden", "8", "--n-chains", "21", "--out", str(out),
               "--no-progress"]  # fmt: skip
        result = subprocess.run(cmd, env=ENV, timeout=300, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        chains = load_checkpoint(out / "checkpoints" / "last.pt")["task"]["chains"]
        if model == "dbn":  # two epochs: the top RBM's chains live on its 8 inputs
            assert chains["layer1"].shape == (21, 8)
            chains = chains["layer0"]
        assert chains.shape == (21, 64)  # 11 + 10 persistent chains, one share per rank


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_node(node: int, port: int, *args: str) -> subprocess.Popen:
    """One of two torchrun "nodes" of one process each, meeting on this machine."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
           f"--node-rank={node}", "--master-addr=127.0.0.1", f"--master-port={port}",
           "-m", "ebmlab", *args]  # fmt: skip
    return subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip


def test_jem_across_two_nodes_matches_two_processes_on_one(tmp_path, full):
    """Two nodes of one process each (both LOCAL_RANK 0, global ranks 0 and 1, one shared
    run directory) train as ``--nproc 2`` does on one machine."""
    port = free_port()
    jem = ["train", "jem", "--out", str(tmp_path / "two"), *JEM, "--max-steps", "6"]
    nodes = [start_node(node, port, *jem) for node in (0, 1)]
    outputs = [node.communicate(timeout=300) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    assert json.loads(outputs[0][0])["step"] == 6 and outputs[1][0] == ""  # rank 0 reports
    a = load_checkpoint(full / "checkpoints" / "last.pt")
    b = load_checkpoint(tmp_path / "two" / "checkpoints" / "last.pt")
    assert a["trainer"]["step"] == b["trainer"]["step"]
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert torch.equal(a["task"]["buffer"]["buffer"], b["task"]["buffer"]["buffer"])
