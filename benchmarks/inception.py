"""Inception-v3 features for FID, KID and the Inception score: ebmlab's network against
pytorch-fid's (``pip install pytorch-fid``, with torchvision; the row is left out when
either is absent), on the same weights.

Both networks get one state dict: random weights whose batch-norm statistics are fitted
to images, so that the features vary from image to image (the published file is not
needed). The row's title gives the largest difference between the two networks'
features, relative to the largest feature; the timing is of 64 CIFAR-size images,
resized to 299 x 299 by each.
"""

from __future__ import annotations

from unittest import mock

import torch

from benchmarks.harness import Case
from ebmlab.evaluation import InceptionV3, inception_outputs

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


def cases() -> list:
    try:
        import pytorch_fid.inception as fid
    except ImportError:
        return []
    state = fitted_weights()
    ours = InceptionV3().eval()
    ours.load_state_dict(state)
    with mock.patch.object(fid, "load_state_dict_from_url", lambda *a, **k: dict(state)):
        theirs = fid.InceptionV3([fid.InceptionV3.DEFAULT_BLOCK_INDEX]).eval()
    images = torch.rand(N, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))

    def reference() -> torch.Tensor:
        with torch.no_grad():
            return theirs(images)[0].flatten(1)

    want = reference()
    difference = float((inception_outputs(ours, images)[0].float() - want).abs().max())
    relative = difference / float(want.abs().max())
    return [
        Case(
            f"Inception-v3 pool features, {N} images {SIZE}x{SIZE} "
            f"(same weights; largest difference {relative:.0e} of the largest feature)",
            lambda: inception_outputs(ours, images),
            reference,
            "pytorch-fid InceptionV3",
            repeats=3,
        )
    ]
