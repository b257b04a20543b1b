import os
import pickle

import pytest
import torch

from ebmlab.training import CheckpointError, load_checkpoint, save_checkpoint


class Exploit:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_round_trip(tmp_path):
    state = {
        "w": torch.randn(3),
        "meta": {"step": 4, "best": float("inf")},
        "rng": torch.get_rng_state(),
    }
    save_checkpoint(state, tmp_path / "c.pt")
    loaded = load_checkpoint(tmp_path / "c.pt")
    assert torch.equal(loaded["w"], state["w"]) and loaded["meta"] == state["meta"]
    assert not list(tmp_path.glob(".*tmp"))


def test_malicious_pickle_is_refused(tmp_path):
    path = tmp_path / "evil.pt"
    with open(path, "wb") as fh:
        pickle.dump({"model": Exploit()}, fh, protocol=2)
    with pytest.raises(CheckpointError, match="refused to load"):
        load_checkpoint(path)
    torch.save({"model": Exploit()}, tmp_path / "evil2.pt")
    with pytest.raises(CheckpointError, match="refused to load"):
        load_checkpoint(tmp_path / "evil2.pt")


def test_truncated_checkpoint_is_a_clear_error_and_old_one_survives_failed_write(
    tmp_path, monkeypatch
):
    path = tmp_path / "c.pt"
    save_checkpoint({"w": torch.ones(1000)}, path)
    data = path.read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_checkpoint(tmp_path / "cut.pt")

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(OSError):
        save_checkpoint({"w": torch.zeros(1000)}, path)
    monkeypatch.undo()
    assert torch.equal(load_checkpoint(path)["w"], torch.ones(1000))
    assert not list(tmp_path.glob(".*tmp"))
