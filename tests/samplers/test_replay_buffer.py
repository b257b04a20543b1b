import pytest
import torch

from ebmlab.samplers import ReplayBuffer, uniform_init


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
