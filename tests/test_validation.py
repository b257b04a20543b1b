"""Bad input anywhere gets a clear error naming the argument, before any work starts."""

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ebmlab import losses
from ebmlab.cli import main
from ebmlab.data import load_dataset, make_toy
from ebmlab.energies import (
    BernoulliRBM,
    ClassifierEnergy,
    DiagonalGaussian,
    FeedForward,
    Funnel,
    Gaussian,
    GaussianMixture,
    MLPEnergy,
    SubspaceRBM,
)
from ebmlab.inference import most_offending, viterbi
from ebmlab.learning.rbm import ContrastiveDivergence
from ebmlab.partition import ais, quadrature_log_partition, rbm_ais
from ebmlab.samplers import (
    HMC,
    MALA,
    Gibbs,
    Langevin,
    MetropolisHastings,
    ParallelTempering,
    ReplayBuffer,
)
from ebmlab.training import TrainerConfig


def quad(x):
    return (x**2).sum(1)


CASES = [
    # energies
    (lambda: Gaussian(torch.zeros(2), -torch.eye(2)), ValueError, "positive definite"),
    (lambda: Gaussian(torch.zeros(2, 2), torch.eye(2)), ValueError, "mean must have 1 dimensions"),
    (lambda: DiagonalGaussian(torch.zeros(2), torch.zeros(2)), ValueError, "std must be > 0"),
    (
        lambda: GaussianMixture(torch.tensor([-1.0]), torch.zeros(1, 2), torch.eye(2)[None]),
        ValueError,
        "weights must be > 0",
    ),
    (lambda: Funnel(dim=1), ValueError, "dim must be >= 2"),
    (lambda: MLPEnergy(0), ValueError, "dim must be an integer >= 1"),
    (lambda: MLPEnergy(2, activation="swish9"), ValueError, "activation must be one of"),
    (lambda: BernoulliRBM(3, 0), ValueError, "n_hidden must be an integer >= 1"),
    (lambda: SubspaceRBM(3, 2, 0), ValueError, "n_subspace must be an integer >= 1"),
    (lambda: ClassifierEnergy(FeedForward([4, 3]), 1), ValueError, "num_classes must be >= 2"),
    (lambda: FeedForward([4]), ValueError, "sizes must list at least"),
    # samplers
    (lambda: Langevin(-1.0), ValueError, "step_size must be a finite number > 0"),
    (lambda: Langevin(math.nan), ValueError, "step_size must be a finite number > 0"),
    (lambda: MALA(0.0), ValueError, "step_size must be a finite number > 0"),
    (lambda: HMC(0.1, n_leapfrog=0), ValueError, "n_leapfrog must be an integer >= 1"),
    (lambda: MetropolisHastings("big"), TypeError, "scale must be a number"),
    (lambda: Gibbs(scan="diagonal"), ValueError, "scan must be one of"),
    (lambda: ParallelTempering(MALA(0.1), [1.0, 2.0]), ValueError, "betas must start at 1.0"),
    (
        lambda: ReplayBuffer(0, lambda n, g=None: torch.zeros(n, 1)),
        ValueError,
        "capacity must be an integer >= 1",
    ),
    (
        lambda: Langevin(0.1).sample(quad, torch.zeros(3), 1),
        ValueError,
        "x0 must have at least 2 dimensions",
    ),
    (
        lambda: Langevin(0.1).sample(quad, torch.zeros(3, 2), -1),
        ValueError,
        "n_steps must be an integer >= 0",
    ),
    (
        lambda: Langevin(0.1).sample(quad, torch.zeros(3, 2), 2, thin=0),
        ValueError,
        "thin must be an integer >= 1",
    ),
    (
        lambda: Langevin(0.1).sample(quad, torch.zeros(3, 2), 2, generator="seed"),
        TypeError,
        "generator must be",
    ),
    (
        lambda: Langevin(0.1).sample(lambda x: x, torch.zeros(3, 2), 1),
        ValueError,
        "one value per sample",
    ),
    # losses and inference
    (lambda: losses.hinge_loss(torch.zeros(2), torch.zeros(3)), ValueError, "same shape"),
    (
        lambda: losses.hinge_loss(torch.zeros(2), torch.zeros(2), margin=-1.0),
        ValueError,
        "margin must be",
    ),
    (
        lambda: losses.nll_loss(torch.zeros(2, 3), torch.tensor([0.0, 1.0])),
        ValueError,
        "integer class indices",
    ),
    (
        lambda: losses.lvq2_loss(torch.ones(2), torch.ones(2), delta=0.0),
        ValueError,
        "delta must be",
    ),
    (
        lambda: most_offending(torch.zeros(2, 3), torch.tensor([0, 1]), eps=-1.0),
        ValueError,
        "eps must be",
    ),
    (
        lambda: viterbi(torch.zeros(2, 3, 4), torch.zeros(3, 3)),
        ValueError,
        "transition must end in shape",
    ),
    # partition
    (lambda: quadrature_log_partition(quad, [(1.0, 0.0)]), ValueError, "low < high"),
    (
        lambda: rbm_ais(BernoulliRBM(3, 2), n_chains=0),
        ValueError,
        "n_chains must be an integer >= 1",
    ),
    (lambda: ais(quad), ValueError, "needs base"),
    # data and training
    (lambda: load_dataset("imagenet"), FileNotFoundError, "neither a known data set"),
    (lambda: load_dataset("digits", transform="zscore"), ValueError, "transform must be one of"),
    (lambda: make_toy("swissroll"), ValueError, "name must be one of"),
    (lambda: TrainerConfig(lr=0.0), ValueError, "lr must be a finite number > 0"),
    (lambda: TrainerConfig(monitor_mode="up"), ValueError, "monitor_mode must be one of"),
    (
        lambda: ContrastiveDivergence(BernoulliRBM(3, 2), k=0),
        ValueError,
        "k must be an integer >= 1",
    ),
]


@pytest.mark.parametrize(("make", "error", "message"), CASES, ids=[c[2] for c in CASES])
def test_bad_input_raises_a_clear_error(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_the_table_is_long_enough():
    assert len(CASES) >= 30


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=st.text(min_size=1, max_size=12).filter(lambda s: not s.startswith("-")))
def test_fuzzed_cli_values_never_show_a_traceback(value, capsys, tmp_path_factory):
    out = tmp_path_factory.mktemp("fuzz") / "run"
    code = main(
        ["train", "density", "--out", str(out), "--epochs", value, "--lr", value, "--no-progress"]
    )
    _, err = capsys.readouterr()
    if code != 0:  # a usage error (2), or a learning rate so high that training diverges (1)
        assert code == 2 or (code == 1 and "training diverged" in err)
        assert err.count("\n") == 1 and "Traceback" not in err


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=st.text(max_size=60))
def test_fuzzed_toml_configs_are_refused_cleanly(text, capsys, tmp_path_factory):
    cfg = tmp_path_factory.mktemp("cfg") / "c.toml"
    cfg.write_text(text)
    code = main(
        [
            "train",
            "density",
            "--out",
            str(cfg.parent / "r"),
            "--config",
            str(cfg),
            "--epochs",
            "1",
            "--hidden",
            "4",
            "--depth",
            "1",
            "--sampler-steps",
            "1",
            "--buffer-size",
            "10",
            "--quadrature-points",
            "8",
            "--no-progress",
        ]
    )
    _, err = capsys.readouterr()
    assert code in (0, 2)
    if code == 2:
        assert err.count("\n") == 1 and "Traceback" not in err
