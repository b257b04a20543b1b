import hashlib
import json
import math

import numpy as np
import pytest
import torch

from ebmlab._checks import ArgumentError
from ebmlab.cli import load_run, main
from ebmlab.energies import ClassifierEnergy
from ebmlab.training.recipes.jem import JEMConfig, JEMTask, evaluate

TINY = [
    "--arch",
    "mlp",
    "--hidden",
    "32",
    "--sampler-steps",
    "5",
    "--buffer-size",
    "200",
    "--epochs",
    "2",
    "--no-progress",
    "--seed",
    "1",
    "--lr",
    "3e-4",
]
SHORT_LONG_RUN = ["--long-run-steps", "201"]  # the stability check's shortest run (1000 by default)


@pytest.fixture(scope="module")
def jem_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("jem") / "run"
    assert main(["train", "jem", "--out", str(run), *TINY]) == 0
    return run


def test_training_writes_the_run_directory(jem_run):
    for name in (
        "config.json",
        "metrics.jsonl",
        "curves.png",
        "samples/buffer.png",
        "checkpoints/last.pt",
    ):
        assert (jem_run / name).is_file(), name
    records = [json.loads(line) for line in (jem_run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    assert {"ce", "gen", "energy_data", "energy_sample", "sample_out_of_range"} <= set(train[0])
    val = [r for r in records if r["split"] == "val"]
    assert len(val) == 2 and all({"val_error", "val_nll", "beta"} <= set(r) for r in val)


def test_evaluate_reports_every_metric(jem_run, tmp_path, capsys, assert_keys_documented):
    capsys.readouterr()
    ood = tmp_path / "ood.npy"
    np.save(ood, np.random.default_rng(0).integers(0, 17, size=(30, 8, 8), dtype=np.uint8))
    assert main(["evaluate", str(jem_run), "--ood-data", str(ood), *SHORT_LONG_RUN]) == 0
    result = json.loads(capsys.readouterr().out)
    assert_keys_documented(result)
    assert 0 <= result["test_error"] <= 1 and 0 <= result["ece"] <= 1
    for name in ("test_error", "test_accuracy", "test_nll", "ece"):
        assert 0 < result[f"{name}_stderr"] < 0.5, name  # from a few hundred test rows
    assert 0 <= result["ece_at_beta_1"] <= 1 and result["beta"] > 0
    assert set(result["ood_auroc"]) == {
        "uniform_noise",
        "permuted",
        "flip_lr",
        "flip_ud",
        "user_file",
    }
    assert set(result["ood_auroc"]["flip_lr"]) == {"log_px", "max_prob", "neg_grad_norm"}
    stderrs = result["ood_auroc_stderr"]
    assert {(k, s) for k in stderrs for s in stderrs[k]} == {
        (k, s) for k in result["ood_auroc"] for s in result["ood_auroc"][k]
    }
    # 447 OOD inputs per built-in set (about +/- 0.02 near chance); the user file holds 30
    # noise images, so each score's error exceeds that of the 447 uniform-noise images
    user = stderrs.pop("user_file")
    assert all(0 < v < 0.03 for scores in stderrs.values() for v in scores.values())
    assert all(user[s] > stderrs["uniform_noise"][s] for s in user)
    assert set(result["samples"]) == {
        "count",
        "train_test_floor_mmd2",
        "train_test_floor_mmd2_stderr",
        "after_training_steps",
        "after_200_more_steps",
        "after_201_more_steps",
        "classifier_features",
    }
    assert result["samples"]["after_training_steps"]["mmd2_stderr"] > 0
    features = result["samples"]["classifier_features"]
    assert features["frechet_distance"] > 0 and features["kid_stderr"] > 0
    assert 0 <= features["precision"] <= 1 and 0 <= features["recall"] <= 1
    floor = features["train_test_floor"]  # training images score better than samples
    assert 0 < floor["frechet_distance"] < features["frechet_distance"]
    assert floor["recall"] > features["recall"] and floor["kid_stderr"] > 0
    for png in ("reliability.png", "samples_unconditional.png", "samples_conditional.png"):
        assert (jem_run / png).is_file(), png


def test_evaluate_compares_as_many_samples_as_asked(jem_run, capsys):
    capsys.readouterr()
    assert main(["evaluate", str(jem_run), "--samples", "40", *SHORT_LONG_RUN]) == 0
    assert json.loads(capsys.readouterr().out)["samples"]["count"] == 40
    assert main(["evaluate", str(jem_run), "--samples", "5"]) == 2
    err = capsys.readouterr().err  # refused before the run is loaded
    assert "--samples must be at least 20, got 5" in err and "loading" not in err


def test_evaluation_samples_are_distinct_buffer_chains_left_in_place(jem_run, monkeypatch):
    _, setup, _ = load_run(jem_run, device="cpu")
    task = setup.task
    before = task.buffer.buffer.clone()
    monkeypatch.setattr(task.sampler, "sample", lambda energy, x0, steps, **kw: x0.clone())
    x = task.generate(task.buffer.capacity, torch.Generator().manual_seed(0))
    assert torch.equal(task.buffer.buffer, before)
    rows = {tuple(r.tolist()) for r in x}
    assert len(rows) == len(x) and rows == {tuple(r.tolist()) for r in before}


def test_sample_command(jem_run, tmp_path, capsys):
    out = tmp_path / "grid.png"
    assert main(["sample", str(jem_run), "--n", "16", "--steps", "5", "--out", str(out)]) == 0
    assert out.stat().st_size > 1000


def test_bad_ood_file_is_a_usage_error(jem_run, tmp_path, capsys):
    capsys.readouterr()
    assert main(["evaluate", str(jem_run), "--ood-data", str(tmp_path / "missing.npy")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["evaluate", str(jem_run), "--long-run-steps", "200"]) == 2
    assert "--long-run-steps must be more than 200, got 200" in capsys.readouterr().err


def test_a_data_set_serves_as_an_ood_set_and_a_wrong_one_is_refused_up_front(
    jem_run, tmp_path, capsys
):
    """--ood-data also takes a data set (a folder here; a published set by name) and
    scores its test split as one more OOD set; a set of another image shape, an unknown
    name or a named set whose files are not found stops before any work."""
    rng = np.random.default_rng(0)
    folder = tmp_path / "letters"
    folder.mkdir()
    for split, n in (("train", 40), ("test", 25)):
        np.savez(folder / f"{split}.npz", x=rng.integers(0, 17, (n, 8, 8), dtype=np.uint8))
    capsys.readouterr()
    assert main(["evaluate", str(jem_run), "--ood-data", str(folder), *SHORT_LONG_RUN]) == 0
    result = json.loads(capsys.readouterr().out)
    assert "user_set" in result["ood_auroc"] and "user_file" not in result["ood_auroc"]
    # 25 test images of the folder's: a larger error than that of the 447 noise images
    stderrs = result["ood_auroc_stderr"]
    assert all(stderrs["user_set"][s] > stderrs["uniform_noise"][s] for s in stderrs["user_set"])
    wide = tmp_path / "wide"
    wide.mkdir()
    np.savez(wide / "test.npz", x=rng.integers(0, 17, (10, 8, 9), dtype=np.uint8))
    np.savez(wide / "train.npz", x=rng.integers(0, 17, (10, 8, 9), dtype=np.uint8))
    for source, message in ((str(wide), "uint8 images (1, 8, 9); the model's are uint8 (1, 8, 8)"),
                            ("letters", "must be a .npy file of uint8 images, a folder"),
                            ("mnist", "--ood-root DIR")):  # fmt: skip
        args = ["evaluate", str(jem_run), "--ood-data", source, "--ood-root", str(tmp_path)]
        assert main(args) == 2, source
        err = capsys.readouterr().err
        assert message in err and "classification" not in err and "--data-root" not in err, err
    assert main(["evaluate", str(jem_run), "--ood-root", str(tmp_path)]) == 2
    assert "ood_root needs ood_data" in capsys.readouterr().err


def test_bad_inception_options_are_usage_errors(jem_run, tmp_path, capsys, inception_weights):
    capsys.readouterr()
    (tmp_path / "bad.pth").write_bytes(b"not a torch file")
    assert main(["evaluate", str(jem_run), "--inception", str(tmp_path / "bad.pth")]) == 2
    assert "bad.pth" in capsys.readouterr().err
    assert main(["evaluate", str(jem_run), "--inception-samples", "100"]) == 2
    assert "inception_samples needs inception" in capsys.readouterr().err
    weights = ["--inception", str(inception_weights[0])]
    assert main(["evaluate", str(jem_run), *weights, "--inception-samples", "5"]) == 2
    assert "at least 20, got 5" in capsys.readouterr().err


def test_book_variant_trains(tmp_path):
    """Chains from uniform noise every step (eq. 6.28), no replay buffer."""
    assert (
        main(
            [
                "train",
                "jem",
                "--out",
                str(tmp_path / "u"),
                *TINY,
                "--init",
                "uniform",
                "--start",
                "uniform",
                "--epochs",
                "1",
            ]
        )
        == 0
    )


def test_energy_discrepancy_objective_trains_without_sampling(tmp_path):
    """--gen-objective ed: the generative term contrasts perturbed copies of the images,
    no chains are run, and the step reports no sample statistics."""
    run = tmp_path / "ed"
    assert main(["train", "jem", "--out", str(run), *TINY, "--gen-objective", "ed"]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "gen" in r]
    assert steps and all(np.isfinite(r["gen"]) and "sample_out_of_range" not in r for r in steps)


def test_recovery_likelihood_objective_trains_on_recovered_images(tmp_path):
    """--gen-objective drl: negatives are recoveries of blurred training images, so they
    stay in the data's range (projected onto it after every step) and no replay-buffer
    picture is written."""
    run = tmp_path / "drl"
    args = ["--gen-objective", "drl", "--drl-sigma", "0.2"]
    assert main(["train", "jem", "--out", str(run), *TINY, *args]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "gen" in r]
    assert steps and all(np.isfinite(r["gen"]) for r in steps)
    assert all(r["sample_out_of_range"] == 0 for r in steps)
    assert not (run / "samples" / "buffer.png").exists()
    with pytest.raises(ValueError, match="drl_sigma must be in"):
        JEMConfig(gen_objective="drl", drl_sigma=1.5)


def test_energy_matching_objective_warms_up_on_the_flow_then_contrasts(tmp_path, capsys):
    """--gen-objective em: the first half of the steps regress -grad E on the OT flow
    alone, the rest add the contrastive term against buffer chains, and the evaluation's
    samples are the generation from noise, inside the data's range. A run resumed in
    its joint phase stays there (the step count is checkpointed). The network is
    Energy Matching's: a U-Net with a patch-transformer head."""
    run = tmp_path / "em"
    args = ["--gen-objective", "em", "--gen-weight", "0.01", "--em-warmup", "0.5"]
    args += ["--arch", "unet", "--conv-width", "8", "--unet-mults", "1", "2", "--vit-embed",
             "16", "--vit-heads", "2", "--vit-layers", "1"]  # fmt: skip
    assert main(["train", "jem", "--out", str(run), *TINY, *args]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "gen" in r]
    warm = [r for r in steps if "contrastive_gap" not in r]
    assert steps and all(np.isfinite(r["gen"]) and np.isfinite(r["flow_loss"]) for r in steps)
    assert 0 < len(warm) < len(steps) and steps[: len(warm)] == warm
    _, setup, _ = load_run(run)
    task = setup.task
    assert task.steps_taken > task.warmup_steps > 0
    assert task.em_phase() == "joint"
    x = task.generate(20, torch.Generator().manual_seed(0))
    assert x.shape == (20, 64) and float(x.min()) >= -1 and float(x.max()) <= 1
    assert float(x.std(0).mean()) > 0.05  # generated from noise, not one point


def test_features_from_another_run_put_samples_in_its_feature_space(
    jem_run, tmp_path, capsys, assert_keys_documented
):
    """--features-from: the samples' FD, KID, precision and recall in another run's
    classifier features; in the run's own, those equal the run's own block. A run on
    other inputs is refused, naming both shapes. --nll adds the test log-likelihood."""
    capsys.readouterr()
    args = ["evaluate", str(jem_run), "--features-from", str(jem_run), "--nll", *SHORT_LONG_RUN]
    assert main([*args, "--weights", "raw"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert np.isfinite(result["test_log_likelihood"]["bits_per_dim"])
    samples = result["samples"]
    assert_keys_documented(samples)
    other, own = samples["other_classifier_features"], samples["classifier_features"]
    assert "frechet_distance" in samples["after_201_more_steps"]["other_classifier_features"]
    assert other["frechet_distance"] == pytest.approx(own["frechet_distance"])
    assert other["train_test_floor"]["kid"] == pytest.approx(own["train_test_floor"]["kid"])
    wide = tmp_path / "rgb"
    assert main(["train", "jem", "--out", str(wide), *TINY, "--data", "digits-rgb",
                 "--epochs", "1"]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["evaluate", str(jem_run), "--features-from", str(wide)]) == 2
    err = capsys.readouterr().err
    assert "(64,)" in err and "(192,)" in err
    assert main(["evaluate", str(jem_run), "--features-from", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err  # refused before the evaluated run is loaded
    assert "is not a run directory" in err and "loading" not in err


def test_conv_architecture_trains(tmp_path):
    args = ["--conv-width", "4", "--arch", "conv", "--sampler-steps", "2", "--buffer-size", "100"]
    assert (
        main(
            ["train", "jem", "--out", str(tmp_path / "c"), "--epochs", "1", "--no-progress", *args]
        )
        == 0
    )


def test_short_run_learns_a_classifier_and_a_density(tmp_path):
    """A few epochs of the default recipe (conv net, augmented cross-entropy, SGLD
    negatives from the replay buffer) already give a classifier whose log p(x) ranks test
    digits above uniform noise and permuted pixels: some fresh chains start in noise
    (with Gaussian starts alone, a short run ranks noise above the digits)."""
    run = tmp_path / "short"
    args = ["--sampler-steps", "3", "--epochs", "10"]
    args += ["--warmup-steps", "20", "--no-progress", "--seed", "0"]
    assert main(["train", "jem", "--out", str(run), *args]) == 0
    _, setup, run_dir = load_run(run)
    result = evaluate(setup, run_dir, long_run_steps=201, samples=100)
    assert result["test_error"] < 0.25  # chance is 0.9; 100 epochs reach 0.020
    assert result["ood_auroc"]["uniform_noise"]["log_px"] > 0.95
    assert result["ood_auroc"]["permuted"]["log_px"] > 0.95
    assert result["samples"]["after_201_more_steps"]["finite"]


def test_fresh_chains_start_where_the_start_option_says():
    def gap(start: str, uniform_share: float) -> float:
        config = JEMConfig(arch="mlp", hidden=(8,), start=start, uniform_share=uniform_share)
        task = JEMTask(config, seed=0)
        return float((task.buffer.buffer.mean(0) - task.train.x.mean(0)).abs().mean())

    # uniform starts average 0 in every pixel; the digits' mean is near -0.5
    assert gap("gaussian", 0.0) < 0.1 < gap("uniform", 0.0)
    assert gap("gaussian", 1.0) > 0.1


@pytest.mark.usefixtures("bfloat16_anywhere")
def test_mixed_precision_step_runs_the_network_in_bfloat16_and_keeps_float32_state():
    def step(train_dtype: str) -> tuple[torch.Tensor, JEMTask]:
        config = JEMConfig(arch="mlp", hidden=(64,), sampler_steps=3, train_dtype=train_dtype)
        task = JEMTask(config, seed=0)
        batch = (task.train.x[:32], task.train.y[:32])
        result = task.training_step(batch, torch.Generator().manual_seed(0))
        result.loss.backward()
        return result.loss.detach(), task

    full, _ = step("float32")
    mixed, task = step("bfloat16")
    assert mixed.dtype == torch.float32
    assert all(p.dtype == p.grad.dtype == torch.float32 for p in task.model.parameters())
    # the same negatives and batch; only the precision of the network's products differs
    assert 0 < abs(float(mixed - full)) < 0.01 * abs(float(full))


def test_colour_images_from_a_folder_of_arrays(
    tmp_path, capsys, inception_weights, monkeypatch, assert_keys_documented
):
    """JEM on the user's RGB data: classes and image shape come from the files, the run
    records the encoding, and the pictures are in colour; a test split smaller than the
    conditional grid (10 a class) still fills it. Sample quality in the features of an
    Inception-v3 weights file too. A relative --data path is recorded as an absolute one,
    so the run evaluates from any directory."""
    rng = np.random.default_rng(0)
    data = tmp_path / "data"
    data.mkdir()
    for split, n in (("train", 60), ("test", 20)):
        y = np.arange(n) % 3
        x = rng.integers(0, 256, (n, 3, 8, 8), dtype=np.uint8)
        x[np.arange(n), y] = 255  # each class has one bright channel
        np.savez(data / f"{split}.npz", x=x, y=y)
    run = tmp_path / "run"
    monkeypatch.chdir(tmp_path)
    args = ["train", "jem", "--out", str(run), "--data", "data", "--conv-width", "8",
            "--sampler-steps", "3", "--buffer-size", "50", "--epochs", "1"]  # fmt: skip
    args.append("--no-progress")
    assert main(args) == 0
    recorded = json.loads((run / "config.json").read_text())["data"]
    assert recorded["image_shape"] == [3, 8, 8] and recorded["num_classes"] == 3
    assert recorded["encoding"]["divisor"] == 255
    assert json.loads((run / "config.json").read_text())["config"]["data"] == str(data)
    splits = json.loads((run / "config.json").read_text())["splits"]  # val held out of train
    assert splits == {
        "train": {"split": "train", "rows": 54, "class_counts": [18, 18, 18]},
        "val": {"split": "val", "rows": 6, "class_counts": [2, 2, 2]},
        "test": {"split": "test", "rows": 20, "class_counts": [7, 7, 6]},
    }
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    capsys.readouterr()
    more = ["--inception-samples", "30", "--inception-reference", "train",  # 20 a batch here
            "--inception-preprocessing", "pytorch-fid"]  # fmt: skip
    more += SHORT_LONG_RUN
    assert main(["evaluate", str(run), "--inception", str(inception_weights[0]), *more]) == 0
    result = json.loads(capsys.readouterr().out)
    assert_keys_documented(result)
    assert {"permuted", "flip_lr", "flip_ud", "uniform_noise"} == set(result["ood_auroc"])
    inception = result["samples"]["inception_features"]
    assert inception["frechet_distance"] > 0 and inception["kid_stderr"] > 0
    assert 1 <= inception["inception_score"] <= 1008 and inception["inception_score_stderr"] > 0
    assert 1 <= inception["data_inception_score"] <= 1008
    assert inception["samples"] == 30 and inception["reference"] == 30
    digest = hashlib.sha256(inception_weights[0].read_bytes()).hexdigest()
    assert inception["weights_sha256"] == digest
    assert inception["preprocessing"] == "pytorch-fid"
    import matplotlib.image

    picture = matplotlib.image.imread(run / "samples_conditional.png")
    channels = picture[..., :3].reshape(-1, 3)
    assert np.abs(channels[:, 0] - channels[:, 1]).max() > 0.1  # not a grey picture


def test_logz_estimates_the_energy_over_the_pixel_box(jem_run, capsys):
    capsys.readouterr()
    assert main(["logz", str(jem_run)]) == 0
    est = json.loads(capsys.readouterr().out)
    assert est["method"] == "smc_box" and est["cost"]["box"] == [-1.0, 1.0]  # the digits scaled
    assert np.isfinite(est["log_z"]) and 0 < est["stderr"] < 1
    assert main(["logz", str(jem_run), "--method", "ais"]) == 2
    assert "method must be one of" in capsys.readouterr().err


@pytest.mark.parametrize("objective", ["pcd", "em"])
def test_test_nll_in_bits_per_dimension_has_the_known_answer(objective, assert_keys_documented):
    """A classifier whose logits are a x_0 + b in every class has the density
    p(x) ∝ exp(LSE) = K e^(b + a x_0) / T on the box [-1, 1]^D (T = eps_max for Energy
    Matching, 1 else): log Z = (D - 1) log 2 + log int exp((log K + b + a x_0) / T) dx_0
    exactly. The SMC estimate and the test NLL match it, and bits per dimension add
    the scaling's log-Jacobian D log(17 / 2) (the digits' 17 levels) to the NLL."""
    from ebmlab.training.recipes import Setup
    from ebmlab.training.recipes.jem import _test_log_likelihood

    config = JEMConfig(arch="mlp", hidden=(8,), buffer_size=10, gen_objective=objective)
    task = JEMTask(config, seed=0)
    d, k, a, b = task.train.x.shape[1], 10, 0.8, 0.3
    head = torch.nn.Linear(d, k)
    with torch.no_grad():
        head.weight.zero_()
        head.weight[:, 0] = a
        head.bias.fill_(b)
    task.model = ClassifierEnergy(head, k)
    t = config.eps_max if objective == "em" else 1.0
    c, s = (math.log(k) + b) / t, a / t
    log_z = (d - 1) * math.log(2) + c + math.log((math.exp(s) - math.exp(-s)) / s)
    result = _test_log_likelihood(Setup(task, ()))
    assert_keys_documented({"test_log_likelihood": result})
    assert abs(result["log_z"] - log_z) < 4 * result["log_z_stderr"] + 0.05
    mean = float((c + s * task.test.x[:, 0]).mean()) - log_z
    assert result["mean"] == pytest.approx(mean, abs=4 * result["stderr"] + 0.05)
    bits = (d * math.log(17 / 2) - result["mean"]) / (d * math.log(2))
    assert result["bits_per_dim"] == pytest.approx(bits)
    assert 0 < result["bits_per_dim_stderr"] < 0.01


def test_class_conditional_test_nll_normalises_each_class_on_its_own(assert_keys_documented):
    """Class y's logit a_y x_j + b_y (pixel j = j_y) gives p(x | y) ∝ exp((a_y x_j +
    b_y) / eps_max) on [-1, 1]^D, whose log Z_y = (D - 1) log 2 + b_y / eps_max +
    log(2 sinh(s_y) / s_y), s_y = a_y / eps_max. The offsets b_y cancel from p(x | y),
    so the mixture p(x) = (1 / 2) sum_y p(x | y) does not depend on them, whereas the
    one density exp(-E(x) / eps_max) of E = -logsumexp would be class 1's alone (b_1
    lies 300 nats above b_0): the estimate meets the mixture and misses that density by
    far. ``ebmlab logz`` of such a run, which has no single log Z, is refused."""
    from ebmlab.training.recipes import Setup
    from ebmlab.training.recipes.jem import _test_log_likelihood, log_partition

    config = JEMConfig(arch="mlp", hidden=(8,), buffer_size=10, gen_objective="em",
                       em_conditional=True)  # fmt: skip
    task = JEMTask(config, seed=0)
    d, t = task.train.x.shape[1], config.eps_max
    a, b, pixels = torch.tensor([1.0, -1.0]), torch.tensor([0.3, 3.3]), [27, 36]
    head = torch.nn.Linear(d, 2)
    with torch.no_grad():
        head.weight.zero_()
        head.weight[[0, 1], pixels] = a
        head.bias.copy_(b)
    task.model = ClassifierEnergy(head, 2)
    s = a.double() / t
    shape = (d - 1) * math.log(2) + torch.log(2 * torch.sinh(s) / s)
    result = _test_log_likelihood(Setup(task, ()))
    assert_keys_documented({"test_log_likelihood": result})
    for y in range(2):
        exact = float(shape[y] + b[y] / t)
        assert abs(result["log_z"][y] - exact) < 4 * result["log_z_stderr"][y] + 0.05
    x = task.test.x[:, pixels].double()
    mixture = torch.logsumexp(s * x - shape, 1) - math.log(2)
    tolerance = 4 * result["stderr"] + 0.05  # the exact answer is on the same rows
    assert result["mean"] == pytest.approx(float(mixture.mean()), abs=tolerance)
    assert result["log_z_method"].endswith("per component")
    one_density = float((s[1] * x[:, 1] - shape[1]).mean())  # class 1's: 56 nats lower
    assert abs(result["mean"] - one_density) > 10 * tolerance
    with pytest.raises(ArgumentError, match="each with its own log Z"):
        log_partition(Setup(task, ()), "auto")


def test_training_on_a_gpu_replays_the_negatives_gradient_from_kept_graphs(
    tmp_path, stand_in_captures
):
    """The GPU's path through a JEM training, each CUDA graph standing in as a rerun:
    the short SGLD runs between optimiser steps capture the network's gradient once per
    batch shape and mode, not once per step, and the run logs what the eager one does."""
    plain, graphed = tmp_path / "plain", tmp_path / "graphed"
    args = [*TINY, "--epochs", "1", "--max-steps", "12"]
    with pytest.MonkeyPatch.context() as undo:  # the eager run: nothing capturable
        undo.setattr("ebmlab.samplers.graphs.capturable", lambda device: False)
        assert main(["train", "jem", "--out", str(plain), *args]) == 0
    assert main(["train", "jem", "--out", str(graphed), *args]) == 0
    assert 1 <= len(stand_in_captures) <= 4
    logs = [(run / "metrics.jsonl").read_text() for run in (plain, graphed)]
    assert logs[0] == logs[1]


def test_class_conditional_energy_matching_generates_class_by_class(tmp_path, capsys):
    """--em-conditional: each class's energy is the potential of its own flow; the
    contrastive phase runs, samples are generated class by class (by default the
    classes in turn, and the labels change them), and the evaluation draws its
    per-class picture from the classes' flows."""
    run = tmp_path / "emc"
    args = ["--gen-objective", "em", "--gen-weight", "0.01", "--em-warmup", "0.5",
            "--em-conditional"]  # fmt: skip
    assert main(["train", "jem", "--out", str(run), *TINY, *args]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "gen" in r]
    assert any("contrastive_gap" in r for r in steps)
    assert all(np.isfinite(r["gen"]) and np.isfinite(r["flow_loss"]) for r in steps)
    _, setup, _ = load_run(run)
    task = setup.task

    def drawn(labels=None):
        return task.generate(20, torch.Generator().manual_seed(0), labels)

    by_default = drawn()
    assert torch.equal(by_default, drawn(torch.arange(20) % 10))
    assert not torch.allclose(by_default, drawn(torch.zeros(20, dtype=torch.long)))
    assert float(by_default.min()) >= -1 and float(by_default.max()) <= 1
    guided = task.generate(20, torch.Generator().manual_seed(0), guidance=2.0)
    assert not torch.allclose(by_default, guided)  # down the guided energy
    assert main(["evaluate", str(run), "--guidance", "-1"]) == 2
    assert "--guidance must be a finite number >= 0" in capsys.readouterr().err
    assert main(["evaluate", str(run), *SHORT_LONG_RUN, "--guidance", "1"]) == 0
    assert json.loads((run / "evaluation.json").read_text())["guidance"] == 1.0
    assert (run / "samples_conditional.png").exists()
    with pytest.raises(ValueError, match="em_conditional needs gen_objective 'em'"):
        JEMConfig(em_conditional=True)
