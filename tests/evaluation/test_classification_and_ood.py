import math

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from ebmlab.evaluation import (
    accuracy,
    auroc,
    expected_calibration_error,
    load_ood_file,
    load_ood_images,
    nll,
    reliability_diagram,
    shifted_images,
)
from ebmlab.testing import assert_mean_close


def test_ece_is_small_for_a_calibrated_predictor_and_large_otherwise():
    gen = torch.Generator().manual_seed(0)
    conf = 0.5 + 0.5 * torch.rand(20_000, generator=gen)
    correct = torch.rand(20_000, generator=gen) < conf  # right with probability = confidence
    probs = torch.stack([conf, 1 - conf], 1)
    y = torch.where(correct, 0, 1)
    assert expected_calibration_error(probs, y) < 0.01
    overconfident = torch.stack([torch.full_like(conf, 0.99), torch.full_like(conf, 0.01)], 1)
    assert expected_calibration_error(overconfident, y) > 0.2


def _overconfident(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A two-class predictor right with probability 0.1 below its confidence, n rows."""
    conf = 0.5 + 0.5 * torch.rand(n, generator=gen)
    correct = torch.rand(n, generator=gen) < conf - 0.1
    return torch.stack([conf, 1 - conf], 1), torch.where(correct, 0, 1)


def test_standard_errors_match_the_spread_over_independent_test_sets():
    gen = torch.Generator().manual_seed(1)
    values = {"accuracy": [], "nll": [], "ece": []}
    reported = {"accuracy": [], "nll": [], "ece": []}
    for seed in range(100):
        probs, y = _overconfident(400, gen)
        for name, fn in (("accuracy", accuracy), ("nll", nll)):
            value, stderr = fn(probs, y, return_stderr=True)
            values[name].append(value)
            reported[name].append(stderr)
        value, stderr = expected_calibration_error(probs, y, return_stderr=True, generator=seed)
        values["ece"].append(value)
        reported["ece"].append(stderr)
    for name in values:
        spread = float(torch.tensor(values[name]).std())
        mean_reported = float(torch.tensor(reported[name]).mean())
        # 100 test sets estimate the spread within about 7 %
        assert 0.7 * spread < mean_reported < 1.3 * spread, (name, spread, mean_reported)
    probs, y = _overconfident(400, gen)
    acc, stderr = accuracy(probs, y, return_stderr=True)
    assert stderr == pytest.approx(math.sqrt(acc * (1 - acc) / 399))
    assert accuracy(probs, y) == acc


def test_nll_and_reliability_png(tmp_path):
    probs = torch.tensor([[0.5, 0.5], [0.9, 0.1]])
    assert nll(probs, torch.tensor([0, 0])) == pytest.approx(-(np.log(0.5) + np.log(0.9)) / 2)
    reliability_diagram(probs, torch.tensor([0, 0]), tmp_path / "r.png")
    assert (tmp_path / "r.png").stat().st_size > 1000


def test_auroc():
    assert auroc(torch.tensor([2.0, 3.0]), torch.tensor([0.0, 1.0])) == 1.0
    assert auroc(torch.tensor([0.0, 1.0]), torch.tensor([2.0, 3.0])) == 0.0
    with pytest.raises(ValueError, match="NaN"):
        auroc(torch.tensor([float("nan")]), torch.tensor([0.0]))
    with pytest.raises(ValueError, match="out_scores must not be empty"):
        auroc(torch.tensor([1.0]), torch.tensor([]))
    with pytest.raises(ValueError, match="two scores"):
        auroc(torch.tensor([1.0]), torch.tensor([0.0, 2.0]), return_stderr=True)


def test_auroc_counts_ties_as_half_a_win_like_scikit_learn():
    gen = torch.Generator().manual_seed(0)
    a = torch.randint(0, 5, (300,), generator=gen).float()
    b = torch.randint(0, 4, (200,), generator=gen).float()
    labels = np.r_[np.ones(300), np.zeros(200)]
    assert auroc(a, b) == pytest.approx(roc_auc_score(labels, torch.cat([a, b]).numpy()))


def test_auroc_and_its_standard_error_match_two_gaussians():
    """N(1, 1) against N(0, 1): AUROC = Phi(1 / sqrt 2); over 300 replications the
    estimates centre there and spread as DeLong's standard error says."""
    gen = torch.Generator().manual_seed(1)
    runs = torch.tensor(
        [
            auroc(
                torch.randn(200, generator=gen) + 1,
                torch.randn(300, generator=gen),
                return_stderr=True,
            )
            for _ in range(300)
        ]
    )
    values, stderrs = runs[:, 0], runs[:, 1]
    exact = 0.5 * (1 + math.erf(0.5))  # Phi(1 / sqrt(2))
    assert_mean_close(values, exact, what="AUROC")
    assert float(stderrs.mean()) == pytest.approx(float(values.std()), rel=0.15)


def test_a_published_set_by_name_is_an_ood_set_of_its_test_images(mnist_dir):
    key, raw = load_ood_images("mnist", (1, 28, 28), mnist_dir)
    assert key == "user_set" and raw.shape == (10_000, 1, 28, 28) and raw.dtype == np.uint8
    with pytest.raises(ValueError, match=r"the model's are uint8 \(3, 32, 32\)"):
        load_ood_images("mnist", (3, 32, 32), mnist_dir)


def test_shifted_images_and_user_file(tmp_path):
    raw = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    sets = shifted_images(raw)
    assert np.array_equal(sets["flip_lr"][0], raw[0, :, ::-1])
    assert np.array_equal(sets["flip_ud"][1], raw[1, ::-1])
    assert sorted(sets["permuted"][0].ravel()) == sorted(raw[0].ravel())
    np.save(tmp_path / "ok.npy", raw)
    assert load_ood_file(tmp_path / "ok.npy", (3, 3)).shape == (2, 3, 3)
    np.save(tmp_path / "bad.npy", raw.astype(np.float32))
    with pytest.raises(ValueError, match="uint8 images of shape"):
        load_ood_file(tmp_path / "bad.npy", (3, 3))
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object))
    with pytest.raises(ValueError, match=r"not a plain \.npy"):
        load_ood_file(tmp_path / "obj.npy", (3, 3))
