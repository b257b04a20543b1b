import pytest
import torch

from ebmlab.data import load_dataset


def test_book_split_sizes_and_order():
    sizes = {s: len(load_dataset("digits", s)) for s in ("train", "val", "test")}
    assert sizes == {"train": 1000, "val": 350, "test": 447}
    from sklearn.datasets import load_digits

    ref = load_digits()  # every image and label as scikit-learn's loader gives them
    for split, rows in (("train", slice(0, 1000)), ("val", slice(1000, 1350)),
                        ("test", slice(1350, 1797))):  # fmt: skip
        part = load_dataset("digits", split, transform="raw")
        assert torch.equal(part.x, torch.tensor(ref.data[rows], dtype=torch.float32))
        assert torch.equal(part.y, torch.tensor(ref.target[rows]))


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


def test_digits_rgb_keeps_labels_and_contrast():
    grey = load_dataset("digits", "val", transform="raw", flatten=False)
    rgb = load_dataset("digits-rgb", "val", transform="raw", flatten=False)
    assert rgb.x.shape == (350, 3, 8, 8) and rgb.image_shape == (3, 8, 8)
    assert torch.equal(rgb.y, grey.y) and rgb.num_classes == 10
    # ink pixels (grey level 16) are lighter than paper pixels (0) in every channel
    ink = rgb.x.permute(1, 0, 2, 3)[:, grey.x[:, 0] == 16]
    paper = rgb.x.permute(1, 0, 2, 3)[:, grey.x[:, 0] == 0]
    assert ink.min() >= 145 and paper.max() <= 110
