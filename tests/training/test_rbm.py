import copy
import warnings

import numpy as np
import pytest
import torch

from ebmlab.energies import BernoulliRBM
from ebmlab.learning.rbm import ContrastiveDivergence
from ebmlab.partition import (
    binary_states,
    enumerate_log_partition,
    log_partition,
    rbm_log_partition,
)
from ebmlab.sklearn import DBN
from ebmlab.sklearn import BernoulliRBM as SkRBM
from ebmlab.sklearn import ClassificationRBM as SkClassificationRBM
from ebmlab.sklearn import ConvolutionalRBM as SkConvolutionalRBM
from ebmlab.sklearn import GatedRBM as SkGatedRBM
from ebmlab.sklearn import GaussianBernoulliRBM as SkGaussianRBM
from ebmlab.sklearn import SpikeSlabRBM as SkSpikeSlabRBM


def random_rbm(d=6, m=4, seed=0, scale=1.0):
    torch.manual_seed(seed)
    rbm = BernoulliRBM(d, m, init_std=scale)
    with torch.no_grad():
        rbm.b.normal_(0, scale)
        rbm.c.normal_(0, scale)
    return rbm.double()


def exact_gradient(rbm, v):
    """-(d mean log p(v)) / d theta by enumeration of every visible state (eq. 6.41)."""
    states = binary_states(rbm.n_visible).double()
    with torch.no_grad():
        p = torch.softmax(-rbm.free_energy(states), 0)
        ph_model, ph_data = rbm.hidden_probs(states), rbm.hidden_probs(v)
    grad_w = (states * p[:, None]).T @ ph_model - v.T @ ph_data / len(v)
    grad_b = p @ states - v.mean(0)
    grad_c = p @ ph_model - ph_data.mean(0)
    return grad_w, grad_b, grad_c


@pytest.mark.parametrize("rbm_shape", [(6, 4), (5, 8)])
def test_exact_log_partition_sums_out_the_larger_layer(rbm_shape):
    rbm = random_rbm(*rbm_shape)
    assert rbm_log_partition(rbm).log_z == pytest.approx(
        enumerate_log_partition(rbm, rbm.n_visible, dtype=torch.float64).log_z, abs=1e-9
    )


def test_persistent_cd_gradient_approaches_the_exact_gradient():
    rbm = random_rbm()
    gen = torch.Generator().manual_seed(0)
    v = (torch.rand(50, 6, generator=gen) < 0.5).double()
    cd = ContrastiveDivergence(rbm, k=50, persistent=True, n_chains=20_000)
    cd.accumulate(v, gen)  # burn in the persistent chains
    cd.accumulate(v, gen)
    for got, want in zip((rbm.W.grad, rbm.b.grad, rbm.c.grad), exact_gradient(rbm, v), strict=True):
        assert (got - want).abs().max() < 0.02


@pytest.mark.usefixtures("bfloat16_anywhere")
def test_bfloat16_products_keep_the_pcd_gradient_and_float32_state():
    rbm = random_rbm().float()
    gen = torch.Generator().manual_seed(0)
    v = (torch.rand(50, 6, generator=gen) < 0.5).float()
    cd = ContrastiveDivergence(
        rbm, k=50, persistent=True, n_chains=20_000, matmul_dtype=torch.bfloat16
    )
    cd.accumulate(v, gen)
    cd.accumulate(v, gen)
    assert cd.chains.dtype == torch.float32 and rbm.W.grad.dtype == torch.float32
    exact = exact_gradient(rbm.double(), v.double())
    for got, want in zip((rbm.W.grad, rbm.b.grad, rbm.c.grad), exact, strict=True):
        assert (got.double() - want).abs().max() < 0.03
    with pytest.raises(ValueError, match="matmul_dtype"):
        ContrastiveDivergence(rbm, matmul_dtype=torch.int8)


def test_cd1_gradient_is_biased_but_pcd_is_not():
    """CD-1 from the data stays near the data; its gradient differs from the exact one."""
    rbm = random_rbm(scale=1.5)
    gen = torch.Generator().manual_seed(1)
    v = (torch.rand(20_000, 6, generator=gen) < 0.2).double()
    ContrastiveDivergence(rbm, k=1).accumulate(v, gen)
    assert (rbm.W.grad - exact_gradient(rbm, v)[0]).abs().max() > 0.05


def test_training_on_samples_of_a_known_rbm_recovers_its_likelihood():
    teacher = random_rbm(d=8, m=4, seed=3, scale=1.5)
    states = binary_states(8).double()
    with torch.no_grad():
        p = torch.softmax(-teacher.free_energy(states), 0)
    gen = torch.Generator().manual_seed(0)
    train = states[torch.multinomial(p, 5000, replacement=True, generator=gen)].numpy()
    test = states[torch.multinomial(p, 5000, replacement=True, generator=gen)].numpy()
    with torch.no_grad():
        teacher_free = teacher.free_energy(torch.as_tensor(test))
    teacher_ll = float((-teacher_free - rbm_log_partition(teacher).log_z).mean())
    model = SkRBM(
        n_components=4,
        learning_rate=0.05,
        batch_size=20,
        n_iter=40,
        momentum=0.5,
        random_state=0,
        dtype="float64",
    ).fit(train)
    assert model.score_samples(test).mean() > teacher_ll - 0.08


ESTIMATORS = (SkRBM, SkGaussianRBM, SkSpikeSlabRBM, SkConvolutionalRBM, SkClassificationRBM,
              DBN, SkGatedRBM)  # fmt: skip


@pytest.mark.parametrize("estimator", ESTIMATORS, ids=lambda cls: cls.__name__)
def test_sklearn_estimator_passes_check_estimator_at_its_defaults(estimator):
    from sklearn.utils.estimator_checks import check_estimator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = check_estimator(estimator(), on_fail=None)
    failed = [r["check_name"] for r in results if r["status"] == "failed"]
    assert len(results) > 40 and not failed, failed


def test_sklearn_estimators_clone_pickle_and_search_in_parallel():
    """What a scikit-learn user does with an estimator besides fitting it: clone it,
    pickle the fitted one (the same answers after loading), and grid-search a pipeline
    with two worker processes."""
    import pickle

    from sklearn.base import clone
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV
    from sklearn.pipeline import make_pipeline

    digits = load_digits()
    x, y = (digits.data[:400] >= 8).astype(np.float32), digits.target[:400]
    model = SkRBM(n_components=12, n_iter=3, random_state=0).fit(x)
    unfitted = clone(model)
    assert unfitted.get_params() == model.get_params() and not hasattr(unfitted, "rbm_")
    loaded = pickle.loads(pickle.dumps(model))
    np.testing.assert_array_equal(loaded.transform(x), model.transform(x))
    np.testing.assert_array_equal(loaded.score_samples(x[:5]), model.score_samples(x[:5]))
    pipe = make_pipeline(SkRBM(n_iter=10, random_state=0), LogisticRegression(max_iter=500))
    search = GridSearchCV(pipe, {"bernoullirbm__n_components": [16, 32]}, cv=2, n_jobs=2)
    search.fit(x, y)
    assert search.best_params_["bernoullirbm__n_components"] in (16, 32)
    assert search.best_score_ > 0.5  # 10 classes: chance is 0.1
    assert list(search.best_estimator_[:-1].get_feature_names_out()[:2]) == [
        "bernoullirbm0", "bernoullirbm1"]  # fmt: skip


def test_gaussian_rbm_estimator_scores_exact_and_by_ais():
    from sklearn.datasets import load_digits

    x = load_digits().data[:300]
    x = (x - x.mean(0)) / (x.std(0) + 1e-3)
    small = SkGaussianRBM(n_components=12, n_iter=5, random_state=0).fit(x)
    exact = small.log_partition()
    assert exact.method.startswith(("enumeration", "exact"))
    assert small.transform(x[:4]).shape == (4, 12)
    # what the estimator does beyond the enumeration limit: AIS with HMC moves from the
    # model without weights
    estimate = log_partition(small.rbm_, "ais", generator=0)
    assert estimate.method == "ais"
    assert abs(estimate.log_z - exact.log_z) < 4 * estimate.stderr + 0.1
    assert np.isfinite(small.score_samples(x[:5])).all()
    with pytest.raises(ValueError, match="sigma"):
        SkGaussianRBM(sigma=0.0).fit(x)


def test_spike_slab_estimator_extracts_features_and_scores_exactly():
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    digits = load_digits()
    x, y = digits.data[:600], digits.target[:600]
    pipe = make_pipeline(
        StandardScaler(),
        SkSpikeSlabRBM(n_components=16, n_iter=10, momentum=0.5, random_state=0),
        LogisticRegression(max_iter=500),
    ).fit(x[:400], y[:400])
    assert pipe.score(x[400:], y[400:]) > 0.5  # 16 spike probabilities as features
    model = pipe[1]
    exact = model.log_partition()
    assert exact.method == "enumeration"
    scores = model.score_samples(pipe[0].transform(x[400:405]))
    assert np.isfinite(scores).all() and scores.shape == (5,)


def test_convolutional_estimator_extracts_features_and_scores():
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    digits = load_digits()
    x, y = digits.data[:600] / 16, digits.target[:600]
    pipe = make_pipeline(
        SkConvolutionalRBM(n_components=4, filter_size=5, n_iter=5, random_state=0),
        LogisticRegression(max_iter=1000),
    ).fit(x[:400], y[:400])
    model = pipe[0]
    assert model.components_.shape == (4, 25) and model.transform(x[:3]).shape == (3, 64)
    assert pipe.score(x[400:], y[400:]) > 0.6  # 4 maps of 4 x 4 as features
    assert np.isfinite(model.score_samples(x[400:405])).all()
    with pytest.raises(ValueError, match=r"image_shape \(7, 7\) holds 49 pixels"):
        SkConvolutionalRBM(image_shape=(7, 7)).fit(x)


def test_drop_in_attributes_and_methods():
    from sklearn.datasets import load_digits

    x = (load_digits().data[:200] >= 8).astype(np.float64)
    model = SkRBM(n_components=10, n_iter=2, random_state=0).fit(x)
    assert model.components_.shape == (10, 64) and model.intercept_hidden_.shape == (10,)
    assert model.intercept_visible_.shape == (64,) and model.h_samples_.shape[1] == 10
    expected = 1 / (1 + np.exp(-(x @ model.components_.T + model.intercept_hidden_)))
    np.testing.assert_allclose(model.transform(x), expected, rtol=1e-4, atol=1e-5)
    assert set(np.unique(model.gibbs(x[:5]))) <= {0.0, 1.0}
    ll, pl = model.score_samples(x[:5]), model.pseudo_likelihood(x[:5])
    assert ll.shape == pl.shape == (5,) and (ll < 0).all()
    assert model.partial_fit(x[:10]) is model
    with pytest.raises(ValueError, match="Negative values"):
        model.transform(-x)
    with pytest.raises(ValueError, match="n_components must be an integer"):
        SkRBM(n_components=0).fit(x)


def test_score_samples_uses_ais_beyond_enumeration():
    from sklearn.datasets import load_digits

    x = (load_digits().data[:300] >= 8).astype(np.float64)
    model = SkRBM(n_components=21, n_iter=5, random_state=0).fit(x)
    estimate = model.log_partition()
    assert estimate.method == "ais" and estimate.stderr < 0.1
    exact = rbm_log_partition(model.rbm_).log_z  # 2^21 terms: slow but exact here
    assert abs(estimate.log_z - exact) < 0.1 + 3 * estimate.stderr
    assert model.score_samples(x[:3]).shape == (3,)


def test_dbn_stacks_rbms_and_samples():
    from sklearn.datasets import load_digits

    x = (load_digits().data[:300] >= 8).astype(np.float64)
    dbn = DBN(hidden_layers=(32, 8), n_iter=3, random_state=0).fit(x)
    assert [r.components_.shape for r in dbn.rbms_] == [(32, 64), (8, 32)]
    features = dbn.transform(x[:5])
    assert features.shape == (5, 8) and ((features >= 0) & (features <= 1)).all()
    samples = dbn.sample(4, n_gibbs=5, random_state=0)
    assert samples.shape == (4, 64) and set(np.unique(samples)) <= {0.0, 1.0}
    with pytest.raises(ValueError, match="at least one layer"):
        DBN(hidden_layers=()).fit(x)


def test_free_energy_cd_gradient_matches_the_closed_form():
    """The autograd path used for Gaussian visible units gives the closed-form CD gradient
    when applied to a Bernoulli RBM with the same negatives."""
    from ebmlab.energies import BernoulliRBM
    from ebmlab.learning.rbm import ContrastiveDivergence, _phase_difference

    gen = torch.Generator().manual_seed(0)
    rbm = BernoulliRBM(6, 4, init_std=0.5)
    cd = ContrastiveDivergence(rbm, 1)
    v = (torch.rand(20, 6, generator=gen) < 0.5).float()
    v_neg = (torch.rand(30, 6, generator=gen) < 0.5).float()
    with torch.no_grad():
        closed = _phase_difference(v_neg, rbm.hidden_probs(v_neg), v, rbm.hidden_probs(v))
    cd._free_energy_gradient(v, v_neg)
    for a, b in zip(closed, (rbm.W.grad, rbm.b.grad, rbm.c.grad), strict=True):
        torch.testing.assert_close(a, b)


def test_centred_update_is_the_gradient_in_the_centred_parameters():
    """The centred update equals autograd's gradient of the CD objective with respect to
    W' = W, b' = b + W lam, c' = c + W^T mu, mapped back to W, b, c."""
    from ebmlab.energies import GaussianBernoulliRBM
    from ebmlab.learning.rbm import _phase_difference

    gen = torch.Generator().manual_seed(1)
    rbm = BernoulliRBM(7, 5, init_std=0.5).double()
    with torch.no_grad():
        rbm.b.normal_(generator=gen)
        rbm.c.normal_(generator=gen)
    v = (torch.rand(30, 7, generator=gen, dtype=torch.float64) < 0.4).double()
    v_neg = (torch.rand(40, 7, generator=gen, dtype=torch.float64) < 0.6).double()
    with torch.no_grad():
        ph = rbm.hidden_probs(v)
        plain = _phase_difference(v_neg, rbm.hidden_probs(v_neg), v, ph)
    cd = ContrastiveDivergence(rbm, centering=True, centering_rate=0.0)
    got = cd._centred(*plain, v, ph)
    mu, lam = v.mean(0), ph.mean(0)

    W = rbm.W.detach().clone().requires_grad_(True)
    b_c = (rbm.b + rbm.W @ lam).detach().requires_grad_(True)
    c_c = (rbm.c + rbm.W.T @ mu).detach().requires_grad_(True)

    def free_energy(x):
        b, c = b_c - W @ lam, c_c - W.T @ mu
        return -(x @ b) - torch.nn.functional.softplus(x @ W + c).sum(1)

    gap = free_energy(v).mean() - free_energy(v_neg).mean()
    g_w, g_b, g_c = torch.autograd.grad(gap, (W, b_c, c_c))
    want = (g_w, g_b - g_w @ lam, g_c - g_w.T @ mu)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
    # the plain gradient differs: the test can tell the two updates apart
    assert not torch.allclose(plain[1].double(), want[1])
    with pytest.raises(ValueError, match="centering"):
        ContrastiveDivergence(GaussianBernoulliRBM(3, 2), centering=True)


def test_recommended_settings_reach_the_likelihood_of_a_known_rbm():
    """On 2000 samples of a known 12 x 4 RBM, 30 epochs with the recommended settings
    (centred PCD, 100 chains, momentum) come within 0.005 nats of the generating
    model's train log-likelihood; scikit-learn's defaults stay further away."""
    gen = torch.Generator().manual_seed(3)
    truth = BernoulliRBM(12, 4).double()
    with torch.no_grad():
        truth.b.normal_(0, 0.5, generator=gen)
        truth.W.normal_(0, 1.5, generator=gen)
        x = truth.gibbs(torch.zeros(2000, 12, dtype=torch.float64), 200, gen)
        reference = float(-truth.free_energy(x).mean() - rbm_log_partition(truth).log_z)
    recommended = dict(k=1, n_chains=100, centering=True, momentum=0.9, learning_rate=0.05,
                       lr_decay=True)  # fmt: skip
    for settings, close in ((recommended, True), ({}, False)):
        est = SkRBM(4, n_iter=30, random_state=0, **settings).fit(x.numpy())
        gap = reference - est.score_samples(x.numpy()).mean()
        assert (gap < 0.005) == close, (settings, gap)


def test_classification_rbm_estimator_classifies_digits_and_scores_inputs():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x >= 8).astype(np.float64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.3, random_state=0)
    clf = SkClassificationRBM(n_components=100, n_iter=15, random_state=0).fit(x_train, y_train)
    assert clf.score(x_test, y_test) > 0.91  # 93.3% (scikit-learn RBM + logistic regression: 88.9%)
    proba = clf.predict_proba(x_test[:5])
    np.testing.assert_allclose(proba.sum(1), 1.0)
    assert clf.transform(x_test[:5]).shape == (5, 100)
    log_z = clf.log_partition()  # 100 hidden and 64 inputs: AIS for each of the 10 labels
    assert log_z.method == "ais" and log_z.cost["parts"] == 10 and 0 < log_z.stderr < 0.2
    # labels as strings, and the model is exact again when a layer is small
    names = np.array(["zero", "one"])[(y_train[:200] > 4).astype(int)]
    small = SkClassificationRBM(n_components=6, n_iter=5, random_state=0).fit(x_train[:200], names)
    assert set(small.predict(x_test[:20])) <= {"zero", "one"}
    scores = small.score_samples(x_test[:50])
    assert small.log_partition().method == "enumeration" and np.all(scores < 0)


def test_subspace_rbm_pcd_gradient_approaches_the_exact_gradient():
    from ebmlab.energies import SubspaceRBM

    torch.manual_seed(0)
    model = SubspaceRBM(6, 2, 2, init_std=0.5).double()
    with torch.no_grad():
        model.c.normal_()
        model.D.normal_()
    gen = torch.Generator().manual_seed(0)
    v = (torch.rand(50, 6, generator=gen) < 0.5).double()
    states = binary_states(6).double()
    with torch.no_grad():
        p_model = torch.softmax(-model.free_energy(states), 0)
    # exact gradient of the mean NLL: <dF/dtheta>_data - <dF/dtheta>_model (eq. 6.41)
    objective = model.free_energy(v).mean() - (p_model * model.free_energy(states)).sum()
    exact = torch.autograd.grad(objective, list(model.parameters()))
    cd = ContrastiveDivergence(model, k=30, persistent=True, n_chains=20_000)
    cd.accumulate(v, gen)  # burn in the persistent chains
    cd.accumulate(v, gen)
    for param, want in zip(model.parameters(), exact, strict=True):
        assert (param.grad - want).abs().max() < 0.03
        assert want.abs().max() > 0.05  # the check has something to compare


@pytest.mark.parametrize("kind", ["bernoulli", "gaussian", "subspace"])
def test_sparsity_target_holds_down_the_hidden_activity_of_every_rbm(kind):
    """The same data and seed with and without the sparsity term: the mean hidden
    activation falls from where free training leaves it (0.39-0.61) towards the target.
    The binary RBM takes its closed-form gradient, the others autograd's."""
    from ebmlab.energies import BernoulliRBM, GaussianBernoulliRBM, SubspaceRBM
    from ebmlab.learning import ContrastiveDivergence

    gen = torch.Generator().manual_seed(0)
    if kind == "gaussian":
        data = torch.randn(400, 16, generator=gen, dtype=torch.float64)
        data[:, :8] += 2 * (torch.rand(400, 1, generator=gen, dtype=torch.float64) < 0.5)
    else:
        data = (torch.rand(400, 16, generator=gen, dtype=torch.float64) < 0.3).double()

    def mean_activity(target):
        torch.manual_seed(0)
        if kind == "gaussian":
            rbm = GaussianBernoulliRBM(16, 12).double()
        elif kind == "bernoulli":
            rbm = BernoulliRBM(16, 12).double()
        else:
            rbm = SubspaceRBM(16, 6, 2).double()
        cd = ContrastiveDivergence(rbm, 1, sparsity_target=target, sparsity_cost=0.5)
        opt = torch.optim.SGD(rbm.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(1)
        for _ in range(40):
            for batch in data.split(50):
                opt.zero_grad()
                cd.accumulate(batch, g)
                opt.step()
        with torch.no_grad():
            return float(torch.sigmoid(rbm.hidden_logits(data)).mean())

    free, sparse = mean_activity(None), mean_activity(0.05)
    assert sparse < 0.2 and free > 2.5 * sparse, (free, sparse)


def test_rbm_estimators_answer_in_the_inputs_precision_and_name_their_outputs(capsys):
    """float32 in, float32 out (scikit-learn's preserves_dtype); outputs named by
    get_feature_names_out, in a Pipeline too; a verbose fit prints scikit-learn's line."""
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import MinMaxScaler

    x = (np.random.default_rng(0).random((40, 9)) > 0.5).astype(np.float32)
    rbm = SkRBM(n_components=3, n_iter=2, verbose=1, random_state=0).fit(x)
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith(
        "[BernoulliRBM] Iteration 1, pseudo-likelihood = "
    )
    assert lines[0].endswith("s") and ", time = " in lines[0]
    for method in (rbm.transform, rbm.score_samples, rbm.gibbs):
        assert method(x).dtype == np.float32 and method(x.astype(np.float64)).dtype == np.float64
    assert rbm.get_feature_names_out().tolist() == ["bernoullirbm0", "bernoullirbm1",
                                                    "bernoullirbm2"]  # fmt: skip
    assert "float32" in rbm.__sklearn_tags__().transformer_tags.preserves_dtype
    pipe = make_pipeline(MinMaxScaler(), SkGaussianRBM(n_components=2, n_iter=1)).fit(x)
    assert pipe.get_feature_names_out().tolist() == ["gaussianbernoullirbm0",
                                                     "gaussianbernoullirbm1"]  # fmt: skip
    # pandas in, pandas out: input column names recorded, output columns named
    import pandas as pd

    frame = pd.DataFrame(x, columns=[f"pixel{i}" for i in range(9)])
    named = SkRBM(n_components=3, n_iter=1, random_state=0).set_output(transform="pandas")
    out = named.fit(frame).transform(frame)
    assert isinstance(out, pd.DataFrame) and list(out.columns) == list(rbm.get_feature_names_out())
    assert list(named.feature_names_in_) == list(frame.columns)
    assert out.dtypes.iloc[0] == np.float32
    plain = named.set_output(transform="default").transform(x)
    np.testing.assert_array_equal(out.to_numpy(), plain)


def test_sparse_input_gives_the_dense_answers():
    """CSR and CSC input, as scikit-learn's BernoulliRBM takes it: the same fit (bit for
    bit: the same mini-batches reach the model), and transform, scores and Gibbs steps
    from sparse products equal to the dense ones within rounding."""
    import scipy.sparse as sp

    x = (np.random.default_rng(1).random((120, 30)) < 0.1).astype(np.float32)
    dense = SkRBM(n_components=4, n_iter=2, random_state=0).fit(x)
    for to_sparse in (sp.csr_matrix, sp.csc_array):
        model = SkRBM(n_components=4, n_iter=2, random_state=0).fit(to_sparse(x))
        np.testing.assert_array_equal(model.components_, dense.components_)
        np.testing.assert_allclose(model.transform(to_sparse(x)), dense.transform(x),
                                   rtol=1e-5, atol=1e-6)  # fmt: skip
        np.testing.assert_allclose(model.score_samples(to_sparse(x)), dense.score_samples(x),
                                   rtol=1e-6)  # fmt: skip
        # the same random numbers and (within rounding) the same probabilities
        twin = copy.deepcopy(model)
        assert np.mean(model.gibbs(to_sparse(x)) != twin.gibbs(x)) < 0.01
        assert model.transform(to_sparse(x)).dtype == np.float32
    with pytest.raises(ValueError, match="Negative values"):
        SkRBM(n_iter=1).fit(sp.csr_matrix(-x))
    # bad sparse input: scikit-learn's own error types and first lines
    from sklearn.neural_network import BernoulliRBM as TheirRBM

    for value, dtype in ((np.nan, np.float32), (np.inf, np.float64), (1j, np.complex128)):
        bad = sp.csr_matrix(x, dtype=dtype)
        bad.data[0] = value
        messages = []
        for estimator in (SkRBM(n_iter=1), TheirRBM(n_iter=1)):
            with pytest.raises(ValueError) as error:
                estimator.fit(bad)
            messages.append(str(error.value).splitlines()[0])
        assert messages[0] == messages[1], messages
    images = (np.random.default_rng(2).random((40, 64)) < 0.2).astype(np.float32)
    conv = [SkConvolutionalRBM(3, filter_size=3, n_iter=1, random_state=0).fit(rows)
            for rows in (images, sp.csr_matrix(images))]  # fmt: skip
    np.testing.assert_array_equal(conv[1].components_, conv[0].components_)
    np.testing.assert_array_equal(conv[1].transform(sp.csr_matrix(images)),
                                  conv[0].transform(images))  # fmt: skip


SPARSE_MEMORY = """
import resource, sys
import numpy as np, scipy.sparse as sp
from ebmlab.sklearn import BernoulliRBM
x = sp.random(10_000, 5_000, density=0.01, format="csr", dtype=np.float32,
              random_state=np.random.default_rng(0), data_rvs=lambda n: np.ones(n))
# the first fit maps the kernels' libraries into memory: not the data's share
BernoulliRBM(16, n_iter=1, batch_size=100, random_state=0).fit(x[:200]).transform(x[:200])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
rbm = BernoulliRBM(16, n_iter=1, batch_size=100, random_state=0).fit(x)
h = rbm.transform(x)
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
# the dense path's answers on a slice of the rows
gap = np.abs(h[:2000] - rbm.transform(x[:2000].toarray())).max()
print(grown, gap)
"""


@pytest.mark.slow
def test_a_sparse_fit_never_holds_the_dense_matrix():
    """10,000 x 5,000 rows of 1 % density: a fit and a transform grow the process's peak
    memory by less than the dense float32 matrix's 200 MB, and the features equal the
    dense path's."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", SPARSE_MEMORY], capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    grown, gap = out.stdout.split()
    assert int(grown) < 10_000 * 5_000 * 4 / 4, out.stderr  # a quarter of the dense size
    assert float(gap) < 1e-5


def test_an_annealed_log_z_is_estimated_once_per_fitted_model():
    """score_samples is a function of the rows: with log Z by AIS (too many units to
    enumerate) two calls agree exactly, and a permutation of the rows permutes the
    scores; training again makes a new estimate."""
    import pickle

    from ebmlab.sklearn import BernoulliRBM as Estimator

    X = (np.random.default_rng(0).random((60, 40)) < 0.3).astype(np.float64)
    rbm = Estimator(n_components=30, n_iter=2, random_state=0).fit(X)
    assert rbm.log_partition().method == "ais"
    first = rbm.score_samples(X)
    order = np.random.default_rng(1).permutation(len(X))
    np.testing.assert_array_equal(rbm.score_samples(X[order]), first[order])
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(rbm)).score_samples(X), first)
    rbm.partial_fit(X)
    assert not np.array_equal(rbm.score_samples(X), first)
