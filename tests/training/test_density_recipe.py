import pytest
import torch

from ebmlab.data import load_dataset
from ebmlab.partition import quadrature_log_partition
from ebmlab.training.recipes import get_recipe
from ebmlab.training.recipes.density import KDE_WIDE_WEIGHT, DensityConfig, DensityTask, nce_noise


@pytest.mark.parametrize("kind", ["gaussian", "kde"])
def test_nce_noise_is_a_normalised_density_that_covers_the_data(kind):
    train = load_dataset("rings", "train").x
    noise = nce_noise(kind, train)
    # log_prob integrates to one (Z of exp(log_prob) over a box holding the mass)
    est = quadrature_log_partition(lambda x: -noise.log_prob(x), [(-12.0, 12.0)] * 2, 512)
    assert abs(est.log_z) < 2e-3
    x = noise.sample(20_000, torch.Generator().manual_seed(0))
    assert torch.isfinite(noise.log_prob(x)).all()
    if kind == "kde":
        # closer to the data than the wide Gaussian: a lower NLL on fresh data
        wide = nce_noise("gaussian", train)
        test = load_dataset("rings", "test").x
        assert float(-noise.log_prob(test).mean()) < float(-wide.log_prob(test).mean()) - 0.5
        assert float(noise.mixture_weights()[-1]) == pytest.approx(KDE_WIDE_WEIGHT, rel=1e-5)


def test_recovery_schedule_starts_where_asked():
    task = DensityTask(DensityConfig(method="drl", drl_levels=4, drl_first=0.3), seed=0)
    assert task.sigmas[0] == pytest.approx(0.3) and task.sigmas[-1] == pytest.approx(0.99)
    assert task.model.n_levels == 4
    with pytest.raises(ValueError, match="drl_first must be in"):
        DensityConfig(method="drl", drl_first=1.5)


def test_noisy_objectives_train_longer_with_a_decaying_rate():
    """NCE and recovery likelihood take their own trainer defaults; what the user sets
    still wins, and the other methods keep the recipe's."""
    recipe = get_recipe("density")
    _, drl = recipe.configs({"method": "drl"})
    _, nce = recipe.configs({"method": "nce"})
    _, pcd = recipe.configs({"method": "pcd"})
    _, short = recipe.configs({"method": "drl", "epochs": 3})
    assert (drl.epochs, drl.lr_schedule) == (150, "cosine")
    assert (nce.epochs, nce.lr, nce.lr_schedule) == (200, 0.01, "cosine")
    assert (pcd.epochs, pcd.lr_schedule) == (recipe.trainer_defaults["epochs"], "constant")
    assert (short.epochs, short.lr_schedule) == (3, "cosine")
