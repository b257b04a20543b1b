import json

import pytest

from ebmlab.cli import main
from ebmlab.training.recipes.rbm import REAL


def strict_json(text: str):
    """JSON as strict readers (jq, JavaScript) take it: no Infinity or NaN."""

    def refuse(constant: str):
        raise AssertionError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_rbm_recipe_trains_evaluates_and_estimates_log_z(tmp_path, capsys, assert_keys_documented):
    run = tmp_path / "rbm"
    args = ["train", "rbm", "--out", str(run), "--epochs", "3", "--n-hidden", "8", "--no-progress"]
    assert main(args) == 0
    for png in ("filters.png", "samples/chains.png", "curves.png"):
        assert (run / png).is_file(), png
    summary = json.loads((run / "summary.json").read_text())  # reported when training ends
    assert summary["log_z"]["method"] == "enumeration" and summary["test_log_likelihood"] < 0
    capsys.readouterr()
    assert main(["evaluate", str(run)]) == 0
    result = strict_json(capsys.readouterr().out)
    assert_keys_documented(result)
    assert result["test_log_likelihood"] == summary["test_log_likelihood"]
    assert result["log_z"]["method"] == "enumeration"
    assert -40 < result["test_log_likelihood"] < result["train_log_likelihood"] + 5
    # exact log Z: the error is the rows' spread over sqrt(rows), a fraction of a nat
    assert 0 < result["test_log_likelihood_stderr"] < 1
    assert result["test_log_likelihood_stderr"] == summary["test_log_likelihood_stderr"]
    assert main(["logz", str(run), "--method", "ais"]) == 0
    ais = strict_json(capsys.readouterr().out)
    assert ais["lower"] is None  # AIS gives no bound: null, as in the run's files
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


def test_logz_of_a_conditional_energy_is_a_usage_error(tmp_path, capsys):
    """The structured recipe's energies E(x, y) are normalised over y exactly; there is
    no log Z over x, and logz says so in one line."""
    run = tmp_path / "s"
    args = ["train", "structured", "--out", str(run), "--epochs", "1", "--no-progress"]
    assert main(args) == 0
    capsys.readouterr()
    assert main(["logz", str(run)]) == 2
    err = capsys.readouterr().err
    assert "no log Z over x" in err and err.count("\n") == 1


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
    assert "Bernoulli RBMs, DBNs and DBMs only" in capsys.readouterr().err


def _log_likelihoods(run, capsys):
    capsys.readouterr()
    assert main(["evaluate", str(run)]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("model", "extra", "floor"),
    [
        # independent unit Gaussians on standardised pixels score -86.7 nats (81.5 reached)
        ("gaussian", ["--lr", "0.01", "--n-hidden", "8"], -84.0),
        # its learned visible precisions take it further (-77.7 reached)
        # (its AIS check below anneals over 300 temperatures, not the default 1,000)
        ("spike_slab", ["--lr", "0.01", "--n-hidden", "8", "--ais-temperatures", "300"], -84.0),
        # the independent-pixel (base-rate) model scores -24.9 nats on binary digits (-22.7)
        ("dbm", ["--lr", "0.05", "--n-hidden", "8", "--n-hidden2", "4"], -23.8),
        # four 7 x 7 filters at 2 x 2 positions: 16 hidden units, exact (-21.5 reached)
        ("conv", ["--lr", "0.05", "--n-hidden", "4", "--filter-size", "7"], -23.0),
    ],
)
def test_real_valued_dbm_and_convolutional_rbms_train_beyond_independent_pixels(
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
    # a DBM anneals (v, h2) with h1 summed out, a convolutional RBM its dense view
    methods = ("ais", "raise")
    if model in REAL:  # AIS from the Gaussian base density with HMC moves; no RAISE
        assert main(["logz", str(run), "--method", "raise"]) == 2
        methods = ("ais",) if model == "spike_slab" else ()
    capsys.readouterr()
    for method in methods:
        assert main(["logz", str(run), "--method", method]) == 0
        estimate = json.loads(capsys.readouterr().out)
        assert estimate["method"] == method
        assert abs(estimate["log_z"] - result["log_z"]["log_z"]) < 0.05 + 3 * estimate["stderr"]


def test_rbm_recipe_rejects_models_it_cannot_evaluate():
    from ebmlab.training.recipes.rbm import RBMConfig

    with pytest.raises(ValueError, match="at most 20"):
        RBMConfig(model="gaussian", n_hidden=64)
    with pytest.raises(ValueError, match="sparsity_target is not available"):
        RBMConfig(model="dbm", sparsity_target=0.1)


def _train_and_evaluate(run, capsys, *args):
    assert (
        main(["train", "rbm", "--out", str(run), "--no-progress", "--val-every", "4", *args]) == 0
    )
    return _log_likelihoods(run, capsys)


# the independent-pixel (base-rate) model scores -24.9 nats per binary digit
def test_subspace_rbm_learns_digits_and_its_log_partition_is_exact_only(
    tmp_path, capsys, assert_keys_documented
):
    run = tmp_path / "subspace"
    args = ["--model", "subspace", "--n-hidden", "5", "--n-subspace", "4", "--epochs", "8"]
    result = _train_and_evaluate(run, capsys, *args)
    assert_keys_documented(result)
    assert result["log_z"]["cost"]["terms"] == 2**20  # the 5 x 4 gate-subspace products
    assert result["train_log_likelihood"] > -22.0, result  # -20.7 reached
    assert (run / "filters.png").is_file() and (run / "samples" / "chains.png").is_file()
    assert main(["logz", str(run), "--method", "ais"]) == 2


def test_a_wide_dbm_reports_its_mean_field_bound_with_log_z_by_ais(tmp_path, capsys):
    """h1 of 24 units is too wide to enumerate: log Z comes from AIS and the
    log-likelihoods are the mean-field lower bound, and say so."""
    args = ["--model", "dbm", "--lr", "0.05", "--n-hidden", "24", "--n-hidden2", "4",
            "--epochs", "1", "--ais-temperatures", "300"]  # fmt: skip
    result = _train_and_evaluate(tmp_path / "wide", capsys, *args)
    assert result["log_z"]["method"] == "ais" and result["log_likelihood_bound"] == "mean field"
    assert -40 < result["test_log_likelihood"] < -20  # independent pixels: -24.9
    narrow = ["--model", "dbm", "--n-hidden", "8", "--n-hidden2", "4", "--epochs", "1"]
    assert "log_likelihood_bound" not in _train_and_evaluate(tmp_path / "narrow", capsys, *narrow)


def test_greedy_pretraining_gives_the_dbm_a_head_start(tmp_path, capsys):
    args = ["--model", "dbm", "--lr", "0.05", "--n-hidden", "8", "--n-hidden2", "4",
            "--epochs", "2"]  # fmt: skip
    plain = _train_and_evaluate(tmp_path / "plain", capsys, *args)
    pretrained = _train_and_evaluate(tmp_path / "pre", capsys, *args, "--pretrain-epochs", "10")
    # -24.9 without, -23.4 with pretraining
    assert pretrained["train_log_likelihood"] > plain["train_log_likelihood"] + 0.8


def test_classification_rbm_recipe_reports_error_and_joint_likelihood(
    tmp_path, capsys, assert_keys_documented
):
    run = tmp_path / "cls"
    result = _train_and_evaluate(run, capsys, "--model", "classification", "--epochs", "8",
                                 "--k", "1")  # fmt: skip
    assert_keys_documented(result)
    assert result["test_error"] < 0.3 and result["test_class_nll"] < 1.5  # 21% after 8 epochs
    assert result["train_log_likelihood"] > -24.5, result  # log p(x, y): -23.5
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    vals = [m for m in metrics if m["split"] == "val"]
    assert len(vals) == 2 and all({"val_error", "val_class_nll", "val_nll"} <= set(m) for m in vals)
    assert main(["sample", str(run), "--n", "4", "--steps", "2"]) == 0


def test_dbn_trains_layer_by_layer_and_reports_its_bound(tmp_path, capsys, assert_keys_documented):
    run = tmp_path / "dbn"
    args = ["--model", "dbn", "--epochs", "8", "--n-hidden", "16", "--n-hidden2", "8"]
    result = _train_and_evaluate(run, capsys, *args)
    assert_keys_documented(result)
    assert result["log_z"]["cost"]["terms"] == 2**8  # the top RBM, 16 x 8
    assert result["train_log_likelihood"] > -24.0, result  # the stack's bound: -22.9
    records = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    assert len([r for r in records if "val_nll" in r]) == 2  # bottom RBM at epoch 4, bound at 8
    assert main(["sample", str(run), "--n", "4", "--steps", "5"]) == 0
    assert main(["logz", str(run), "--method", "ais"]) == 0


def test_conditional_rbm_recipe_beats_the_linear_autoregression(
    tmp_path, capsys, assert_keys_documented
):
    """``--model conditional`` trains on the simulated walkers (its own data set) with
    Adam by default, and its exact next-frame mean beats the least-squares
    autoregression it starts from; it has no single log Z."""
    run = tmp_path / "crbm"
    args = ["--model", "conditional", "--epochs", "8", "--lr", "0.01"]
    result = _train_and_evaluate(run, capsys, *args)
    assert_keys_documented(result)
    saved = json.loads((run / "config.json").read_text())
    assert saved["config"]["data"] == "walking" and saved["trainer"]["optimizer"] == "adam"
    # 9 % below after these 8 epochs, 15 % after the default 40
    assert result["test_mse"] < 0.95 * result["test_mse_linear_autoregression"], result
    # the standard errors over the 40 test walkers are small beside the means
    for name in ("nll", "mse", "mse_linear_autoregression"):
        assert 0 < result[f"test_{name}_stderr"] < 0.1 * abs(result[f"test_{name}"]), result
    assert (run / "samples" / "sequences.png").is_file()
    assert main(["logz", str(run)]) == 2
    assert main(["sample", str(run), "--n", "2", "--steps", "5"]) == 0


def test_gated_rbm_recipe_learns_transformations_without_labels(
    tmp_path, capsys, assert_keys_documented
):
    """``--model gated`` learns from the dot pairs alone; a linear probe on its mapping
    units then names the held-out pairs' transformations far above chance (7/8 error)."""
    run = tmp_path / "gated"
    result = _train_and_evaluate(run, capsys, "--model", "gated", "--epochs", "12")
    assert_keys_documented(result)
    assert result["test_error"] < 0.6, result  # 0.44 after these 12 epochs, 0.006 after 40
    e = result["test_error"]
    assert 0 < result["test_error_stderr"] < (e * (1 - e)) ** 0.5 / 10  # > 100 test pairs
    assert (run / "samples" / "analogies.png").is_file()


def test_conditional_models_train_on_their_own_data():
    from ebmlab.training.recipes.rbm import RBMConfig

    assert RBMConfig(model="gated").data == "dot-pairs"
    assert RBMConfig().data == "digits"
    with pytest.raises(ValueError, match="trains on data 'walking'"):
        RBMConfig(model="conditional", data="digits")
    with pytest.raises(ValueError, match="order must be"):
        RBMConfig(model="conditional", order=0)


def test_a_dbn_stopped_while_its_bottom_rbm_trains_samples_that_rbm(tmp_path):
    run = tmp_path / "dbn"
    args = ["train", "rbm", "--model", "dbn", "--epochs", "8", "--max-steps", "3",
            "--n-hidden", "8", "--n-hidden2", "4", "--no-progress", "--out", str(run)]  # fmt: skip
    assert main(args) == 0
    out = tmp_path / "s.png"
    assert main(["sample", str(run), "--n", "4", "--steps", "2", "--out", str(out)]) == 0
    assert out.is_file()
