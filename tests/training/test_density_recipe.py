import math

import numpy as np
import pytest
import torch

from ebmlab.cli import main
from ebmlab.data import load_dataset
from ebmlab.energies import DiagonalGaussian
from ebmlab.partition import quadrature_log_partition
from ebmlab.training.recipes import get_recipe
from ebmlab.training.recipes.density import KDE_WIDE_WEIGHT, DensityConfig, DensityTask, nce_noise


@pytest.mark.parametrize("kind", ["gaussian", "kde"])
def test_nce_noise_is_a_normalised_density_that_covers_the_data(kind):
    train = load_dataset("rings", "train").x
    noise = nce_noise(kind, train)
    # log_prob integrates to one (Z of exp(log_prob) over a box holding the mass)
    est = quadrature_log_partition(lambda x: -noise.log_prob(x), [(-12.0, 12.0)] * 2, 256)
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


def _features(path, x):
    np.save(path, x.astype(np.float32))
    return str(path)


def test_own_features_train_with_nlls_in_their_units(
    tmp_path, assert_keys_documented, evaluate_density_run
):
    """A user's 2-D features are standardised for the model, and the NLL is reported in
    their units: the same points scaled by 10 train the same model and cost exactly
    2 log 10 nats more."""
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(-2, 0.5, (800, 2)), rng.normal(2, 0.5, (800, 2))]) + 3
    nlls = []
    for scale in (1, 10):
        data = _features(tmp_path / f"x{scale}.npy", scale * x)
        run = tmp_path / f"run{scale}"
        args = ["train", "density", "--data", data, "--method", "sm", "--epochs", "2",
                "--no-progress", "--out", str(run)]  # fmt: skip
        assert main(args) == 0
        result = evaluate_density_run(run)
        assert_keys_documented(result)
        assert result["log_z"]["method"] == "quadrature" and "true_nll" not in result
        nlls.append(result["test_nll"])
        assert (run / "samples.png").is_file() and (run / "density.png").is_file()
    assert nlls[1] - nlls[0] == pytest.approx(2 * math.log(10), abs=1e-3)


def test_log_z_above_two_features_is_tempered_smc_and_exact_where_known(tmp_path):
    """Three features: log Z by SMC, whose estimate for a Gaussian energy in the task's
    place agrees with the exact value; two: quadrature, likewise."""
    rng = np.random.default_rng(1)
    for dim, method in ((3, "smc"), (2, "quadrature")):
        data = _features(tmp_path / f"d{dim}.npy", rng.normal(0, 2, (500, dim)))
        task = DensityTask(DensityConfig(data=data, buffer_size=64), seed=0)
        task.model = DiagonalGaussian(torch.zeros(dim), torch.full((dim,), 0.7))
        est = task.log_z(generator=torch.Generator().manual_seed(2))
        assert est.method == method
        exact = float(task.model.log_partition())
        assert abs(est.log_z - exact) < 4 * est.stderr + 1e-3, (est.log_z, exact, est.stderr)


def test_bad_own_features_are_refused_before_training(tmp_path):
    x = np.random.default_rng(0).normal(size=(100, 3))
    x[:, 1] = 5.0
    with pytest.raises(ValueError, match="feature 1 is constant"):
        DensityTask(DensityConfig(data=_features(tmp_path / "c.npy", x)), seed=0)
    varied = _features(tmp_path / "v.npy", np.random.default_rng(0).normal(size=(100, 3)))
    with pytest.raises(ValueError, match="log_z 'quadrature' integrates 1 or 2 features"):
        DensityTask(DensityConfig(data=varied, log_z="quadrature"), seed=0)
    with pytest.raises(ValueError, match="data must be one of"):
        DensityConfig(data=str(tmp_path / "missing.npy"))


@pytest.mark.parametrize("method", ["em", "eqm", "fm"])
def test_transport_methods_train_a_potential_scored_as_a_boltzmann_density(
    method, tmp_path, assert_keys_documented, evaluate_density_run
):
    """A potential V learned by Energy or Equilibrium Matching or flow matching is the
    density exp(-V / eps_max): its NLL uses log Z of V / eps_max, and its own generator
    draws points from noise."""
    run = tmp_path / method
    args = ["train", "density", "--method", method, "--epochs", "2", "--eps-max", "0.25",
            "--flow-steps", "10", "--no-progress", "--out", str(run)]  # fmt: skip
    assert main(args) == 0
    result = evaluate_density_run(run)
    assert_keys_documented(result)
    assert math.isfinite(result["test_nll"]) and result["mmd2_generated"] < 0.5


def test_energy_matching_warms_up_by_flow_then_contrasts_and_resumes_its_phase():
    config = DensityConfig(method="em", eps_max=0.5, flow_steps=4, buffer_size=64)
    recipe = get_recipe("density")
    _, trainer = recipe.configs({"method": "em", "epochs": 2, "batch_size": 1000})
    setup = recipe.build(config, trainer)
    task = setup.task
    steps = 2 * -(-len(task.train) // 1000)
    assert task.warmup_steps == round(0.3 * steps) > 0
    gen = torch.Generator().manual_seed(0)
    x = task.train[:256]
    phases = []
    for _ in range(task.warmup_steps + 1):
        phases.append("contrastive_gap" in task.training_step((x,), gen).metrics)
    assert phases == [False] * task.warmup_steps + [True]
    again = DensityTask(config, seed=0)
    again.load_state_dict(task.state_dict())
    assert again.steps_taken == task.steps_taken
    # the model is V / eps_max with V's parameters
    z = torch.randn(5, 2)
    torch.testing.assert_close(task.model(z), task.model.potential(z) / 0.5)


def test_transport_paths_start_at_a_toy_source():
    """--source 8gaussians carries eight Gaussians to the data: the flow's starts are
    exact draws of the source, and a potential with no gradient leaves them there."""
    from ebmlab.data.toys import EightGaussians

    task = DensityTask(DensityConfig(data="moons", method="fm", source="8gaussians"), seed=0)
    gen = torch.Generator().manual_seed(0)
    starts = task.source(4000, gen)
    toy = EightGaussians()
    nearest = torch.cdist(starts, toy.means).min(1).values
    assert float(nearest.max()) < 1.5 and float(nearest.mean()) < 0.35  # std 0.2 rings
    with torch.no_grad():
        for p in task.model.potential.parameters():
            p.zero_()
    generated = task.generate(100, gen)
    gap = (generated[:, None] - task.source_pool[None]).abs().amax(-1).min(1).values
    assert bool((gap == 0).all())
    gaussian = DensityTask(DensityConfig(data="moons", method="fm"), seed=0)
    assert float(torch.cdist(gaussian.source(4000, gen), toy.means).min(1).values.mean()) > 0.5


def test_a_source_needs_a_transport_method_and_two_features(tmp_path):
    with pytest.raises(ValueError, match="source '8gaussians' applies to the transport"):
        DensityConfig(method="pcd", source="8gaussians")
    with pytest.raises(ValueError, match="source must be one of"):
        DensityConfig(method="em", source="spirals")
    x = np.random.default_rng(0).normal(size=(100, 3))
    with pytest.raises(ValueError, match="is a 2-D toy, the data have 3 features"):
        DensityTask(DensityConfig(data=_features(tmp_path / "f.npy", x), method="em",
                                  source="8gaussians"), seed=0)  # fmt: skip


def test_energy_matching_trained_as_a_density_generates_draws_of_it():
    """With SMC negatives, generation draws exp(-V / eps_max): for V = eps |x - m|^2 /
    (2 s^2) the draws are N(m, s^2); exp(-V) (sd s / sqrt(eps) = 0.42) or the noise
    (sd 1) would fail."""
    eps, m, s = 0.5, torch.tensor([1.0, -0.5]), 0.3
    task = DensityTask(DensityConfig(method="em", em_negatives="smc", eps_max=eps), seed=0)
    task.model.potential = DiagonalGaussian(m, torch.full((2,), s / math.sqrt(eps)))
    x = task.generate(2000, torch.Generator().manual_seed(0))
    assert x.shape == (2000, 2)
    torch.testing.assert_close(x.mean(0), m, atol=0.05, rtol=0)
    torch.testing.assert_close(x.std(0), torch.full((2,), s), atol=0.05, rtol=0)


def test_energy_matching_with_smc_negatives_and_no_flow_term_is_contrastive_alone():
    config = DensityConfig(method="em", em_negatives="smc", em_flow_weight=0.0, buffer_size=64)
    task = DensityTask(config, seed=0)
    task.warmup_steps = 0  # straight to the contrastive phase
    x = task.train[:256]
    result = task.training_step((x,), torch.Generator().manual_seed(0))
    assert float(result.loss.detach()) == pytest.approx(result.metrics["contrastive_gap"], abs=1e-6)
    with pytest.raises(ValueError, match="em_negatives must be one of"):
        DensityConfig(method="em", em_negatives="pcd")
