"""Generated input over the public Python API: samplers, losses, partition-function
estimators, ``load_dataset`` on array files and the scikit-learn estimators, with
arbitrary shapes, dtypes, NaN and inf, empty batches, tensors and generators on another
device, and extreme hyperparameters. Every call either returns finite output or raises a
ValueError or TypeError whose message names the argument at fault; no other exception,
no silent NaN, and no call runs longer than its time box."""

import math
import signal
import warnings
from collections import Counter
from contextlib import contextmanager

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ebmlab import losses, partition, samplers, sklearn
from ebmlab.conformance import simulated_device, to_device
from ebmlab.data import load_dataset
from ebmlab.energies import (
    BernoulliRBM,
    BoltzmannMachine,
    ClassificationRBM,
    ConditionalRBM,
    Gaussian,
    MLPEnergy,
    NoiseConditionalEnergy,
)

EXAMPLES: Counter = Counter()  # generated inputs per group and outcome, read by the last test
TIME_BOX = 20.0  # seconds one call may take
nan, inf = math.nan, math.inf

FLOATS = st.sampled_from([-1.0, 0.0, 1e-300, 1e-3, 0.1, 0.5, 1.0, 3.0, 1e8, nan, inf, -inf])
INTS = st.sampled_from([-2, 0, 1, 2, 3, 7])
DTYPES = st.sampled_from(
    [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.bool,
     torch.complex64]
)  # fmt: skip


def mostly(valid, fuzzed: st.SearchStrategy) -> st.SearchStrategy:
    """``valid`` four times in five, else a draw of ``fuzzed``: most inputs then hold one
    or two faults, each meeting its own check."""
    return st.integers(0, 4).flatmap(lambda i: fuzzed if i == 0 else st.just(valid))


def fuzz(n: int):
    """Hypothesis settings for ``n`` generated inputs, the same ones on every run."""
    return settings(
        max_examples=n,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


@st.composite
def tensors(draw, max_ndim: int = 3, size: int = 4) -> torch.Tensor:
    """A tensor of any shape up to ``max_ndim`` dimensions (empty ones too), any dtype,
    scaled by an extreme number, sometimes with one NaN or inf."""
    shape = draw(st.lists(st.integers(0, size), max_size=max_ndim))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * draw(FLOATS)
    if x.numel() and draw(st.booleans()):
        x.view(-1)[0] = draw(st.sampled_from([nan, inf, -inf]))
    return x.to(draw(DTYPES))


def well_formed(draw, *shape: int) -> torch.Tensor:
    """Mostly a plausible float tensor of ``shape`` (a batch of 6 points in 2-D by
    default), sometimes an arbitrary one."""
    if draw(st.integers(0, 4)) == 0:
        return draw(tensors())
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    return torch.randn(shape or (6, 2), generator=gen) * draw(st.sampled_from([0.1, 1.0, 3.0]))


def as_array(t: torch.Tensor) -> np.ndarray:
    """A generated tensor as the float array a user might save."""
    return (t.real if t.is_complex() else t).float().numpy()


@contextmanager
def time_box(seconds: float = TIME_BOX):
    """Fail a call that runs past ``seconds`` (a hang) instead of waiting for it."""

    def hung(signum, frame):
        raise AssertionError(f"the call ran past its time box of {seconds} s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def assert_finite(out, where: str = "output") -> None:
    """Every number in ``out`` (tensors, floats, containers, result records) is finite."""
    if isinstance(out, torch.Tensor):
        if out.is_floating_point() or out.is_complex():
            assert torch.isfinite(out).all(), f"non-finite values in the {where}"
    elif isinstance(out, float):
        assert math.isfinite(out), f"{where} is {out}"
    elif isinstance(out, np.ndarray) and out.dtype.kind in "fc":
        assert np.isfinite(out).all(), f"non-finite values in the {where}"
    elif isinstance(out, dict):
        for key, value in out.items():
            assert_finite(value, f"{where}[{key!r}]")
    elif isinstance(out, tuple | list):
        for i, value in enumerate(out):
            assert_finite(value, f"{where}[{i}]")
    elif isinstance(out, partition.LogZEstimate):
        assert_finite(out.log_z, "log Z")
        assert_finite(out.stderr, "log Z's standard error")
    elif isinstance(out, samplers.SampleRun):
        assert_finite(out.samples, "samples")


def holds(test: str, call, names: list[str]):
    """Run ``call`` in its time box: finite output, or a ValueError / TypeError naming
    one of ``names``. Returns the output (None after a refusal)."""
    try:
        with time_box(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = call()
    except (ValueError, TypeError) as err:
        message = str(err)
        assert any(name in message for name in names), (
            f"{type(err).__name__} names none of {names}: {message}"
        )
        EXAMPLES[test, "refused"] += 1
        return None
    assert_finite(out)
    EXAMPLES[test, "ran"] += 1
    return out


SAMPLERS = {
    "Langevin": lambda h, k: samplers.Langevin(h),
    "Langevin-clipped": lambda h, k: samplers.Langevin(0.1, h, grad_clip=h, clamp=(-k, k)),
    "MALA": lambda h, k: samplers.MALA(h),
    "HMC": lambda h, k: samplers.HMC(h, k),
    "AdaptiveHMC": lambda h, k: samplers.AdaptiveHMC(h, h, max_leapfrog=k),
    "NUTS": lambda h, k: samplers.NUTS(h, max_depth=k),
    "MetropolisHastings": lambda h, k: samplers.MetropolisHastings(h),
    "UnderdampedLangevin": lambda h, k: samplers.UnderdampedLangevin(h, h),
    "SGHMC": lambda h, k: samplers.SGHMC(h, h),
    "ParallelTempering": lambda h, k: samplers.ParallelTempering(samplers.MALA(0.1), [1.0, h], k),
}
SAMPLER_ARGS = ["step_size", "n_leapfrog", "trajectory_length", "max_leapfrog", "max_depth",
                "scale", "friction", "learning_rate", "momentum_decay", "betas", "swap_every",
                "noise_scale", "grad_clip", "clamp", "x0", "n_steps", "burn_in", "thin",
                "generator", "non-finite"]  # fmt: skip


@fuzz(800)
@given(
    data=st.data(),
    name=st.sampled_from(sorted(SAMPLERS)),
    h=mostly(0.1, FLOATS),
    k=mostly(2, INTS),
)
def test_samplers(data, name, h, k):
    energy = Gaussian(torch.zeros(2), torch.eye(2))
    x0 = well_formed(data.draw)
    n_steps, burn_in = data.draw(mostly(3, INTS)), data.draw(mostly(0, INTS))
    thin = data.draw(mostly(None, st.sampled_from([-1, 0, 1, 2])))
    seed = data.draw(mostly(0, st.sampled_from([None, -1, "seed", 1.5])))

    def call():
        sampler = SAMPLERS[name](h, k)
        return sampler.run(energy, x0, n_steps, burn_in=burn_in, thin=thin, generator=seed)

    holds("samplers", call, SAMPLER_ARGS)


DISCRETE = {
    "Gibbs": lambda rbm, h: samplers.Gibbs(),
    "Gibbs-random-scan": lambda rbm, h: samplers.Gibbs("random"),
    "BlockGibbs": lambda rbm, h: samplers.BlockGibbs(rbm),
    "DiscreteLangevin": lambda rbm, h: samplers.DiscreteLangevin(h),
    "GibbsWithGradients": lambda rbm, h: samplers.GibbsWithGradients(),
}


@fuzz(200)
@given(
    data=st.data(),
    name=st.sampled_from(sorted(DISCRETE)),
    h=mostly(0.5, FLOATS),
    n_steps=mostly(3, INTS),
)
def test_discrete_samplers(data, name, h, n_steps):
    rbm = BernoulliRBM(4, 3)
    valid = torch.bernoulli(torch.full((6, 4), 0.5), generator=torch.Generator().manual_seed(0))
    x0 = data.draw(mostly(valid, tensors()))
    seed = data.draw(mostly(0, st.sampled_from([None, -1, "seed", 1.5])))

    def call():
        return DISCRETE[name](rbm, h).run(rbm, x0, n_steps, generator=seed)

    holds("samplers", call, [*SAMPLER_ARGS, "model", "binary", "0/1", "states"])


@fuzz(100)
@given(data=st.data(), name=st.sampled_from(sorted(SAMPLERS)), moved=st.sampled_from(["x0", "gen"]))
def test_samplers_refuse_another_device(data, name, moved):
    """Chains on an accelerator with the energy's parameters on the CPU, or a generator
    on an accelerator with the chains on the CPU: refused before any step."""
    energy = MLPEnergy(2, hidden=(4,))
    x0 = torch.randn(5, 2)
    with simulated_device():
        if moved == "x0":
            x0, gen = to_device(x0), 0
        else:
            gen = torch.Generator(device="meta")
        sampler = SAMPLERS[name](0.1, 2)
        out = holds(
            "device", lambda: sampler.run(energy, x0, 2, generator=gen), ["x0", "generator"]
        )
    assert out is None, "a run across two devices went through"


PAIR_LOSSES = [losses.hinge_loss, losses.log_loss, losses.lvq2_loss, losses.mce_loss,
               losses.square_square_loss, losses.square_exponential_loss,
               losses.contrastive_update_loss]  # fmt: skip
TABLE_LOSSES = [losses.perceptron_loss, losses.nll_loss, losses.mee_loss]
ENERGY_LOSSES = {
    "contrastive_divergence": lambda f, x, y, h, k: losses.contrastive_divergence_loss(
        f, x, y, l2=h),
    "score_matching": lambda f, x, y, h, k: losses.score_matching_loss(f, x),
    "sliced_score_matching": lambda f, x, y, h, k: losses.sliced_score_matching_loss(
        f, x, n_projections=k, generator=0),
    "denoising_score_matching": lambda f, x, y, h, k: losses.denoising_score_matching_loss(
        f, x, h, generator=0),
    "energy_discrepancy": lambda f, x, y, h, k: losses.energy_discrepancy_loss(
        f, x, scale=h, n_negatives=k, w=h, generator=0),
    "nce": lambda f, x, y, h, k: losses.nce_loss(
        f, torch.tensor(h), x, y, lambda z: -(z**2).sum(-1) / 2),
    "recovery_likelihood": lambda f, x, y, h, k: losses.diffusion_recovery_likelihood_loss(
        NoiseConditionalEnergy(2, 2, hidden=(4,)), x, [h, 0.1], langevin_steps=k,
        generator=0),
}  # fmt: skip
BINARY_LOSSES = {
    "energy": lambda m, v, y, h, k: losses.energy_loss(v[:, 0] if v.ndim == 2 else v),
    "exact_nll": lambda m, v, y, h, k: losses.exact_nll(BoltzmannMachine(4), v),
    "pseudo_likelihood": lambda m, v, y, h, k: losses.pseudo_likelihood_loss(m, v),
    "probability_flow": lambda m, v, y, h, k: losses.minimum_probability_flow_loss(m, v),
    "classification_rbm": lambda m, v, y, h, k: losses.classification_rbm_loss(
        ClassificationRBM(4, 3, 2), v, y, alpha=h, k=k, generator=0),
    "conditional_cd": lambda m, v, y, h, k: losses.conditional_cd_loss(
        ConditionalRBM(4, 3, 1), v, v, k=k, generator=0),
}  # fmt: skip
LOSS_ARGS = ["e_correct", "e_offending", "energies", "target", "margin", "delta", "gamma", "beta",
             "reduction", "x", "x_data", "x_sample", "x_noise", "l2", "sigmas", "scale",
             "n_projections", "n_negatives", "w", "log_normalizer", "energy", "shape",
             "langevin_steps", "step_scale", "model",
             "non-finite", "finite"]  # fmt: skip


@fuzz(700)
@given(
    data=st.data(),
    kind=st.sampled_from(["pair", "table", "energy", "binary"]),
    h=mostly(0.5, FLOATS),
    k=mostly(2, INTS),
)
def test_losses(data, kind, h, k):
    reduction = data.draw(mostly("mean", st.sampled_from(["sum", "none", "max"])))
    if kind == "pair":
        loss = data.draw(st.sampled_from(PAIR_LOSSES))
        a, b = well_formed(data.draw, 5), well_formed(data.draw, 5)
        options = {"reduction": reduction}
        for name in ("margin", "delta", "gamma"):
            if name in loss.__code__.co_varnames:
                options[name] = h
        holds("losses", lambda: loss(a, b, **options), LOSS_ARGS)
    elif kind == "table":
        loss = data.draw(st.sampled_from(TABLE_LOSSES))
        energies = well_formed(data.draw, 5, 3)
        target = data.draw(mostly(torch.tensor([0, 2, 1, 1, 0]), tensors(max_ndim=1)))
        options = {
            "reduction": reduction,
            **({"beta": h} if loss is not losses.perceptron_loss else {}),
        }
        holds("losses", lambda: loss(energies, target, **options), LOSS_ARGS)
    elif kind == "energy":
        name = data.draw(st.sampled_from(sorted(ENERGY_LOSSES)))
        f = MLPEnergy(2, hidden=(4,))
        x, y = well_formed(data.draw), well_formed(data.draw)
        holds("losses", lambda: ENERGY_LOSSES[name](f, x, y, h, k), LOSS_ARGS)
    else:
        name = data.draw(st.sampled_from(sorted(BINARY_LOSSES)))
        rbm = BernoulliRBM(4, 3)
        valid = torch.bernoulli(torch.full((6, 4), 0.5), generator=torch.Generator().manual_seed(1))
        v = data.draw(mostly(valid, tensors()))
        y = data.draw(mostly(torch.tensor([0, 1, 1, 0, 1, 0]), tensors(max_ndim=1)))
        names = [
            *LOSS_ARGS,
            "v",
            "data",
            "y",
            "alpha",
            "k",
            "condition",
            "0/1",
            "binary",
            "history",
        ]
        holds("losses", lambda: BINARY_LOSSES[name](rbm, v, y, h, k), names)


def small_rbm(draw) -> BernoulliRBM:
    rbm = BernoulliRBM(draw(st.integers(1, 6)), draw(st.integers(1, 4)))
    with torch.no_grad():
        rbm.W.mul_(draw(st.sampled_from([0.0, 1.0, 30.0, 1e30, nan, inf])))
    return rbm


ESTIMATORS = {
    "exact": lambda m, h, k: partition.log_partition(m, "exact"),
    "ais": lambda m, h, k: partition.rbm_ais(m, n_chains=k, n_temperatures=k, generator=0),
    "raise": lambda m, h, k: partition.raise_(m, n_chains=k, n_temperatures=k, generator=0),
    "bethe": lambda m, h, k: partition.bethe_log_partition(m, damping=h, max_iter=k),
    "trw": lambda m, h, k: partition.trw_log_partition(m, damping=h, max_iter=k),
    "plefka": lambda m, h, k: partition.plefka_log_partition(m, k, damping=h, max_iter=50),
    "pam": lambda m, h, k: partition.perturb_and_map_log_partition(m, n_samples=k, generator=0),
    "quadrature": lambda m, h, k: partition.quadrature_log_partition(
        Gaussian(torch.zeros(2), torch.eye(2)), [(-h, h), (-3, 3)], k),
    "enumerate": lambda m, h, k: partition.enumerate_log_partition(
        lambda v: m.free_energy(v), k),
    "auto": lambda m, h, k: partition.log_partition(m, n_chains=k, n_temperatures=k, generator=0),
    "smc": lambda m, h, k: partition.smc(
        Gaussian(torch.zeros(2), torch.eye(2) * h), Gaussian(torch.zeros(2), torch.eye(2)),
        samplers.MALA(0.5), n_particles=k, n_runs=2, generator=0),
    "ais-gaussian": lambda m, h, k: partition.ais(
        Gaussian(torch.zeros(2), torch.eye(2) * h), n_chains=k, n_temperatures=k, generator=0),
}  # fmt: skip
ESTIMATOR_ARGS = ["model", "rbm", "n_chains", "n_temperatures", "damping", "max_iter", "order",
                  "n_samples", "bounds", "n_points", "n_bits", "energy", "base", "cov",
                  "non-finite", "x", "v", "method", "n_particles", "covariance"]  # fmt: skip


@fuzz(300)
@given(
    data=st.data(),
    name=st.sampled_from(sorted(ESTIMATORS)),
    h=mostly(0.5, FLOATS),
    k=mostly(3, INTS),
)
def test_partition_estimators(data, name, h, k):
    rbm = small_rbm(data.draw)
    holds("partition", lambda: ESTIMATORS[name](rbm, h, k), ESTIMATOR_ARGS)


@fuzz(200)
@given(data=st.data(), suffix=st.sampled_from([".npy", ".npz"]))
def test_load_dataset_on_array_files(data, suffix, tmp_path_factory):
    path = tmp_path_factory.mktemp("arrays") / f"data{suffix}"
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    valid = data.draw(
        st.sampled_from(
            [
                rng.normal(size=(30, 3)).astype(np.float32),
                rng.integers(0, 256, (30, 4, 4)).astype(np.uint8),
            ]
        )
    )
    x = data.draw(mostly(valid, tensors(max_ndim=4, size=6).map(as_array)))
    if suffix == ".npy":
        np.save(path, x)
    else:
        key = data.draw(mostly("x", st.sampled_from(["images", "data", "y", "features"])))
        labels = np.arange(len(x)) % 3 if x.ndim else np.zeros(1)
        fuzzed = tensors(max_ndim=2, size=30).map(as_array)
        np.savez(path, **{key: x, "y": data.draw(mostly(labels, fuzzed))})
    transform = data.draw(mostly("scaled", st.sampled_from(["raw", "binary", "log"])))
    split = data.draw(mostly("train", st.sampled_from(["val", "test", "all"])))
    names = ["name", "split", "transform", "x", "y", "labels", "array", "values", "data", "rows",
             "shape", "dtype", "images", "non-finite"]  # fmt: skip
    holds("load_dataset", lambda: load_dataset(str(path), split, transform=transform).x, names)


ESTIMATOR_CLASSES = {
    "BernoulliRBM": lambda h, k: sklearn.BernoulliRBM(k, learning_rate=h, n_iter=1),
    "GaussianBernoulliRBM": lambda h, k: sklearn.GaussianBernoulliRBM(k, learning_rate=h, n_iter=1),
    "SpikeSlabRBM": lambda h, k: sklearn.SpikeSlabRBM(k, learning_rate=h, n_iter=1),
    "ClassificationRBM": lambda h, k: sklearn.ClassificationRBM(k, learning_rate=h, n_iter=1),
    "DBN": lambda h, k: sklearn.DBN((k,), learning_rate=h, n_iter=1),
    "GatedRBM": lambda h, k: sklearn.GatedRBM(k, n_factors=k, learning_rate=h, n_iter=1),
    "ConvolutionalRBM": lambda h, k: sklearn.ConvolutionalRBM(
        k, filter_size=2, image_shape=(4, 5), learning_rate=h, n_iter=1),
}  # fmt: skip


@fuzz(200)
@given(
    data=st.data(),
    name=st.sampled_from(sorted(ESTIMATOR_CLASSES)),
    h=mostly(0.1, FLOATS),
    k=mostly(3, INTS),
)
def test_sklearn_estimators(data, name, h, k):
    valid = np.random.default_rng(data.draw(st.integers(0, 2**16))).random((20, 5))
    x = data.draw(mostly(valid, tensors(max_ndim=3, size=8).map(as_array)))
    y = np.arange(len(x)) % 2 if x.ndim else np.zeros(1)
    names = ["X", "y", "n_components", "n_hidden", "hidden_layers", "learning_rate", "n_iter",
             "input", "array", "samples", "features", "finite", "NaN", "infinity", "dimension",
             "values in", "classes", "class", "filter_size", "image_shape", "n_factors",
             "n_input"]  # fmt: skip

    def call():
        estimator = ESTIMATOR_CLASSES[name](h, k)
        estimator.fit(x, y) if name == "ClassificationRBM" else estimator.fit(x)
        if hasattr(estimator, "score_samples"):
            return estimator.score_samples(x)
        return estimator.transform(x)  # a deep belief net: features, no likelihood

    holds("sklearn", call, names)


def test_enough_inputs_were_generated(request):
    """Over 2,000 generated inputs when the whole module runs; the counts per group."""
    ours = [item for item in request.session.items if item.module is request.module]
    if len(ours) < len([n for n in dir(request.module) if n.startswith("test_")]):
        pytest.skip("only part of the module was selected")
    print("\ngenerated inputs (group, outcome): count")
    for key, count in sorted(EXAMPLES.items()):
        print(f"  {key}: {count}")
    print(f"  total: {sum(EXAMPLES.values())}")
    assert sum(EXAMPLES.values()) >= 2000
