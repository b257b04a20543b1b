"""The conditional RBM against exact answers: quadrature of its conditional density,
the exact conditional mean against Gibbs sampling, and the linear autoregression it
reduces to without hidden units."""

import pytest
import torch

from ebmlab.energies import ConditionalRBM
from ebmlab.losses import conditional_cd_loss


def random_model(n_visible=1, n_hidden=3, order=2, seed=0) -> ConditionalRBM:
    torch.manual_seed(seed)
    model = ConditionalRBM(n_visible, n_hidden, order, init_std=0.8).double()
    with torch.no_grad():
        model.b.normal_()
        model.c.normal_()
        model.log_sigma.normal_(0, 0.3)
    return model.requires_grad_(False)


def test_conditional_density_integrates_to_one():
    model = random_model()
    history = torch.randn(3, 2, dtype=torch.double)
    grid = torch.linspace(-20, 20, 40001, dtype=torch.double)
    for row in history:
        log_p = model.log_likelihood(grid[:, None], row.expand(len(grid), 2))
        mass = torch.trapezoid(log_p.exp(), grid)
        assert float(mass) == pytest.approx(1.0, abs=1e-8)
        mean = torch.trapezoid(grid * log_p.exp(), grid)
        assert float(mean) == pytest.approx(float(model.predict(row[None])[0, 0]), abs=1e-8)


def test_gibbs_sampling_recovers_the_exact_conditional_mean():
    model = random_model(n_visible=3, n_hidden=4, order=1)
    history = torch.randn(1, 3, dtype=torch.double).expand(20000, 3)
    generator = torch.Generator().manual_seed(0)
    v = model.gibbs(torch.zeros(20000, 3, dtype=torch.double), history, 200, generator)
    stderr = v.std(0) / len(v) ** 0.5
    assert torch.all((v.mean(0) - model.predict(history[:1])[0]).abs() < 5 * stderr)


def test_windows_stack_the_history_most_recent_first():
    model = ConditionalRBM(2, 3, order=2)
    frames = torch.arange(10.0).view(5, 2)  # frame t is (2t, 2t + 1)
    targets, history = model.windows(frames)
    assert targets.tolist() == [[4, 5], [6, 7], [8, 9]]
    assert history[0].tolist() == [2, 3, 0, 1]
    with pytest.raises(ValueError, match="longer than the model's order 2"):
        model.windows(frames[:2])
    with pytest.raises(ValueError, match=r"frames must be \(T, 2\)"):
        model.windows(torch.zeros(5, 3))


def test_without_hidden_units_it_is_the_least_squares_autoregression():
    torch.manual_seed(0)
    frames = torch.cumsum(torch.randn(2, 300, 2, dtype=torch.double), 1)
    model = ConditionalRBM(2, 2, order=3, init_std=0.0).double()
    v, x = model.windows(frames)
    model.fit_autoregression(v, x)
    design = torch.cat([x, torch.ones(len(x), 1, dtype=torch.double)], 1)
    coef = torch.linalg.lstsq(design, v).solution
    with torch.no_grad():
        prediction = model.predict(x)
        residual = v - prediction
    assert torch.allclose(prediction, design @ coef, atol=1e-8)
    assert torch.allclose(model.sigma, residual.std(0).to(model.sigma.dtype), rtol=1e-6)


def test_cd_training_raises_the_conditional_likelihood_and_generates():
    model = ConditionalRBM(2, 4, order=2).double()
    t = torch.arange(400, dtype=torch.double) * 0.3
    frames = torch.stack([torch.sin(t), torch.cos(2 * t).sign()], 1)  # one smooth, one switching
    v, x = model.windows(frames)
    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    with torch.no_grad():
        before = float(model.log_likelihood(v, x).mean())
    for _ in range(300):
        optimizer.zero_grad()
        conditional_cd_loss(model, v, x, k=1, generator=generator).backward()
        optimizer.step()
    with torch.no_grad():
        assert float(model.log_likelihood(v, x).mean()) > before + 1.0
        sequences = model.generate(frames[:2], 5, generator=generator)
    assert sequences.shape == (5, 2) and torch.isfinite(sequences).all()


@pytest.mark.slow
def test_on_simulated_walking_it_predicts_the_next_frame_better_than_linear_autoregression():
    from ebmlab.data.motion import JOINTS, walking_gaits

    clean = walking_gaits(4, 50, noise=0.0)
    assert clean.shape == (4, 50, len(JOINTS)) and clean[:, :, [1, 4]].min() >= 0  # knees flex
    torch.manual_seed(0)
    model = ConditionalRBM(len(JOINTS), 8, order=2, init_std=0.1).double()
    v, x = model.windows(walking_gaits(seed=0).double())
    vt, xt = model.windows(walking_gaits(seed=1).double())
    design = torch.cat([x, torch.ones(len(x), 1, dtype=torch.double)], 1)
    coef = torch.linalg.lstsq(design, v).solution  # the linear autoregression
    linear = float(((torch.cat([xt, torch.ones(len(xt), 1)], 1) @ coef - vt) ** 2).mean())
    model.fit_autoregression(v, x)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.003)
    generator = torch.Generator().manual_seed(0)
    for _ in range(40):
        for idx in torch.randperm(len(v), generator=generator).split(100):
            optimizer.zero_grad()
            conditional_cd_loss(model, v[idx], x[idx], generator=generator).backward()
            optimizer.step()
    with torch.no_grad():
        error = float(((model.predict(xt) - vt) ** 2).mean())
    assert error < 0.85 * linear, (error, linear)  # 0.00130 against 0.00170
