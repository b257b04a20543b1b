"""The FID tools' Inception-v3: the published layout, reading its weights file as tensors
only, what the forward pass does to images, and the Inception score's closed forms."""

import math
import pickle
import zipfile

import numpy as np
import pytest
import torch

from ebmlab._checks import ArgumentError
from ebmlab.evaluation import InceptionV3, inception_outputs, inception_score, load_inception
from ebmlab.evaluation.inception import _average, resize_like_tensorflow

# torchvision documents 27,161,264 parameters for its Inception-v3, whose auxiliary head
# (3,326,696 of them) the FID port lacks and whose classifier has 1000 outputs, not 1008
PUBLISHED_PARAMETERS = 27_161_264 - 3_326_696 + 8 * (2048 + 1)

# names and shapes of the port's state dict, one from each kind of block
PUBLISHED_SHAPES = {
    "Conv2d_1a_3x3.conv.weight": (32, 3, 3, 3),
    "Conv2d_4a_3x3.bn.running_var": (192,),
    "Mixed_5b.branch_pool.conv.weight": (32, 192, 1, 1),
    "Mixed_6a.branch3x3.conv.weight": (384, 288, 3, 3),
    "Mixed_6e.branch7x7dbl_5.conv.weight": (192, 192, 1, 7),
    "Mixed_7a.branch7x7x3_4.conv.weight": (192, 192, 3, 3),
    "Mixed_7b.branch3x3dbl_3b.conv.weight": (384, 384, 3, 1),
    "Mixed_7c.branch_pool.conv.weight": (192, 2048, 1, 1),
    "fc.weight": (1008, 2048),
    "fc.bias": (1008,),
}


def test_the_network_has_the_published_parameters():
    network = InceptionV3()
    assert sum(p.numel() for p in network.parameters()) == PUBLISHED_PARAMETERS
    shapes = {k: tuple(v.shape) for k, v in network.state_dict().items()}
    for name, shape in PUBLISHED_SHAPES.items():
        assert shapes[name] == shape


def test_a_published_file_loads_and_gives_its_network(inception_weights):
    path, network = inception_weights
    loaded = load_inception(path)
    assert not loaded.training
    assert not any(p.requires_grad for p in loaded.parameters())
    images = torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = network(images)
    got = inception_outputs(loaded, images)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.float(), w)


def test_a_file_in_the_old_format_without_step_counters_loads(tmp_path, inception_weights):
    """Ports saved before torch's zip format, and before batch norm counted its steps (no
    num_batches_tracked), load too."""
    network = inception_weights[1]
    state = {k: v for k, v in network.state_dict().items() if "num_batches_tracked" not in k}
    torch.save(state, tmp_path / "old.pth", _use_new_zipfile_serialization=False)
    assert not zipfile.is_zipfile(tmp_path / "old.pth")
    loaded = load_inception(tmp_path / "old.pth")
    torch.testing.assert_close(loaded.fc.weight, network.fc.weight)


class _Planted:
    """Unpickling this would create a file: the proof that code ran."""

    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (open, (str(self.target), "w"))


def test_loading_never_runs_code_from_the_file(tmp_path):
    target = tmp_path / "ran"
    path = tmp_path / "weights.pth"
    torch.save({"fc.weight": _Planted(target)}, path, pickle_module=pickle)
    with pytest.raises(ArgumentError, match="readable without running code"):
        load_inception(path)
    assert not target.exists()


def test_files_that_are_not_the_port_are_refused(tmp_path, inception_weights):
    path, network = inception_weights
    with pytest.raises(ArgumentError, match="no file"):
        load_inception(tmp_path / "missing.pth")
    truncated = tmp_path / "truncated.pth"
    truncated.write_bytes(path.read_bytes()[:100_000])
    with pytest.raises(ArgumentError, match=r"truncated\.pth"):
        load_inception(truncated)
    state = network.state_dict()
    torch.save({k: v for k, v in state.items() if not k.startswith("fc.")}, tmp_path / "a.pth")
    with pytest.raises(ArgumentError, match=r"2 names missing, e.g. \['fc.bias', 'fc.weight'\]"):
        load_inception(tmp_path / "a.pth")
    torch.save({**state, "fc.weight": torch.zeros(1000, 2048)}, tmp_path / "b.pth")
    with pytest.raises(ArgumentError, match=r"fc.weight has shape \(1000, 2048\)"):
        load_inception(tmp_path / "b.pth")
    torch.save([1, 2], tmp_path / "c.pth")
    with pytest.raises(ArgumentError, match="expected a dict of tensors"):
        load_inception(tmp_path / "c.pth")


def test_features_and_the_logits_of_the_inception_score(inception_weights):
    """Logits are the pool features times the classifier's weights, without its bias (as
    the original Inception-score code computes them); grey images are the colour image
    with three equal channels."""
    network = inception_weights[1]
    grey = torch.rand(2, 1, 28, 28, generator=torch.Generator().manual_seed(3))
    features, logits = inception_outputs(network, grey)
    assert features.shape == (2, 2048) and logits.shape == (2, 1008)
    torch.testing.assert_close(logits.float(), features.float() @ network.fc.weight.T)
    colour, _ = inception_outputs(network, grey.expand(-1, 3, -1, -1))
    torch.testing.assert_close(colour, features)
    with pytest.raises(ArgumentError, match="1 or 3 channels"):
        inception_outputs(network, torch.rand(2, 2, 8, 8))


def test_the_tensorflow_resize_reads_source_pixels_without_half_pixel_offsets():
    """Output i reads the input at i * in / out: 2 -> 4 gives x0, (x0 + x1) / 2, x1, x1
    (PyTorch's half-pixel rule would give x0, (3 x0 + x1) / 4, (x0 + 3 x1) / 4, x1); an
    image already at the size is left as it is."""
    x = torch.tensor([[[[0.0, 4.0], [8.0, 16.0]]]])
    resized = resize_like_tensorflow(x, 4)
    torch.testing.assert_close(resized[0, 0, 0], torch.tensor([0.0, 2.0, 4.0, 4.0]))
    torch.testing.assert_close(resized[0, 0, :, 0], torch.tensor([0.0, 4.0, 8.0, 8.0]))
    torch.testing.assert_close(resized[0, 0, 1], torch.tensor([4.0, 7.0, 10.0, 10.0]))
    same = torch.rand(1, 3, 299, 299)
    assert torch.equal(resize_like_tensorflow(same, 299), same)


def test_the_tensorflow_preprocessing_sees_8_bit_pixels(inception_weights):
    """Pixels are quantised to 8 bits, as saved samples are: a change below half a grey
    level changes nothing, while pytorch-fid's preprocessing sees it."""
    network = inception_weights[1]
    levels = torch.randint(256, (2, 3, 16, 16), generator=torch.Generator().manual_seed(4)) / 255
    nudged = levels + 0.3 / 255
    torch.testing.assert_close(*(inception_outputs(network, x)[0] for x in (levels, nudged)),
                               rtol=0, atol=0)  # fmt: skip
    plain = InceptionV3("pytorch-fid").eval()
    plain.load_state_dict(network.state_dict())
    a, b = (inception_outputs(plain, x)[0] for x in (levels, nudged))
    assert not torch.equal(a, b)
    with pytest.raises(ArgumentError, match="preprocessing must be one of"):
        InceptionV3("keras")


def test_the_inner_average_pools_leave_the_padding_out():
    """The port's pools average over the pixels inside the image only: a constant image
    stays constant, corners included (zeros counted in would give 4/9 there)."""
    pooled = _average(torch.ones(1, 1, 5, 5))
    torch.testing.assert_close(pooled, torch.ones(1, 1, 5, 5))


def test_inception_score_closed_forms():
    k, n = 10, 200
    assert inception_score(torch.zeros(n, k)) == pytest.approx((1.0, 0.0))
    certain = 50.0 * torch.nn.functional.one_hot(torch.arange(n) % k, k)
    score, stderr = inception_score(certain)
    assert score == pytest.approx(k, rel=1e-6) and stderr == pytest.approx(0, abs=1e-5)


def test_inception_score_matches_its_definition_per_split():
    """Against the formula written out in NumPy: mean over splits of exp(mean KL)."""
    logits = 3 * torch.randn(103, 7, generator=torch.Generator().manual_seed(4))
    p = torch.softmax(logits.double(), 1).numpy()
    scores = []
    for part in np.array_split(p, 5):
        marginal = part.mean(0)
        scores.append(math.exp(np.mean(np.sum(part * np.log(part / marginal), 1))))
    score, stderr = inception_score(logits, splits=5)
    assert score == pytest.approx(np.mean(scores), rel=1e-9)
    assert stderr == pytest.approx(np.std(scores, ddof=1) / math.sqrt(5), rel=1e-9)


def test_inception_score_refuses_too_few_samples():
    with pytest.raises(ArgumentError, match="splits"):
        inception_score(torch.zeros(10, 3), splits=10)
    with pytest.raises(ArgumentError, match="splits"):
        inception_score(torch.zeros(10, 3), splits=1)
