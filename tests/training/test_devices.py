"""The device setting: resolution, moving a task, resuming across devices, compile and
channels_last, and the command line's answers."""

import json

import pytest
import torch
from torch import nn

from ebmlab.cli import main
from ebmlab.devices import available
from ebmlab.energies import ConvNet, SNResNet, WideResNet
from ebmlab.energies.base import in_chunks
from ebmlab.energies.conv import as_images
from ebmlab.training import StepResult, Task, Trainer, TrainerConfig, load_checkpoint
from ebmlab.training.checkpoint import save_checkpoint


class Regression(Task):
    def __init__(self):
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(3, 8), nn.SiLU(), nn.Linear(8, 1))
        self.val_x = torch.randn(20, 3, generator=torch.Generator().manual_seed(2))

    def training_step(self, batch, generator):
        x, y = batch
        assert x.device == self.val_x.device == next(self.model.parameters()).device
        noise = 0.01 * torch.randn(x.shape, generator=generator, device=x.device)
        return StepResult(((self.model(x + noise).squeeze(1) - y) ** 2).mean())


def data():
    x = torch.randn(64, 3, generator=torch.Generator().manual_seed(1))
    return (x, x.sum(1))


def config(**kw):
    return TrainerConfig(**{"epochs": 2, "batch_size": 16, "progress": False, **kw})


def test_a_device_that_is_not_there_is_refused_by_the_config():
    with pytest.raises(ValueError, match="device must be one of auto, cpu, cuda, cuda:N, mps"):
        config(device="gpu")
    with pytest.raises(ValueError, match="compile_mode must be one of"):
        config(compile_mode="fast")


def test_the_trainer_moves_the_task_and_its_data():
    task = Regression()
    trainer = Trainer(task, data(), config(device="cpu"))
    assert trainer.device == torch.device("cpu") and trainer.generator.device.type == "cpu"
    trainer.fit()


def test_resume_after_a_generator_of_another_device(tmp_path):
    """A checkpoint whose generator was a CUDA one resumes on the CPU (not bit for bit)."""
    Trainer(Regression(), data(), config(max_steps=3), tmp_path).fit()
    state = load_checkpoint(tmp_path / "checkpoints" / "last.pt")
    state["rng"]["device"] = "cuda:0"
    state["rng"]["generator"] = torch.zeros(16, dtype=torch.uint8)  # a philox state's size
    save_checkpoint(state, tmp_path / "checkpoints" / "last.pt")
    summary = Trainer(Regression(), data(), config(), tmp_path).fit(resume=True)
    assert summary["status"] == "completed" and summary["step"] == 8


def test_compiled_training_gives_the_eager_result(monkeypatch):
    eager = Regression()
    Trainer(eager, data(), config()).fit()
    real = torch.compile
    calls = []

    def compile_eagerly(fn, **options):
        calls.append(options)
        return real(fn, backend="eager")

    monkeypatch.setattr(torch, "compile", compile_eagerly)
    compiled = Regression()
    Trainer(compiled, data(), config(compile=True, compile_mode="reduce-overhead")).fit()
    assert calls == [{"mode": "reduce-overhead"}] * 3  # the Sequential's three layers
    for a, b in zip(eager.model.parameters(), compiled.model.parameters(), strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize(
    "recipe, args",
    [("density", ["--method", "fm"]), ("density", ["--method", "dsm"]),
     ("jem", ["--gen-objective", "em", "--arch", "mlp"])],
)  # fmt: skip
def test_compile_is_refused_where_the_loss_differentiates_twice(recipe, args, tmp_path, capsys):
    """Losses that hold input gradients (flow matching of -grad V, score matching)
    differentiate the network twice, which torch.compile cannot: one clear line before
    any training step, where it would otherwise fail inside the first backward pass."""
    run = tmp_path / "run"
    assert main(["train", recipe, *args, "--compile", "--out", str(run), "--no-progress"]) == 2
    assert "differentiates the network twice" in capsys.readouterr().err
    assert not (run / "metrics.jsonl").exists() or not (run / "metrics.jsonl").read_text()


@pytest.mark.parametrize(
    "make",
    [
        lambda: ConvNet((3, 8, 8), 5, width=4),
        lambda: WideResNet((3, 8, 8), 5, depth=10, widen=1, norm="group"),
        lambda: SNResNet((3, 8, 8), 5, width=4, stages=2),
    ],
)
def test_channels_last_image_networks_give_the_same_outputs(make):
    torch.manual_seed(0)
    net = make().eval()  # eval: spectral norm's power iteration stays put
    x = torch.randn(6, 3 * 8 * 8)
    want = net(x)
    net.to(memory_format=torch.channels_last)
    assert as_images(x, net.image_shape, net.features).is_contiguous(
        memory_format=torch.channels_last
    )
    torch.testing.assert_close(net(x), want, rtol=1e-5, atol=1e-5)


def test_in_chunks_equals_one_pass():
    x = torch.randn(10, 3)
    torch.testing.assert_close(in_chunks(lambda t: t * 2, x, 3), x * 2)
    a, b = in_chunks(lambda t: (t.sum(1), t), x, 4)
    torch.testing.assert_close(a, x.sum(1))
    torch.testing.assert_close(b, x)


def test_cli_refuses_a_missing_device_in_one_line(tmp_path, capsys):
    if "mps" in available():
        pytest.skip("this machine has every device the test asks for")
    missing = "cuda:7" if torch.cuda.device_count() < 8 else "mps"
    code = main(["train", "density", "--out", str(tmp_path / "r"), "--device", missing])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1
    assert f"device {missing!r} is not available here; available: " in err and "cpu" in err


def test_info_lists_devices_cpu_features_and_fast_paths(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "devices: " in out and "cpu fast paths:" in out and "onednn_packed_float32" in out


def test_a_run_evaluates_on_the_device_asked_for(tmp_path, capsys):
    run = tmp_path / "run"
    args = ["train", "density", "--out", str(run), "--epochs", "1", "--hidden", "8"]
    tiny = ["--buffer-size", "64", "--sampler-steps", "2", "--quadrature-points", "16"]
    assert main([*args, *tiny, "--no-progress", "--device", "cpu"]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(run), "--device", "cpu"]) == 0
    assert json.loads(capsys.readouterr().out)["log_z"]["method"] == "quadrature"
    picture = tmp_path / "s.png"
    assert main(["sample", str(run), "--n", "8", "--steps", "2", "--out", str(picture)]) == 0
    assert picture.is_file()


def test_loss_scaling_trains_and_resumes_exactly(tmp_path):
    Trainer(Regression(), data(), config(grad_scaler=True), tmp_path / "full").fit()
    Trainer(Regression(), data(), config(grad_scaler=True, max_steps=3), tmp_path / "part").fit()
    part = Regression()
    Trainer(part, data(), config(grad_scaler=True), tmp_path / "part").fit(resume=True)
    full = load_checkpoint(tmp_path / "full" / "checkpoints" / "last.pt")
    for name, value in full["model"].items():
        assert torch.equal(value, part.model.state_dict()[name])
    assert full["grad_scaler"]["scale"] > 0


def test_float16_jem_needs_the_loss_scaler(tmp_path, capsys):
    code = main(["train", "jem", "--out", str(tmp_path / "r"), "--train-dtype", "float16"])
    assert code == 2 and "needs grad_scaler (--grad-scaler)" in capsys.readouterr().err
