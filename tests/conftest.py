import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

MNIST_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "mnist"
EVALUATION_KEYS = Path(__file__).resolve().parents[1] / "docs" / "guides" / "evaluation.md"


@pytest.fixture
def assert_keys_documented():
    """Check that every key of an evaluation (at any depth; ``after_<N>_more_steps``
    as written, and ``X_stderr`` through ``X``) is named in backticks on the evaluation
    keys page."""
    named = set(re.findall(r"`([^`]+)`", EVALUATION_KEYS.read_text()))

    def check(result: dict) -> None:
        missing = set()

        def walk(record: dict) -> None:
            for key, value in record.items():
                generic = re.sub(r"after_\d+_more_steps", "after_N_more_steps", key)
                if not {key, generic, key.removesuffix("_stderr")} & named:
                    missing.add(key)
                if isinstance(value, dict):
                    walk(value)

        walk(result)
        assert not missing, f"evaluation keys missing from {EVALUATION_KEYS.name}: {missing}"

    return check


@pytest.fixture
def evaluate_density_run():
    """Evaluate a density run as ``ebmlab evaluate`` does, with 1,000 samples after 100
    Langevin steps (the command's 5,000 after 500 cost five times more and test nothing
    more where the command's path is not what is tested)."""
    from ebmlab.cli import load_run

    def evaluate(run: Path) -> dict:
        recipe, setup, run_dir = load_run(run)
        return recipe.evaluate(setup, run_dir, n_samples=1000, sample_steps=100)

    return evaluate


@pytest.fixture
def mnist_dir() -> Path:
    if not (MNIST_DIR / "t10k-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"MNIST test split not found at {MNIST_DIR}")
    return MNIST_DIR


@pytest.fixture(scope="session")
def inception_weights(tmp_path_factory):
    """A weights file in the format of the FID tools' Inception-v3 port (torch.save of its
    state dict): random weights with batch-norm statistics fitted to random images, so
    that features vary from image to image; and the network it holds."""
    from benchmarks.inception import fitted_weights

    from ebmlab.evaluation import InceptionV3

    with torch.random.fork_rng():
        state = fitted_weights()
    network = InceptionV3().eval()
    network.load_state_dict(state)
    path = tmp_path_factory.mktemp("inception") / "pt_inception-2015-12-05.pth"
    torch.save(state, path)
    return path, network


def pytest_configure(config):
    """Decoded image folders are cached in a folder of the test run's, not the user's
    (subprocesses inherit it). Under pytest-xdist each worker gets its share of the
    cores, and so do the processes its tests start (through OMP_NUM_THREADS, which
    ebmlab's default thread count honours): the workers do not oversubscribe them."""
    cache = tempfile.mkdtemp(prefix="ebmlab-cache-")
    config.add_cleanup(lambda: shutil.rmtree(cache, ignore_errors=True))
    os.environ["EBMLAB_CACHE"] = cache
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        share = max(1, torch.get_num_threads() // int(workers))
        torch.set_num_threads(share)
        os.environ["OMP_NUM_THREADS"] = str(share)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True, scope="session")
def _quiet_load():
    """The suite's own workers load the CPUs: the busy-CPU hint is left to the tests of
    it (tests/test_threads.py), so that tests reading stderr read only their own lines."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("ebmlab.threads.load_average", lambda: None)
        yield


# the test files that take longest (a minute or more of one worker, by ``--durations``),
# longest first: pytest-xdist hands out whole files in collection order, and two workers
# that start on these do not end with one of them running a long file alone
LONGEST_FILES = (
    "training/test_distributed.py",
    "test_cli.py",
    "training/test_fault_tolerance.py",
    "test_docs.py",
    "training/test_jem_recipe.py",
    "training/test_rbm_recipe.py",
    "training/test_rbm.py",
    "samplers/test_riemannian.py",
    "conformance/test_recipes.py",
    "samplers/test_dense_mass.py",
    "test_gpu_benchmark.py",
    "samplers/test_warmup.py",
)


def _longest_first(items):
    root = Path(__file__).parent
    rank = {root / name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(Path(item.path), len(rank)))  # stable: others keep order


def pytest_collection_modifyitems(config, items):
    """The longest files first (:data:`LONGEST_FILES`); tests marked ``cuda`` run wherever
    a CUDA GPU is present, and are skipped elsewhere."""
    _longest_first(items)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU here")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def bfloat16_anywhere(monkeypatch):
    """bfloat16 requests run in bfloat16 even on CPUs where ebmlab would take the float32
    path (emulated there, so slow, but these tests check the reduced-precision arithmetic
    itself)."""
    from ebmlab import hardware

    monkeypatch.setattr(hardware, "reduced_precision", lambda device, dtype: dtype)


@pytest.fixture
def stand_in_captures(monkeypatch):
    """Off a GPU, make every device capturable for the samplers' CUDA graphs and every
    capture a rerun of its work (run once, then once per replay): the GPU's code path
    with the eager values. Returns the list of captured works."""
    from types import SimpleNamespace

    from ebmlab.samplers import graphs

    captures = []

    def capture(run, device, generator=None, pool=None):
        run()
        captures.append(run)
        return SimpleNamespace(replay=run, pool=lambda: (0, 1))

    monkeypatch.setattr(graphs, "capturable", lambda device: True)
    monkeypatch.setattr(graphs, "warm_and_capture", capture)
    return captures


FAULTS: list[tuple[str, str, str]] = []  # (scenario, outcome checked, result) as tests end


def pytest_runtest_logreport(report):
    """Record the result of every fault-injection scenario (tests marked ``fault``)."""
    fault = dict(report.user_properties).get("fault")
    if fault and (report.when == "call" or report.outcome != "passed"):
        FAULTS.append((*fault, report.outcome))


def pytest_runtest_setup(item):
    marker = item.get_closest_marker("fault")
    if marker:
        item.user_properties.append(("fault", tuple(marker.args)))


def pytest_terminal_summary(terminalreporter):
    """The fault-injection table: each scenario, the outcome checked, and its result."""
    if FAULTS:
        terminalreporter.section("fault injection")
        for scenario, checked, result in FAULTS:
            terminalreporter.write_line(f"{result:>7}  {scenario}: {checked}")
