"""Chunks of steps replayed as CUDA graphs (ebmlab.samplers.graphs).

On any device the chunked path runs its chunks eagerly from fixed buffers; it must
give the eager loop's answer bit for bit: the same positions, counts, kept samples and
the same report of a chain turning non-finite. On a CUDA GPU the chunks are captured
and replayed from a generator of their own; the tests marked ``cuda`` check that the
replayed run is reproducible and samples the target as the eager run does.
"""

import dataclasses
import warnings

import pytest
import torch

from ebmlab.devices import CaptureError
from ebmlab.energies import BernoulliRBM, DiagonalGaussian, Gaussian, GaussianMixture, MLPEnergy
from ebmlab.energies.base import as_energy_fn, energy_and_grad
from ebmlab.partition import ais, smc
from ebmlab.samplers import (
    HMC,
    MALA,
    NUTS,
    SGHMC,
    AdaptiveHMC,
    BlockGibbs,
    EnergyMatchingSampler,
    EquilibriumDescent,
    Gibbs,
    Langevin,
    MetropolisHastings,
    UnderdampedLangevin,
    graphs,
)
from ebmlab.samplers.base import NonFiniteChainError, _FiniteWatch
from ebmlab.samplers.diagnostics import SamplingWarning, effective_sample_size
from ebmlab.samplers.graphs import (
    CAPTURE_AT,
    ChunkedSteps,
    ReplayedGradient,
    chunk_size,
    layout,
    rebuilt,
    tensors,
)
from ebmlab.testing import assert_mean_close

MEAN = torch.tensor([1.0, -1.0])
COV = torch.tensor([[1.0, 0.8], [0.8, 1.5]])


def continuous(device="cpu"):
    return Gaussian(MEAN, COV).to(device), torch.randn(64, 2, device=device)


def binary(device="cpu"):
    torch.manual_seed(0)
    rbm = BernoulliRBM(6, 3).to(device)
    return rbm, (torch.rand(32, 6, device=device) < 0.5).float()


KERNELS = {
    "langevin": (lambda t: Langevin(0.05), continuous),
    "mala": (lambda t: MALA(0.2), continuous),
    "hmc": (lambda t: HMC(0.2, 5), continuous),
    "underdamped": (lambda t: UnderdampedLangevin(0.1), continuous),
    "sghmc": (lambda t: SGHMC(0.01), continuous),
    "metropolis": (lambda t: MetropolisHastings(0.5), continuous),
    "gibbs": (lambda t: Gibbs(), binary),
    "block-gibbs": (lambda t: BlockGibbs(t), binary),
    "energy-matching": (
        lambda t: EnergyMatchingSampler(0.05, tau_star=0.5, eps_max=1.0, flow_steps=20),
        continuous,
    ),
    "equilibrium-descent": (lambda t: EquilibriumDescent(0.05, 0.3), continuous),
}
SAMPLING = [name for name in KERNELS if name != "equilibrium-descent"]  # descent: no target


def eager_and_chunked(kernel, target, x0, n, thin, device="cpu"):
    """The same n kept steps run eagerly and through the chunked path (capture off on
    the CPU), from one seed: (final state, kept samples) of each."""
    results = []
    for replay in (False, True):
        gen = torch.Generator(device).manual_seed(7)
        state = kernel.init(x0, target)
        kept = [] if thin else None
        state = kernel._steps(state, target, gen, n, _FiniteWatch(x0), replay, thin, kept)
        results.append((state, torch.cat(kept) if kept else None))
    return results


@pytest.mark.parametrize("name", KERNELS)
def test_chunked_steps_reproduce_the_eager_steps_bit_for_bit(name):
    make, data = KERNELS[name]
    target, x0 = data()
    kernel = make(target)
    assert kernel.replayable(kernel.init(x0, target))
    (eager, kept_eager), (chunked, kept_chunked) = eager_and_chunked(kernel, target, x0, 83, 2)
    assert chunked.t == eager.t == 83
    assert chunked.n_grad_evals == eager.n_grad_evals
    for a, b in zip(tensors(eager), tensors(chunked), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert kept_chunked.shape == kept_eager.shape == (41, *x0.shape)
    torch.testing.assert_close(kept_chunked, kept_eager, rtol=0, atol=0)


def test_a_chunk_with_a_wrong_advance_would_be_seen():
    """Negative control: a chunked run shorter by one step differs from the eager one."""
    target, x0 = continuous()
    kernel = Langevin(0.05)
    (eager, _), _ = eager_and_chunked(kernel, target, x0, 83, None)
    (shorter, _), _ = eager_and_chunked(kernel, target, x0, 82, None)
    assert not torch.equal(eager.x, shorter.x)


def test_chunk_sizes_are_powers_of_two_that_keep_thinned_positions():
    assert chunk_size(20, None) == 4
    assert chunk_size(200, None) == 16
    assert chunk_size(10_000, None) == 64
    assert chunk_size(200, 3) == 15 and chunk_size(200, 3) % 3 == 0
    assert chunk_size(200, 100) == 100


def test_a_state_rebuilt_from_its_tensors_has_the_same_layout():
    target, x0 = continuous()
    kernel = MALA(0.2)
    state = kernel.step(kernel.init(x0, target), target, torch.Generator().manual_seed(0))
    copies = [t.clone() for t in tensors(state)]
    again = rebuilt(state, iter(copies))
    assert layout(again) == layout(state)
    assert all(a is b for a, b in zip(tensors(again), copies, strict=True))
    other = dataclasses.replace(state, step_size=0.3)
    assert layout(other) != layout(state)  # a changed setting is a different layout


class GrowingKernel(Langevin):
    """A kernel that claims to be replayable but changes its state's layout at step 20:
    the chunked path must see it and go on eagerly."""

    def replayable(self, state):
        return True

    def step(self, state, energy, generator=None):
        new = super().step(state, energy, generator)
        return new.replace(info=None) if new.t >= 20 else new


def test_a_layout_change_inside_a_chunk_falls_back_to_eager_steps():
    target, x0 = continuous()
    kernel = GrowingKernel(0.05)
    state = kernel.init(x0, target)
    out = kernel._steps(state, target, torch.Generator().manual_seed(0), 90, _FiniteWatch(x0), True)
    assert out.t == 90 and out.info is None


def test_chunked_steps_report_a_diverging_chain_at_the_eager_step():
    def blowing_up(x):
        return -(x**4).sum(1)  # the drift pushes chains away ever faster

    x0 = torch.zeros(8, 2)
    x0[3] = 2.0
    messages = []
    for replay in (False, True):
        with pytest.raises(NonFiniteChainError) as err:
            kernel = Langevin(0.05)
            state = kernel.init(x0, blowing_up)
            watch = _FiniteWatch(x0)
            gen = torch.Generator().manual_seed(0)
            state = kernel._steps(state, blowing_up, gen, 300, watch, replay)
            watch.check(state.t)
        messages.append(str(err.value))
    assert "chain 3 became non-finite (NaN or inf) at step 6 of" in messages[0]
    # the same chain and step; " of t" says when the record was read back
    assert messages[0].split(" of ")[0] == messages[1].split(" of ")[0]


def test_short_phases_run_eagerly(monkeypatch):
    """A capture would not pay for itself in a few dozen steps (a training step's SGLD)."""
    from ebmlab.samplers import graphs

    def refuse(*args, **kwargs):
        raise AssertionError("chunks made for a short phase")

    target, x0 = continuous()
    kernel = Langevin(0.05)
    monkeypatch.setattr(graphs, "ChunkedSteps", refuse)
    state = kernel.init(x0, target)
    gen = torch.Generator().manual_seed(0)
    out = kernel._steps(state, target, gen, graphs.MIN_STEPS - 1, _FiniteWatch(x0), True)
    assert out.t == graphs.MIN_STEPS - 1
    with pytest.raises(AssertionError, match="short phase"):  # the control: a long one
        kernel._steps(state, target, gen, graphs.MIN_STEPS, _FiniteWatch(x0), True)


def test_chunks_hold_fixed_buffers_and_the_state_reads_them():
    target, x0 = continuous()
    kernel = HMC(0.2, 3)
    gen = torch.Generator().manual_seed(0)
    state = kernel.step(kernel.init(x0, target), target, gen)
    chunks = ChunkedSteps(kernel, target, gen, state, 8, None, capture=True)  # CPU: no capture
    buffers = [b.data_ptr() for b in chunks.buffers]
    assert chunks.run() and chunks.run()
    assert [b.data_ptr() for b in chunks.buffers] == buffers
    after = chunks.state()
    assert after.t == state.t + 16 and after.n_grad_evals == state.n_grad_evals + 16 * 3
    assert chunks.graph is None and chunks.sums.isfinite().all()


def energy_counting(target):
    calls = []

    def energy(x):
        calls.append(1)
        return target(x)

    return energy, calls


@pytest.mark.parametrize("graphs", [True, False])
def test_on_the_cpu_every_step_runs_eagerly(graphs):
    target, x0 = continuous()
    energy, calls = energy_counting(target)
    Langevin(0.05).run(energy, x0, 200, generator=0, graphs=graphs)
    assert len(calls) == 200


def test_a_replayed_gradient_off_a_cuda_device_is_the_eager_one():
    target, x0 = continuous()
    fn = ReplayedGradient(as_energy_fn(target))
    for _ in range(CAPTURE_AT + 2):
        e, g = fn.value_and_grad(x0)
        e0, g0 = energy_and_grad(target, x0)
        assert torch.equal(e, e0) and torch.equal(g, g0)
    assert not fn.store.graphs and torch.equal(fn(x0), target(x0))


class RerunGraph:
    """A stand-in for a captured graph off a GPU: each replay runs the work again and
    writes its outputs into the same tensors, as a graph's static outputs are."""

    def __init__(self, run, fn):
        self.run, self.fn = run, fn

    def pool(self):
        return ("pool of", id(self))

    def replay(self):
        outputs = next(out for graph, _, out in self.fn.store.graphs.values() if graph is self)
        static = list(outputs)
        self.run()
        for old, new in zip(static, outputs, strict=True):
            old.copy_(new)
        outputs[:] = static


def test_replayed_gradients_capture_each_shape_at_its_third_evaluation(monkeypatch):
    captured = []

    def capture(run, device, generator=None, pool=None):
        run()
        captured.append(pool)
        return RerunGraph(run, fn)

    monkeypatch.setattr(graphs, "capturable", lambda device: True)
    monkeypatch.setattr(graphs, "warm_and_capture", capture)
    target, _ = continuous()
    fn = ReplayedGradient(as_energy_fn(target))
    held = {}  # the last results at each shape, which a later replay must not change
    for n in [8] * 5 + [16] * 3 + [1, 2, 3, 4] * 3:
        x = torch.randn(n, 2)
        e, g = fn.value_and_grad(x)
        e0, g0 = energy_and_grad(target, x)
        assert torch.equal(e, e0) and torch.equal(g, g0)
        if n in held:
            assert torch.equal(held[n][0], held[n][1])
        held[n] = (e, e0)
    assert len(captured) == graphs.MAX_SHAPES  # 8, 16, 1 and 2; 3 and 4 stay eager
    first = fn.store.graphs[next(iter(fn.store.graphs))][0]
    assert captured == [None] + [first.pool()] * 3  # one memory pool for all
    assert sorted(key[0][0] for key in fn.store.graphs) == [1, 2, 8, 16]


def test_a_gradient_that_cannot_be_captured_is_evaluated_eagerly_from_then_on(monkeypatch):
    def capture(run, device, generator=None, pool=None):
        raise CaptureError("it reads values back to the host", ran=False)

    monkeypatch.setattr(graphs, "capturable", lambda device: True)
    monkeypatch.setattr(graphs, "warm_and_capture", capture)
    target, x0 = continuous()
    fn = ReplayedGradient(as_energy_fn(target))
    with pytest.warns(SamplingWarning, match="could not be captured"):
        for _ in range(CAPTURE_AT + 3):
            _, g = fn.value_and_grad(x0)
    assert fn.store.failed and not fn.store.graphs
    assert torch.equal(g, energy_and_grad(target, x0)[1])


@pytest.mark.parametrize(
    "kernel",
    [
        pytest.param(NUTS(max_depth=6), id="nuts", marks=pytest.mark.slow),
        pytest.param(AdaptiveHMC(), id="adaptive-hmc"),
    ],
)
def test_tree_and_tuned_sampler_runs_replay_their_gradients(stand_in_captures, kernel):
    """Sampler.run's path on a GPU, with each capture standing in as a rerun: the same
    draws as the eager run, the energy called from Python for the first evaluations
    of each shape (and the rerun replays) only."""
    x0 = torch.rand(16, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    eager = kernel.run(diagonal_gaussian, x0 * 4 - 2, 40, burn_in=40, generator=2, graphs=False)
    captures = stand_in_captures
    replayed = kernel.run(diagonal_gaussian, x0 * 4 - 2, 40, burn_in=40, generator=2)
    assert len(captures) == 1  # one batch shape
    assert torch.equal(replayed.samples, eager.samples)
    short = kernel.run(diagonal_gaussian, x0 * 4 - 2, 20, burn_in=20, generator=2)
    assert len(captures) == 1  # runs under 64 steps evaluate eagerly
    assert torch.equal(
        short.final.x,
        kernel.run(
            diagonal_gaussian, x0 * 4 - 2, 20, burn_in=20, generator=2, graphs=False
        ).final.x,
    )


@pytest.mark.parametrize("estimator", [ais, smc])
def test_annealed_moves_evaluate_gradients_through_the_replay(stand_in_captures, estimator):
    """AIS and SMC on a GPU, each capture standing in as a rerun: the path reads its
    inverse temperatures from a tensor, so one capture serves every temperature and the
    estimate is the eager one."""
    mix = GaussianMixture.isotropic(torch.tensor([[-2.0, 0.0], [2.0, 1.0]]), std=0.5)
    base = DiagonalGaussian(torch.zeros(2), torch.full((2,), 3.0))
    sizes = {"n_chains": 50, "n_temperatures": 50} if estimator is ais else {"n_particles": 64}
    eager = estimator(mix, base, HMC(0.2, 3), generator=0, graphs=False, **sizes)
    captures = stand_in_captures
    replayed = estimator(mix, base, HMC(0.2, 3), generator=0, **sizes)
    assert len(captures) == 1 and replayed.log_z == eager.log_z


# On a CUDA GPU: captured, replayed, and compared with the eager run.


def exact_mean(target, x0):
    """The target's mean: the Gaussian's, or the RBM's visible marginals by enumeration."""
    if isinstance(target, Gaussian):
        return MEAN
    d = x0.shape[1]
    states = ((torch.arange(2**d)[:, None] >> torch.arange(d)) & 1).float().to(x0.device)
    with torch.no_grad():
        weights = torch.softmax(-target(states).double(), 0)
    return (weights[:, None] * states.double()).sum(0).float().cpu()


@pytest.mark.cuda
@pytest.mark.parametrize("name", SAMPLING)
def test_replayed_graphs_sample_the_target_as_the_eager_run_does(name):
    make, data = KERNELS[name]
    target, x0 = data("cuda")
    kernel = make(target)
    runs = {g: kernel.run(target, x0, 600, burn_in=200, thin=2, generator=11, graphs=g)
            for g in (False, True)}  # fmt: skip
    eager, replayed = runs[False], runs[True]
    assert replayed.info["n_steps"] == eager.info["n_steps"] == 800
    assert replayed.info["n_grad_evals"] == eager.info["n_grad_evals"]
    assert replayed.samples.shape == eager.samples.shape == (300, *x0.shape)
    again = kernel.run(target, x0, 600, burn_in=200, thin=2, generator=11)
    assert torch.equal(again.samples, replayed.samples)  # reproducible from the seed
    assert not torch.equal(eager.samples, replayed.samples)  # the chunks' own stream
    mean = exact_mean(target, x0)
    for run in (eager, replayed):
        samples = run.samples.cpu()
        ess = effective_sample_size(samples).clamp_min(10)
        assert_mean_close(samples.reshape(-1, x0.shape[1]), mean, ess=ess)


@pytest.mark.cuda
def test_replayed_langevin_launches_python_steps_for_few_chunks_only():
    target, x0 = continuous("cuda")
    energy, calls = energy_counting(target)
    Langevin(0.05).run(energy, x0, 400, generator=0)
    # one eager step, one warm-up chunk and one captured chunk of 32, then the tail
    assert len(calls) < 100
    calls.clear()
    Langevin(0.05).run(energy, x0, 400, generator=0, graphs=False)
    assert len(calls) == 400


@pytest.mark.cuda
def test_replayed_langevin_recovers_the_gaussian_moments():
    target = Gaussian(MEAN, COV).cuda()
    x0 = torch.randn(512, 2, device="cuda")
    traj = Langevin(0.02).sample(target, x0, 2000, burn_in=300, thin=4, generator=3)
    ess = effective_sample_size(traj.cpu())
    # ULA's bias at h = 0.02 is about h/2 of the variance: well inside the tolerance
    assert_mean_close(traj.reshape(-1, 2).cpu(), MEAN, ess=ess)
    cov = torch.cov(traj.reshape(-1, 2).T.cpu())
    torch.testing.assert_close(cov, COV, rtol=0.05, atol=0.05)


@pytest.mark.cuda
def test_an_energy_that_reads_values_back_runs_eagerly_and_spares_the_generator():
    target, x0 = continuous("cuda")

    def syncing(x):
        if float(x.abs().max()) > 1e6:  # a host read-back: not capturable
            raise AssertionError("unreachable")
        return target(x)

    gen = torch.Generator("cuda").manual_seed(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = Langevin(0.05).run(syncing, x0, 200, generator=gen)
    assert any(issubclass(w.category, SamplingWarning) for w in caught)
    assert run.final.t == 200 and torch.isfinite(run.final.x).all()
    torch.randn(4, device="cuda", generator=gen)  # the run's generator still draws
    again = Langevin(0.05).run(target, x0, 200, generator=gen)  # and captures
    assert again.final.t == 200


@pytest.mark.cuda
def test_replayed_mlp_langevin_with_bfloat16_gradients_is_reproducible():
    torch.manual_seed(0)
    model = MLPEnergy(16, hidden=(64, 64)).cuda()
    model.grad_dtype = torch.bfloat16
    x0 = torch.randn(256, 16, device="cuda")
    a = Langevin(1e-3).sample(model, x0, 200, generator=1)
    b = Langevin(1e-3).sample(model, x0, 200, generator=1)
    c = Langevin(1e-3).sample(model, x0, 200, generator=1, graphs=False)
    assert torch.equal(a, b) and torch.isfinite(a).all()
    assert not torch.equal(a, c)  # replayed, not eager


def diagonal_gaussian(x):
    """A 6-d Gaussian of scales 0.1 to 3 written elementwise: the same kernels replayed
    or eager give the same bits."""
    scale = torch.linspace(0.1, 3.0, x.shape[1], dtype=x.dtype, device=x.device)
    return 0.5 * ((x - 1.0) / scale).square().sum(1)


@pytest.mark.cuda
def test_a_replayed_gradient_equals_the_eager_one_at_each_shape():
    torch.manual_seed(0)
    model = MLPEnergy(8, hidden=(32, 32)).cuda()
    fn = ReplayedGradient(as_energy_fn(model))
    for n in (16, 16, 16, 16, 32, 32, 32, 16, 32):
        x = torch.randn(n, 8, device="cuda")
        e, g = fn.value_and_grad(x)
        e0, g0 = energy_and_grad(model, x)
        torch.testing.assert_close(e, e0)
        torch.testing.assert_close(g, g0)
    assert len(fn.store.graphs) == 2 and not fn.store.failed


def well_scaled_gaussian(x):
    """diagonal_gaussian with scales 0.5 to 1.5: NUTS's trees stay shallow from the
    start, so that a GPU test of a few hundred steps takes seconds."""
    scale = torch.linspace(0.5, 1.5, x.shape[1], dtype=x.dtype, device=x.device)
    return 0.5 * ((x - 1.0) / scale).square().sum(1)


@pytest.mark.cuda
@pytest.mark.parametrize("kernel", [NUTS(), AdaptiveHMC()], ids=["nuts", "adaptive-hmc"])
def test_tree_and_tuned_samplers_replay_their_gradients_with_the_eager_draws(kernel):
    x0 = torch.rand(64, 6, dtype=torch.float64, device="cuda") * 4 - 2
    runs, calls = {}, {}
    for g in (True, False):
        energy, calls[g] = energy_counting(well_scaled_gaussian)
        runs[g] = kernel.run(energy, x0, 100, burn_in=100, thin=1, generator=2, graphs=g)
    assert torch.equal(runs[True].samples, runs[False].samples)
    assert len(calls[True]) < len(calls[False]) / 4  # most evaluations replayed
    samples = runs[True].samples.cpu()
    ess = effective_sample_size(samples).clamp_min(10)
    assert_mean_close(samples.reshape(-1, 6), torch.ones(6, dtype=torch.float64), ess=ess)


@pytest.mark.cuda
def test_a_gradient_that_reads_values_back_is_evaluated_eagerly_with_a_warning():
    def syncing(x):
        if float(x.abs().max()) > 1e6:  # a host read-back: not capturable
            raise AssertionError("unreachable")
        return well_scaled_gaussian(x)

    x0 = torch.rand(32, 6, dtype=torch.float64, device="cuda") * 4 - 2
    with pytest.warns(SamplingWarning, match="gradient could not be captured"):
        run = AdaptiveHMC().run(syncing, x0, 50, burn_in=50, thin=1, generator=4)
    eager = AdaptiveHMC().run(syncing, x0, 50, burn_in=50, thin=1, generator=4, graphs=False)
    assert torch.equal(run.samples, eager.samples)


def runs_between_optimiser_steps(model, optimizer, x0, runs):
    """A training loop's negatives: Langevin runs of 20 steps on ``model`` with an
    optimiser step between them, each with the draws of the same run made eagerly."""
    for seed in range(runs):
        replayed = Langevin(0.01).sample(model, x0, 20, generator=seed)
        eager = Langevin(0.01).sample(model, x0, 20, generator=seed, graphs=False)
        assert torch.equal(replayed, eager)
        optimizer.zero_grad()
        model.energy(x0).mean().backward()
        optimizer.step()


def test_a_modules_gradient_graphs_serve_its_later_short_runs(stand_in_captures):
    """A training loop's negatives on a GPU, each capture standing in as a rerun: runs
    of 20 steps on one module share one capture across optimiser steps (graphs read
    the parameters where the in-place update leaves them), with the eager draws."""
    torch.manual_seed(0)
    model = MLPEnergy(6, hidden=(16,)).double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x0 = torch.randn(8, 6, dtype=torch.float64)
    runs_between_optimiser_steps(model, optimizer, x0, 3)
    assert len(stand_in_captures) == 1


def test_a_moved_module_drops_its_graphs_and_each_mode_has_its_own(stand_in_captures):
    torch.manual_seed(0)
    model = MLPEnergy(6, hidden=(16,)).double()
    x0 = torch.randn(8, 6, dtype=torch.float64)
    captures = stand_in_captures
    first = Langevin(0.01).sample(model, x0, 20, generator=0)
    model.eval()  # a graph of its own, the training mode's kept
    assert torch.equal(Langevin(0.01).sample(model, x0, 20, generator=0), first)
    model.train()
    assert torch.equal(Langevin(0.01).sample(model, x0, 20, generator=0), first)
    assert len(captures) == 2
    for p in model.parameters():  # as a reload by assignment or a move between devices
        p.data = p.data.clone()
    assert torch.equal(Langevin(0.01).sample(model, x0, 20, generator=0), first)
    assert len(captures) == 3 and len(graphs._KEPT[model].graphs) == 1


@pytest.mark.cuda
def test_a_modules_graphs_read_its_parameters_after_each_optimiser_step():
    torch.manual_seed(0)
    model = MLPEnergy(8, hidden=(32, 32)).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    x0 = torch.randn(64, 8, device="cuda")
    runs_between_optimiser_steps(model, optimizer, x0, 4)
    assert len(graphs._KEPT[model].graphs) == 1
