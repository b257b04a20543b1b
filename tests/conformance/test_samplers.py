"""Every sampler runs on a simulated accelerator: draws on the device, no CPU tensor
mixed in, no host synchronisation inside a step, and the same chains as on the CPU;
and every sampler reports each step it takes."""

import pytest
import torch

from ebmlab import conformance as cf
from ebmlab.energies import BernoulliRBM, Gaussian, MLPEnergy
from ebmlab.samplers import (
    HMC,
    MALA,
    NUTS,
    SGHMC,
    AdaptiveHMC,
    BlockGibbs,
    DiscreteLangevin,
    EnergyMatchingSampler,
    EquilibriumDescent,
    Gibbs,
    GibbsWithGradients,
    Langevin,
    MetropolisHastings,
    ParallelTempering,
    ReplayBuffer,
    SoftAbsHMC,
    StepInfo,
    UnderdampedLangevin,
    anneal,
    gaussian_init,
    mixture_init,
    uniform_init,
)
from ebmlab.samplers.base import as_energy_fn
from ebmlab.samplers.neutra import NeuTra


def gaussian():
    return Gaussian(torch.tensor([1.0, -1.0]), torch.tensor([[1.0, 0.8], [0.8, 1.5]]))


def mlp():
    torch.manual_seed(0)
    return MLPEnergy(2, hidden=(16, 16))


def rbm():
    torch.manual_seed(0)
    model = BernoulliRBM(6, 4)
    with torch.no_grad():
        model.W.normal_()
    return model


CONTINUOUS = {
    "langevin": lambda: Langevin(0.05),
    "langevin_clipped": lambda: Langevin(0.05, 0.01, grad_clip=1.0, clamp=(-2.0, 2.0)),
    "mala": lambda: MALA(0.15),
    "mala_tuned": lambda: MALA(0.15, target_accept=0.6, adapt_mass=True),
    "hmc": lambda: HMC(0.2, 5),
    "adaptive_hmc": lambda: AdaptiveHMC(),
    "nuts": lambda: NUTS(max_depth=4),
    "softabs_hmc": lambda: SoftAbsHMC(0.3, 3),
    "neutra": lambda: NeuTra(MALA(0.15), layers=2, hidden=8, fit_steps=5, fit_batch=16),
    "metropolis_hastings": lambda: MetropolisHastings(0.5),
    "parallel_tempering": lambda: ParallelTempering(MALA(0.1), [1.0, 0.5, 0.25]),
    "parallel_tempering_tuned": lambda: ParallelTempering(
        MALA(0.1), [1.0, 0.5, 0.25], tune_ladder=True
    ),
    "underdamped_baoab": lambda: UnderdampedLangevin(0.2),
    "underdamped_obabo": lambda: UnderdampedLangevin(0.2, scheme="obabo"),
    "sghmc": lambda: SGHMC(0.01),
    "equilibrium_descent": lambda: EquilibriumDescent(0.1, momentum=0.3),
    "energy_matching": lambda: EnergyMatchingSampler(
        0.05, tau_star=0.5, eps_max=0.1, flow_steps=10
    ),
}
BINARY = {
    "gibbs": lambda model: Gibbs(),
    "block_gibbs": lambda model: BlockGibbs(model),
    "gibbs_with_gradients": lambda model: GibbsWithGradients(),
    "gibbs_with_gradients_path": lambda model: GibbsWithGradients(n_flips=3),
    "dula": lambda model: DiscreteLangevin(0.5, adjusted=False),
    "dmala": lambda model: DiscreteLangevin(0.5),
}


def steps(sampler, energy, x0, n, seed, sim=None):
    """init, then ``n`` steps (each under no_sync when simulated, except NUTS's), as
    Sampler.run does."""
    fn = as_energy_fn(energy)
    gen = torch.Generator(device=x0.device).manual_seed(seed)
    state = sampler.begin_warmup(sampler.init(x0, fn), 0)
    state = sampler.end_warmup(state)
    before = sim.host_syncs if sim else 0
    for i in range(n):
        # NeuTra fits its flow at its first step, where it checks the fit on the host
        if sim is None or isinstance(sampler, NUTS) or (isinstance(sampler, NeuTra) and i == 0):
            state = sampler.step(state, fn, gen)
        else:
            with sim.no_sync(f"a {type(sampler).__name__} step"):
                state = sampler.step(state, fn, gen)
    return state.x, (sim.host_syncs if sim else 0) - before


def same_chains_on_device(make_sampler, make_energy, x0, float64, n=6):
    want, _ = steps(make_sampler(), make_energy(), x0, n, seed=3)
    with cf.simulated_device(float64=float64) as sim:
        energy, sampler = cf.to_device(make_energy()), make_sampler()
        got, syncs = steps(sampler, energy, cf.to_device(x0), n, seed=3, sim=sim)
        assert cf.on_device(got)
    torch.testing.assert_close(cf.cpu_value(got), want)
    # NUTS reads one flag per leapfrog step, to stop when every chain has a transition
    # NeuTra reads three flags once: after its fit's first step, at its end, and whether
    # the flow maps every start to a finite latent position
    bound = 3 if isinstance(sampler, NeuTra) else 0
    assert syncs <= (n * 2**sampler.max_depth if isinstance(sampler, NUTS) else bound)


@pytest.mark.parametrize("energy", [gaussian, mlp], ids=["gaussian", "mlp"])
@pytest.mark.parametrize("name", list(CONTINUOUS))
def test_continuous_samplers_run_on_the_device(name, energy, float64):
    x0 = torch.randn(8, 2, generator=torch.Generator().manual_seed(1))
    same_chains_on_device(CONTINUOUS[name], energy, x0, float64)


@pytest.mark.parametrize("name", list(BINARY))
def test_binary_samplers_run_on_the_device(name, float64):
    x0 = (torch.rand(8, 6, generator=torch.Generator().manual_seed(1)) < 0.5).float()
    model = rbm()
    same_chains_on_device(lambda: BINARY[name](model), lambda: model, x0, float64)


def test_sample_and_run_take_a_seed_on_the_device(float64):
    x0 = torch.randn(8, 2, generator=torch.Generator().manual_seed(1))
    want = Langevin(0.05).run(gaussian(), x0, 5, burn_in=2, thin=1, generator=4)
    with cf.simulated_device(float64=float64):
        got = Langevin(0.05).run(
            cf.to_device(gaussian()), cf.to_device(x0), 5, burn_in=2, thin=1, generator=4
        )
    torch.testing.assert_close(cf.cpu_value(got.samples), want.samples)
    assert got.info == want.info


def test_anneal_runs_on_the_device(float64):
    x0 = torch.randn(8, 2, generator=torch.Generator().manual_seed(1))
    betas = [0.1, 0.5, 1.0]
    want = anneal(MALA(0.1), gaussian(), x0, betas, generator=2)
    with cf.simulated_device(float64=float64):
        got = anneal(MALA(0.1), cf.to_device(gaussian()), cf.to_device(x0), betas, generator=2)
    torch.testing.assert_close(cf.cpu_value(got), want)


@pytest.mark.parametrize(
    "init",
    [
        lambda data: uniform_init((2,)),
        lambda data: gaussian_init(data),
        lambda data: mixture_init([uniform_init((2,)), gaussian_init(data)], [0.3, 0.7]),
    ],
    ids=["uniform", "gaussian", "mixture"],
)
def test_replay_buffer_runs_on_the_device(init, float64):
    data = torch.randn(50, 2, generator=torch.Generator().manual_seed(0))

    def cycle(buffer_data, gen, sim=None):
        buffer = ReplayBuffer(20, init(buffer_data), reinit_prob=0.3, generator=gen)
        for _ in range(3):
            with sim.no_sync("a replay-buffer draw") if sim else torch.no_grad():
                x, slots = buffer.sample(6, gen)
                buffer.push(x + 1.0, slots)
        return buffer.buffer

    want = cycle(data, torch.Generator().manual_seed(9))
    with cf.simulated_device(float64=float64) as sim:
        got = cycle(cf.to_device(data), torch.Generator(device=cf.DEVICE).manual_seed(9), sim)
    torch.testing.assert_close(cf.cpu_value(got), want)


def check_trace(sampler, energy, x0, burn_in=3, n=6):
    """``run(trace=True)`` holds one report per step, and the energy a step starts from
    is the energy of the state the previous step made."""
    run = sampler.run(energy, x0, n, burn_in=burn_in, thin=1, generator=2, trace=True)
    b = x0.shape[0]
    assert set(run.trace) == {"accept_prob", "divergent", "energy"}
    for value in run.trace.values():
        assert value.shape == (burn_in + n, b)
    prob = run.trace["accept_prob"]
    assert ((prob >= 0) & (prob <= 1)).all()
    assert run.trace["divergent"].dtype == torch.bool
    assert isinstance(run.final.info, StepInfo)
    with torch.no_grad():
        after = torch.stack([energy(x) for x in run.samples[:-1]])
    torch.testing.assert_close(run.trace["energy"][burn_in + 1 :], after, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", list(CONTINUOUS))
def test_continuous_samplers_report_every_step(name):
    x0 = torch.randn(32, 2, generator=torch.Generator().manual_seed(0))
    check_trace(CONTINUOUS[name](), gaussian(), x0)


@pytest.mark.parametrize("name", list(BINARY))
def test_binary_samplers_report_every_step(name):
    model = rbm()
    x0 = (torch.rand(16, 6, generator=torch.Generator().manual_seed(1)) < 0.5).float()
    check_trace(BINARY[name](model), model, x0)
