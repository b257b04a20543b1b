"""A training step, validation and the epoch-end pictures of every recipe, with the
task moved onto a simulated accelerator: no CPU tensor mixed in, and the CPU's numbers."""

import pytest
import torch

from ebmlab import conformance as cf
from ebmlab.training.recipes import get_recipe
from ebmlab.training.run_dir import RunDirectory

SETTINGS = {
    "density": {"hidden": 16, "depth": 2, "sampler_steps": 3, "buffer_size": 64},
    "jem": {"arch": "mlp", "hidden": (32,), "sampler_steps": 3, "buffer_size": 40},
    "jem-conv": {"arch": "conv", "conv_width": 4, "sampler_steps": 2, "buffer_size": 40},
    "rbm": {"n_hidden": 8, "k": 2, "n_chains": 20},
    "rbm-dbm": {"model": "dbm", "n_hidden": 6, "n_hidden2": 4, "n_chains": 20},
    "rbm-conditional": {"model": "conditional", "n_hidden": 4},
    "rbm-gated": {"model": "gated", "n_hidden": 4, "n_factors": 8},
    "structured": {},
}


def step(name, to_device, run):
    recipe = get_recipe(name.split("-")[0])
    config, trainer = recipe.configs({**SETTINGS[name], "seed": 0})
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
def test_recipe_step_runs_on_the_device(name, tmp_path):
    runs = [RunDirectory(tmp_path / where) for where in ("cpu", "device")]
    for run in runs:
        run.create()
    want = step(name, lambda task: task, runs[0])
    with cf.simulated_device():
        got = step(name, lambda task: task.to(cf.DEVICE), runs[1])
    pictures = [sorted(p.relative_to(r.path) for p in r.path.rglob("*.png")) for r in runs]
    assert pictures[1] == pictures[0]
    assert got[0] == pytest.approx(want[0], rel=1e-4, abs=1e-6)
    assert got[1] == pytest.approx(want[1], rel=1e-4, abs=1e-6)
    assert got[2].keys() == want[2].keys()
