"""The GPU benchmark's every row runs end to end at toy sizes on the CPU (``--smoke``),
so that a machine with a GPU spends its time measuring, not debugging."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_gpu_benchmark_row_runs_at_toy_sizes(tmp_path):
    out = tmp_path / "gpu.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu", "--smoke", "--device", "cpu", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    names = " | ".join(row["what"] for row in rows)
    for family in ("JEM step", "Langevin", "AIS", "jem_cifar10.toml step"):
        assert family in names, names
    for row in rows:
        assert row["ebmlab"] > 0, row
    assert not out.exists()  # a smoke run measures nothing, so it writes no results


def test_the_gpu_benchmark_measures_only_on_cuda():
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu", "--device", "cpu"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and "--smoke" in done.stderr


def test_the_gpu_benchmark_measures_the_groups_asked_for():
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu", "--smoke", "--device", "cpu", "--rows",
         "langevin,rbm"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert {row["group"] for row in rows} == {"langevin", "rbm"}
    bad = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu", "--smoke", "--rows", "jem,sgld"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2 and "--rows: unknown group 'sgld'" in bad.stderr
