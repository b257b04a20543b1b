import statistics

import pytest
import torch
from scipy import stats

from ebmlab.energies import (
    BernoulliRBM,
    DeepBoltzmannMachine,
    DiagonalGaussian,
    GaussianMixture,
)
from ebmlab.partition import (
    ais,
    annealing_graphs,
    binary_products,
    raise_,
    rbm_ais,
    rbm_exact_samples,
    rbm_log_partition,
)
from ebmlab.samplers import HMC


def random_rbm(scale, seed, d=12, m=8):
    torch.manual_seed(seed)
    rbm = BernoulliRBM(d, m, init_std=scale)
    with torch.no_grad():
        rbm.b.normal_(0, scale)
        rbm.c.normal_(0, scale)
    return rbm


@pytest.mark.parametrize(("scale", "seed"), [(0.3, 0), (1.0, 1), (2.0, 2), (2.0, 3)])
def test_rbm_ais_is_within_0_03_nats_and_inside_its_interval(scale, seed):
    rbm = random_rbm(scale, seed)
    exact = rbm_log_partition(rbm).log_z
    est = rbm_ais(rbm, n_chains=100, n_temperatures=1000, generator=seed)
    assert abs(est.log_z - exact) < 0.03
    low, high = est.interval(3.0)
    assert low <= exact <= high
    assert est.method == "ais" and est.cost["ess"] > 10


@pytest.mark.fastpath
@pytest.mark.parametrize("path", ["int8", "float", "chunked"])
def test_annealing_is_exact_with_int8_float_and_chunked_steps(path, monkeypatch):
    """Forward and reverse AIS agree with enumeration on each path; "chunked" runs the
    steps a CUDA GPU replays as graphs eagerly, across several chunks and a partial
    last one."""
    if path == "int8" and not binary_products.quantized_available(torch.device("cpu")):
        pytest.skip("no int8 kernel on this CPU")
    monkeypatch.setattr(binary_products, "quantized_available", lambda device: path == "int8")
    monkeypatch.setattr(annealing_graphs, "replaces_loop", lambda device: path == "chunked")
    rbm = random_rbm(3.0, 4, d=14, m=10)
    exact = rbm_log_partition(rbm).log_z
    for estimate in (
        rbm_ais(rbm, n_chains=200, n_temperatures=1000, generator=0),
        raise_(rbm, n_chains=200, n_temperatures=1000, generator=1),
    ):
        assert abs(estimate.log_z - exact) < 4 * estimate.stderr + 0.01


@pytest.mark.fastpath
def test_int8_product_is_exact_for_its_rounded_weights():
    if not binary_products.quantized_available(torch.device("cpu")):
        pytest.skip("no int8 kernel on this CPU")
    gen = torch.Generator().manual_seed(0)
    W = torch.randn(300, 70, generator=gen) * torch.logspace(-3, 1, 70)
    product = binary_products.QuantizedProduct(W, 16)
    assert (product.Wq - W.double()).abs().max() <= product.scale / 2 + 1e-12
    x = torch.rand(16, 300, generator=gen) < 0.5
    product.load(x)
    bias = torch.randn(70, generator=gen)
    want = 0.25 * (x.double() @ product.Wq) + bias.double()
    torch.testing.assert_close(product(0.25, bias).double(), want, rtol=1e-6, atol=1e-4)
    u = torch.randint(-(2**31), 2**31 - 1, (16, 300), generator=gen, dtype=torch.int32)
    threshold = torch.randn(16, 300) * 2**30
    bits = product.sample(u, threshold)
    assert torch.equal(bits, u < threshold)
    assert torch.equal(product.x[:, :300], 128 * bits.to(torch.uint8))


def random_dbm(seed, d=16, m1=10, m2=6):
    torch.manual_seed(seed)
    dbm = DeepBoltzmannMachine(d, m1, m2, init_std=0.8).double()
    with torch.no_grad():
        for bias in (dbm.b, dbm.c1, dbm.c2):
            bias.normal_(0, 1)
    return dbm


def test_dbm_as_rbm_has_the_same_energy_and_log_partition():
    dbm = random_dbm(0)
    rbm = dbm.as_rbm()
    v, h1, h2 = (torch.randint(0, 2, (50, n)).double() for n in (16, 10, 6))
    with torch.no_grad():
        torch.testing.assert_close(
            rbm.joint_energy(torch.cat([v, h2], 1), h1), dbm.joint_energy(v, h1, h2)
        )
        assert rbm_log_partition(rbm).log_z == pytest.approx(float(dbm.log_partition()))


@pytest.mark.parametrize("seed", [0, 1])
def test_dbm_ais_and_raise_match_exact(seed):
    dbm = random_dbm(seed)
    with torch.no_grad():
        exact = float(dbm.log_partition())
    data = (torch.rand(100, 16, generator=torch.Generator().manual_seed(seed)) < 0.3).double()
    for estimate in (
        ais(dbm, n_chains=100, n_temperatures=1000, data=data, generator=seed),
        raise_(dbm, n_chains=100, n_temperatures=1000, data=data, generator=seed),
    ):
        assert abs(estimate.log_z - exact) < 0.05
        low, high = estimate.interval(4.0)
        assert low <= exact <= high


def test_ais_and_raise_sandwich_the_truth_in_expectation():
    rbm = random_rbm(2.0, 0)
    exact = rbm_log_partition(rbm).log_z
    forward = [rbm_ais(rbm, n_chains=20, n_temperatures=30, generator=s).log_z for s in range(60)]
    reverse = [
        raise_(rbm, n_chains=20, n_temperatures=30, generator=100 + s).log_z for s in range(60)
    ]
    se_f = statistics.stdev(forward) / 60**0.5
    se_r = statistics.stdev(reverse) / 60**0.5
    assert statistics.mean(forward) <= exact + 2 * se_f
    assert statistics.mean(reverse) >= exact - 2 * se_r


def test_exact_samples_follow_the_rbm():
    from ebmlab.partition import binary_states

    for rbm in (random_rbm(1.0, 0, d=5, m=9), random_rbm(1.0, 1, d=9, m=4)):
        x = rbm_exact_samples(rbm, 40_000, torch.Generator().manual_seed(0))
        states = binary_states(rbm.n_visible).double()
        with torch.no_grad():
            p = torch.softmax(-rbm.double().free_energy(states), 0)
        codes = (x.long() * (1 << torch.arange(rbm.n_visible))).sum(1)
        counts = torch.bincount(codes, minlength=len(p)).double()
        expected = p * len(x)
        keep = expected > 5
        chi2 = float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())
        assert stats.chi2.sf(chi2, int(keep.sum()) - 1) > 1e-4


def test_generic_ais_with_an_mcmc_kernel_matches_an_analytic_mixture():
    mix = GaussianMixture.isotropic(torch.tensor([[-2.0, 0.0], [2.0, 1.0]]), std=0.5)
    base = DiagonalGaussian(torch.zeros(2), torch.full((2,), 3.0))
    est = ais(mix, base, HMC(0.2, 5), n_chains=200, n_temperatures=200, generator=0)
    truth = float(mix.log_partition())
    assert abs(est.log_z - truth) < 3 * est.stderr + 0.02


def test_schedule_validation():
    with pytest.raises(ValueError, match="schedule must rise strictly from 0 to 1"):
        rbm_ais(random_rbm(1.0, 0), schedule=[0.0, 0.5, 0.4, 1.0])


def test_exact_log_partition_dispatches_on_the_model():
    from ebmlab.energies import BoltzmannMachine
    from ebmlab.partition import enumerate_log_partition, exact_log_partition

    rbm = random_rbm(1.0, 0, d=6, m=4)
    assert exact_log_partition(rbm).log_z == rbm_log_partition(rbm).log_z
    bm = BoltzmannMachine(5, init_std=0.5)
    assert exact_log_partition(bm).log_z == enumerate_log_partition(bm, 5).log_z
    g = DiagonalGaussian(torch.zeros(1), torch.ones(1))
    assert exact_log_partition(g).method == "closed form"
    assert abs(exact_log_partition(g, bounds=[(-8.0, 8.0)]).log_z - float(g.log_partition())) < 1e-6
    with pytest.raises(ValueError, match="no exact method"):
        exact_log_partition(lambda x: x.sum(1))
    assert ais(rbm, n_temperatures=200, generator=0).method == "ais"
    with pytest.raises(ValueError, match="needs base"):
        ais(g)


def test_exact_log_partition_of_gaussian_and_categorical_rbms():
    import itertools

    from ebmlab.energies import CategoricalRBM, GaussianBernoulliRBM
    from ebmlab.partition import exact_log_partition, quadrature_log_partition

    torch.manual_seed(0)
    gb = GaussianBernoulliRBM(2, 3, sigma=0.8, init_std=0.7).requires_grad_(False)
    gb.b.normal_()
    gb.c.normal_()
    quad = quadrature_log_partition(gb.free_energy, [(-12.0, 12.0), (-12.0, 12.0)], n_points=600)
    assert abs(exact_log_partition(gb).log_z - quad.log_z) < 1e-3 + 3 * quad.stderr

    cat = CategoricalRBM(2, 3, 4, init_std=1.0).double().requires_grad_(False)
    cat.b.normal_()
    configs = torch.tensor(list(itertools.product(range(3), repeat=2)))
    v = torch.nn.functional.one_hot(configs, 3).double().flatten(1)
    assert exact_log_partition(cat).log_z == pytest.approx(
        float(torch.logsumexp(-cat.free_energy(v), 0)), abs=1e-9
    )


def test_classification_rbm_log_partition_by_ais_per_label_matches_enumeration():
    from ebmlab.energies import ClassificationRBM
    from ebmlab.partition.exact import label_sum_log_partition

    torch.manual_seed(3)
    model = ClassificationRBM(12, 10, 3, init_std=0.5).double()
    exact = label_sum_log_partition(model)
    gen = torch.Generator().manual_seed(0)
    ais = label_sum_log_partition(model, lambda rbm, y: rbm_ais(rbm, n_chains=64, generator=gen))
    assert exact.method == "enumeration" and ais.method == "ais" and ais.cost["parts"] == 3
    assert 0 < ais.stderr < 0.05
    assert abs(ais.log_z - exact.log_z) < 4 * ais.stderr + 1e-3
