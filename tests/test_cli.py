import dataclasses
import json
import math
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from ebmlab import cli, mcmc_command
from ebmlab.cli import main
from ebmlab.mcmc_command import mass_used
from ebmlab.samplers import NUTS, WALNUTS, NeuTra
from ebmlab.samplers import nuts as nuts_module
from ebmlab.samplers.integrators import DenseMass
from ebmlab.samplers.nuts import _cpp_compiler
from ebmlab.training import load_checkpoint
from ebmlab.training.recipes import get_recipe, recipes

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

TINY = [
    "--hidden",
    "16",
    "--depth",
    "2",
    "--sampler-steps",
    "3",
    "--buffer-size",
    "500",
    "--quadrature-points",
    "32",
    "--batch-size",
    "500",
    "--no-progress",
    "--seed",
    "3",
]


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_info_lists_data_sets(capsys, mnist_dir, monkeypatch):
    monkeypatch.setenv("EBMLAB_DATA", str(mnist_dir))
    code, out, _ = run_cli(capsys, "info")
    assert code == 0
    assert "digits" in out and "mnist10k" in out and "torch threads" in out and "density" in out
    assert f"decoded image folders: {os.environ['EBMLAB_CACHE']}/image-folders" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "density", "--out", "x", "--epochs", "0"], "epochs must be an integer >= 1"),
        (["train", "density", "--out", "x", "--data", "spirals"], "data must be one of"),
        (["train", "density", "--out", "x", "--lr", "fast"], "invalid float value"),
        (
            ["train", "jem", "--out", "x", "--validation-fraction", "1"],
            "validation_fraction must lie in [0, 1), got 1.0",
        ),
        (["train", "nonsense", "--out", "x"], "invalid choice"),
        (["train", "density"], "required: --out"),
        (["evaluate", "/nonexistent/run"], "not a run directory"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_arguments_give_one_line_and_status_2(capsys, argv, message):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert message in err and err.count("\n") == 1 and out == ""


def test_train_evaluate_and_resume(capsys, tmp_path, assert_keys_documented):
    run = tmp_path / "run"
    code, out, _ = run_cli(capsys, "train", "density", "--out", str(run), "--epochs", "2", *TINY)
    assert code == 0 and json.loads(out)["status"] == "completed"
    full = load_checkpoint(run / "checkpoints" / "last.pt")["model"]

    code, out, err = run_cli(capsys, "evaluate", str(run))
    result = json.loads(out)  # stdout holds the JSON alone; the stages go to stderr
    stages = [line for line in err.splitlines() if line.startswith("ebmlab evaluate: ")]
    assert stages[0].startswith("ebmlab evaluate: loading") and "log Z" in stages[1]
    assert stages[-1].startswith("ebmlab evaluate: done") and len(stages) >= 5
    assert_keys_documented(result)
    assert code == 0 and result["test_nll"] > result["true_nll"] - 0.1
    assert 0 < result["test_nll_stderr"] < 0.2  # the test rows' spread over sqrt(rows)
    assert result["log_z"]["method"] == "quadrature"
    code, _, err = run_cli(capsys, "evaluate", str(run), "--long-run-steps", "500")
    assert code == 2 and "recipe 'density' does not take --long-run-steps" in err
    # a 2-epoch model's samples are far from the data: each MMD² is many errors above 0
    assert result["mmd2"] > 3 * result["mmd2_stderr"] > 0
    assert result["mmd2_floor_stderr"] > 0
    # the Stein test of fit finds a 2-epoch model wrong for the test data
    assert result["ksd"]["ksd2"] > 3 * result["ksd"]["stderr"] and result["ksd"]["p_value"] < 0.05
    for png in ("curves.png", "density.png", "samples.png", "samples/buffer.png"):
        assert (run / png).is_file(), png

    part = tmp_path / "part"
    run_cli(
        capsys, "train", "density", "--out", str(part), "--epochs", "2", "--max-steps", "13", *TINY
    )
    code, _, _ = run_cli(
        capsys, "train", "density", "--out", str(part), "--resume", "--max-steps", "0"
    )
    resumed = load_checkpoint(part / "checkpoints" / "last.pt")["model"]
    assert code == 0 and all(torch.equal(full[k], resumed[k]) for k in full)


def test_toml_config_with_flag_override(capsys, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('data = "rings"\nepochs = 1\nlr = 0.5\n')
    code, _, _ = run_cli(
        capsys,
        "train",
        "density",
        "--out",
        str(tmp_path / "r"),
        "--config",
        str(cfg),
        "--lr",
        "0.002",
        *TINY,
    )
    stored = json.loads((tmp_path / "r" / "config.json").read_text())
    assert code == 0 and stored["config"]["data"] == "rings" and stored["trainer"]["lr"] == 0.002
    cfg.write_text("colour = 3\n")
    code, _, err = run_cli(
        capsys, "train", "density", "--out", str(tmp_path / "s"), "--config", str(cfg)
    )
    assert code == 2 and "unknown setting(s)" in err


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.toml")), ids=lambda p: p.name)
def test_shipped_configs_are_valid(path):
    """Each file in configs/ (named RECIPE_*.toml) holds only settings its recipe knows,
    with values its config classes accept."""
    recipe = get_recipe(path.name.split("_")[0])
    recipe.configs(tomllib.loads(path.read_text()))


@pytest.mark.parametrize("method", ["cd", "sm", "ssm", "dsm", "nce", "ed", "drl"])
def test_density_training_principles(tmp_path, method, evaluate_density_run):
    run = tmp_path / method
    assert (
        main(["train", "density", "--method", method, "--out", str(run), "--epochs", "1", *TINY])
        == 0
    )
    result = evaluate_density_run(run)
    assert math.isfinite(result["test_nll"]) and result["test_nll"] > result["true_nll"] - 0.1


def test_recipe_configs_start_from_the_recipe_defaults():
    """The Python API builds the same job as the CLI: settings not given take the
    recipe's trainer defaults, not the generic TrainerConfig ones."""
    recipe = get_recipe("jem")
    config, trainer = recipe.configs({"lr": 0.01, "conv_width": 16})
    assert trainer.lr == 0.01 and config.conv_width == 16
    for name in ("epochs", "optimizer", "lr_schedule", "warmup_steps"):
        assert getattr(trainer, name) == recipe.trainer_defaults[name]


def test_bad_data_fails_before_the_run_directory_exists(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "jem", "--data", str(tmp_path / "missing.npz"), "--out", str(run)]) == 2
    assert "existing .npy/.npz file or image folder" in capsys.readouterr().err
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"PK\x03\x04 truncated")
    assert main(["train", "jem", "--data", str(bad), "--out", str(run)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and err.count("\n") == 1
    assert not run.exists()


def test_data_show_gives_the_splits_a_recipe_reads(capsys, tmp_path):
    """``ebmlab data show``: each split's rows and class counts (validation held out of a
    set that has none), the shape and encoding, and a picture of each class."""
    rng = np.random.default_rng(0)
    for split, n in (("train", 40), ("test", 12)):
        x = rng.integers(0, 256, (n, 3, 6, 6), dtype=np.uint8)
        np.savez(tmp_path / f"{split}.npz", x=x, y=np.arange(n) % 4)
    grid = tmp_path / "pictures" / "classes.png"
    code, out, _ = run_cli(capsys, "data", "show", str(tmp_path), "--grid", str(grid))
    assert code == 0 and grid.stat().st_size > 1000
    shown = json.loads(out)
    assert shown["image_shape"] == [3, 6, 6] and shown["num_classes"] == 4
    assert shown["encoding"]["transform"] == "scaled"
    assert shown["splits"] == {
        "train": {"split": "train", "rows": 36, "class_counts": [9, 9, 9, 9]},
        "val": {"split": "val", "rows": 4, "class_counts": [1, 1, 1, 1]},
        "test": {"split": "test", "rows": 12, "class_counts": [3, 3, 3, 3]},
    }
    code, out, _ = run_cli(capsys, "data", "show", str(tmp_path), "--validation-fraction", "0")
    assert json.loads(out)["splits"]["val"] == {
        "split": "test",
        "rows": 12,
        "class_counts": [3, 3, 3, 3],
    }
    code, out, err = run_cli(capsys, "data", "show", str(tmp_path), "--grid", "x.jpg")
    assert code == 2 and "--grid must name a .png file" in err and out == ""
    code, out, err = run_cli(capsys, "data", "show", "rings", "--grid", str(grid))
    assert code == 2 and "--grid draws labelled images; data 'rings' has none" in err
    code, out, err = run_cli(capsys, "data", "show", str(tmp_path / "absent"))
    assert code == 2 and "data must be one of" in err


def test_data_download_offers_the_sets_with_a_public_address(capsys):
    assert main(["data", "download", "emnist-letters", "somewhere"]) == 2
    err = capsys.readouterr().err
    assert "cifar10" in err and "svhn" in err


def test_every_option_has_help_and_shows_its_choices():
    """Each config field's line in its Attributes docstring reaches --help, with the
    field's choices and the recipe's defaults."""
    from ebmlab.cli import field_help
    from ebmlab.training import TrainerConfig

    for cls in [TrainerConfig, *(r.config_cls for r in recipes().values())]:
        helps = field_help(cls)
        missing = [f.name for f in dataclasses.fields(cls) if not helps.get(f.name)]
        assert not missing, f"{cls.__name__} fields without help: {missing}"
        assert set(helps) <= {f.name for f in dataclasses.fields(cls)}, cls.__name__
    parser = cli._build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "jem", "--help"])


def test_help_text_of_jem(capsys):
    with pytest.raises(SystemExit):
        main(["train", "jem", "--help"])
    out = capsys.readouterr().out
    flat = " ".join(out.split())  # argparse wraps at the terminal's width
    assert "--arch {mlp,conv,wrn,resnet,unet,unet-dot}" in flat and "head (default: conv)" in flat
    assert "passes over the training data (default: 100)" in out  # the recipe's default


def test_internal_errors_surface_with_their_traceback(monkeypatch, tmp_path):
    """Only usage errors become one line and status 2; a failure inside the work, even a
    ValueError raised by torch, propagates (Python prints it and exits with status 1)."""
    recipe = get_recipe("density")

    def broken(config, trainer):
        return torch.nn.functional.cross_entropy(torch.zeros(2, 3), torch.zeros(3).long())

    monkeypatch.setattr(cli, "get_recipe", lambda name: dataclasses.replace(recipe, build=broken))
    with pytest.raises(ValueError, match="batch_size"):
        main(["train", "density", "--out", str(tmp_path / "run"), "--epochs", "1"])


def test_a_run_directory_is_never_trained_over_by_accident(capsys, tmp_path):
    run = tmp_path / "run"
    quick = ["train", "density", "--out", str(run), "--epochs", "1", *TINY]
    assert run_cli(capsys, *quick)[0] == 0
    (run / "evaluation.json").write_text("{}")  # what an evaluation of the old run left
    (run / "samples" / "sample.png").write_bytes(b"old")
    code, out, err = run_cli(capsys, *quick)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "holds a run (completed at step" in err and "--resume" in err and "--overwrite" in err
    code, _, err = run_cli(capsys, *quick, "--resume", "--overwrite")
    assert code == 2 and "give one of them" in err
    assert run_cli(capsys, *quick, "--overwrite")[0] == 0
    assert not (run / "evaluation.json").exists() and not (run / "samples" / "sample.png").exists()
    assert (run / "checkpoints" / "last.pt").is_file()


def test_a_resumed_run_counts_the_time_of_every_part(capsys, tmp_path):
    run = tmp_path / "run"
    args = ["train", "density", "--out", str(run), "--epochs", "2", *TINY]
    assert run_cli(capsys, *args, "--max-steps", "3")[0] == 0
    first = json.loads((run / "summary.json").read_text())["seconds"]
    assert run_cli(capsys, *args, "--resume", "--max-steps", "0")[0] == 0
    total = json.loads((run / "summary.json").read_text())
    saved = load_checkpoint(run / "checkpoints" / "last.pt")["trainer"]["seconds"]
    assert total["seconds"] > first > 0 and saved <= total["seconds"]


def test_the_resume_command_repeats_the_arguments_with_resume():
    argv = ["train", "jem", "--out", "my runs/a", "--overwrite", "--lr", "1e-3"]
    assert cli.resume_command(argv) == "ebmlab train jem --out 'my runs/a' --lr 1e-3 --resume"


def test_every_command_takes_threads_and_refuses_more_than_the_cpus(capsys, monkeypatch):
    monkeypatch.setattr("ebmlab.threads.usable_cpus", lambda: 2)
    for argv in (["info"], ["evaluate", "x"], ["sample", "x"], ["logz", "x"],
                 ["data", "cache"], ["train", "density", "--out", "x"]):  # fmt: skip
        code, _, err = run_cli(capsys, *argv, "--threads", "3")
        assert code == 2 and "threads 3 is more than the 2 CPUs" in err, argv


HEAVY = ("scipy", "sklearn", "matplotlib", "pandas", "PIL")


@pytest.mark.parametrize(
    "argv", [["--help"], ["train", "jem", "--help"], ["train", "jem", "--epochs", "0"]]
)
def test_help_and_usage_errors_import_nothing_beyond_torch(argv):
    """What a typo costs: the command line is parsed before scipy, scikit-learn or
    matplotlib are imported (they take seconds on a busy machine)."""
    probe = (
        "import sys\nfrom ebmlab.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stderr


def test_logz_of_a_density_run_by_quadrature_and_by_smc(capsys, tmp_path):
    """Quadrature integrates over the plotted box, SMC over the whole plane: the box
    holds at most the plane's mass."""
    run = tmp_path / "run"
    assert run_cli(capsys, "train", "density", "--out", str(run), "--epochs", "1", *TINY)[0] == 0
    code, out, _ = run_cli(capsys, "logz", str(run))
    grid = json.loads(out)
    code, out, _ = run_cli(capsys, "logz", str(run), "--method", "smc")
    smc = json.loads(out)
    assert code == 0 and grid["method"] == "quadrature" and smc["method"] == "smc"
    assert grid["log_z"] < smc["log_z"] + 4 * smc["stderr"] and grid["stderr"] < 0.01
    assert smc["cost"]["kernel_steps_per_particle"] > 0 and 0 < smc["stderr"] < 0.5
    code, _, err = run_cli(capsys, "logz", str(run), "--method", "trw")
    assert code == 2 and "method must be one of" in err


MODEL = """
import torch

def log_density(x):  # x0 ~ N(0, 1), x1 | x0 ~ N(x0, 0.5^2): sd of x1 is sqrt(1.25)
    return -0.5 * (x[:, 0] ** 2 + ((x[:, 1] - x[:, 0]) / 0.5) ** 2)

def energy(x):
    return -log_density(x)

def wrong_shape(x):
    return x.sum()
"""


def test_mcmc_samples_a_posterior_from_a_file(capsys, tmp_path):
    model = tmp_path / "model.py"
    model.write_text(MODEL)
    out = tmp_path / "mcmc"
    code, printed, _ = run_cli(capsys, "mcmc", f"{model}:log_density", "--dim", "2",
                               "--log-density", "--chains", "8", "--warmup", "150",
                               "--draws", "150", "--out", str(out))  # fmt: skip
    assert code == 0
    summary = json.loads(printed)
    draws = np.load(out / "draws.npz")["draws"]
    assert draws.shape == (150, 8, 2) and (out / "trace.png").is_file()
    assert json.loads((out / "summary.json").read_text()) == summary
    assert summary["mass"] == "dense"  # correlation 0.89: the default --mass auto chose it
    truth_sd = [1.0, math.sqrt(1.25)]
    for d in range(2):
        assert abs(summary["mean"][d]) < 4 * summary["mcse_mean"][d]
        assert abs(summary["sd"][d] - truth_sd[d]) < 0.1
    # the energy of the same model, without --log-density, gives the same chains
    code, again, _ = run_cli(capsys, "mcmc", f"{model}:energy", "--dim", "2", "--chains", "8",
                             "--warmup", "150", "--draws", "150")  # fmt: skip
    assert json.loads(again)["mean"] == summary["mean"]


def shorten_neutras_fit(monkeypatch) -> None:
    """NeuTra's flow fitted in 500 Adam steps, not 4000: its exactness given any flow,
    and what a long fit buys, are tests/samplers/test_neutra.py's; here, the command."""
    neutra = lambda **options: NeuTra(WALNUTS(**options), fit_steps=500)  # noqa: E731
    monkeypatch.setitem(mcmc_command.SAMPLERS, "neutra", neutra)


@pytest.mark.parametrize("sampler", ["walnuts", "softabs-hmc", "neutra"])
def test_mcmc_with_another_sampler_recovers_the_moments(capsys, tmp_path, sampler, monkeypatch):
    shorten_neutras_fit(monkeypatch)
    model = tmp_path / "model.py"
    model.write_text(MODEL)
    code, printed, _ = run_cli(capsys, "mcmc", f"{model}:energy", "--dim", "2",
                               "--sampler", sampler, "--chains", "8", "--warmup", "100",
                               "--draws", "100")  # fmt: skip
    assert code == 0
    summary = json.loads(printed)
    for d, truth_sd in enumerate([1.0, math.sqrt(1.25)]):
        assert abs(summary["mean"][d]) < 4 * summary["mcse_mean"][d]
        assert abs(summary["sd"][d] - truth_sd) < 0.15
    if sampler == "neutra":
        assert summary["mass"].endswith("in the flow's latent space")
    if sampler == "softabs-hmc":
        assert summary["mass"] == "softabs metric"
        code, _, err = run_cli(capsys, "mcmc", f"{model}:energy", "--dim", "2",
                               "--sampler", sampler, "--mass", "dense")  # fmt: skip
        assert code == 2 and "--mass dense does not apply to --sampler softabs-hmc" in err


@pytest.mark.slow
@pytest.mark.skipif(_cpp_compiler() is None, reason="torch.compile needs a C++ compiler")
def test_mcmc_compiles_the_tree_steps_where_asked(capsys, tmp_path, monkeypatch):
    """--compile runs NUTS's tree steps through the compiled step. The compiler is
    stood in for by the eager step here: that the compiled steps are the eager ones is
    tests/samplers/test_nuts_compile.py's, which pays for the compiles once."""
    calls = []

    def compiled():  # the eager step, counted, in the compiled one's place
        def step(*args):
            calls.append(1)
            return NUTS._tree_step(*args)

        return step

    monkeypatch.setattr(nuts_module, "_compiled_tree_step", compiled)
    model = tmp_path / "model.py"
    model.write_text(MODEL)
    code, printed, _ = run_cli(capsys, "mcmc", f"{model}:energy", "--dim", "2", "--compile",
                               "--chains", "8", "--warmup", "100", "--draws", "100")  # fmt: skip
    assert code == 0 and len(calls) > 200  # every tree step of the 200 NUTS steps
    summary = json.loads(printed)
    for d, truth_sd in enumerate([1.0, math.sqrt(1.25)]):
        assert abs(summary["mean"][d]) < 4 * summary["mcse_mean"][d]
        assert abs(summary["sd"][d] - truth_sd) < 0.15
    code, _, err = run_cli(capsys, "mcmc", f"{model}:energy", "--dim", "2", "--compile",
                           "--sampler", "adaptive-hmc")  # fmt: skip
    assert code == 2 and "--compile applies to --sampler nuts or walnuts" in err


def test_mcmc_says_in_one_line_when_neutras_flow_cannot_map_a_start(capsys, tmp_path, monkeypatch):
    """A target narrower than 1e-3 and starts near the largest float: the fitted flow
    shrinks, so its inverse overflows at a start; one line names the chain, exit 1."""
    shorten_neutras_fit(monkeypatch)
    model = tmp_path / "narrow.py"
    model.write_text("import torch\n\ndef energy(x):\n"
                     "    return 5000.0 * torch.log1p(x.abs()).sum(-1)\n")  # fmt: skip
    code, _, err = run_cli(capsys, "mcmc", f"{model}:energy", "--dim", "2", "--sampler",
                           "neutra", "--chains", "4", "--warmup", "5", "--draws", "5",
                           "--init-radius", "1.7e308")  # fmt: skip
    assert code == 1
    assert err.startswith("ebmlab: the fitted flow maps chain ") and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_mcmc_starts_chains_within_the_init_radius_as_stan_does(capsys, tmp_path):
    """--init-radius R starts the chains in (-R, R) (Stan's init=R): 2 is the default,
    0 starts every chain at zero and still recovers the moments; a negative radius is
    refused in one line."""
    model = tmp_path / "model.py"
    model.write_text(MODEL)
    args = ("mcmc", f"{model}:energy", "--dim", "2", "--chains", "8", "--warmup", "100",
            "--draws", "100")  # fmt: skip
    short = (*args[:-4], "--warmup", "5", "--draws", "5")  # the same starts, the same chains
    _, default, _ = run_cli(capsys, *short)
    _, two, _ = run_cli(capsys, *short, "--init-radius", "2")
    _, one, _ = run_cli(capsys, *short, "--init-radius", "1")
    assert json.loads(default)["mean"] == json.loads(two)["mean"] != json.loads(one)["mean"]
    code, printed, _ = run_cli(capsys, *args, "--init-radius", "0")
    summary = json.loads(printed)
    assert code == 0 and summary["init_radius"] == 0
    for d, sd in enumerate([1.0, math.sqrt(1.25)]):
        assert abs(summary["mean"][d]) < 4 * summary["mcse_mean"][d]
        assert abs(summary["sd"][d] - sd) < 0.15
    code, out, err = run_cli(capsys, *args, "--init-radius", "-1")
    assert code == 2 and "--init-radius must be a finite number >= 0" in err and out == ""


def test_mcmc_with_a_dense_mass_learns_the_correlation(capsys, tmp_path):
    """x0 and x1 above have correlation 1 / sqrt(1.25) = 0.89: --mass dense draws them
    with the right sds, and the draws keep that correlation."""
    model = tmp_path / "model.py"
    model.write_text(MODEL)
    out = tmp_path / "mcmc"
    code, printed, _ = run_cli(capsys, "mcmc", f"{model}:energy", "--dim", "2", "--mass", "dense",
                               "--chains", "16", "--warmup", "150", "--draws", "150",
                               "--out", str(out))  # fmt: skip
    assert code == 0
    summary = json.loads(printed)
    assert summary["mass"] == "dense"
    for d, sd in enumerate([1.0, math.sqrt(1.25)]):
        assert abs(summary["mean"][d]) < 4 * summary["mcse_mean"][d]
        assert abs(summary["sd"][d] - sd) < 0.1
    draws = np.load(out / "draws.npz")["draws"].reshape(-1, 2)
    assert abs(np.corrcoef(draws.T)[0, 1] - 1 / math.sqrt(1.25)) < 0.03


def test_mcmc_names_the_mass_and_a_refused_dense_one():
    """The summary's mass says when the warm-up refused a dense mass (the split test)."""

    def final(**fields):
        return SimpleNamespace(final=SimpleNamespace(**fields))

    assert mass_used(final(inv_mass=DenseMass(torch.eye(2))), "nuts") == "dense"
    assert mass_used(final(inv_mass=torch.ones(2), refused_spread=None), "nuts") == "diagonal"
    refused = mass_used(final(inv_mass=torch.ones(2), refused_spread=91.3), "adaptive-hmc")
    assert refused == "diagonal (dense refused: the posterior changes shape, spread 91)"


def test_mcmc_warns_of_failed_checks(capsys, tmp_path):
    model = tmp_path / "model.py"
    model.write_text(MODEL)
    code, printed, err = run_cli(capsys, "mcmc", f"{model}:energy", "--dim", "2",
                                 "--chains", "4", "--warmup", "10", "--draws", "10")  # fmt: skip
    summary = json.loads(printed)
    assert code == 0 and not summary["passed"]
    assert "ebmlab: warning: bulk ESS" in err and summary["problems"]


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("{model}", "target must be FILE.py:NAME"),
        ("{dir}/missing.py:energy", "does not exist"),
        ("{model}:nothing", "has no function 'nothing'"),
        ("{model}:wrong_shape", "must map chains (4, 2) to one value per chain, shape (4,)"),
    ],
)
def test_mcmc_refuses_bad_targets_in_one_line(capsys, tmp_path, target, message):
    model = tmp_path / "model.py"
    model.write_text(MODEL)
    spec = target.format(model=model, dir=tmp_path)
    code, out, err = run_cli(capsys, "mcmc", spec, "--dim", "2", "--chains", "4")
    assert code == 2 and message in err and err.count("\n") == 1 and out == ""
