import pytest
import torch

from ebmlab.data import load_dataset


def test_book_split_sizes_and_order():
    sizes = {s: len(load_dataset("digits", s)) for s in ("train", "val", "test")}
    assert sizes == {"train": 1000, "val": 350, "test": 447}
    from sklearn.datasets import load_digits

    ref = load_digits()
    test = load_dataset("digits", "test", transform="raw")
    assert torch.equal(test.x[0], torch.tensor(ref.data[1350], dtype=torch.float32))
    assert int(test.y[-1]) == int(ref.target[-1])


def test_transforms():
    raw = load_dataset("digits", transform="raw")
    scaled = load_dataset("digits", transform="scaled")
    binary = load_dataset("digits", transform="binary")
    assert raw.x.max() == 16 and raw.x.min() == 0
    torch.testing.assert_close(scaled.x, 2 * raw.x / 17 - 1)
    assert torch.equal(binary.x, (raw.x >= 8).float())
    assert scaled.value_range == (-1.0, 1.0) and binary.value_range == (0.0, 1.0)


def test_image_layout():
    d = load_dataset("digits", flatten=False, n=5)
    assert d.x.shape == (5, 1, 8, 8) and d.image_shape == (1, 8, 8) and d.num_classes == 10


def test_bad_split_and_transform():
    with pytest.raises(ValueError, match="split must be one of"):
        load_dataset("digits", "validation")
    with pytest.raises(ValueError, match="transform must be one of"):
        load_dataset("digits", transform="normalised")
