import pytest
import torch

from ebmlab.samplers import ReplayBuffer, gaussian_init, mixture_init, uniform_init


def test_sample_push_and_reinit_fraction():
    gen = torch.Generator().manual_seed(0)
    buf = ReplayBuffer(1000, uniform_init((2,)), reinit_prob=0.0, generator=gen)
    starts, slots = buf.sample(50, gen)
    torch.testing.assert_close(starts, buf.buffer[slots])
    buf.push(torch.full((50, 2), 9.0), slots)
    assert (buf.buffer[slots] == 9.0).all()

    buf = ReplayBuffer(100, lambda n, g=None: torch.zeros(n, 1), reinit_prob=0.3)
    buf.buffer.fill_(5.0)
    starts, _ = buf.sample(20_000, gen)
    assert abs(float((starts == 0).double().mean()) - 0.3) < 0.02


def test_state_round_trip_and_shape_check():
    buf = ReplayBuffer(10, uniform_init((3,)))
    other = ReplayBuffer(10, uniform_init((3,)))
    other.load_state_dict(buf.state_dict())
    assert torch.equal(other.buffer, buf.buffer)
    with pytest.raises(ValueError, match="replay buffer state has shape"):
        ReplayBuffer(5, uniform_init((3,))).load_state_dict(buf.state_dict())
    with pytest.raises(ValueError, match="reinit_prob must lie in"):
        ReplayBuffer(5, uniform_init((3,)), reinit_prob=1.5)


def test_per_class_segments():
    buf = ReplayBuffer(
        30, lambda n, g=None: torch.arange(n, dtype=torch.float32)[:, None], 0.0, n_classes=3
    )
    y = torch.tensor([0, 1, 2, 2])
    starts, slots = buf.sample(4, torch.Generator().manual_seed(0), y=y)
    assert ((slots // 10) == y).all() and torch.equal(starts[:, 0], slots.float())
    with pytest.raises(ValueError, match="y must be given exactly"):
        buf.sample(4)
    with pytest.raises(ValueError, match="multiple of n_classes"):
        ReplayBuffer(31, uniform_init((1,)), n_classes=3)


def test_gaussian_init_recovers_each_class_moments_and_weights():
    gen = torch.Generator().manual_seed(0)
    a = torch.tensor([[1.0, 0.0, 0.0], [0.8, 0.5, 0.0], [0.0, -0.3, 0.2]])
    data = torch.cat(
        [torch.randn(1000, 3, generator=gen) @ a.T + 10, torch.randn(3000, 3, generator=gen) - 10]
    )
    labels = torch.cat([torch.zeros(1000), torch.ones(3000)]).long()
    init = gaussian_init(data.reshape(-1, 1, 3), labels, ridge=0.01)
    x = init(40_000, gen)
    assert x.shape == (40_000, 1, 3)
    x = x.flatten(1)
    first = x[:, 0] > 0
    assert abs(float(first.double().mean()) - 0.25) < 4 * (0.25 * 0.75 / 40_000) ** 0.5
    for rows, block in ((first, data[:1000]), (~first, data[1000:])):
        n = int(rows.sum())
        cov = torch.cov(block.T, correction=0) + 0.01 * torch.eye(3)
        stderr = (cov.diagonal() / n).sqrt()
        assert ((x[rows].mean(0) - block.mean(0)).abs() < 4 * stderr).all()
        torch.testing.assert_close(torch.cov(x[rows].T), cov, atol=0.05, rtol=0.05)


def test_gaussian_init_clamps_and_checks_its_arguments():
    data = torch.randn(50, 4)
    x = gaussian_init(data, clamp=(-0.5, 0.5))(200, torch.Generator().manual_seed(1))
    assert x.min() == -0.5 and x.max() == 0.5
    with pytest.raises(ValueError, match="labels must be"):
        gaussian_init(data, torch.zeros(49).long())
    with pytest.raises(ValueError, match="at least two rows"):
        gaussian_init(data, torch.cat([torch.zeros(49), torch.ones(1)]).long())
    with pytest.raises(ValueError, match="data must be a float tensor"):
        gaussian_init(torch.zeros(5, dtype=torch.long))


def test_mixture_init_draws_each_part_with_its_weight():
    gen = torch.Generator().manual_seed(2)
    parts = [lambda n, g=None: torch.zeros(n, 1, 2), lambda n, g=None: torch.ones(n, 1, 2)]
    x = mixture_init(parts, [1.0, 3.0])(20_000, gen)
    assert x.shape == (20_000, 1, 2) and bool((x[:, 0, 0] == x[:, 0, 1]).all())
    assert abs(float(x.mean()) - 0.75) < 4 * (0.75 * 0.25 / 20_000) ** 0.5
    assert mixture_init(parts)(0, gen).shape == (0, 1, 2)
    assert gaussian_init(torch.randn(10, 3))(0, gen).shape == (0, 3)
    with pytest.raises(ValueError, match="weights must be 2 numbers"):
        mixture_init(parts, [1.0, -1.0])
    with pytest.raises(ValueError, match="at least one"):
        mixture_init([])


def test_a_slot_drawn_twice_keeps_the_last_chain_whole():
    """Duplicate slots on two threads: each slot holds the last chain pushed to it, all of
    its elements (a plain indexed write leaves a run-dependent mix of chains)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for seed in range(20):
            buf = ReplayBuffer(10, lambda n, g=None: torch.zeros(n, 64), reinit_prob=0.0)
            slots = torch.randint(10, (64,), generator=torch.Generator().manual_seed(seed))
            buf.push(torch.arange(64.0)[:, None].expand(64, 64), slots)
            last = {s: i for i, s in enumerate(slots.tolist())}
            for s in range(10):
                assert buf.buffer[s].eq(last.get(s, 0)).all(), (seed, s)
    finally:
        torch.set_num_threads(threads)


def test_distinct_draws_stored_chains_without_repeats_and_leaves_the_buffer():
    buf = ReplayBuffer(50, lambda n, g=None: torch.arange(n, dtype=torch.float32).view(n, 1),
                       reinit_prob=1.0)  # fmt: skip
    before = buf.buffer.clone()
    g = torch.Generator().manual_seed(0)
    x = buf.distinct(30, g)
    assert x.shape == (30, 1) and len(x.unique()) == 30  # no repeats, no fresh starts
    assert set(x.flatten().tolist()) <= set(range(50))
    x[:] = -1.0  # a copy: writing to it leaves the buffer
    assert torch.equal(buf.buffer, before)
    assert sorted(buf.distinct(80, g).flatten().tolist()) == list(range(50))  # capped
    with pytest.raises(ValueError, match="n"):
        buf.distinct(0)
