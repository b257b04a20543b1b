"""NUTS with each tree step compiled by torch.compile: the same kernel as the eager one."""

import pytest
import torch
from torch._dynamo.utils import counters

from ebmlab._checks import ArgumentError
from ebmlab.energies import Gaussian, MLPEnergy
from ebmlab.samplers import NUTS, WALNUTS
from ebmlab.samplers import nuts as nuts_module
from ebmlab.samplers.diagnostics import effective_sample_size
from ebmlab.testing import assert_mean_close

MEAN = torch.tensor([1.0, -1.0])
COV = torch.tensor([[1.0, 0.8], [0.8, 1.5]])
needs_compiler = pytest.mark.skipif(
    nuts_module._cpp_compiler() is None, reason="torch.compile needs a C++ compiler on the CPU"
)


def starts(chains=32):
    return torch.randn(chains, 2, generator=torch.Generator().manual_seed(5)) * 3


@needs_compiler
@pytest.mark.slow
def test_compiled_nuts_recovers_a_gaussian_in_one_graph_per_kind_of_step():
    # warm-up (the chains' step sizes adapting) and the kept steps: two graphs, no break
    # (the energy's gradient traced into them), and the moments of the target
    torch._dynamo.reset()  # no graph compiled by an earlier test
    counters.clear()
    run = NUTS(compile=True).run(Gaussian(MEAN, COV), starts(), 300, burn_in=200, thin=1,
                                 generator=11)  # fmt: skip
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 2
    traj = run.samples
    flat = traj.reshape(-1, 2)
    assert_mean_close(flat, MEAN, ess=effective_sample_size(traj), what="mean")
    c = flat - MEAN
    products = torch.stack([c[:, 0] ** 2, c[:, 1] ** 2, c[:, 0] * c[:, 1]], 1)
    ess = effective_sample_size(products.reshape(traj.shape[0], traj.shape[1], 3))
    expected = torch.stack([COV[0, 0], COV[1, 1], COV[0, 1]])
    assert_mean_close(products, expected, ess=ess, what="covariance")


def network():
    torch.manual_seed(0)
    return MLPEnergy(2, (16, 16))


CASES = {
    "nuts": (NUTS, lambda: Gaussian(MEAN, COV)),
    "walnuts": (WALNUTS, lambda: Gaussian(MEAN, COV)),
    "nuts-network": (NUTS, network),
}


@needs_compiler
@pytest.mark.slow
@pytest.mark.parametrize("kind, energy", list(CASES.values()), ids=list(CASES))
def test_compiled_steps_are_the_eager_steps(kind, energy):
    # the compiled step runs every part, masked, where the eager one on the CPU skips
    # what no chain needs (and a network's gradient comes from autograd in the graph,
    # not from its hand-fused pass): from the same random numbers the same transitions,
    # to rounding (a handful of steps, before rounding could flip a decision), with the
    # energy's gradient inside the one graph
    energy = energy()
    eager = kind(0.3, adapt_mass=False).run(energy, starts(), 4, thin=1, generator=3)
    counters.clear()
    compiled = kind(0.3, adapt_mass=False, compile=True).run(energy, starts(), 4, thin=1,
                                                             generator=3)  # fmt: skip
    assert not counters["graph_break"], dict(counters["graph_break"])
    torch.testing.assert_close(compiled.samples, eager.samples, rtol=1e-5, atol=1e-5)
    assert compiled.info["n_grad_evals_used"] == eager.info["n_grad_evals_used"]


def test_compile_must_be_a_flag_and_needs_a_compiler_on_the_cpu(monkeypatch):
    with pytest.raises(ArgumentError, match="compile must be True or False"):
        NUTS(compile="yes")
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(nuts_module.shutil, "which", lambda name: None)
    with pytest.raises(ArgumentError, match="compile=True needs a C\\+\\+ compiler"):
        NUTS(compile=True).run(Gaussian(MEAN, COV), starts(), 1)
