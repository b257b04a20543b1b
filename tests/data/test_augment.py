import pytest
import torch

from ebmlab.data.augment import random_affine, random_crop_flip

SHAPE = (1, 16, 16)


def blob(n: int) -> torch.Tensor:
    """n copies of one bright pixel (+1) at the centre of a -1 background."""
    x = torch.full((n, *SHAPE), -1.0)
    x[:, 0, 7:9, 7:9] = 1.0
    return x.flatten(1)


def centroid(x: torch.Tensor) -> torch.Tensor:
    mass = (x + 1).view(-1, 16, 16)
    grid = torch.arange(16.0)
    total = mass.sum((1, 2))
    return (
        torch.stack([(mass.sum(2) * grid).sum(1), (mass.sum(1) * grid).sum(1)], 1) / total[:, None]
    )


def test_no_transform_is_the_identity():
    x = torch.rand(5, 256) * 2 - 1
    out = random_affine(x, SHAPE, torch.Generator().manual_seed(0), fill=-1.0)
    torch.testing.assert_close(out, x, atol=1e-5, rtol=0)


def test_shifts_are_uniform_within_the_bound():
    out = random_affine(blob(2000), SHAPE, torch.Generator().manual_seed(0), shift=2.0, fill=-1.0)
    move = centroid(out) - 7.5
    assert move.abs().max() <= 2.0 + 1e-4
    assert move.abs().max() > 1.9  # the whole range is used
    # uniform on [-2, 2]: mean 0, standard deviation 4 / sqrt(12)
    assert move.mean(0).abs().max() < 0.1
    torch.testing.assert_close(move.std(0), torch.full((2,), 4 / 12**0.5), atol=0.08, rtol=0)
    # bilinear resampling moves mass, it does not create it
    torch.testing.assert_close((out + 1).sum(1), (blob(2000) + 1).sum(1), atol=1e-3, rtol=0)


def test_rotation_and_zoom_keep_the_centre_and_fill_the_border():
    x = torch.full((300, 256), 1.0)
    out = random_affine(
        x, SHAPE, torch.Generator().manual_seed(1), rotate=45.0, scale=0.3, fill=-1.0
    ).view(-1, 16, 16)
    torch.testing.assert_close(out[:, 6:10, 6:10], torch.ones(300, 4, 4))  # centre stays inside
    corners = out[:, 0, 0]
    assert (corners < 0).float().mean() > 0.5  # rotated or zoomed-out corners come from outside
    assert out.min() >= -1 - 1e-6 and out.max() <= 1 + 1e-6


def test_validation():
    gen = torch.Generator()
    with pytest.raises(ValueError, match="shift"):
        random_affine(blob(1), SHAPE, gen, shift=-1.0)
    with pytest.raises(ValueError, match="scale"):
        random_affine(blob(1), SHAPE, gen, scale=1.5)


def test_crop_flip_identity_crops_and_mirrors():
    image = torch.arange(2 * 4 * 5, dtype=torch.float32).reshape(1, 2, 4, 5)
    x = image.flatten(1).repeat(400, 1)
    gen = torch.Generator().manual_seed(0)
    assert torch.equal(random_crop_flip(x, (2, 4, 5), gen), x)
    out = random_crop_flip(x, (2, 4, 5), gen, pad=2, flip=True, fill=-1.0).reshape(400, 2, 4, 5)
    padded = torch.nn.functional.pad(image, (2, 2, 2, 2), value=-1.0)[0]
    windows = {
        (dy, dx, m): padded[:, dy : dy + 4, dx : dx + 5].flip(2 if m else ())
        for dy in range(5)
        for dx in range(5)
        for m in (False, True)
    }
    seen = set()
    for o in out:
        match = [key for key, w in windows.items() if torch.equal(o, w)]
        assert match, "every output is a (mirrored) window of the padded image"
        seen.update(match)
    assert {(dy, dx) for dy, dx, _ in seen} == {(a, b) for a in range(5) for b in range(5)}
    assert {m for _, _, m in seen} == {False, True}
