import json

import pytest

from ebmlab.cli import main


def test_rbm_recipe_trains_evaluates_and_estimates_log_z(tmp_path, capsys):
    run = tmp_path / "rbm"
    args = ["train", "rbm", "--out", str(run), "--epochs", "3", "--n-hidden", "8", "--no-progress"]
    assert main(args) == 0
    for png in ("filters.png", "samples/chains.png", "curves.png"):
        assert (run / png).is_file(), png
    capsys.readouterr()
    assert main(["evaluate", str(run)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["log_z"]["method"] == "enumeration"
    assert -40 < result["test_log_likelihood"] < result["train_log_likelihood"] + 5
    assert main(["logz", str(run), "--method", "ais"]) == 0
    ais = json.loads(capsys.readouterr().out)
    assert abs(ais["log_z"] - result["log_z"]["log_z"]) < 0.05 + 3 * ais["stderr"]
    assert main(["logz", str(run), "--method", "raise"]) == 0
    assert json.loads(capsys.readouterr().out)["method"] == "raise"
    for method in ("bethe", "trw", "pam"):
        assert main(["logz", str(run), "--method", method]) == 0
        assert json.loads(capsys.readouterr().out)["log_z"] > 0
    assert (
        main(["sample", str(run), "--n", "9", "--steps", "3", "--out", str(tmp_path / "s.png")])
        == 0
    )


def test_logz_on_a_recipe_without_estimator_is_a_usage_error(tmp_path, capsys):
    run = tmp_path / "d"
    args = [
        "train",
        "density",
        "--out",
        str(run),
        "--epochs",
        "1",
        "--hidden",
        "8",
        "--buffer-size",
        "100",
    ]
    assert main([*args, "--sampler-steps", "2", "--quadrature-points", "16", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["logz", str(run)]) == 2
    assert "no partition function estimator" in capsys.readouterr().err


def test_categorical_rbm_on_grey_levels(tmp_path, capsys):
    run = tmp_path / "cat"
    args = [
        "train",
        "rbm",
        "--model",
        "categorical",
        "--out",
        str(run),
        "--epochs",
        "2",
        "--n-hidden",
        "6",
    ]
    assert main([*args, "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(run)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["n_visible"] == 64 * 17 and result["log_z"]["method"] == "enumeration"
    assert result["train_log_likelihood"] < 0
    assert main(["logz", str(run), "--method", "trw"]) == 2
    assert "Bernoulli RBMs and DBMs only" in capsys.readouterr().err


def _log_likelihoods(run, capsys):
    capsys.readouterr()
    assert main(["evaluate", str(run)]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("model", "extra", "floor"),
    [
        # independent unit Gaussians on standardised pixels score -86.7 nats (81.5 reached)
        ("gaussian", ["--lr", "0.01", "--n-hidden", "8"], -84.0),
        # the independent-pixel (base-rate) model scores -24.9 nats on binary digits (-22.7)
        ("dbm", ["--lr", "0.05", "--n-hidden", "8", "--n-hidden2", "4"], -23.8),
    ],
)
def test_gaussian_rbm_and_dbm_train_beyond_independent_pixels(
    tmp_path, capsys, model, extra, floor
):
    run = tmp_path / model
    args = ["train", "rbm", "--model", model, "--out", str(run), "--epochs", "8", *extra]
    assert main([*args, "--no-progress", "--val-every", "4"]) == 0
    assert (run / "samples" / "chains.png").is_file() and (run / "filters.png").is_file()
    result = _log_likelihoods(run, capsys)
    assert result["log_z"]["method"].startswith(("enumeration", "exact"))
    assert result["train_log_likelihood"] > floor, result
    assert main(["sample", str(run), "--n", "4", "--steps", "2"]) == 0
    if model == "gaussian":
        assert main(["logz", str(run), "--method", "ais"]) == 2  # exact only
        return
    capsys.readouterr()
    for method in ("ais", "raise"):  # a DBM anneals (v, h2) with h1 summed out
        assert main(["logz", str(run), "--method", method]) == 0
        estimate = json.loads(capsys.readouterr().out)
        assert estimate["method"] == method
        assert abs(estimate["log_z"] - result["log_z"]["log_z"]) < 0.05 + 3 * estimate["stderr"]


def test_rbm_recipe_rejects_models_it_cannot_evaluate():
    from ebmlab.training.recipes.rbm import RBMConfig

    with pytest.raises(ValueError, match="n_hidden <= 20"):
        RBMConfig(model="dbm", n_hidden=64)
    with pytest.raises(ValueError, match="sparsity_target is not available"):
        RBMConfig(model="gaussian", sparsity_target=0.1)
