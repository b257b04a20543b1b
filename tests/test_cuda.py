"""On a real GPU: samplers, estimators, a recipe's training and evaluation, and the
distributed backend, each against the CPU's answer. Skipped without CUDA."""

import json
import math
import time

import numpy as np
import pytest
import torch

from ebmlab.cli import main
from ebmlab.energies import BernoulliRBM, DiagonalGaussian, Gaussian, GaussianMixture, MLPEnergy
from ebmlab.partition import (
    ais,
    bethe_log_partition,
    rbm_ais,
    rbm_log_partition,
    smc,
    trw_log_partition,
)
from ebmlab.samplers import HMC, MALA, NUTS, Gibbs, Langevin, ParallelTempering
from ebmlab.samplers.diagnostics import effective_sample_size
from ebmlab.testing import assert_mean_close

pytestmark = pytest.mark.cuda

MEAN = torch.tensor([1.0, -1.0])
COV = torch.tensor([[1.0, 0.8], [0.8, 1.5]])


@pytest.mark.parametrize(
    "sampler",
    [
        MALA(0.15),
        HMC(0.25, 8),
        NUTS(),
        NUTS(compile=True),
        ParallelTempering(MALA(0.1), [1.0, 0.5]),
    ],
    ids=["mala", "hmc", "nuts", "nuts-compiled", "tempering"],
)
def test_samplers_recover_moments_on_the_gpu(sampler):
    target = Gaussian(MEAN, COV).cuda()
    x0 = torch.randn(256, 2, device="cuda")
    traj = sampler.sample(target, x0, 300, burn_in=200, thin=1, generator=3)
    assert traj.device.type == "cuda"

    ess = effective_sample_size(traj.cpu())
    assert_mean_close(traj.reshape(-1, 2).cpu(), MEAN, ess=ess)


@pytest.mark.parametrize("estimator", [ais, smc])
def test_annealed_moves_replay_their_gradients_with_the_eager_estimate(estimator):
    mix = GaussianMixture.isotropic(torch.tensor([[-2.0, 0.0], [2.0, 1.0]]), std=0.5).cuda()
    base = DiagonalGaussian(torch.zeros(2), torch.full((2,), 3.0)).cuda()
    sizes = {"n_chains": 200, "n_temperatures": 200} if estimator is ais else {}
    estimates = [estimator(mix, base, HMC(0.2, 5), generator=0, graphs=g, **sizes)
                 for g in (True, False)]  # fmt: skip
    assert estimates[0].log_z == estimates[1].log_z  # the same values, replayed
    truth = float(mix.log_partition())
    assert abs(estimates[0].log_z - truth) < 4 * estimates[0].stderr + 0.02


def test_fused_mlp_gradients_match_autograd_on_the_gpu():
    torch.manual_seed(0)
    model = MLPEnergy(8, hidden=(64, 64)).cuda()
    x = torch.randn(512, 8, device="cuda")
    _, g = model.energy_and_grad(x)
    xg = x.clone().requires_grad_(True)
    (g_ref,) = torch.autograd.grad(model.energy(xg).sum(), xg)
    torch.testing.assert_close(g, g_ref, rtol=1e-4, atol=1e-5)
    x = Langevin(0.01).sample(model, x, 20, generator=0)
    assert torch.isfinite(x).all() and x.device.type == "cuda"


def random_rbm(d: int, m: int) -> BernoulliRBM:
    """A Bernoulli RBM with standard normal weights, on the CPU."""
    torch.manual_seed(0)
    rbm = BernoulliRBM(d, m)
    with torch.no_grad():
        rbm.W.normal_(0, 1)
    return rbm


def test_rbm_estimates_on_the_gpu_match_enumeration():
    rbm = random_rbm(12, 8)
    exact = rbm_log_partition(rbm).log_z
    gpu = rbm.cuda()
    assert rbm_log_partition(gpu).log_z == pytest.approx(exact, abs=1e-6)
    est = rbm_ais(gpu, n_chains=256, n_temperatures=2000, generator=1)
    assert abs(est.log_z - exact) < 4 * est.stderr + 0.02
    x = Gibbs().sample(gpu, (torch.rand(64, 12, device="cuda") < 0.5).float(), 5, generator=2)
    assert x.device.type == "cuda"


def test_belief_propagation_bounds_on_the_gpu_repeat_to_the_bit():
    torch.manual_seed(0)
    rbm = BernoulliRBM(30, 20, init_std=0.3)
    cpu = trw_log_partition(rbm).log_z
    gpu = rbm.cuda()
    first, second = trw_log_partition(gpu).log_z, trw_log_partition(gpu).log_z
    assert first == second and first == pytest.approx(cpu, rel=1e-5)
    assert bethe_log_partition(gpu).log_z == bethe_log_partition(gpu).log_z


def test_a_recipe_trains_resumes_and_evaluates_on_the_gpu(tmp_path, capsys):
    run = tmp_path / "jem"
    args = ["train", "jem", "--out", str(run), "--arch", "conv", "--conv-width", "8",
            "--sampler-steps", "5", "--buffer-size", "200", "--no-progress",
            "--device", "cuda"]  # fmt: skip
    assert main([*args, "--epochs", "2", "--max-steps", "20"]) == 0
    assert main([*args, "--epochs", "2", "--resume"]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(run), "--device", "cuda"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert 0 <= result["test_error"] <= 1
    assert main(["evaluate", str(run), "--device", "cpu"]) == 0  # trained on a GPU, read on a CPU


def test_bfloat16_training_step_on_the_gpu(tmp_path):
    args = ["train", "jem", "--out", str(tmp_path / "bf16"), "--arch", "conv", "--conv-width", "8",
            "--sampler-steps", "3", "--buffer-size", "100", "--epochs", "1", "--max-steps", "10",
            "--train-dtype", "bfloat16", "--sampler-dtype", "bfloat16", "--channels-last",
            "--no-progress", "--device", "cuda"]  # fmt: skip
    assert main(args) == 0


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpus_train_with_nccl(tmp_path):
    args = ["train", "density", "--out", str(tmp_path / "ddp"), "--epochs", "1", "--nproc", "2",
            "--device", "cuda", "--no-progress"]  # fmt: skip
    assert main(args) == 0


def test_a_colour_run_with_a_wide_resnet_trains_and_evaluates_on_the_gpu(tmp_path, capsys):
    """The image pipeline on a GPU: a WideResNet on 3x32x32 data from .npz files, loader
    workers, crops and flips, weight averaging, and the evaluation's sample quality."""
    data = tmp_path / "data"
    data.mkdir()
    x = np.random.default_rng(0).integers(0, 256, (192, 3, 32, 32), dtype=np.uint8)
    np.savez(data / "train.npz", x=x, y=np.arange(192) % 10)
    np.savez(data / "test.npz", x=x[:64], y=np.arange(64) % 10)
    run = tmp_path / "run"
    args = ["train", "jem", "--data", str(data), "--arch", "wrn", "--wrn-depth", "10",
            "--wrn-widen", "1", "--sampler-steps", "2", "--buffer-size", "64", "--batch-size",
            "32", "--epochs", "1", "--max-steps", "4", "--num-workers", "2", "--ema", "0.9",
            "--crop-pad", "4", "--hflip", "--channels-last", "--no-progress", "--device", "cuda",
            "--out", str(run)]  # fmt: skip
    assert main(args) == 0
    capsys.readouterr()
    assert main(["evaluate", str(run), "--device", "cuda"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result["samples"]["classifier_features"]) >= {"frechet_distance", "kid", "recall"}


def test_inception_features_on_the_gpu_match_the_cpu(inception_weights):
    """The FID network on the GPU (channels-last, TF32 convolutions by default) agrees
    with the CPU within 1 % of the largest feature (a wrong pool moves them by 30 %)."""
    from ebmlab.evaluation import inception_outputs, load_inception

    images = torch.rand(8, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    want, _ = inception_outputs(load_inception(inception_weights[0]), images)
    got, _ = inception_outputs(load_inception(inception_weights[0], "cuda"), images.cuda())
    assert got.device.type == "cuda"
    assert float((got.cpu() - want).abs().max()) < 1e-2 * float(want.abs().max())


@pytest.mark.parametrize("workers", [0, 2])
def test_rows_read_from_disk_train_on_the_gpu(tmp_path, workers):
    """Rows kept on disk reach the GPU through pinned loader batches, labels with them."""
    from ebmlab.training import Trainer
    from ebmlab.training.recipes import data_splits, get_recipe

    rng = np.random.default_rng(0)
    np.savez(tmp_path / "train.npz", x=rng.integers(0, 256, (96, 1, 8, 8), dtype=np.uint8),
             y=np.arange(96) % 4)  # fmt: skip
    np.savez(tmp_path / "test.npz", x=rng.integers(0, 256, (32, 1, 8, 8), dtype=np.uint8),
             y=np.arange(32) % 4)  # fmt: skip
    recipe = get_recipe("jem")
    config, trainer_config = recipe.configs(
        {
            "data": str(tmp_path),
            "arch": "mlp",
            "sampler_steps": 2,
            "buffer_size": 64,
            "batch_size": 16,
            "epochs": 1,
            "num_workers": workers,
            "device": "cuda",
            "progress": False,
        }
    )
    setup = recipe.build(config, trainer_config)
    train = data_splits(config, in_memory=False)[0]
    trainer = Trainer(setup.task, (train.x, train.y), trainer_config)
    assert trainer.streamed
    trainer.fit()
    assert trainer.step == len(trainer._batches(0))


def test_annealing_replayed_as_cuda_graphs_agrees_with_the_same_steps_run_eagerly():
    """The captured chunks and the same chunks launched one kernel at a time (the same
    uniforms, drawn before each chunk) both give log Z within their error. They are not
    bit-identical: cuBLAS may pick other kernels under capture, and a rounding
    difference at a threshold sends a chain another way."""
    from ebmlab.partition.ais import _estimate, _log_weights
    from ebmlab.partition.annealing_graphs import anneal_rbm_in_chunks

    rbm = random_rbm(14, 10)
    exact = rbm_log_partition(rbm).log_z
    rbm = rbm.cuda()
    W, b, c = rbm.W.detach(), rbm.b.detach(), rbm.c.detach()
    v = (torch.rand(400, 14, device="cuda") < 0.5).float()
    betas = torch.linspace(0, 1, 1001, dtype=torch.float64)
    log_z0 = 14 * math.log(2) + 10 * math.log(2)  # the base model: no weights, zero biases
    for graphs in (True, False):
        gen = torch.Generator("cuda").manual_seed(5)
        sums = anneal_rbm_in_chunks(v, betas, W, b, c, torch.zeros_like(b), gen, graphs)
        est = _estimate(_log_weights(sums, betas), log_z0, "ais", betas, time.perf_counter())
        assert abs(est.log_z - exact) < 4 * est.stderr + 0.01, graphs
    est = rbm_ais(rbm, n_chains=200, n_temperatures=1000, generator=1)
    assert abs(est.log_z - exact) < 4 * est.stderr + 0.01


RBM_MODELS = ["bernoulli", "categorical", "gaussian", "spike_slab", "conv", "subspace",
              "classification", "dbn", "dbm", "conditional", "gated"]  # fmt: skip
DENSITY_METHODS = ["pcd", "cd", "sm", "ssm", "dsm", "nce", "ed", "drl"]
DENSITY = ["density", "--hidden", "16", "--depth", "2", "--quadrature-points", "32"]
JEM = ["jem", "--arch", "conv", "--conv-width", "8", "--sampler-steps", "3", "--buffer-size", "200"]
RUNS = {
    **{f"rbm-{m}": ["rbm", "--model", m, "--n-hidden", "8"] for m in RBM_MODELS},
    **{f"density-{m}": [*DENSITY, "--method", m] for m in DENSITY_METHODS},
    **{f"structured-{t}": ["structured", "--task", t] for t in ["digits", "chain", "completion"]},
    **{f"jem-{g}": [*JEM, "--gen-objective", g] for g in ["pcd", "drl", "ed"]},
}


@pytest.mark.parametrize("name", list(RUNS))
def test_every_recipe_trains_evaluates_samples_and_estimates_on_the_gpu(name, tmp_path, capsys):
    """Each recipe and model through every command on the GPU; sample and logz where
    the recipe has them (elsewhere they are usage errors, exit status 2)."""
    run = str(tmp_path / "run")
    args = ["train", *RUNS[name], "--out", run, "--epochs", "1", "--max-steps", "10",
            "--no-progress", "--device", "cuda"]  # fmt: skip
    assert main(args) == 0
    assert main(["evaluate", run, "--device", "cuda"]) == 0
    samples = not name.startswith("structured")
    sample = ["sample", run, "--n", "4", "--steps", "2", "--out", f"{run}/s.png"]
    assert main([*sample, "--device", "cuda"]) == (0 if samples else 2)
    # every recipe with a normalisable energy estimates log Z (density by quadrature, JEM
    # over the pixel box); structured prediction and conditional RBMs do not
    log_z = not name.startswith("structured") and name not in {"rbm-conditional", "rbm-gated"}
    assert main(["logz", run, "--device", "cuda"]) == (0 if log_z else 2)
