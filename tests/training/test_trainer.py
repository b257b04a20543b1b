import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from ebmlab.data import load_dataset
from ebmlab.training import (
    CheckpointError,
    DivergenceError,
    RunDirectory,
    StepResult,
    Task,
    Trainer,
    TrainerConfig,
    load_checkpoint,
)


class NoisyRegression(Task):
    """Uses dropout (global RNG) and the trainer's generator, to exercise every RNG stream."""

    def __init__(self, blow_up_at: int | None = None):
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(3, 16), nn.Dropout(0.2), nn.Linear(16, 1))
        self.calls = 0
        self.blow_up_at = blow_up_at
        self.val_x = torch.randn(64, 3, generator=torch.Generator().manual_seed(9))

    def training_step(self, batch, generator):
        x, y = batch
        self.calls += 1
        noise = 0.01 * torch.randn(x.shape, generator=generator)
        loss = ((self.model(x + noise).squeeze(1) - y) ** 2).mean()
        if self.blow_up_at is not None and self.calls >= self.blow_up_at:
            loss = loss * math.nan
        return StepResult(loss, {"mse": float(loss.detach())})

    def validate(self, generator):
        with torch.no_grad():
            return {
                "val_loss": float(
                    (self.model(self.val_x).squeeze(1) - self.val_x.sum(1)).pow(2).mean()
                )
            }

    def state_dict(self):
        return {"calls": self.calls}

    def load_state_dict(self, state):
        self.calls = state["calls"]


def data():
    x = torch.randn(100, 3, generator=torch.Generator().manual_seed(1))
    return (x, x.sum(1))


def config(**kw):
    base = dict(epochs=4, batch_size=16, lr=1e-2, log_every=3, progress=False, checkpoint_every=5)
    return TrainerConfig(**{**base, **kw})


def params(task):
    return torch.cat([p.detach().flatten() for p in task.model.parameters()])


def test_resume_reproduces_uninterrupted_run_bit_for_bit(tmp_path):
    full = NoisyRegression()
    Trainer(full, data(), config(), tmp_path / "full").fit()

    part = NoisyRegression()
    summary = Trainer(part, data(), config(max_steps=10), tmp_path / "part").fit()
    assert summary["status"] == "max_steps" and summary["step"] == 10
    # a record written after the last checkpoint (as by a killed process) is dropped on resume
    RunDirectory(tmp_path / "part").append_metrics({"split": "train", "step": 999, "loss": 1.0})
    resumed = NoisyRegression()
    Trainer(resumed, data(), config(), tmp_path / "part").fit(resume=True)

    assert torch.equal(params(full), params(resumed))
    assert (
        RunDirectory(tmp_path / "full").read_metrics()
        == RunDirectory(tmp_path / "part").read_metrics()
    )


def test_run_directory_contents(tmp_path):
    summary = Trainer(NoisyRegression(), data(), config(epochs=2), tmp_path).fit()
    for name in (
        "config.json",
        "metrics.jsonl",
        "summary.json",
        "curves.png",
        "checkpoints/last.pt",
        "checkpoints/best.pt",
    ):
        assert (tmp_path / name).is_file(), name
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "completed"
    assert summary["epoch"] == 2 and summary["step"] == 14
    splits = {r["split"] for r in RunDirectory(tmp_path).read_metrics()}
    assert splits == {"train", "val"}


def test_divergence_stops_with_message_and_keeps_last_good_checkpoint(tmp_path):
    task = NoisyRegression(blow_up_at=13)
    with pytest.raises(
        DivergenceError, match=r"diverged at step 12: the loss is nan; the last good checkpoint"
    ):
        Trainer(task, data(), config(), tmp_path).fit()
    assert (
        "divergence_restarts > 0" in json.loads((tmp_path / "summary.json").read_text())["error"]
    )  # the remedy: restart from that checkpoint at a lower learning rate
    state = load_checkpoint(tmp_path / "checkpoints" / "last.pt")
    assert state["trainer"]["step"] == 10
    assert all(torch.isfinite(v).all() for v in state["model"].values())
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "diverged"


def test_early_stopping(tmp_path):
    class Stagnant(NoisyRegression):
        def validate(self, generator):
            return {"val_loss": 1.0}

    summary = Trainer(
        Stagnant(), data(), config(epochs=20, early_stopping_patience=2), tmp_path
    ).fit()
    assert summary["status"] == "early_stopped" and summary["epoch"] == 3


def test_lr_schedules():
    t = Trainer(NoisyRegression(), data(), config(epochs=10, lr_schedule="cosine", warmup_steps=4))
    assert t.lr_at(0) == pytest.approx(1e-2 / 4)
    assert t.lr_at(4) == pytest.approx(1e-2)
    assert t.lr_at(t.total_steps) == pytest.approx(0.0, abs=1e-12)


def test_resume_without_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        Trainer(NoisyRegression(), data(), config(), tmp_path).fit(resume=True)


@pytest.mark.fault(
    "changed data on resume",
    "refused with a clear message unless --allow-data-change",
)
def test_resume_refuses_changed_data_unless_allowed(tmp_path, capsys):
    Trainer(NoisyRegression(), data(), config(epochs=1), tmp_path).fit()
    x, y = data()
    changed = (x, y + 1e-3)
    with pytest.raises(ValueError, match=r"training data changed.*--allow-data-change"):
        Trainer(NoisyRegression(), changed, config(epochs=2), tmp_path).fit(resume=True)
    Trainer(NoisyRegression(), data(), config(epochs=2), tmp_path).fit(resume=True)
    allowed = config(epochs=3, allow_data_change=True)
    Trainer(NoisyRegression(), changed, allowed, tmp_path).fit(resume=True)
    assert "resuming on the new data" in capsys.readouterr().err


def test_bad_config_and_data():
    with pytest.raises(ValueError, match="optimizer must be one of"):
        TrainerConfig(optimizer="adagrad")
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
        TrainerConfig(batch_size=0)
    with pytest.raises(ValueError, match="share their first dimension"):
        Trainer(NoisyRegression(), (torch.zeros(3, 3), torch.zeros(4)))


def test_task_signalled_divergence_names_the_step(tmp_path):
    class Runaway(NoisyRegression):
        def training_step(self, batch, generator):
            if self.calls >= 7:
                raise DivergenceError("energies reached 1e5")
            return super().training_step(batch, generator)

    with pytest.raises(
        DivergenceError, match=r"diverged at step 7: energies reached 1e5; the last good"
    ):
        Trainer(Runaway(), data(), config(), tmp_path).fit()


def test_callbacks_see_every_record_and_epoch():
    from ebmlab.training import Callback

    class Recorder(Callback):
        def __init__(self):
            self.records, self.epochs, self.ended = [], 0, None

        def on_log(self, trainer, record):
            self.records.append(record)

        def on_epoch_end(self, trainer):
            self.epochs += 1

        def on_train_end(self, trainer, summary):
            self.ended = summary["status"]

    rec = Recorder()
    trainer = Trainer(NoisyRegression(), data(), config(epochs=2), callbacks=[rec])
    trainer.fit()
    assert rec.records == trainer.history and rec.epochs == 2 and rec.ended == "completed"


def test_tensorboard_option_writes_every_logged_metric_as_a_scalar(tmp_path, monkeypatch):
    """``tensorboard=True`` attaches one TensorBoardLogger writing into the run
    directory: every numeric metric of every logged record becomes the scalar
    ``<split>/<name>`` at the record's step, and the writer is closed at the end. The
    writer is a stand-in, so the test needs no tensorboard package."""
    import sys
    import types

    writers = []

    class Writer:
        def __init__(self, log_dir):
            self.log_dir, self.scalars, self.closed = log_dir, [], False
            writers.append(self)

        def add_scalar(self, tag, value, step):
            self.scalars.append((tag, value, step))

        def close(self):
            self.closed = True

    stand_in = types.ModuleType("torch.utils.tensorboard")
    stand_in.SummaryWriter = Writer
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", stand_in)
    trainer = Trainer(NoisyRegression(), data(), config(epochs=2, tensorboard=True), tmp_path)
    trainer.fit()
    (writer,) = writers
    assert writer.log_dir == str(tmp_path.resolve() / "tensorboard") and writer.closed
    expected = [
        (f"{r.get('split', 'train')}/{k}", v, r["step"])
        for r in RunDirectory(tmp_path).read_metrics()
        for k, v in r.items()
        if k not in ("split", "step", "epoch") and isinstance(v, int | float)
    ]
    assert writer.scalars == expected
    assert {tag for tag, _, _ in expected} >= {"train/mse", "val/val_loss"}


def test_opt_in_restart_after_divergence_with_a_lower_learning_rate(tmp_path):
    class TransientFault(NoisyRegression):
        """Diverges once at step 13 (a fault that does not come back after a restart)."""

        fired = False

        def training_step(self, batch, generator):
            result = super().training_step(batch, generator)
            if self.calls == 13 and not TransientFault.fired:
                TransientFault.fired = True
                raise DivergenceError("energies ran away")
            return result

    trainer = Trainer(
        TransientFault(), data(), config(divergence_restarts=1, restart_lr_factor=0.5), tmp_path
    )
    summary = trainer.fit()
    assert summary["status"] == "completed" and summary["restarts"] == 1
    assert trainer.lr_at(trainer.step) == pytest.approx(0.5e-2)
    restarts = [r for r in RunDirectory(tmp_path).read_metrics() if r["split"] == "restart"]
    assert restarts == [{"split": "restart", "epoch": 1, "step": 10, "lr_scale": 0.5}]


@pytest.mark.parametrize("workers", [0, 2])
def test_rows_on_disk_train_exactly_as_in_memory(tmp_path, workers):
    """Streamed through a DataLoader (with or without workers) the batches, hence the
    parameters, are those of in-memory training, and a resumed run matches an
    uninterrupted one bit for bit."""
    (tmp_path / "data").mkdir()
    np.savez(tmp_path / "data" / "train.npz", x=data()[0].numpy())
    rows = load_dataset(str(tmp_path / "data"), "train", transform="raw", in_memory=False)
    streamed = (rows.x, data()[1])
    memory = NoisyRegression()
    Trainer(memory, data(), config()).fit()
    full = NoisyRegression()
    Trainer(full, streamed, config(num_workers=workers), tmp_path / "full").fit()
    assert torch.equal(params(memory), params(full))
    part = NoisyRegression()
    Trainer(part, streamed, config(num_workers=workers, max_steps=10), tmp_path / "part").fit()
    resumed = NoisyRegression()
    Trainer(resumed, streamed, config(num_workers=workers), tmp_path / "part").fit(resume=True)
    assert torch.equal(params(full), params(resumed))


class Recording(NoisyRegression):
    """Keeps the parameters each step starts from (the previous step's result)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def training_step(self, batch, generator):
        self.seen.append(params(self))
        return super().training_step(batch, generator)


def test_ema_follows_its_recursion_validates_with_it_and_resumes(tmp_path):
    decay = 0.8
    task = Recording()
    trainer = Trainer(task, data(), config(ema=decay, epochs=2), tmp_path / "full")
    trainer.fit()
    expected = task.seen[0].clone()
    for after_step in [*task.seen[1:], params(task)]:
        expected = decay * expected + (1 - decay) * after_step
    average = torch.cat([s.flatten() for s in trainer.ema.shadow])
    torch.testing.assert_close(average, expected)
    assert not torch.equal(average, params(task))
    state = load_checkpoint(tmp_path / "full" / "checkpoints" / "last.pt")
    assert set(state["ema"]["average"]) == {n for n, _ in task.model.named_parameters()}
    # the validation metric is the averaged model's
    own = params(task)
    with trainer.ema.applied():
        val_ema = task.validate(None)["val_loss"]
    records = RunDirectory(tmp_path / "full").read_metrics()
    assert [r for r in records if r["split"] == "val"][-1]["val_loss"] == pytest.approx(val_ema)
    assert torch.equal(params(task), own)  # the model's own parameters are back
    part = Recording()
    Trainer(part, data(), config(ema=decay, epochs=2, max_steps=9), tmp_path / "part").fit()
    resumed = Recording()
    again = Trainer(resumed, data(), config(ema=decay, epochs=2), tmp_path / "part")
    again.fit(resume=True)
    assert torch.equal(params(task), params(resumed))
    assert all(torch.equal(a, b) for a, b in zip(trainer.ema.shadow, again.ema.shadow, strict=True))
    with pytest.raises(ValueError, match="ema"):
        TrainerConfig(ema=1.0)


def test_fingerprints_of_rows_on_disk_see_a_rewritten_block(tmp_path, monkeypatch):
    from ebmlab.data.encoding import EncodedRows, Encoding
    from ebmlab.training import fingerprint

    monkeypatch.setattr(fingerprint, "BLOCK_BYTES", 16)  # sample 64 blocks of 16 bytes
    path = tmp_path / "rows.u8"
    np.arange(64 * 100, dtype=np.uint8).tofile(path)
    stored = np.memmap(path, dtype=np.uint8, mode="r+", shape=(100, 64))
    rows = EncodedRows(stored, Encoding("raw", 0, 255, 255, 128), (64,))
    before = fingerprint.data_fingerprint((rows,))
    assert fingerprint.data_fingerprint((rows,)) == before
    assert (
        fingerprint.data_fingerprint((EncodedRows(stored, rows.encoding, (64,), np.arange(99)),))
        != before
    )
    stored[0, :16] += 1  # the first sampled block
    assert fingerprint.data_fingerprint((rows,)) != before


def test_a_warm_up_longer_than_a_tenth_of_the_run_is_shortened_and_said(tmp_path, capsys):
    t = Trainer(NoisyRegression(), data(), config(warmup_steps=300), tmp_path)
    assert t.total_steps == 28 and t.warmup_steps == 2
    assert t.lr_at(0) == pytest.approx(1e-2 / 2) and t.lr_at(2) == pytest.approx(1e-2)
    t.fit()
    err = capsys.readouterr().err
    assert err.count("warmup_steps 300 is more than a tenth") == 1
    assert "warming up over 2 instead" in err
    lrs = [r["lr"] for r in t.run.read_metrics() if r["split"] == "train"]
    assert lrs and all(0 < lr <= 1e-2 for lr in lrs)


def test_a_fresh_start_into_a_run_is_refused_unless_overwritten(tmp_path):
    Trainer(NoisyRegression(), data(), config(epochs=1), tmp_path).fit()
    (tmp_path / "stale.png").write_bytes(b"")
    with pytest.raises(ValueError, match=r"holds a run.*resume=True.*overwrite=True"):
        Trainer(NoisyRegression(), data(), config(epochs=1), tmp_path).fit()
    Trainer(NoisyRegression(), data(), config(epochs=1), tmp_path).fit(overwrite=True)
    assert not (tmp_path / "stale.png").exists() and (tmp_path / "summary.json").is_file()
