"""The scikit-learn estimators train on a simulated accelerator and answer in NumPy."""

import numpy as np
import pytest

from ebmlab import conformance as cf
from ebmlab import sklearn as sk

RNG = np.random.default_rng(0)
X = (RNG.random((40, 8)) < 0.4).astype(float)
Y = RNG.integers(0, 2, 40)

ESTIMATORS = {
    "bernoulli_rbm": lambda device: sk.BernoulliRBM(4, n_iter=2, random_state=0, device=device),
    "gaussian_bernoulli_rbm": lambda device: sk.GaussianBernoulliRBM(
        4, n_iter=2, random_state=0, device=device
    ),
    "spike_slab_rbm": lambda device: sk.SpikeSlabRBM(4, n_iter=2, random_state=0, device=device),
    "convolutional_rbm": lambda device: sk.ConvolutionalRBM(
        3, filter_size=2, image_shape=(2, 4), n_iter=2, random_state=0, device=device
    ),
    "classification_rbm": lambda device: sk.ClassificationRBM(
        4, n_iter=2, random_state=0, device=device
    ),
    "dbn": lambda device: sk.DBN((6, 3), n_iter=2, random_state=0, device=device),
    "gated_rbm": lambda device: sk.GatedRBM(
        4, n_factors=6, n_iter=2, batch_size=10, random_state=0, device=device
    ),
}


def fit_and_use(make, device):
    est = make(device)
    if isinstance(est, sk.ClassificationRBM):
        est.fit(X, Y)
        return est.predict_proba(X), est.score_samples(X)
    est.fit(X)
    return est.transform(X), getattr(est, "components_", None)


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_estimator_trains_on_the_device(name, monkeypatch, float64):
    want = fit_and_use(ESTIMATORS[name], "cpu")
    monkeypatch.setattr(sk, "resolve_device", lambda device: cf.DEVICE)
    with cf.simulated_device(float64=float64):
        got = fit_and_use(ESTIMATORS[name], "simulated")
    for a, b in zip(got, want, strict=True):
        if b is not None:
            assert isinstance(a, np.ndarray)
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_float64_on_a_device_without_it_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(sk, "resolve_device", lambda device: cf.DEVICE)
    est = sk.BernoulliRBM(4, n_iter=1, dtype="float64", device="simulated")
    with cf.simulated_device(float64=False), pytest.raises(ValueError, match="dtype 'float64'"):
        est.fit(X)
