import pytest

from ebmlab.training import RunDirectory


def test_artefact_paths_stay_inside(tmp_path):
    run = RunDirectory(tmp_path / "run").create()
    assert run.file("samples/grid.png").parent == (tmp_path / "run" / "samples").resolve()
    with pytest.raises(ValueError, match="outside the run directory"):
        run.file("../escape.png")


def test_metrics_truncate(tmp_path):
    run = RunDirectory(tmp_path).create()
    for i in range(5):
        run.append_metrics({"step": i, "loss": float(i)})
    run.truncate_metrics(3)
    assert [r["step"] for r in run.read_metrics()] == [0, 1, 2]
    run.append_metrics({"step": 9, "loss": float("nan")})
    assert run.read_metrics()[-1]["loss"] is None  # strict JSON: no NaN
