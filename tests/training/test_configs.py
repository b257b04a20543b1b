"""Every shipped configuration loads, builds its model, and trains one step on
synthetic data of its data set's shape (no data files needed)."""

import tomllib
from pathlib import Path

import numpy as np
import pytest

from ebmlab.cli import main
from ebmlab.training.recipes import get_recipe
from ebmlab.training.recipes.jem import network

CONFIGS = sorted((Path(__file__).parents[2] / "configs").glob("*.toml"))
SHAPES = {"cifar10": (3, 32, 32, 10), "svhn": (3, 32, 32, 10), "mnist10k": (1, 28, 28, 10),
          "fashion-mnist": (1, 28, 28, 10), "digits-rgb": (3, 8, 8, 10)}  # fmt: skip


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_shipped_config_loads_and_takes_a_step(path, tmp_path):
    recipe_name = path.stem.split("_")[0]
    settings = tomllib.loads(path.read_text())
    config, _ = get_recipe(recipe_name).configs(settings)  # every key is known
    c, h, w, k = SHAPES[settings["data"]]
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        np.savez(data / f"{split}.npz", x=rng.integers(0, 256, (4 * k, c, h, w), dtype=np.uint8),
                 y=np.arange(4 * k) % k)  # fmt: skip
    if recipe_name == "jem":  # the full network builds (WRN-28-10: 36.5 M parameters)
        net = network(config, c * h * w, (c, h, w), k)
        assert sum(p.numel() for p in net.parameters()) > 0
    # eager: compiling would take half a minute on a CPU (test_devices covers compile)
    small = ["--buffer-size", "8", "--sampler-steps", "1", "--batch-size", "4", "--max-steps", "1",
             "--no-compile"]  # fmt: skip
    if getattr(config, "arch", "") == "wrn":
        small += ["--wrn-depth", "10", "--wrn-widen", "1"]  # the architecture, scaled down
    if getattr(config, "arch", "") == "unet":
        small += ["--conv-width", "8", "--vit-embed", "16", "--flow-steps", "2"]
    run = str(tmp_path / "run")
    args = ["train", recipe_name, "--config", str(path), "--data", str(data), "--warmup-steps",
            "0", "--out", run, "--no-progress", "--device", "cpu", *small]  # fmt: skip
    assert main(args) == 0
    assert (tmp_path / "run" / "checkpoints" / "last.pt").is_file()
