"""Sample-quality statistics against closed forms: the Fréchet distance of Gaussians,
KID's unbiasedness, and precision/recall of identical and disjoint sets."""

import importlib
import math

import pytest
import torch

from ebmlab.energies import ClassifierEnergy, ConvNet
from ebmlab.evaluation import (
    frechet_distance,
    kernel_distance,
    penultimate_features,
    precision_recall,
    sample_quality,
)


def gaussian(n, d, mean=0.0, std=1.0, seed=0):
    return mean + std * torch.randn(n, d, generator=torch.Generator().manual_seed(seed))


def test_frechet_distance_matches_the_gaussian_closed_form():
    """N(0, I) against N(m 1, s^2 I) in d dimensions: d m^2 + d (1 - s)^2."""
    d, m, s = 4, 0.5, 2.0
    value, stderr = frechet_distance(gaussian(20000, d), gaussian(20000, d, m, s, seed=1))
    exact = d * m**2 + d * (1 - s) ** 2
    assert abs(value - exact) < 4 * stderr + 0.02
    assert 0 < stderr < 0.2


@pytest.mark.parametrize(
    "rows_a, rows_b", [(30, 40), (40, 30), (30, 2000), (2000, 30), (2000, 3000)]
)
def test_frechet_distance_agrees_with_the_matrix_square_root_in_every_space(rows_a, rows_b):
    """Fewer rows than features on one side or both (the trace term from the rows), or
    more on both (from the covariances' roots): the same distance as scipy's square root
    of S_a S_b, on correlated features with different means."""
    scipy_linalg = pytest.importorskip("scipy.linalg")
    g = torch.Generator().manual_seed(rows_a + rows_b)
    d = 64
    a = torch.randn(rows_a, d, generator=g, dtype=torch.float64)
    a = a @ torch.randn(d, d, generator=g, dtype=torch.float64)
    b = torch.randn(rows_b, d, generator=g, dtype=torch.float64).add(0.3).exp()
    sa, sb = torch.cov(a.T).numpy(), torch.cov(b.T).numpy()
    mu = (a.mean(0) - b.mean(0)).numpy()
    root = scipy_linalg.sqrtm(sa @ sb).real
    expected = mu @ mu + sa.trace() + sb.trace() - 2 * root.trace()
    value, _ = frechet_distance(a, b, bootstrap=1)
    assert value == pytest.approx(expected, rel=1e-6)


def test_kid_is_unbiased_near_zero_and_detects_a_shift():
    same = [kernel_distance(gaussian(400, 8, seed=i), gaussian(400, 8, seed=100 + i), 5, 200)
            for i in range(10)]  # fmt: skip
    values = torch.tensor([v for v, _ in same])
    assert abs(float(values.mean())) < 3 * float(values.std()) / math.sqrt(10) + 1e-3
    shifted, se = kernel_distance(gaussian(400, 8), gaussian(400, 8, 1.0, seed=1), 5, 200)
    assert shifted > 10 * se > 0


def test_precision_recall_identical_disjoint_and_mode_dropping():
    data = gaussian(500, 2)
    same = precision_recall(gaussian(500, 2, seed=1), data)
    assert same["precision"] > 0.9 and same["recall"] > 0.9
    far = precision_recall(gaussian(500, 2, 10.0, seed=1), data)
    assert far["precision"] == 0 and far["recall"] == 0
    # samples covering half the data: precise, but recall about one half
    half = data[data[:, 0] > 0]
    dropped = precision_recall(half + 0.01 * gaussian(len(half), 2, seed=2), data)
    assert dropped["precision"] > 0.9 and 0.35 < dropped["recall"] < 0.65
    assert dropped["recall_stderr"] == pytest.approx(
        math.sqrt(dropped["recall"] * (1 - dropped["recall"]) / 500)
    )


def test_precision_recall_by_chunks_of_rows_is_the_same(monkeypatch):
    """Distances are taken a chunk of rows at a time, so 50 000 features fit in memory;
    chunks of 7 rows (the last one short) give what one chunk gives."""
    samples, data = gaussian(60, 3, 0.5, seed=3), gaussian(50, 3, seed=4)
    whole = precision_recall(samples, data)
    module = importlib.import_module("ebmlab.evaluation.sample_quality")
    monkeypatch.setattr(module, "NEIGHBOUR_CHUNK", 7)
    assert precision_recall(samples, data) == whole
    assert 0 < whole["precision"] < 1 and 0 < whole["recall"] < 1


def test_penultimate_features_and_the_combined_report():
    torch.manual_seed(0)
    model = ClassifierEnergy(ConvNet((3, 8, 8), 4, width=4), 4)
    x = torch.randn(30, 3 * 8 * 8)
    features = penultimate_features(model, x)
    assert features.shape == (30, model.net.head.in_features)
    report = sample_quality(features[:15], features[15:])
    assert {"frechet_distance", "kid", "precision", "recall"} <= set(report)
    assert report["kid_stderr"] > 0  # disjoint subsets, even of a small set
    with pytest.raises(ValueError, match="NaN"):
        frechet_distance(features * math.nan, features)
    with pytest.raises(ValueError, match="at least 20 rows"):
        kernel_distance(features[:15], features[15:], subsets=10)
    with pytest.raises(ValueError, match="k must be below"):
        precision_recall(features[:3], features, k=3)
