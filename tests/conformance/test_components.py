"""Losses, inference routines, partition estimators and evaluation metrics on a
simulated accelerator: each follows its inputs' device and gives the CPU's answer."""

import math
import tempfile
from pathlib import Path

import pytest
import torch

from ebmlab import conformance as cf
from ebmlab import evaluation as ev
from ebmlab import inference as inf
from ebmlab import learning as learn
from ebmlab import losses as L
from ebmlab import partition as P
from ebmlab import transport as T
from ebmlab.data.augment import random_affine, random_crop_flip
from ebmlab.energies import (
    Banana,
    BernoulliRBM,
    BoltzmannMachine,
    CategoricalRBM,
    ChainEnergy,
    ClassificationRBM,
    ClassifierEnergy,
    ConditionalBoltzmann,
    ConditionalRBM,
    ConvEnergy,
    DeepBeliefNetwork,
    DeepBoltzmannMachine,
    DiagonalGaussian,
    DistanceEnergy,
    DoubleWell,
    FeedForward,
    Funnel,
    Gaussian,
    GaussianMixture,
    ImageEnergy,
    IndependentBernoulli,
    LogitEnergy,
    MLPEnergy,
    NoiseConditionalEnergy,
    SNResNet,
    SubspaceRBM,
    UNetDot,
    UNetViT,
    WideResNet,
    energy_and_grad,
)
from ebmlab.samplers import HMC, MALA, geometric_path, tuned_ladder
from ebmlab.samplers.recovery import RecoverySampler

GEN = torch.Generator().manual_seed(0)
E_TABLE = torch.randn(6, 4, generator=GEN, dtype=torch.float64)
TARGET = torch.tensor([0, 1, 2, 3, 0, 1])
E_CORRECT = torch.rand(6, generator=GEN, dtype=torch.float64)
E_OFFENDING = E_CORRECT + torch.rand(6, generator=GEN, dtype=torch.float64) - 0.3
X = torch.randn(16, 2, generator=GEN)
X_NOISE = torch.randn(16, 2, generator=GEN) * 2
BITS = (torch.rand(8, 6, generator=GEN) < 0.5).float()
UNARY = torch.randn(3, 5, 2, generator=GEN)
TRANSITION = torch.randn(2, 2, generator=GEN)
PAIR = torch.randn(5, 5, 2, 2, generator=GEN)
PAIR = (PAIR + PAIR.permute(1, 0, 3, 2)) / 2 * (1 - torch.eye(5))[:, :, None, None]
CHAIN_EDGES = torch.tensor([[0, 1], [1, 2], [2, 3], [1, 4]])
CHAIN_POTENTIALS = torch.randn(3, 4, 2, 2, generator=GEN, dtype=torch.float64)
PROBS = torch.softmax(torch.randn(40, 3, generator=GEN), 1)
LABELS = torch.randint(3, (40,), generator=GEN)
IMAGES = torch.rand(4, 64, generator=GEN)


def mlp():
    torch.manual_seed(0)
    return MLPEnergy(2, hidden=(8,))


def rbm():
    torch.manual_seed(0)
    model = BernoulliRBM(6, 4)
    with torch.no_grad():
        model.W.normal_()
        model.b.normal_()
    return model


def noise_conditional():
    torch.manual_seed(0)
    return NoiseConditionalEnergy(2, 2, hidden=(8,))


def classifier():
    torch.manual_seed(0)
    return ClassifierEnergy(FeedForward((2, 8, 3)), 3)


def inception():
    torch.manual_seed(0)
    return ev.InceptionV3().eval()


def boltzmann_machine():
    torch.manual_seed(0)
    model = BoltzmannMachine(6)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    return model


def classification_rbm():
    torch.manual_seed(0)
    return ClassificationRBM(6, 4, 3, init_std=0.5)


def conditional_rbm():
    torch.manual_seed(0)
    return ConditionalRBM(3, 4, 2, init_std=0.5)


def deep_boltzmann_machine():
    torch.manual_seed(0)
    return DeepBoltzmannMachine(6, 4, 3, init_std=0.5)


def device_generator(put, seed):
    return torch.Generator(put(X).device).manual_seed(seed)


def gradients(model, step):
    """The parameters' gradients after ``step(model)``, which returns a loss to
    differentiate or writes the gradients itself."""
    loss = step(model)
    if isinstance(loss, torch.Tensor):
        loss.backward()
    return [p.grad for p in model.parameters() if p.grad is not None]


def drawn(draw):
    """Whether ``draw(path)`` wrote a picture."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "picture.png"
        draw(path)
        return path.stat().st_size > 0


def linear():
    torch.manual_seed(0)
    return torch.nn.Linear(2, 3)


def _pretrained(dbm, data, generator):
    learn.pretrain_dbm(dbm, data, 1, batch_size=4, generator=generator)
    return dbm


def gaussian():
    return Gaussian(torch.tensor([0.5, -0.5]), torch.tensor([[1.0, 0.3], [0.3, 0.8]]))


def noise_log_prob(x):
    return -0.125 * (x**2).sum(1)


def seeded(factory, *args, **kwargs):
    torch.manual_seed(0)
    return factory(*args, **kwargs)


def analytic_outputs(model, x, put):
    """An analytic energy's values and gradients, exact log Z and exact draws (from a
    generator on the device, since a parameter-free energy has no device of its own:
    its log Z is then a constant)."""
    draws = model.sample(8, generator=device_generator(put, 5))
    log_z = model.log_partition()
    if not [*model.parameters(), *model.buffers()]:
        log_z = float(log_z)
    return (*energy_and_grad(model, x), log_z, draws)


COLOUR = torch.rand(2, 3, 8, 8, generator=GEN)
ENERGIES = {
    "diagonal_gaussian": lambda put: analytic_outputs(
        put(DiagonalGaussian(torch.tensor([0.5, -1.0]), torch.tensor([1.0, 2.0]))), put(X), put
    ),
    "gaussian_mixture": lambda put: analytic_outputs(
        put(
            GaussianMixture(
                torch.tensor([0.3, 0.7]), 2 * torch.eye(2), torch.eye(2).repeat(2, 1, 1)
            )
        ),
        put(X),
        put,
    ),
    "funnel": lambda put: analytic_outputs(put(Funnel(2)), put(X), put),
    "banana": lambda put: analytic_outputs(put(Banana()), put(X), put),
    "double_well": lambda put: analytic_outputs(put(DoubleWell(2)), put(X), put),
    "independent_bernoulli": lambda put: analytic_outputs(
        put(IndependentBernoulli(torch.linspace(-1, 1, 6))), put(BITS), put
    ),
    "subspace_rbm": lambda put: energy_and_grad(put(seeded(SubspaceRBM, 6, 2, 3, 0.5)), put(BITS)),
    "categorical_rbm": lambda put: put(seeded(CategoricalRBM, 2, 3, 4, 0.5)).free_energy(
        put(torch.nn.functional.one_hot(LABELS[:8].view(4, 2), 3).flatten(1).float())
    ),
    "deep_belief_network": lambda put: put(seeded(DeepBeliefNetwork, 6, (4, 3))).sample(
        4, 5, generator=device_generator(put, 6)
    ),
    "conv_energy": lambda put: energy_and_grad(
        put(seeded(ConvEnergy, (1, 8, 8), width=4)), put(IMAGES)
    ),
    "image_energy_wide_resnet": lambda put: energy_and_grad(
        put(ImageEnergy(seeded(WideResNet, (3, 8, 8), 1, depth=10, widen=1, norm="group"))),
        put(COLOUR),
    ),
    "image_energy_unet_vit": lambda put: energy_and_grad(
        put(ImageEnergy(seeded(UNetViT, (3, 8, 8), 1, width=8, mults=(1, 2), embed=16, heads=2))),
        put(COLOUR),
    ),
    "image_energy_unet_dot": lambda put: energy_and_grad(
        put(ImageEnergy(seeded(UNetDot, (3, 8, 8), 1, width=8, mults=(1, 2)))), put(COLOUR)
    ),
    "image_energy_sn_resnet": lambda put: energy_and_grad(
        put(ImageEnergy(seeded(SNResNet, (3, 8, 8), 1, width=8, stages=2))), put(COLOUR)
    ),
    "class_conditional_energy": lambda put: energy_and_grad(
        put(classifier()).conditional(put(LABELS[:16])), put(X)
    ),
    "logit_energy": lambda put: put(seeded(LogitEnergy, 2, (8,), 3))(put(X)),
    "distance_energy": lambda put: put(seeded(DistanceEnergy, 2, (8,), 4, 3))(put(X)),
    "chain_energy": lambda put: put(seeded(ChainEnergy, 2, (8,), 3))(put(X)),
    "conditional_boltzmann": lambda put: put(seeded(ConditionalBoltzmann, 2, 4, (8,)))(put(X)),
}

# each case receives ``put`` (identity, or onto the simulated device) for its inputs
CASES = {
    **ENERGIES,
    "energy_loss": lambda put: L.energy_loss(put(E_CORRECT)),
    "perceptron_loss": lambda put: L.perceptron_loss(put(E_TABLE), put(TARGET)),
    "hinge_loss": lambda put: L.hinge_loss(put(E_CORRECT), put(E_OFFENDING), margin=0.5),
    "log_loss": lambda put: L.log_loss(put(E_CORRECT), put(E_OFFENDING)),
    "lvq2_loss": lambda put: L.lvq2_loss(put(E_CORRECT), put(E_OFFENDING) + 1, delta=0.2),
    "mce_loss": lambda put: L.mce_loss(put(E_CORRECT), put(E_OFFENDING)),
    "square_square_loss": lambda put: L.square_square_loss(put(E_CORRECT), put(E_OFFENDING)),
    "square_exponential_loss": lambda put: L.square_exponential_loss(
        put(E_CORRECT), put(E_OFFENDING)
    ),
    "nll_loss": lambda put: L.nll_loss(put(E_TABLE), put(TARGET), beta=2.0),
    "mee_loss": lambda put: L.mee_loss(put(E_TABLE), put(TARGET)),
    "contrastive_update_loss": lambda put: L.contrastive_update_loss(
        put(E_CORRECT), put(E_OFFENDING)
    ),
    "contrastive_divergence_loss": lambda put: L.contrastive_divergence_loss(
        put(mlp()), put(X), put(X_NOISE), l2=0.1
    ),
    "score_matching_loss": lambda put: L.score_matching_loss(put(mlp()), put(X)),
    "sliced_score_matching_loss": lambda put: L.sliced_score_matching_loss(
        put(mlp()), put(X), generator=torch.Generator(put(X).device).manual_seed(1)
    ),
    "denoising_score_matching_loss": lambda put: L.denoising_score_matching_loss(
        put(mlp()), put(X), [0.1, 0.3], generator=torch.Generator(put(X).device).manual_seed(1)
    ),
    "nce_loss": lambda put: L.nce_loss(
        put(mlp()), put(torch.zeros(())), put(X), put(X_NOISE), noise_log_prob
    ),
    "energy_discrepancy_loss": lambda put: L.energy_discrepancy_loss(
        put(mlp()), put(X), generator=torch.Generator(put(X).device).manual_seed(1)
    ),
    "energy_discrepancy_loss_bernoulli": lambda put: L.energy_discrepancy_loss(
        put(rbm()),
        put(BITS),
        perturbation="bernoulli",
        generator=torch.Generator(put(X).device).manual_seed(1),
    ),
    "flow_matching_loss_potential_ot": lambda put: L.flow_matching_loss(
        put(mlp()),
        put(X),
        potential=True,
        coupling="ot",
        generator=torch.Generator(put(X).device).manual_seed(1),
    ),
    "energy_matching_loss": lambda put: L.energy_matching_loss(
        put(mlp()),
        put(X),
        tau_star=0.5,
        eps_max=0.1,
        steps=5,
        generator=torch.Generator(put(X).device).manual_seed(1),
    ),
    "equilibrium_matching_loss": lambda put: L.equilibrium_matching_loss(
        put(mlp()), put(X), generator=torch.Generator(put(X).device).manual_seed(1)
    ),
    "ot_pairs_sinkhorn": lambda put: _pairs(
        T.ot_pairs(
            put(X_NOISE),
            put(X),
            method="sinkhorn",
            generator=torch.Generator(put(X).device).manual_seed(1),
        )
    ),
    "odeint_dopri5": lambda put: T.odeint(lambda x, t: -x * t[:, None], put(X), method="dopri5"),
    "odeint_rk4": lambda put: T.odeint(lambda x, t: -x * t[:, None], put(X), n_steps=10),
    "diffusion_recovery_likelihood_loss": lambda put: L.diffusion_recovery_likelihood_loss(
        put(noise_conditional()),
        put(X),
        [0.1, 0.5],
        langevin_steps=3,
        generator=torch.Generator(put(X).device).manual_seed(1),
    ),
    "recovery_sampler": lambda put: RecoverySampler([0.1, 0.5], steps=3).sample(
        put(noise_conditional()), 8, generator=torch.Generator(put(X).device).manual_seed(2)
    ),
    "pseudo_likelihood_loss": lambda put: L.pseudo_likelihood_loss(put(rbm()), put(BITS)),
    "minimum_probability_flow_loss": lambda put: L.minimum_probability_flow_loss(
        put(rbm()), put(BITS)
    ),
    "candidate_energies": lambda put: inf.candidate_energies(
        lambda x, y: ((x - y) ** 2).sum(1), put(X[:4]), put(X_NOISE[:3])
    ),
    "chain_energy": lambda put: inf.chain_energy(
        put(UNARY), put(TRANSITION), put(torch.tensor([[0, 1, 1, 0, 1]] * 3))
    ),
    "mean_field_free_energy": lambda put: inf.mean_field_free_energy(
        inf.PairwiseMRF(put(UNARY), put(PAIR)), put(torch.full((3, 5, 2), 0.5))
    ),
    "argmin_answer": lambda put: inf.argmin_answer(put(E_TABLE)),
    "most_offending": lambda put: inf.most_offending(put(E_TABLE), put(TARGET)),
    "viterbi": lambda put: inf.viterbi(put(UNARY), put(TRANSITION)),
    "chain_free_energy": lambda put: inf.chain_free_energy(put(UNARY), put(TRANSITION)),
    "chain_marginals": lambda put: inf.chain_marginals(put(UNARY), put(TRANSITION)),
    "gradient_argmin": lambda put: inf.gradient_argmin(
        put(gaussian()).energy, put(X[:4]), steps=10, restarts=2, generator=3
    ),
    "most_offending_continuous": lambda put: inf.most_offending_continuous(
        put(gaussian()).energy, put(X[:4]), 0.1, steps=10, generator=3
    ),
    "annealed_gibbs": lambda put: inf.annealed_gibbs(
        inf.PairwiseMRF(put(UNARY), put(PAIR)), 5, generator=4
    ),
    "icm": lambda put: inf.icm(inf.PairwiseMRF(put(UNARY), put(PAIR))),
    "mean_field": lambda put: inf.mean_field(inf.PairwiseMRF(put(UNARY), put(PAIR)), n_iter=5),
    "enumerate_log_partition": lambda put: P.enumerate_log_partition(put(rbm()), 6),
    "log_likelihood": lambda put: ev.log_likelihood(
        put(rbm()), put(BITS), P.rbm_log_partition(put(rbm()))
    ),
    "rbm_log_partition": lambda put: P.rbm_log_partition(put(rbm())),
    "exact_log_partition": lambda put: P.exact_log_partition(put(rbm())),
    "rbm_ais": lambda put: P.rbm_ais(
        put(rbm()), n_chains=16, n_temperatures=50, data=put(BITS), generator=5
    ),
    "raise_": lambda put: P.raise_(put(rbm()), n_chains=16, n_temperatures=50, generator=5),
    "ais": lambda put: P.ais(
        put(mlp()),
        base=put(gaussian()),
        kernel=HMC(0.2, 3),
        n_chains=16,
        n_temperatures=20,
        generator=6,
    ),
    "smc": lambda put: P.smc(
        put(mlp()), put(gaussian()), HMC(0.2, 3), n_particles=16, n_runs=2, generator=6
    ),
    "box_smc": lambda put: P.box_smc(
        put(mlp()), -1.0, 1.0, (2,), kernel=HMC(0.2, 3), n_particles=16, n_runs=2, generator=6
    ),
    "smc_genealogy": lambda put: P.smc(
        put(mlp()),
        put(gaussian()),
        HMC(0.2, 3),
        n_particles=16,
        n_runs=1,
        variance="genealogy",
        generator=6,
    ),
    "kernel_stein_discrepancy": lambda put: ev.kernel_stein_discrepancy(
        put(X), put(gaussian()), n_bootstrap=20, generator=torch.Generator(put(X).device)
    ),
    "bethe_log_partition": lambda put: P.bethe_log_partition(put(rbm())),
    "pairwise_marginals": lambda put: P.pairwise_marginals(
        put(UNARY.double()), put(CHAIN_POTENTIALS), put(CHAIN_EDGES)
    ),
    "trw_log_partition": lambda put: P.trw_log_partition(put(rbm())),
    "perturb_and_map_log_partition": lambda put: P.perturb_and_map_log_partition(
        put(rbm()), generator=7
    ),
    "quadrature_log_partition": lambda put: P.quadrature_log_partition(
        put(mlp()), [(-3.0, 3.0), (-3.0, 3.0)], 64
    ),
    "quadrature_sample": lambda put: P.quadrature_sample(
        put(mlp()),
        [(-3.0, 3.0), (-3.0, 3.0)],
        32,
        64,
        generator=torch.Generator(put(X).device).manual_seed(8),
    ),
    "accuracy": lambda put: ev.accuracy(put(PROBS), put(LABELS)),
    "nll": lambda put: ev.nll(put(PROBS), put(LABELS)),
    "expected_calibration_error": lambda put: ev.expected_calibration_error(
        put(PROBS), put(LABELS)
    ),
    "calibration_bins": lambda put: ev.calibration_bins(put(PROBS), put(LABELS), 5),
    "auroc": lambda put: ev.auroc(put(X[:, 0]), put(X_NOISE[:, 0]), return_stderr=True),
    "mmd2": lambda put: ev.mmd2(put(X), put(X_NOISE), return_stderr=True),
    "mmd_permutation_test": lambda put: ev.mmd_permutation_test(
        put(X), put(X_NOISE), n_permutations=20, generator=torch.Generator(put(X).device)
    ),
    "median_bandwidth": lambda put: ev.median_bandwidth(put(X), put(X_NOISE)),
    "frechet_distance": lambda put: ev.frechet_distance(put(X), put(X_NOISE)),
    "kernel_distance": lambda put: ev.kernel_distance(put(X), put(X_NOISE), subsets=4),
    "precision_recall": lambda put: ev.precision_recall(put(X), put(X_NOISE)),
    "sample_quality": lambda put: ev.sample_quality(put(X), put(X_NOISE)),
    "penultimate_features": lambda put: ev.penultimate_features(put(classifier()), put(X)),
    "inception_score": lambda put: ev.inception_score(put(PROBS.log()), splits=4),
    "inception_outputs": lambda put: ev.inception_outputs(
        put(inception()), put(IMAGES[:2].view(2, 1, 8, 8))
    ),
    "uniform_noise": lambda put: ev.uniform_noise(8, 4, (-1.0, 1.0), 3, device=put(X).device),
    "reliability_diagram": lambda put: drawn(
        lambda path: ev.reliability_diagram(put(PROBS), put(LABELS), path)
    ),
    "classification_rbm_loss": lambda put: L.classification_rbm_loss(
        put(classification_rbm()), put(BITS), put(LABELS[:8]), generator=device_generator(put, 1)
    ),
    "conditional_cd_loss": lambda put: L.conditional_cd_loss(
        put(conditional_rbm()), put(BITS[:, :3]), put(BITS), generator=device_generator(put, 1)
    ),
    "exact_nll": lambda put: L.exact_nll(put(boltzmann_machine()), put(BITS)),
    "boltzmann_log_partition": lambda put: P.boltzmann_log_partition(put(boltzmann_machine())),
    "log_partition": lambda put: P.log_partition(put(rbm())),
    "pairwise_log_partition": lambda put: P.pairwise_log_partition(
        put(UNARY.double()), put(CHAIN_POTENTIALS), put(CHAIN_EDGES)
    ),
    # damped to converge (89 iterations); undamped it oscillates for all 2,000
    "plefka_log_partition": lambda put: P.plefka_log_partition(
        put(boltzmann_machine()), damping=0.8
    ),
    "rbm_exact_samples": lambda put: P.rbm_exact_samples(
        put(rbm()), 8, generator=device_generator(put, 2)
    ),
    "perturbed_map": lambda put: P.perturbed_map(put(rbm()), 4, device_generator(put, 2)),
    "grid_points": lambda put: P.grid_points([(-1.0, 1.0), (-2.0, 2.0)], 5, put(X).device),
    "binary_states": lambda put: P.binary_states(4, device=put(X).device),
    "contrastive_divergence": lambda put: gradients(
        put(rbm()),
        lambda m: learn.ContrastiveDivergence(m, 2).accumulate(put(BITS), device_generator(put, 3)),
    ),
    "persistent_contrastive_divergence": lambda put: gradients(
        put(rbm()),
        lambda m: learn.ContrastiveDivergence(m, 1, persistent=True, n_chains=4).accumulate(
            put(BITS), device_generator(put, 3)
        ),
    ),
    "bm_contrastive_divergence": lambda put: gradients(
        put(boltzmann_machine()),
        lambda m: learn.BMContrastiveDivergence(m).loss(put(BITS), device_generator(put, 3)),
    ),
    "dbm_learning": lambda put: gradients(
        put(deep_boltzmann_machine()),
        lambda m: learn.DBMLearning(m, n_chains=4).accumulate(put(BITS), device_generator(put, 3)),
    ),
    "emf_learning": lambda put: gradients(
        put(rbm()), lambda m: learn.EMFLearning(m).loss(put(BITS))
    ),
    "perturb_and_map_learning": lambda put: gradients(
        put(rbm()),
        lambda m: learn.PerturbAndMAP(m, 4).loss(put(BITS), device_generator(put, 3)),
    ),
    "pretrain_dbm": lambda put: list(
        _pretrained(put(deep_boltzmann_machine()), put(BITS), device_generator(put, 4)).parameters()
    ),
    "energy_learner": lambda put: gradients(
        put(linear()),
        lambda m: learn.EnergyLearner(m, "hinge").step_loss(put(X), put(LABELS[:16]))[0],
    ),
    "tuned_ladder": lambda put: tuned_ladder(
        MALA(0.1),
        put(mlp()),
        put(X),
        0.2,
        pilot_temperatures=3,
        pilot_steps=20,
        generator=device_generator(put, 7),
    ),
    "geometric_path": lambda put: geometric_path(put(mlp()), put(gaussian()), 0.3)(put(X)),
    "random_crop_flip": lambda put: random_crop_flip(
        put(IMAGES), (1, 8, 8), device_generator(put, 9), pad=1, flip=True
    ),
    "random_affine": lambda put: random_affine(
        put(IMAGES),
        (1, 8, 8),
        torch.Generator(put(X).device).manual_seed(9),
        shift=1.0,
        rotate=10.0,
        scale=0.1,
    ),
}


def _plain(value):
    """Tensors to CPU tensors, records to dicts, for comparison."""
    if isinstance(value, torch.Tensor):
        return cf.cpu_value(value).detach()
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if k != "seconds"}
    if hasattr(value, "to_dict"):
        return _plain(value.to_dict())
    return value


def _float32_all(value):
    """Every float tensor in float32, for comparing float32 sums with float64 ones."""
    if isinstance(value, torch.Tensor):
        return value.float() if value.is_floating_point() else value
    if isinstance(value, list):
        return [_float32_all(v) for v in value]
    if isinstance(value, dict):
        return {k: _float32_all(v) for k, v in value.items()}
    return value


def _assert_same(got, want, rel=None, abs=None):
    """Equal up to rounding (torch's defaults for tensors), or within ``rel``/``abs``."""
    if isinstance(want, torch.Tensor):
        torch.testing.assert_close(got, want, rtol=rel, atol=abs)
    elif isinstance(want, list):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _assert_same(g, w, rel, abs)
    elif isinstance(want, dict):
        assert got.keys() == want.keys()
        for k in want:
            _assert_same(got[k], want[k], rel, abs)
    elif isinstance(want, float) and not math.isnan(want):
        assert got == pytest.approx(want, rel=rel or 1e-5, abs=abs or 1e-8)
    else:
        assert got == want or (got != got and want != want)


def _pairs(pairs: T.Pairs) -> tuple[torch.Tensor, torch.Tensor]:
    return pairs.x0, pairs.cost


# on the CPU the RBM annealing draws from a NumPy stream, elsewhere from torch's: the
# estimates then agree within their standard errors, not to the last digit
OTHER_STREAM = {"rbm_ais", "raise_"}

# these draw their random numbers in the wide dtype: without float64 the stream differs,
# so the draws are other draws of the same shape
WIDE_DRAWS = {"rbm_exact_samples", "perturbed_map", "perturb_and_map_learning", "double_well"}


def _shapes(value):
    if isinstance(value, torch.Tensor):
        return value.shape
    if isinstance(value, list):
        return [_shapes(v) for v in value]
    return type(value)


def _float32(value):
    """An input as a user of a device without float64 passes it: float32."""
    if isinstance(value, torch.Tensor) and value.dtype == torch.float64:
        return value.float()
    if isinstance(value, torch.nn.Module):
        return value.float()
    return value


@pytest.mark.parametrize("name", list(CASES))
def test_component_follows_the_device(name, float64):
    prepare = (lambda v: v) if float64 else _float32
    want = _plain(CASES[name](prepare))
    with cf.simulated_device(float64=float64):
        got = CASES[name](lambda v: cf.to_device(prepare(v)))
        outputs = [t for t in (got if isinstance(got, tuple) else (got,))]
        for out in outputs:
            if isinstance(out, torch.Tensor):
                assert cf.on_device(out), f"{name} returned a CPU tensor"
        got = _plain(got)
    # with float32 sums an adaptive estimator (SMC's next temperature) may take other
    # steps, so its estimate then agrees within the standard errors too
    adaptive = (
        not float64 and isinstance(want, dict) and want.get("stderr", 0) > 0 and "log_z" in want
    )
    if name in WIDE_DRAWS and not float64:
        assert _shapes(got) == _shapes(want)
    elif name in OTHER_STREAM or adaptive:
        error = math.hypot(got["stderr"], want["stderr"])
        assert abs(got["log_z"] - want["log_z"]) < 4 * error
    elif float64:
        _assert_same(got, want)
    else:  # float32 sums where the CPU's are float64: other iteration counts, close values
        got, want = _float32_all(got), _float32_all(want)
        if isinstance(want, dict):
            got.pop("cost", None), want.pop("cost", None)
        # a draw whose uniform falls at a cell's edge may pick the neighbouring cell
        tolerance = 6 / 64 if name == "quadrature_sample" else 1e-5
        _assert_same(got, want, rel=1e-4, abs=tolerance)
