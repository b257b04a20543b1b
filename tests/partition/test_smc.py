"""Tempered SMC log Z against analytic and enumerated answers."""

import importlib

import pytest
import torch

from ebmlab.energies import (
    BoltzmannMachine,
    Funnel,
    Gaussian,
    GaussianMixture,
    IndependentBernoulli,
)
from ebmlab.partition import binary_states, exact_log_partition, smc, smc_sample
from ebmlab.samplers import HMC, MALA, GibbsWithGradients

smc_module = importlib.import_module("ebmlab.partition.smc")  # the package's smc is the function


def mixture(d, seed=123):
    means = torch.randn(4, d, generator=torch.Generator().manual_seed(seed)) * 2
    return GaussianMixture.isotropic(means, 1.0)


def assert_within(estimate, truth, k=4.0, most=0.15):
    error = estimate.log_z - truth
    assert abs(error) <= k * estimate.stderr + 1e-9, (error, estimate.stderr)
    assert abs(error) < most, error


@pytest.mark.parametrize("d", [2, 10])
def test_gaussian_mixture(d):
    target = mixture(d)
    base = Gaussian(torch.zeros(d), torch.eye(d) * 9)
    estimate = smc(target, base, HMC(0.3, 5), n_particles=256, steps_per_stage=3, generator=0)
    assert_within(estimate, float(target.log_partition()))
    assert estimate.method == "smc" and len(estimate.cost["n_stages"]) == 8


@pytest.mark.parametrize("chain_length", [1, 8])
def test_funnel(chain_length):
    """Resample-move and waste-free SMC (8 particles kept per chain)."""
    target = Funnel(5, scale=1.5)
    base = Gaussian(torch.zeros(5), torch.eye(5) * 4)
    estimate = smc(
        target,
        base,
        MALA(0.05),
        n_particles=256,
        steps_per_stage=5,
        chain_length=chain_length,
        generator=1,
    )
    assert_within(estimate, float(target.log_partition()))


@pytest.mark.parametrize("chain_length", [1, 4])
def test_binary_boltzmann_machine(chain_length):
    torch.manual_seed(0)
    bm = BoltzmannMachine(12, init_std=0.4)
    base = IndependentBernoulli(torch.zeros(12))
    kernel = GibbsWithGradients()
    estimate = smc(
        bm, base, kernel, n_particles=256, steps_per_stage=4, chain_length=chain_length, generator=2
    )
    assert_within(estimate, exact_log_partition(bm).log_z)


def test_independent_bernoulli_base_is_exact():
    base = IndependentBernoulli(torch.tensor([0.5, -1.0, 2.0]))
    states = binary_states(3)
    log_z = torch.logsumexp(-base.energy(states).double(), 0)
    torch.testing.assert_close(base.log_partition(), log_z)
    draws = base.sample(20000, torch.Generator().manual_seed(0))
    torch.testing.assert_close(draws.mean(0), torch.sigmoid(base.logits), atol=0.015, rtol=0)


def test_interval_covers_the_truth_across_seeds():
    target = mixture(2, seed=7)
    base = Gaussian(torch.zeros(2), torch.eye(2) * 9)
    truth = float(target.log_partition())
    covered = 0
    for seed in range(20):
        estimate = smc(target, base, HMC(0.3, 5), n_particles=128, generator=seed)
        low, high = estimate.interval(2.0)
        covered += low <= truth <= high
    assert covered >= 17


def genealogy_calibration(seeds=200):
    """Reported stderr of one population (variance="genealogy") over the spread of its
    log Z across seeds, on the 2-d mixture."""
    target = mixture(2, seed=7)
    base = Gaussian(torch.zeros(2), torch.eye(2) * 9)
    truth = float(target.log_partition())
    errors, stderrs = [], []
    for seed in range(seeds):
        estimate = smc(
            target,
            base,
            HMC(0.3, 5),
            n_runs=1,
            variance="genealogy",
            steps_per_stage=3,
            generator=seed,
        )
        errors.append(estimate.log_z - truth)
        stderrs.append(estimate.stderr)
    errors, stderrs = torch.tensor(errors), torch.tensor(stderrs)
    return float(stderrs.square().mean().sqrt() / errors.std())


@pytest.mark.slow
def test_single_population_stderr_matches_the_spread_across_seeds():
    """Lee & Whiteley's genealogy estimate of Var(Z_hat) / Z^2: its root-mean-square
    over 200 seeds is within 20 % of the actual spread of log Z_hat (the spread's own
    relative standard error is 5 %)."""
    assert 0.8 < genealogy_calibration() < 1.25


@pytest.mark.slow
def test_single_population_stderr_needs_multinomial_resampling(monkeypatch):
    """Negative control: the same check rejects the estimate under systematic
    resampling, whose evenly spread offspring make the genealogy look too diverse."""
    monkeypatch.setattr(smc_module, "_multinomial", smc_module._systematic)
    assert genealogy_calibration() < 0.8


def test_single_population_on_a_binary_model():
    torch.manual_seed(0)
    bm = BoltzmannMachine(12, init_std=0.4)
    base = IndependentBernoulli(torch.zeros(12))
    estimate = smc(
        bm,
        base,
        GibbsWithGradients(),
        n_particles=2048,
        n_runs=1,
        variance="genealogy",
        steps_per_stage=4,
        generator=3,
    )
    assert estimate.cost["variance"] == "genealogy" and 0 < estimate.stderr < 0.1
    assert_within(estimate, exact_log_partition(bm).log_z)


def test_bad_input():
    target, base, kernel = mixture(2), Gaussian(torch.zeros(2), torch.eye(2)), MALA(0.1)
    with pytest.raises(ValueError, match="n_particles"):
        smc(target, base, kernel, n_particles=0)
    with pytest.raises(ValueError, match="n_runs must be at least 2"):
        smc(target, base, kernel, n_runs=1)
    with pytest.raises(ValueError, match="ess_fraction must be in"):
        smc(target, base, kernel, ess_fraction=1.0)
    with pytest.raises(ValueError, match="variance must be one of"):
        smc(target, base, kernel, variance="bootstrap")
    with pytest.raises(ValueError, match="variance='genealogy' needs chain_length=1"):
        smc(target, base, kernel, variance="genealogy", n_particles=64, chain_length=8)
    with pytest.raises(ValueError, match="chain_length must divide n_particles"):
        smc(target, base, kernel, n_particles=100, chain_length=8)
    with pytest.raises(TypeError, match="kernel must be an ebmlab Sampler"):
        smc(target, base, "mala")
    with pytest.raises(TypeError, match="base must provide sample"):
        smc(target, target.energy, kernel)
    with pytest.raises(ValueError, match="NaN or infinite"):
        smc(lambda x: x.sum(1) * float("nan"), base, kernel, n_particles=8)


@pytest.mark.slow
@pytest.mark.parametrize(("d", "scale"), [(8, 0.5), (32, 0.3)])
def test_box_smc_recovers_a_gaussian_truncated_to_a_box(d, scale):
    """Z of exp(-|x - mu|^2 / (2 s^2)) on [-1, 1]^D: a product of normal CDF
    differences, against SMC in logit coordinates."""
    from ebmlab.partition import box_smc

    mean = torch.linspace(-0.5, 0.8, d, dtype=torch.float64)
    mass = torch.special.ndtr((1 - mean) / scale) - torch.special.ndtr((-1 - mean) / scale)
    exact = float((scale * (2 * torch.pi) ** 0.5 * mass).log().sum())

    def energy(x):
        return 0.5 * (((x - mean) / scale) ** 2).sum(1)

    est = box_smc(energy, -1.0, 1.0, (d,), generator=0)
    assert est.method == "smc_box" and est.cost["box"] == [-1.0, 1.0]
    assert 0 < est.stderr < 0.2 and abs(est.log_z - exact) < 4 * est.stderr + 0.02


def test_box_smc_refuses_an_empty_box():
    from ebmlab.partition import box_smc

    with pytest.raises(ValueError, match="finite low < high"):
        box_smc(lambda x: x.sum(1), 1.0, 1.0, (2,))


def test_smc_sample_carries_mass_between_modes_by_their_weights():
    """Two modes 10 sds apart with weights 0.2 and 0.8: the population's share in the
    light mode is 0.2 within sampling error, and each mode's spread is right, where
    Langevin chains started in the heavy mode never reach the light one."""
    from ebmlab.samplers import Langevin

    weights = torch.tensor([0.2, 0.8])
    means = torch.tensor([[-5.0, 0.0], [5.0, 0.0]])
    target = GaussianMixture(weights, means, torch.eye(2).expand(2, 2, 2) * 0.25)
    base = Gaussian(torch.zeros(2), torch.eye(2) * 16.0)
    gen = torch.Generator().manual_seed(0)
    x = smc_sample(target, base, HMC(0.2, 5), 4000, generator=gen)
    light = x[:, 0] < 0
    share = float(light.double().mean())
    # resampling correlates the draws: allow 3x the independent draws' error
    assert abs(share - 0.2) < 3 * 3 * (0.2 * 0.8 / 4000) ** 0.5
    assert abs(float(x[light, 1].std()) - 0.5) < 0.05
    chains = Langevin(0.05).sample(target, means[1] + torch.zeros(4000, 2), 200, generator=gen)
    assert float((chains[:, 0] < 0).double().mean()) == 0.0


def test_smc_sample_bad_input():
    target, base = mixture(2), Gaussian(torch.zeros(2), torch.eye(2))
    with pytest.raises(ValueError, match="n must be at least 2"):
        smc_sample(target, base, MALA(0.1), 1)
    with pytest.raises(ValueError, match="ess_fraction must be in"):
        smc_sample(target, base, MALA(0.1), 100, ess_fraction=1.0)


def test_the_eves_weight_concentration_sums_each_eves_particles():
    """sum_e S_e^2 by sorted running sums (fixed order on every device) against a plain
    scatter of the weights onto their eves: one eve, every particle its own eve, and
    random ancestries."""
    from ebmlab.partition.smc import _eve_concentration

    gen = torch.Generator().manual_seed(0)
    log_w = torch.randn(4, 300, generator=gen, dtype=torch.float64) * 3
    eve = torch.randint(0, 300, (4, 300), generator=gen)
    eve[0] = 7
    eve[1] = torch.arange(300)
    expected = torch.zeros_like(log_w).scatter_add_(1, eve, torch.softmax(log_w, -1))
    got = _eve_concentration(log_w, eve)
    torch.testing.assert_close(got, expected.square().sum(-1), rtol=1e-12, atol=1e-14)
    assert abs(float(got[0]) - 1.0) < 1e-12  # one eve holds all the weight


def test_progress_bar_shows_the_way_to_beta_one_and_changes_no_draw(capsys):
    """``progress`` draws a bar of the slowest run's beta on stderr; the estimate is
    the one without it, to the bit."""
    target = Gaussian(torch.tensor([1.0, -1.0]), torch.eye(2) * 0.25)
    base = Gaussian(torch.zeros(2), torch.eye(2))
    args = dict(n_particles=64, n_runs=2, generator=3)
    quiet = smc(target.energy, base, MALA(0.1), **args)
    assert capsys.readouterr().err == ""
    shown = smc(target.energy, base, MALA(0.1), progress="log Z here", **args)
    err = capsys.readouterr().err
    stages = max(quiet.cost["n_stages"])
    assert "log Z here:" in err and "100%|" in err and f"stages={stages}" in err
    assert shown.log_z == quiet.log_z and shown.stderr == quiet.stderr
