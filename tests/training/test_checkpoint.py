import os
import pickle

import pytest
import torch

from ebmlab.training import CheckpointError, load_checkpoint, save_checkpoint
from ebmlab.training.checkpoint import load_newest_good


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


@pytest.mark.fault(
    "corrupt checkpoint (one flipped byte)",
    "refused by the SHA-256 check",
)
def test_checksum_catches_a_flipped_byte_that_unpickling_would_miss(tmp_path):
    path = tmp_path / "c.pt"
    save_checkpoint({"w": torch.zeros(1000)}, path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside the tensor's bytes
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="SHA-256"):
        load_checkpoint(path)


@pytest.mark.fault(
    "damaged last checkpoint",
    "the previous one is loaded and the damage named",
)
def test_previous_checkpoint_is_kept_and_used_when_the_last_is_damaged(tmp_path):
    path = tmp_path / "last.pt"
    save_checkpoint({"step": 1}, path, keep_previous=True)
    save_checkpoint({"step": 2}, path, keep_previous=True)
    assert load_checkpoint(tmp_path / "last-1.pt")["step"] == 1
    state, used, problem = load_newest_good(path)
    assert state["step"] == 2 and used == path and problem is None
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    state, used, problem = load_newest_good(path)
    assert state["step"] == 1 and used.name == "last-1.pt" and "truncated" in problem
    path.unlink()  # a crash between rotating and writing: the previous one still serves
    assert load_newest_good(path)[0]["step"] == 1


@pytest.mark.fault(
    "checkpoint of another format",
    "format 1 loads as it is; a newer format is refused by number",
)
def test_format_versions(tmp_path):
    legacy = tmp_path / "legacy.pt"
    torch.save({"step": 3}, legacy)  # format 1: no format key, no checksum file
    assert load_checkpoint(legacy) == {"step": 3}
    future = tmp_path / "future.pt"
    torch.save({"step": 3, "format": 99}, future)
    with pytest.raises(CheckpointError, match="format 99; this ebmlab reads formats 1 to"):
        load_checkpoint(future)
    save_checkpoint({"step": 4}, tmp_path / "now.pt")
    assert load_checkpoint(tmp_path / "now.pt") == {"step": 4}


def test_a_checksum_removed_between_a_readers_look_and_its_read_is_no_error(tmp_path, monkeypatch):
    # A writer replacing the checkpoint removes the old checksum before it renames the
    # new file into place; a reader that saw the checksum a moment earlier must still
    # read the (complete) checkpoint rather than fail on the vanished file.
    path = tmp_path / "last.pt"
    save_checkpoint({"step": 2}, path)
    (tmp_path / "last.pt.sha256").unlink()
    real = type(path).is_file
    monkeypatch.setattr(type(path), "is_file", lambda p: p.suffix == ".sha256" or real(p))
    assert load_checkpoint(path)["step"] == 2
