"""The GPU benchmark's every row runs end to end at toy sizes on the CPU (``--smoke``),
so that a machine with a GPU spends its time measuring, not debugging."""

import json

import pytest
import torch
from benchmarks import gpu


def smoke(capsys, *args: str) -> list[dict]:
    """The rows ``python -m benchmarks.gpu --smoke --device cpu ARGS`` prints (the global
    random stream, which the rows seed, is restored after them)."""
    with torch.random.fork_rng():
        gpu.main(["--smoke", "--device", "cpu", *args])
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_every_gpu_benchmark_row_runs_at_toy_sizes(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    rows = smoke(capsys, "--out", str(out))
    names = " | ".join(row["what"] for row in rows)
    for family in ("JEM step", "Langevin", "AIS", "jem_cifar10.toml step"):
        assert family in names, names
    for row in rows:
        assert row["ebmlab"] > 0, row
    assert not out.exists()  # a smoke run measures nothing, so it writes no results


def test_the_gpu_benchmark_measures_only_on_cuda(capsys):
    with pytest.raises(SystemExit) as stop:
        gpu.main(["--device", "cpu"])
    assert stop.value.code == 2 and "--smoke" in capsys.readouterr().err


def test_the_gpu_benchmark_measures_the_groups_asked_for(capsys):
    rows = smoke(capsys, "--rows", "langevin,rbm")
    assert {row["group"] for row in rows} == {"langevin", "rbm"}
    with pytest.raises(SystemExit) as stop:
        gpu.main(["--smoke", "--rows", "jem,sgld"])
    assert stop.value.code == 2
    assert "--rows: unknown group 'sgld'" in capsys.readouterr().err
