import json

import numpy as np
import pytest
import torch

from ebmlab.cli import main
from ebmlab.learning.structured import LOSSES, EnergyLearner


@pytest.mark.parametrize("loss", LOSSES)
def test_every_loss_trains_a_small_problem_by_one_call(loss):
    """Two well-separated classes: every loss learns them; the energy loss has no minimum
    on this architecture (it pulls energies down without bound)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(100, 2, generator=gen) + 2, torch.randn(100, 2, generator=gen) - 2])
    y = torch.cat([torch.zeros(100), torch.ones(100)]).long()
    torch.manual_seed(0)
    net = torch.nn.Linear(2, 2)
    learner = EnergyLearner(lambda z: -net(z) + 1.5, loss)  # offset keeps LVQ2's energies positive
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(200):
        value, metrics = learner.step_loss(x, y)
        opt.zero_grad()
        value.backward()
        opt.step()
    accuracy = float((learner.predict(x) == y).double().mean())
    assert accuracy > 0.95 and metrics["energy_gap"] > 0
    if loss == "energy":
        assert float(value.detach()) < -50


def test_structured_recipe_runs(tmp_path, capsys, assert_keys_documented):
    run = tmp_path / "s"
    args = [
        "train",
        "structured",
        "--loss",
        "square_exponential",
        "--arch",
        "distance",
        "--epochs",
        "1",
    ]
    assert main([*args, "--out", str(run), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(run)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert_keys_documented(result)
    assert result["loss"] == "square_exponential" and 0 <= result["test_accuracy"] <= 1
    assert 0 < result["test_accuracy_stderr"] < 0.05  # a few hundred test digits


def test_learner_validation():
    with pytest.raises(ValueError, match="loss must be one of"):
        EnergyLearner(torch.nn.Identity(), "contrastive")
    learner = EnergyLearner(lambda z: z.sum(1), "hinge")
    with pytest.raises(ValueError, match=r"shape \(B, K\)"):
        learner.step_loss(torch.zeros(3, 2), torch.zeros(3).long())


def test_chain_task_learns_towards_the_bayes_error(tmp_path, capsys):
    run = tmp_path / "chain"
    args = [
        "train",
        "structured",
        "--task",
        "chain",
        "--loss",
        "nll",
        "--hidden",
        "16",
        "--epochs",
        "3",
    ]
    assert (
        main([*args, "--n-sequences", "200", "--lr", "0.01", "--out", str(run), "--no-progress"])
        == 0
    )
    capsys.readouterr()
    assert main(["evaluate", str(run)]) == 0
    result = json.loads(capsys.readouterr().out)
    chance = 1 - 1 / 4
    assert (
        result["bayes_error"] <= result["test_error"] + 0.02
        and result["test_error"] < chance - 0.15
    )
    # both errors are means over independent sequences, each with its standard error
    assert 0 < result["bayes_error_stderr"] < 0.05 and 0 < result["test_error_stderr"] < 0.05


def test_chain_task_rejects_losses_without_a_chain_form():
    from ebmlab.training.recipes.structured import StructuredConfig

    with pytest.raises(ValueError, match="loss \\(for task chain\\) must be one of"):
        StructuredConfig(task="chain", loss="mce")


def test_chain_evaluation_reports_exact_and_approximate_inference(
    tmp_path, capsys, assert_keys_documented
):
    run = tmp_path / "chain"
    args = ["train", "structured", "--task", "chain", "--loss", "hinge", "--hidden", "16"]
    assert main([*args, "--epochs", "2", "--lr", "0.01", "--n-sequences", "100",
                 "--out", str(run), "--no-progress"]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["evaluate", str(run)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert_keys_documented(result)
    by = result["test_error_by_inference"]
    assert set(by) == {"viterbi", "annealed_gibbs", "icm", "mean_field"}
    assert by["viterbi"] == result["test_error"]
    # the standard error is over sequences: between that of independent positions and
    # that of sequences wholly right or wrong
    from ebmlab.training.recipes.structured import StructuredConfig
    from ebmlab.training.recipes.structured.tasks import ChainTask

    x, _ = ChainTask(StructuredConfig(task="chain", n_sequences=100), 0).test
    e, (n, length) = result["test_error"], x.shape[:2]
    bernoulli = (e * (1 - e)) ** 0.5
    stderr = result["test_error_stderr"]
    assert bernoulli / (n * length) ** 0.5 < stderr < bernoulli / (n - 1) ** 0.5
    # annealing finds (nearly) the exact minimisers on a chain
    assert abs(by["annealed_gibbs"] - by["viterbi"]) < 0.05


def test_completion_learns_the_bottom_half_with_annealed_gibbs_answers():
    from ebmlab.training import Trainer, TrainerConfig
    from ebmlab.training.recipes.structured import StructuredConfig
    from ebmlab.training.recipes.structured.tasks import CompletionTask

    task = CompletionTask(
        StructuredConfig(task="completion", loss="hinge", hidden=(32,), gibbs_sweeps=5), 0
    )
    before = task.pixel_error(task.test.x, "icm")
    config = TrainerConfig(epochs=3, batch_size=32, lr=0.01, progress=False)
    Trainer(task, (task.train.x,), config).fit()
    after = task.pixel_error(task.test.x, "icm")
    mean_pixel = task.train.x[:, 32:].mean()
    always_off = float(task.test.x[:, 32:].mean())  # error of predicting every pixel 0
    assert after < before and after < min(always_off, 1 - always_off) - 0.05, (before, after)
    assert float(task.model.coupling.detach().abs().max()) > 0  # couplings were learned
    from ebmlab.training.recipes import Setup
    from ebmlab.training.recipes.structured import evaluate

    result = evaluate(Setup(task, (task.train.x,)), None)
    e, n = result["test_pixel_error"], len(task.test.x)
    bernoulli = (e * (1 - e)) ** 0.5  # the stderr lies between independent and tied pixels
    stderr = result["test_pixel_error_stderr"]
    assert bernoulli / (32 * n) ** 0.5 < stderr < bernoulli / (n - 1) ** 0.5
    assert 0 < mean_pixel < 1


def test_completion_rejects_losses_it_cannot_use():
    from ebmlab.training.recipes.structured import StructuredConfig

    with pytest.raises(ValueError, match="loss \\(for task completion\\) must be one of"):
        StructuredConfig(task="completion", loss="nll")


def test_classification_and_completion_take_the_users_data(
    tmp_path, capsys, assert_keys_documented
):
    """--data: classes come from the labels (three here), and completion splits a
    grayscale image of any size into its top and bottom rows."""
    rng = np.random.default_rng(0)
    data = tmp_path / "data"
    data.mkdir()
    for split, n in (("train", 120), ("test", 60)):
        y = np.arange(n) % 3
        x = rng.integers(0, 60, (n, 1, 6, 5), dtype=np.uint8)
        x[np.arange(n), 0, 3 + y] = 255  # each class lights a row of the bottom half
        x[np.arange(n), 0, y] = 255  # and the matching row of the top half
        np.savez(data / f"{split}.npz", x=x, y=y)
    for task, key in (("digits", "test_accuracy"), ("completion", "test_pixel_error")):
        run = tmp_path / task
        args = ["train", "structured", "--task", task, "--data", str(data), "--epochs", "8",
                "--lr", "0.01", "--no-progress", "--out", str(run)]  # fmt: skip
        args += ["--loss", "hinge", "--gibbs-sweeps", "5"] if task == "completion" else []
        assert main(args) == 0
        capsys.readouterr()
        assert main(["evaluate", str(run)]) == 0
        result = json.loads(capsys.readouterr().out)
        assert_keys_documented(result)
        if task == "digits":
            assert result[key] > 0.9  # the lit row names the class
        else:  # the lit bottom row follows from the top one (all pixels off: 1/3 wrong)
            assert result[key] < 0.1
            assert "logistic_regression_pixel_error_stderr" in result


def test_data_that_does_not_fit_the_task_is_refused():
    from ebmlab.training.recipes.structured import StructuredConfig
    from ebmlab.training.recipes.structured.tasks import CompletionTask

    with pytest.raises(ValueError, match="task 'chain' draws its sequences"):
        StructuredConfig(task="chain", loss="hinge", data="digits-rgb")
    config = StructuredConfig(task="completion", loss="hinge", data="digits-rgb")
    with pytest.raises(ValueError, match="completes grayscale images"):
        CompletionTask(config, 0)
