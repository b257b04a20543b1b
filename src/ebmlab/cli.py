"""The ``ebmlab`` command: ``info``, ``train``, ``evaluate``, ``sample``, ``logz`` and
``data download``.

Each recipe's options are generated from its config dataclass and the shared
:class:`~ebmlab.training.TrainerConfig`, so a new recipe needs no change here.
Settings are read from defaults, then ``--config FILE.toml``, then flags. Each
option's help is the field's line in its config's ``Attributes`` docstring, with the
field's ``CHOICES`` where it has them. A usage error (a bad argument or setting, a
missing file, an unreadable checkpoint) prints one line to stderr and exits with status
2; an internal error surfaces with its traceback and exits with status 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import inspect
import json
import os
import platform
import re
import shlex
import sys
import tomllib
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import torch

import ebmlab
from ebmlab import _checks, hardware, mcmc_command, partition
from ebmlab._checks import ArgumentError
from ebmlab.data import (
    DATASETS,
    VALIDATION_FRACTION,
    Dataset,
    available_datasets,
    check_data,
    check_validation_fraction,
    describe_splits,
    download,
    run_splits,
)
from ebmlab.data.catalog import SOURCES, DownloadError
from ebmlab.data.folders import cache_root, cached_folders, clear_cache
from ebmlab.devices import resolve_device
from ebmlab.evaluation.inception import PREPROCESSING
from ebmlab.evaluation.progress import Stages
from ebmlab.partition.binary_products import quantized_available
from ebmlab.plotting import image_grid
from ebmlab.samplers import FlowFitError
from ebmlab.threads import apply_threads, busy_warning, load_average, usable_cpus
from ebmlab.training import (
    CheckpointError,
    CheckpointWriteError,
    DivergenceError,
    RunDirectory,
    Trainer,
    TrainerConfig,
    distributed,
)
from ebmlab.training.checkpoint import load_newest_good, previous_path
from ebmlab.training.recipes import Recipe, Setup, get_recipe, recipes
from ebmlab.training.recipes.jem import (
    GRID_CLASSES,
    INCEPTION_REFERENCES,
    STABILITY_STEPS,
    check_eval_samples,
)
from ebmlab.training.run_dir import jsonable, write_json

# What a user can fix: bad arguments and settings, missing files and data, failed
# downloads, unreadable checkpoints. Anything else is an internal error and surfaces
# with its traceback (exit status 1).
USAGE_ERRORS = (ArgumentError, FileNotFoundError, DownloadError, CheckpointError)
# A run that went numerically wrong (training diverged; NeuTra's flow fit diverged or
# cannot map a start) says so in one line, exit status 1.
RUN_FAILURES = (DivergenceError, CheckpointWriteError, FlowFitError)


# every recipe's log Z methods: the Boltzmann family's policy, and the continuous ones
LOGZ_METHODS = (*partition.policy.METHODS, "quadrature", "smc")


class UsageError(Exception):
    """A bad command line; reported in one line with exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


def field_help(cls: type) -> dict[str, str]:
    """Each field's description from the ``Attributes:`` section of a config dataclass's
    docstring (Google style: ``name: text``, continuation lines indented deeper)."""
    doc = inspect.getdoc(cls) or ""
    helps: dict[str, str] = {}
    section = doc.partition("Attributes:")[2]
    name = None
    for line in section.splitlines():
        if not line.strip():
            if name:
                break
            continue
        entry = re.match(r"^ {4}(\w+): (.*)$", line)
        if entry:
            name, text = entry.groups()
            helps[name] = text
        elif name and line.startswith(" " * 8):
            helps[name] += " " + line.strip()
        else:
            break
    return helps


def _add_dataclass_options(
    parser: argparse.ArgumentParser,
    cls: type,
    skip: set[str],
    defaults: dict[str, Any] | None = None,
) -> None:
    """One option per field of ``cls`` (those in ``skip`` excepted), with its help text,
    choices and default (``defaults`` overriding the field's own)."""
    hints = typing.get_type_hints(cls)
    helps = field_help(cls)
    choices = getattr(cls, "CHOICES", {})
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        kind = hints[f.name]
        default = (defaults or {}).get(f.name, f.default)
        if default is dataclasses.MISSING:
            default = f.default_factory()
        shown = " ".join(map(str, default)) if isinstance(default, tuple) else default
        text = helps.get(f.name, "").rstrip(".")
        if shown not in ("", None):
            text = f"{text} (default: {shown})"
        if kind is bool:
            parser.add_argument(
                flag,
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=text,
            )
        elif typing.get_origin(kind) is tuple:
            (item, *_) = typing.get_args(kind)
            parser.add_argument(
                flag, dest=f.name, type=item, nargs="+", default=argparse.SUPPRESS, help=text
            )
        else:
            parser.add_argument(
                flag,
                dest=f.name,
                type=kind,
                choices=choices.get(f.name),
                default=argparse.SUPPRESS,
                help=text,
            )


def _add_threads_option(parser: argparse.ArgumentParser) -> None:
    """``--threads``, which every command takes (``train`` as a TrainerConfig field)."""
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="CPU threads (default 0: PyTorch's count, at most the CPUs this process may "
        "use; 1 on a busy machine)",
    )


def _add_device_option(parser: argparse.ArgumentParser) -> None:
    """The options of commands that load a trained run: device, which weights, threads."""
    _add_threads_option(parser)
    parser.add_argument(
        "--device",
        default="auto",
        help="auto | cpu | cuda | cuda:N | mps (auto: cuda, then mps, then cpu)",
    )
    parser.add_argument(
        "--weights",
        choices=["ema", "raw"],
        default="ema",
        help="the averaged weights of a run trained with --ema (default) or the last ones",
    )


def _build_parser() -> _Parser:
    parser = _Parser(prog="ebmlab", description="Energy-based models on PyTorch.")
    parser.add_argument("--version", action="version", version=f"ebmlab {ebmlab.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    info = sub.add_parser("info", help="versions, threads and the data sets found")
    info.add_argument("--data-root", default=None, help="directory holding data set files")
    _add_threads_option(info)
    data = sub.add_parser("data", help="fetch published data sets; the image folder cache")
    dsub = data.add_subparsers(dest="action", required=True, parser_class=_Parser)
    dl = dsub.add_parser("download", help="download a data set, verifying its checksums")
    dl.add_argument("name", choices=[n for n, s in SOURCES.items() if s.url])
    dl.add_argument("dir", help="directory to write (then pass it as --data-root)")
    dl.add_argument("--mirror", default=None, help="base URL replacing the publisher's")
    _add_threads_option(dl)
    cache = dsub.add_parser("cache", help="list the decoded image folders (or --clear them)")
    cache.add_argument("--clear", action="store_true", help="delete every decoded folder")
    _add_threads_option(cache)
    show = dsub.add_parser(
        "show", help="the splits a recipe reads of a data set: rows, classes, shape, encoding"
    )
    show.add_argument("name", help="a data set name or a file or folder")
    show.add_argument("--data-root", default=None, help="directory holding data set files")
    show.add_argument("--resize", type=int, nargs=2, default=(), metavar=("H", "W"),
                      help="resample an image folder's images")  # fmt: skip
    show.add_argument("--validation-fraction", type=float, default=VALIDATION_FRACTION,
                      help="share of the training rows held out where the set has no "
                      f"validation split (default: {VALIDATION_FRACTION})")  # fmt: skip
    show.add_argument("--grid", default=None, help="PNG of ten training images per class")
    _add_threads_option(show)
    train = sub.add_parser("train", help="train a recipe into a run directory")
    rsub = train.add_subparsers(dest="recipe", required=True, parser_class=_Parser)
    for name, recipe in recipes().items():
        p = rsub.add_parser(name, help=recipe.help, description=recipe.help)
        p.add_argument("--out", required=True, help="run directory to write")
        p.add_argument("--config", default=None, help="TOML file of settings (flags override it)")
        p.add_argument(
            "--resume", action="store_true", help="continue from RUN_DIR/checkpoints/last.pt"
        )
        p.add_argument(
            "--auto-resume",
            action="store_true",
            help="resume when RUN_DIR has a checkpoint, else start fresh (for resubmitted jobs)",
        )
        p.add_argument(
            "--overwrite",
            action="store_true",
            help="start afresh in a RUN_DIR that holds a run, deleting every file of the old one",
        )
        p.add_argument(
            "--nproc",
            type=int,
            default=1,
            help="data-parallel processes on this machine (launched as with torchrun)",
        )
        p.add_argument(
            "--max-restarts",
            type=int,
            default=0,
            help="with --nproc: when a process dies, restart all from the last checkpoint, "
            "at most this many times",
        )
        _add_dataclass_options(p, recipe.config_cls, set())
        _add_dataclass_options(
            p,
            TrainerConfig,
            {f.name for f in dataclasses.fields(recipe.config_cls)},
            recipe.trainer_defaults,
        )
    ev = sub.add_parser("evaluate", help="evaluate a run directory; prints JSON")
    ev.add_argument("run_dir")
    _add_device_option(ev)
    ev.add_argument("--checkpoint", choices=["last", "best"], default="last")
    ev.add_argument("--ood-data", default=None, metavar="FILE|SET",
                    help="one more OOD set: uint8 .npy images (N, H, W), or a published image "
                         "set's test split (e.g. mnist for a Fashion-MNIST model; "
                         "SET:SPLIT for another split)")  # fmt: skip
    ev.add_argument("--ood-root", default=None, metavar="DIR",
                    help="the folder of the --ood-data set's files (default: the run's data "
                         "root, else $EBMLAB_DATA and the system's data folders)")  # fmt: skip
    ev.add_argument(
        "--nll",
        action="store_const",
        const=True,
        default=None,
        help="the test split's log-likelihood and bits per dimension, with log Z by "
        "tempered SMC (slow on images)",
    )
    ev.add_argument(
        "--features-from",
        default=None,
        metavar="RUN_DIR",
        help="sample quality also in the penultimate features of this run's classifier "
        "(e.g. a cross-entropy twin), so that runs compare in one feature space",
    )
    ev.add_argument(
        "--long-run-steps",
        type=int,
        default=None,
        metavar="N",
        help="jem: the samples' stability after N further SGLD steps (default 1000; more "
        f"than {STABILITY_STEPS})",
    )
    ev.add_argument(
        "--samples",
        type=int,
        default=None,
        metavar="N",
        help="jem: model samples for the sample-quality metrics and the stability check, "
        "against as many test images (default 500; more shrink the Frechet distance's bias "
        "and error)",
    )
    ev.add_argument(
        "--guidance",
        type=float,
        default=None,
        metavar="W",
        help="jem: class-conditional samples of p(x|y) p(y|x)^W (default 0): sharper and "
        "less diverse; also the sample-quality metrics' samples of a class-by-class run "
        "(--em-conditional)",
    )
    ev.add_argument(
        "--inception",
        default=None,
        metavar="FILE",
        help="Inception-v3 weights of the FID tools (pt_inception-2015-12-05-*.pth): "
        "FID, KID, precision, recall and Inception score in its features",
    )
    ev.add_argument(
        "--inception-samples",
        type=int,
        default=None,
        metavar="N",
        help="model samples for the Inception metrics (default: those of the other sample "
        "metrics; papers' FID-50k: 50000)",
    )
    ev.add_argument(
        "--inception-reference",
        choices=INCEPTION_REFERENCES,
        default=None,
        help="the split compared with (default test; papers' CIFAR-10 FID: train)",
    )
    ev.add_argument(
        "--inception-preprocessing",
        choices=PREPROCESSING,
        default=None,
        help="how images reach the network: as the original FID code and torch-fidelity "
        "(default) or as pytorch-fid",
    )
    sa = sub.add_parser("sample", help="draw samples from a trained run and save a picture")
    sa.add_argument("run_dir")
    _add_device_option(sa)
    sa.add_argument("--n", type=int, default=64, help="number of samples")
    sa.add_argument("--steps", type=int, default=200, help="sampler steps")
    sa.add_argument("--out", default=None, help="PNG path (default RUN_DIR/samples/sample.png)")
    sa.add_argument("--checkpoint", choices=["last", "best"], default="last")
    sa.add_argument("--seed", type=int, default=0)
    _add_threads_option(mcmc_command.add_parser(sub))
    lz = sub.add_parser("logz", help="estimate log Z of a trained run; prints JSON")
    lz.add_argument("run_dir")
    _add_device_option(lz)
    lz.add_argument(
        "--method",
        default="auto",
        choices=LOGZ_METHODS,
        help="auto: rbm exact when the sum is small enough, else AIS; density quadrature "
        "for 1 or 2 features, else SMC; jem SMC over the pixel box. quadrature, smc: "
        "density; smc: jem; the rest: the rbm recipe's Boltzmann models",
    )
    lz.add_argument("--checkpoint", choices=["last", "best"], default="last")
    lz.add_argument("--seed", type=int, default=0)
    return parser


def _configs(
    recipe: Recipe, args: argparse.Namespace, run: RunDirectory
) -> tuple[Any, TrainerConfig]:
    settings: dict[str, Any] = {}
    if args.resume:
        stored = run.read_config()
        if stored.get("recipe") != recipe.name:
            raise ArgumentError(
                f"{run.path} was trained with recipe {stored.get('recipe')!r}, not {recipe.name!r}"
            )
        settings.update(stored["config"])
        settings.update(stored["trainer"])
    if args.config:
        path = Path(args.config)
        if not path.is_file():
            raise FileNotFoundError(f"--config file {path} does not exist")
        try:
            settings.update(tomllib.loads(path.read_text()))
        except tomllib.TOMLDecodeError as err:
            raise ArgumentError(f"--config file {path} is not valid TOML: {err}") from err
    launcher = ("command", "recipe", "out", "config", "resume", "auto_resume", "overwrite",
                "nproc", "max_restarts", "argv")  # fmt: skip
    flags = {k: v for k, v in vars(args).items() if k not in launcher}
    settings.update(flags)
    return recipe.configs(settings)


def run_config(recipe: Recipe, config: Any, setup: Setup) -> dict[str, Any]:
    """What config.json records: the recipe, its settings, and (for recipes that train on
    a data set) the data's shape, classes and encoding, so pictures can undo it, and which
    split and how many rows it trains, validates and tests on."""
    record = {
        "recipe": recipe.name,
        "config": dataclasses.asdict(config),
        "ebmlab": ebmlab.__version__,
    }
    parts = {role: getattr(setup.task, role, None) for role in ("train", "val", "test")}
    if isinstance(parts["train"], Dataset):
        record["data"] = parts["train"].describe()
    if all(isinstance(part, Dataset) for part in parts.values()):
        record["splits"] = describe_splits(parts)
    return record


def cmd_train(args: argparse.Namespace) -> int:
    _checks.positive_int("--nproc", args.nproc)
    recipe = get_recipe(args.recipe)
    run = RunDirectory(args.out)
    _checks.positive_int("--max-restarts", args.max_restarts, allow_zero=True)
    saved = run.last.is_file() or previous_path(run.last).is_file()
    # processes restarted by torchrun after one of them died continue from the checkpoint
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    args.resume = args.resume or ((args.auto_resume or restarted) and saved)
    if args.resume and args.overwrite:
        raise ArgumentError("--resume continues the run in --out and --overwrite deletes it; "
                            "give one of them")  # fmt: skip
    # a resubmitted job whose run never reached a checkpoint starts that run again
    overwrite = args.overwrite or ((args.auto_resume or restarted) and not saved)
    launched = "WORLD_SIZE" in os.environ
    if not (args.resume or overwrite or launched):
        run.refuse_fresh_start("--resume", "--overwrite")
    config, trainer_config = _configs(recipe, args, run)
    apply_threads(trainer_config.threads, "--threads")  # before any work, as the trainer will
    device = resolve_device(trainer_config.device)
    if device.type == "cuda" and args.nproc > torch.cuda.device_count():
        raise ArgumentError(
            f"--nproc {args.nproc} needs one GPU per process, and {torch.cuda.device_count()} "
            "are present; use --nproc <= that, or --device cpu"
        )
    if args.nproc > 1 and not launched:
        return launch(args.nproc, args.argv, args.max_restarts)
    distributed.init(device)  # before the recipe builds its per-rank state
    if launched and args.nproc not in (1, int(os.environ["WORLD_SIZE"])):
        raise ArgumentError(
            f"--nproc {args.nproc} disagrees with WORLD_SIZE={os.environ['WORLD_SIZE']}"
        )
    try:
        setup = recipe.build(config, trainer_config)
        trainer = Trainer(
            setup.task, setup.train_data, trainer_config, run, run_config(recipe, config, setup)
        )
        trainer.preemption.hint = f"resume with: {resume_command(args.argv)}"
        summary = trainer.fit(resume=args.resume, overwrite=overwrite)
        distributed.barrier()  # no rank leaves the group while another still writes or talks
    finally:
        distributed.shutdown()
    if trainer.main:
        print(json.dumps(jsonable({"run_dir": str(run.path), **summary}), indent=2, default=str))
    if summary["status"] != "interrupted":
        return 0
    if trainer.main:
        print(f"ebmlab: stopped at step {summary['step']}; {trainer.preemption.hint}",
              file=sys.stderr)  # fmt: skip
    return trainer.preemption.exit_status


def resume_command(argv: Sequence[str]) -> str:
    """The shell command that continues the run ``ebmlab <argv>`` trains: the same
    arguments (flags override the stored settings alike) with ``--resume`` in place of
    ``--overwrite`` and ``--auto-resume``."""
    kept = [a for a in argv if a not in ("--resume", "--auto-resume", "--overwrite")]
    return shlex.join(["ebmlab", *kept, "--resume"])


def launch(nproc: int, argv: list[str], max_restarts: int = 0) -> int:
    """Run ``ebmlab <argv>`` in ``nproc`` processes on this machine, like
    ``torchrun --standalone --nproc-per-node nproc --max-restarts N -m ebmlab <argv>``;
    returns the exit status (the first failing process's, or 0)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, usable_cpus() // nproc)))
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"ebmlab-{os.getpid()}",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=max_restarts,
        monitor_interval=0.1,
    )
    try:
        elastic_launch(config, sys.executable)("-m", "ebmlab", *argv)
    except ChildFailedError as err:
        _, first = err.get_first_failure()
        return first.exitcode if first.exitcode > 0 else 1
    return 0


def load_run(
    run_dir: str | Path, checkpoint: str = "last", device: str = "auto", weights: str = "ema"
) -> tuple[Recipe, Setup, RunDirectory]:
    """Rebuild a run's recipe on ``device`` (whatever device trained it) and restore its
    model and task state from a checkpoint: with the averaged weights of a run trained
    with ``ema`` unless ``weights`` is ``"raw"``."""
    _checks.one_of("weights", weights, ["ema", "raw"])
    run = RunDirectory(run_dir)
    stored = run.read_config()
    recipe = get_recipe(stored["recipe"])
    settings = {**stored["config"], **stored["trainer"], "device": device}
    setup = recipe.build(*recipe.configs(settings))
    target = resolve_device(device)
    # a run still training may be between writes: a damaged file gives way to the one
    # it replaced, so readers only ever see a complete checkpoint
    state, used, problem = load_newest_good(run.checkpoints / f"{checkpoint}.pt", target)
    if problem:
        print(f"ebmlab: {problem}; reading {used.name} instead", file=sys.stderr)
    setup.task.to(target)
    setup.train_data = tuple(t.to(target) for t in setup.train_data)
    setup.task.model.load_state_dict(state["model"])
    if weights == "ema" and "ema" in state:
        setup.task.model.load_state_dict(state["ema"]["average"], strict=False)
    setup.task.load_state_dict(state["task"])
    setup.task.model.eval()
    setup.step = state["trainer"]["step"]
    return recipe, setup, run


FLAGS = {"feature_model": "--features-from", "likelihood": "--nll"}  # evaluate's, by option


def _feature_model(args: argparse.Namespace, setup: Setup) -> torch.nn.Module | None:
    """The classifier of the run ``--features-from`` names (None without), checked to
    read the evaluated run's inputs: the same row shape and value range."""
    if args.features_from is None:
        return None
    _, other, _ = load_run(args.features_from, "last", args.device, args.weights)
    mine, theirs = setup.task.train, other.task.train  # type: ignore[attr-defined]
    if mine.x.shape[1:] != theirs.x.shape[1:] or mine.value_range != theirs.value_range:
        raise ArgumentError(
            f"--features-from {args.features_from}: its classifier reads rows of "
            f"{tuple(theirs.x.shape[1:])} in {theirs.value_range}, this run's are "
            f"{tuple(mine.x.shape[1:])} in {mine.value_range}"
        )
    return other.task.model


def cmd_evaluate(args: argparse.Namespace) -> int:
    for run_dir in (args.run_dir, args.features_from):  # not a run: one line, before any other
        if run_dir is not None:
            RunDirectory(run_dir).read_config()
    if args.long_run_steps is not None and args.long_run_steps <= STABILITY_STEPS:
        raise ArgumentError(
            f"--long-run-steps must be more than {STABILITY_STEPS}, got {args.long_run_steps}"
        )
    if args.samples is not None:
        check_eval_samples("--samples", args.samples)
    if args.guidance is not None:
        _checks.positive("--guidance", args.guidance, allow_zero=True)
    progress = Stages("evaluate")
    progress(f"loading {args.run_dir} ({args.checkpoint} checkpoint)")
    recipe, setup, run = load_run(args.run_dir, args.checkpoint, args.device, args.weights)
    given = {
        "feature_model": _feature_model(args, setup),
        "ood_data": args.ood_data,
        "ood_root": args.ood_root,
        "likelihood": args.nll,
        "long_run_steps": args.long_run_steps,
        "samples": args.samples,
        "guidance": args.guidance,
        "inception": args.inception,
        "inception_samples": args.inception_samples,
        "inception_reference": args.inception_reference,
        "inception_preprocessing": args.inception_preprocessing,
    }
    options = {name: value for name, value in given.items() if value is not None}
    accepted = inspect.signature(recipe.evaluate).parameters
    for name in options:
        if name not in accepted:
            flag = FLAGS.get(name, "--" + name.replace("_", "-"))
            raise ArgumentError(f"recipe {recipe.name!r} does not take {flag}")
    if "progress" in accepted:
        options["progress"] = progress
    result = {
        "checkpoint": args.checkpoint,
        "step": setup.step,
        **recipe.evaluate(setup, run, **options),
    }
    write_json(run.path / "evaluation.json", result)
    progress(f"done; written to {run.path / 'evaluation.json'}")
    print(json.dumps(jsonable(result), indent=2, default=str))
    return 0


def cmd_sample(args: argparse.Namespace) -> int:
    _checks.positive_int("--n", args.n)
    _checks.positive_int("--steps", args.steps)
    recipe, setup, run = load_run(args.run_dir, args.checkpoint, args.device, args.weights)
    if recipe.sample is None:
        raise ArgumentError(f"recipe {recipe.name!r} cannot draw samples")
    out = Path(args.out) if args.out else run.samples / "sample.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    recipe.sample(setup, run, args.n, args.steps, out, seed=args.seed)
    print(out)
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    import numpy
    import sklearn

    print(f"ebmlab {ebmlab.__version__}")
    print(
        f"python {platform.python_version()}, torch {torch.__version__}, "
        f"numpy {numpy.__version__}, scikit-learn {sklearn.__version__}"
    )
    threads = torch.get_num_threads()
    load = load_average()
    shown_load = "unknown" if load is None else f"{load:.1f}"
    print(f"torch threads: {threads} (this process may use {usable_cpus()} CPUs; "
          f"load average {shown_load}; set with --threads)")  # fmt: skip
    if busy := busy_warning(threads):
        print(f"warning: {busy}")
    hw = hardware.report()
    features = [name for name, present in hw["cpu_features"].items() if present]
    print(f"cpu: {hw['cpu']} ({', '.join(features) or 'no listed extensions'}); "
          f"ATen kernels: {hw['aten_cpu_capability']}")  # fmt: skip
    for gpu in hw["cuda"]:
        print(f"{gpu['device']}: {gpu['name']} (bfloat16: {'yes' if gpu['bf16'] else 'no'})")
    print("devices: " + ", ".join(hw["devices"]))
    fast = {**hw["fast_paths"], "onednn_int8_binary_products": quantized_available(
        torch.device("cpu"))}  # fmt: skip
    print("cpu fast paths:")
    for name, value in fast.items():
        shown = value if not isinstance(value, bool) else ("on" if value else "off")
        print(f"  {name:<28} {shown}")
    print("data sets:")
    for name, where in available_datasets(args.data_root).items():
        print(f"  {name:<13} {where}")
    print(f"decoded image folders: {cache_root() / 'image-folders'} (set EBMLAB_CACHE to move)")
    print("recipes: " + ", ".join(recipes()))
    return 0


def show_data(args: argparse.Namespace) -> dict[str, Any]:
    """What ``ebmlab data show`` prints: the data's shape, classes and encoding, and the
    rows and class counts of each split a recipe trains, validates and tests on; with
    ``--grid``, a picture of training images, ten of each of the first ten classes
    (fewer where a class has fewer)."""
    name = check_data(args.name, DATASETS, args.data_root)
    check_validation_fraction(args.validation_fraction)
    if args.grid is not None and Path(args.grid).suffix.lower() != ".png":
        raise ArgumentError(f"--grid must name a .png file, got {args.grid!r}")
    parts = run_splits(
        name,
        root=args.data_root,
        resize=tuple(args.resize),
        validation_fraction=args.validation_fraction,
    )
    train = parts[0]
    summary = {k: v for k, v in train.describe().items() if k not in ("split", "rows")}
    summary["splits"] = describe_splits(dict(zip(("train", "val", "test"), parts, strict=True)))
    if args.grid is not None:
        if train.image_shape is None or train.y is None:
            raise ArgumentError(f"--grid draws labelled images; data {args.name!r} has none")
        classes = range(min(train.num_classes or 0, GRID_CLASSES))
        picks = [torch.nonzero(train.y == c).flatten()[:GRID_CLASSES] for c in classes]
        per_class = min(len(p) for p in picks)
        rows = torch.cat([p[:per_class] for p in picks])
        names = train.classes or [str(c) for c in classes]
        Path(args.grid).parent.mkdir(parents=True, exist_ok=True)
        image_grid(train.x[rows], args.grid, image_shape=train.image_shape,
                   value_range=train.value_range, ncol=per_class,
                   row_labels=[names[c] for c in classes],
                   title=f"{args.name}: training images")  # fmt: skip
        summary["grid"] = str(args.grid)
    return summary


def cmd_data(args: argparse.Namespace) -> int:
    if args.action == "show":
        print(json.dumps(jsonable(show_data(args)), indent=2))
        return 0
    if args.action == "cache":
        if args.clear:
            print(f"freed {clear_cache() / 2**20:.1f} MiB in {cache_root() / 'image-folders'}")
            return 0
        for entry in cached_folders():
            size = entry["resize"]
            resized = f" resized to {size[0]}x{size[1]}" if size else ""
            print(f"{entry['bytes'] / 2**20:9.1f} MiB  {tuple(entry['shape'])}  "
                  f"{entry['source']}{resized}")  # fmt: skip
        return 0
    for path in download(args.name, args.dir, base_url=args.mirror):
        print(path)
    return 0


def cmd_logz(args: argparse.Namespace) -> int:
    recipe, setup, _ = load_run(args.run_dir, args.checkpoint, args.device, args.weights)
    if recipe.log_partition is None:
        raise ArgumentError(
            f"recipe {recipe.name!r} trains a conditional energy E(x, y), whose normaliser "
            "over the answers y is summed exactly in its likelihood; there is no log Z "
            "over x to estimate"
        )
    estimate = recipe.log_partition(setup, args.method, seed=args.seed)
    print(json.dumps(jsonable(estimate.to_dict()), indent=2, default=str))
    return 0


COMMANDS = {
    "info": cmd_info,
    "train": cmd_train,
    "evaluate": cmd_evaluate,
    "sample": cmd_sample,
    "logz": cmd_logz,
    "data": cmd_data,
    "mcmc": mcmc_command.cmd_mcmc,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
        args.argv = list(sys.argv[1:] if argv is None else argv)
        if args.command != "train":  # train takes it with the run's other settings
            apply_threads(args.threads, "--threads")
        return COMMANDS[args.command](args)
    except UsageError as err:
        print(str(err).splitlines()[0], file=sys.stderr)
        return 2
    except USAGE_ERRORS as err:
        print(
            f"ebmlab: error: {str(err).splitlines()[0] if str(err) else type(err).__name__}",
            file=sys.stderr,
        )
        return 2
    except RUN_FAILURES as err:
        print(f"ebmlab: {err}", file=sys.stderr)
        return 1


def run() -> NoReturn:
    """The ``ebmlab`` program (``python -m ebmlab``): :func:`main` in a process of its own.

    What the imports made (torch's modules among them, some 170,000 objects) lives as long
    as the process, so it is moved out of the garbage collector's reach first
    (``gc.freeze``, as the gc module's documentation advises): no collection walks it
    again, nor the interpreter's teardown, which otherwise takes 1.5-2 s of every
    command.
    """
    gc.freeze()
    sys.exit(main())


if __name__ == "__main__":  # pragma: no cover
    run()
