"""The convolutional RBM against exact answers: its dense unrolling, enumeration of its
states, AIS, Gibbs marginals, and CD on the digits."""

import pytest
import torch

from ebmlab.data import load_dataset
from ebmlab.energies import ConvolutionalRBM
from ebmlab.energies.boltzmann import base_rate_logits, binary_states
from ebmlab.evaluation import log_likelihood
from ebmlab.learning import ContrastiveDivergence
from ebmlab.partition import log_partition
from ebmlab.testing import assert_mean_close


def random_model(
    image_shape=(2, 4, 3), n_filters=2, filter_size=2, visible="binary", visible_bias="channel"
):
    torch.manual_seed(0)
    model = ConvolutionalRBM(image_shape, n_filters, filter_size, visible, visible_bias, 0.8)
    with torch.no_grad():
        model.b.normal_(0, 0.5)
        model.c.normal_(0, 0.5)
    return model.double().requires_grad_(False)


@pytest.mark.parametrize("visible", ["binary", "gaussian"])
@pytest.mark.parametrize("visible_bias", ["channel", "pixel"])
def test_dense_view_has_the_same_energy_and_conditionals(visible, visible_bias):
    model = random_model(visible=visible, visible_bias=visible_bias)
    dense = model.as_rbm()
    v = torch.randn(5, 2, 4, 3, dtype=torch.double)
    v = (v > 0).double() if visible == "binary" else v
    h = (torch.rand(5, model.n_hidden, dtype=torch.double) > 0.5).double()
    assert torch.allclose(model.free_energy(v), dense.free_energy(v.flatten(1)), atol=1e-10)
    assert torch.allclose(model.joint_energy(v, h), dense.joint_energy(v.flatten(1), h), atol=1e-10)
    assert torch.allclose(model.hidden_logits(v), dense.hidden_logits(v.flatten(1)), atol=1e-10)
    assert torch.allclose(model.visible_mean(h), dense.visible_mean(h), atol=1e-10)


def test_free_energy_sums_the_feature_maps_out():
    model = random_model(image_shape=(1, 3, 3))
    hs = binary_states(model.n_hidden).double()  # 2 maps of 2 x 2
    v = (torch.rand(4, 9, dtype=torch.double) > 0.5).double()
    for row in v:
        joint = model.joint_energy(row.expand(len(hs), 9), hs)
        assert float(model.free_energy(row[None])[0]) == pytest.approx(
            float(-torch.logsumexp(-joint, 0)), abs=1e-10
        )


def test_exact_log_z_matches_enumeration_and_ais_agrees():
    model = random_model(image_shape=(1, 4, 4), n_filters=2, filter_size=3, visible_bias="pixel")
    states = binary_states(16).double()
    brute = float(torch.logsumexp(-model.free_energy(states), 0))
    assert log_partition(model, "exact").log_z == pytest.approx(brute, abs=1e-9)
    ais = log_partition(model, "ais", n_chains=200, n_temperatures=500, generator=0)
    assert abs(ais.log_z - brute) < 0.05 and ais.stderr < 0.02


def test_gibbs_recovers_the_exact_visible_marginals():
    model = random_model(image_shape=(1, 3, 4), n_filters=2, filter_size=2)
    states = binary_states(12).double()
    log_p = -model.free_energy(states) - log_partition(model, "exact").log_z
    exact = log_p.exp() @ states
    generator = torch.Generator().manual_seed(0)
    v = model.gibbs(torch.zeros(4000, 12, dtype=torch.double), 100, generator)
    assert_mean_close(v, exact, k=5)


def test_bad_shapes_fail_clearly():
    with pytest.raises(ValueError, match="filter_size must be at most the image's side 8"):
        ConvolutionalRBM((8, 8), 4, 9)
    with pytest.raises(ValueError, match="visible must be one of"):
        ConvolutionalRBM((8, 8), 4, 3, visible="poisson")
    with pytest.raises(ValueError, match=r"v must be images of shape \(1, 8, 8\)"):
        ConvolutionalRBM((8, 8), 4, 3).free_energy(torch.zeros(2, 63))


def test_persistent_cd_with_a_sparsity_target_learns_the_digits():
    train = load_dataset("digits", "train", transform="binary")
    test = load_dataset("digits", "test", transform="binary")
    torch.manual_seed(0)
    model = ConvolutionalRBM((8, 8), 8, 5, visible_bias="pixel", init_std=0.1)
    with torch.no_grad():
        model.b.copy_(base_rate_logits(train.x).view(1, 8, 8))
    cd = ContrastiveDivergence(model, 1, persistent=True, sparsity_target=0.1, sparsity_cost=1.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    generator = torch.Generator().manual_seed(0)
    for _ in range(15):
        for idx in torch.randperm(len(train.x), generator=generator).split(50):
            optimizer.zero_grad()
            cd.accumulate(train.x[idx], generator)
            optimizer.step()
    log_z = log_partition(
        model, "ais", data=train.x, n_chains=100, n_temperatures=1000, generator=0
    )
    # the independent-pixel model with the data's base rates, for comparison
    rates = torch.sigmoid(base_rate_logits(train.x)).float()
    independent = (test.x * rates.log() + (1 - test.x) * (1 - rates).log()).sum(1).mean()
    assert log_likelihood(model, test.x, log_z).mean > float(independent) + 2
    with torch.no_grad():
        assert abs(float(model.hidden_probs(train.x).mean()) - 0.1) < 0.03
