import pytest
import torch

from ebmlab.data import load_dataset
from ebmlab.energies import ClassificationRBM
from ebmlab.losses import classification_rbm_loss


@pytest.mark.parametrize(
    ("mode", "min_accuracy"), [("discriminative", 0.82), ("hybrid", 0.82), ("generative", 0.6)]
)
def test_each_training_mode_learns_digits(mode, min_accuracy):
    train = load_dataset("digits", "train", transform="binary")
    test = load_dataset("digits", "test", transform="binary")
    torch.manual_seed(0)
    model = ClassificationRBM(64, 64, 10, init_std=0.05)
    opt = torch.optim.Adam(model.parameters(), lr=0.01 if mode != "generative" else 0.003)
    gen = torch.Generator().manual_seed(0)
    for _ in range(15):
        for idx in torch.randperm(len(train), generator=gen).split(50):
            loss = classification_rbm_loss(
                model, train.x[idx], train.y[idx], mode=mode, generator=gen
            )
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        accuracy = float((model.predict(test.x) == test.y).double().mean())
    assert accuracy > min_accuracy
