"""Inception-v3 features for FID, KID and the Inception score: ebmlab's network against
the tools users run instead, on the same weights, each row with its own preprocessing:

- torch-fidelity's ``FeatureExtractorInceptionV3`` (``pip install torch-fidelity``),
  against ebmlab's default ``"tensorflow"`` preprocessing (8-bit pixels, TensorFlow 1's
  bilinear resize), pool features and the Inception score's logits;
- pytorch-fid's ``InceptionV3`` (``pip install pytorch-fid``), against ebmlab's
  ``"pytorch-fid"`` preprocessing, pool features.

A row is left out when its tool (or the torchvision it imports) is absent. Both networks
get one state dict: random weights whose batch-norm statistics are fitted to images, so
that features vary from image to image (the published file is not needed). A row's title
gives the largest difference between the two networks' outputs, relative to the largest
output; the timing is of 64 CIFAR-size images, resized to 299 x 299 by each.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import torch

from benchmarks.harness import Case
from ebmlab.evaluation import InceptionV3, inception_outputs, load_inception

N, SIZE = 64, 32


def fitted_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    """A state dict of the port's layout: random weights, batch-norm statistics of the
    activations of random images."""
    torch.manual_seed(seed)
    network = InceptionV3()
    for m in network.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.momentum = None  # the plain average over the batches seen
            torch.nn.init.uniform_(m.weight, 0.5, 1.5)
            torch.nn.init.normal_(m.bias, 0, 0.2)
    with torch.no_grad():
        network.train()(torch.rand(24, 3, 64, 64))
    return network.state_dict()


def _relative(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return float((ours.float() - theirs).abs().max() / theirs.abs().max())


def _case(tool: str, ours: Callable[[], object], theirs: Callable[[], object], note: str) -> Case:
    return Case(f"Inception-v3 {note}, {N} images {SIZE}x{SIZE} (same weights)",
                ours, theirs, tool, repeats=3)  # fmt: skip


def cases() -> list:
    state = fitted_weights()
    images = torch.rand(N, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "weights.pth"
        torch.save(state, path)
        try:
            from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3
        except ImportError:
            pass
        else:
            ours = load_inception(path)
            outputs = ["2048", "logits_unbiased"]  # pool features, the IS's logits
            theirs = FeatureExtractorInceptionV3(
                "inception-v3-compat", outputs, feature_extractor_weights_path=str(path)
            )
            pixels = torch.floor(images * 255 + 0.5).to(torch.uint8)

            def fidelity() -> tuple[torch.Tensor, torch.Tensor]:
                with torch.no_grad():
                    return theirs(pixels)

            got, want = inception_outputs(ours, images), fidelity()
            differences = [f"{_relative(g, w):.0e}" for g, w in zip(got, want, strict=True)]
            note = ("features and IS logits, TensorFlow preprocessing (largest differences "
                    f"{' and '.join(differences)})")  # fmt: skip
            rows.append(_case("torch-fidelity", lambda: inception_outputs(ours, images), fidelity,
                              note))  # fmt: skip
        try:
            import pytorch_fid.inception as fid
        except ImportError:
            pass
        else:
            plain = load_inception(path, preprocessing="pytorch-fid")
            with mock.patch.object(fid, "load_state_dict_from_url", lambda *a, **k: dict(state)):
                reference = fid.InceptionV3([fid.InceptionV3.DEFAULT_BLOCK_INDEX]).eval()

            def pytorch_fid() -> torch.Tensor:
                with torch.no_grad():
                    return reference(images)[0].flatten(1)

            difference = _relative(inception_outputs(plain, images)[0], pytorch_fid())
            note = f"features, pytorch-fid preprocessing (largest difference {difference:.0e})"
            rows.append(_case("pytorch-fid", lambda: inception_outputs(plain, images), pytorch_fid,
                              note))  # fmt: skip
    return rows
