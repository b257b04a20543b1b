"""One log-Z policy: log_partition dispatches by model and always returns a LogZEstimate."""

import math

import pytest
import torch

from ebmlab.energies import (
    BernoulliRBM,
    BoltzmannMachine,
    CategoricalRBM,
    ClassificationRBM,
    DeepBoltzmannMachine,
    Gaussian,
    GaussianBernoulliRBM,
    MLPEnergy,
    SubspaceRBM,
)
from ebmlab.energies.boltzmann import ENUMERATION_LIMIT
from ebmlab.partition import (
    LogZEstimate,
    enumerate_log_partition,
    enumeration_bits,
    exact_log_partition,
    log_partition,
)


def _rbm(d: int, m: int, seed: int = 0) -> BernoulliRBM:
    torch.manual_seed(seed)
    rbm = BernoulliRBM(d, m)
    with torch.no_grad():
        rbm.W.normal_(0, 0.3)
    return rbm.double()


def test_auto_is_exact_up_to_the_limit_and_ais_beyond():
    small = _rbm(12, 8)
    estimate = log_partition(small)
    assert isinstance(estimate, LogZEstimate) and estimate.method == "enumeration"
    brute = enumerate_log_partition(small, 12, dtype=torch.float64)  # every v
    assert estimate.log_z == pytest.approx(brute.log_z, rel=1e-10)
    wide = _rbm(ENUMERATION_LIMIT + 4, ENUMERATION_LIMIT + 2)
    sampled = log_partition(wide, n_chains=50, n_temperatures=300, generator=0)
    assert sampled.method.startswith("ais") and sampled.stderr > 0
    exact = exact_log_partition(wide)  # 2^22 terms: allowed when asked for explicitly
    assert abs(sampled.log_z - exact.log_z) < 4 * sampled.stderr + 0.05


def test_every_model_of_the_family_has_an_automatic_log_z():
    torch.manual_seed(0)
    models = {
        "bm": BoltzmannMachine(8),
        "subspace": SubspaceRBM(6, 3, 2),
        "gaussian": GaussianBernoulliRBM(4, 6),
        "classification": ClassificationRBM(6, 5, 3),
        "dbm": DeepBoltzmannMachine(6, 5, 4),
        "analytic": Gaussian(torch.zeros(2), torch.eye(2)),
    }
    for name, model in models.items():
        estimate = log_partition(model)
        assert math.isfinite(estimate.log_z) and estimate.stderr == 0, name
        assert enumeration_bits(model) <= ENUMERATION_LIMIT, name
    assert log_partition(models["analytic"]).log_z == pytest.approx(math.log(2 * math.pi))


def test_ais_of_gaussian_and_classification_rbms_agrees_with_exact():
    torch.manual_seed(1)
    gaussian = GaussianBernoulliRBM(3, 5).double()
    estimate = log_partition(gaussian, "ais", n_temperatures=300, generator=0)
    assert abs(estimate.log_z - exact_log_partition(gaussian).log_z) < 4 * estimate.stderr + 0.05
    crbm = ClassificationRBM(8, 6, 3).double()
    x = (torch.rand(60, 8) < 0.5).double()
    y = torch.arange(60) % 3
    estimate = log_partition(crbm, "ais", data=x, labels=y, n_temperatures=300, generator=0)
    assert abs(estimate.log_z - exact_log_partition(crbm).log_z) < 4 * estimate.stderr + 0.05


def test_methods_that_do_not_apply_are_named():
    with pytest.raises(ValueError, match="method 'trw' does not apply to GaussianBernoulliRBM"):
        log_partition(GaussianBernoulliRBM(3, 4), "trw")
    with pytest.raises(ValueError, match="method 'ais' does not apply to CategoricalRBM"):
        log_partition(CategoricalRBM(4, 3, 3), "ais")
    with pytest.raises(ValueError, match="method must be one of"):
        log_partition(_rbm(4, 3), "guess")
    with pytest.raises(ValueError, match="no automatic log Z for MLPEnergy"):
        log_partition(MLPEnergy(2))
    with pytest.raises(ValueError, match="needs data and their labels"):
        log_partition(ClassificationRBM(30, 30, 2), "ais")
