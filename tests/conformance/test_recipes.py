"""A training step, validation and the epoch-end pictures of every recipe, with the
task moved onto a simulated accelerator: no CPU tensor mixed in, and the CPU's numbers."""

import numpy as np
import pytest
import torch

from ebmlab import conformance as cf
from ebmlab.training.recipes import Setup, get_recipe
from ebmlab.training.run_dir import RunDirectory

SETTINGS = {
    "density": {"hidden": 16, "depth": 2, "sampler_steps": 3, "buffer_size": 64},
    "density-features": {  # a features file (written by `settings`), log Z by SMC
        "hidden": 16,
        "depth": 2,
        "sampler_steps": 3,
        "buffer_size": 64,
    },
    "jem": {"arch": "mlp", "hidden": (32,), "sampler_steps": 3, "buffer_size": 40},
    "jem-conv": {"arch": "conv", "conv_width": 4, "sampler_steps": 2, "buffer_size": 40},
    "rbm": {"n_hidden": 8, "k": 2, "n_chains": 20},
    "rbm-dbm": {"model": "dbm", "n_hidden": 6, "n_hidden2": 4, "n_chains": 20},
    "rbm-conditional": {"model": "conditional", "n_hidden": 4},
    "rbm-gated": {"model": "gated", "n_hidden": 4, "n_factors": 8},
    "rbm-classification": {"model": "classification", "n_hidden": 8},
    "rbm-dbn": {"model": "dbn", "n_hidden": 8, "n_hidden2": 4, "n_chains": 20},
    "structured": {},
    "structured-chain": {"task": "chain", "n_sequences": 40},
    "structured-completion": {"task": "completion"},
}


@pytest.fixture(scope="module")
def features(tmp_path_factory):
    """A user's features file for the density recipe: 300 rows of 3 columns."""
    path = tmp_path_factory.mktemp("features") / "features.npy"
    np.save(path, np.random.default_rng(0).normal(3, 2, (300, 3)).astype(np.float32))
    return path


@pytest.fixture
def settings(features):
    """The options of a recipe entry, with the features file where it takes one."""

    def of(name):
        data = {"data": str(features)} if name == "density-features" else {}
        return {**SETTINGS[name], **data, "seed": 0}

    return of


def step(name, options, to_device, run):
    recipe = get_recipe(name.split("-")[0])
    config, trainer = recipe.configs(options)
    setup = recipe.build(config, trainer)
    task = to_device(setup.task)
    device = task.model.parameters().__next__().device
    batch = tuple(t[:16].to(device) for t in setup.train_data)
    gen = torch.Generator(device).manual_seed(1)
    task.model.train()
    result = task.training_step(batch, gen)
    if not result.grads_ready:
        result.loss.backward()
    task.model.eval()
    metrics = task.validate(gen)
    task.on_epoch_end(run, 0, gen)
    return float(result.loss.detach()), result.metrics, metrics


@pytest.mark.parametrize("name", list(SETTINGS))
def test_recipe_step_runs_on_the_device(name, settings, tmp_path, float64):
    runs = [RunDirectory(tmp_path / where) for where in ("cpu", "device")]
    for run in runs:
        run.create()
    want = step(name, settings(name), lambda task: task, runs[0])
    with cf.simulated_device(float64=float64):
        got = step(name, settings(name), lambda task: task.to(cf.DEVICE), runs[1])
    pictures = [sorted(p.relative_to(r.path) for p in r.path.rglob("*.png")) for r in runs]
    assert pictures[1] == pictures[0]
    assert got[0] == pytest.approx(want[0], rel=1e-4, abs=1e-6)
    assert got[1] == pytest.approx(want[1], rel=1e-4, abs=1e-6)
    assert got[2].keys() == want[2].keys()


EVALUATE_OPTIONS = {
    "jem": {"long_run_steps": 201},
    "density": {"n_samples": 200, "sample_steps": 5},
}


def evaluation(name, options, to_device, run):
    recipe = get_recipe(name.split("-")[0])
    config, trainer = recipe.configs(options)
    setup = recipe.build(config, trainer)
    setup = Setup(to_device(setup.task), setup.train_data)
    return recipe.evaluate(setup, run, **EVALUATE_OPTIONS.get(name.split("-")[0], {}))


def _numbers(result, prefix=""):
    """The result's numbers by dotted key (nested dicts flattened; seconds left out)."""
    out = {}
    for key, value in result.items():
        if isinstance(value, dict):
            out.update(_numbers(value, f"{prefix}{key}."))
        elif isinstance(value, float | int) and not isinstance(value, bool) and key != "seconds":
            out[prefix + key] = value
    return out


@pytest.mark.parametrize("name", list(SETTINGS))
def test_recipe_evaluation_runs_on_the_device(name, settings, tmp_path, float64):
    runs = [RunDirectory(tmp_path / where) for where in ("cpu", "device")]
    for run in runs:
        run.create()
    want = _numbers(evaluation(name, settings(name), lambda task: task, runs[0]))
    with cf.simulated_device(float64=float64):
        got = _numbers(evaluation(name, settings(name), lambda task: task.to(cf.DEVICE), runs[1]))
    assert got.keys() == want.keys()
    if float64:  # the same draws, so the same numbers
        # but hundreds of Langevin steps grow a rounding apart (the CPU's own SiLU
        # formulas, say) into the fourth digit: their figures within 1 %, which
        # another draw would miss by several times
        long = {key for key in want if "_more_steps." in key}
        for keys, rel in ((want.keys() - long, 1e-4), (long, 1e-2)):
            assert {k: got[k] for k in keys} == pytest.approx(
                {k: want[k] for k in keys}, rel=rel, abs=1e-6, nan_ok=True
            )
    pictures = [sorted(p.relative_to(r.path) for p in r.path.rglob("*.png")) for r in runs]
    assert pictures[1] == pictures[0]


@pytest.mark.parametrize(
    "name", [name for name in SETTINGS if get_recipe(name.split("-")[0]).sample is not None]
)
def test_recipe_samples_on_the_device(name, settings, tmp_path):
    """``ebmlab sample``'s picture, drawn with the task on the simulated device."""
    recipe = get_recipe(name.split("-")[0])
    setup = recipe.build(*recipe.configs(settings(name)))
    run = RunDirectory(tmp_path / "run")
    run.create()
    out = tmp_path / "sample.png"
    with cf.simulated_device():
        recipe.sample(Setup(setup.task.to(cf.DEVICE), setup.train_data), run, 4, 2, out, seed=0)
    assert out.is_file()
