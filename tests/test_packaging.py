"""The wheel holds the whole package and its command: built from the sources, installed
on its own (no editable install, no source tree on the path), it runs ``ebmlab info``.
The declared dependency floors are the ones ``make test-oldest`` tests, and ``make
test``'s fast-path pass collects every file that holds a fast-path test."""

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_installs_and_runs_info(tmp_path):
    project = tmp_path / "project"  # a copy, so that the build writes nothing here
    shutil.copytree(ROOT / "src", project / "src", ignore=shutil.ignore_patterns("*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, project / name)
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(wheels), str(project)],
        check=True, cwd=tmp_path,
    )  # fmt: skip
    (wheel,) = wheels.glob("ebmlab-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = next(n for n in names if n.endswith("entry_points.txt"))
        assert "ebmlab = ebmlab.cli:run" in archive.read(entry_points).decode()
    sources = {p.relative_to(project / "src").as_posix() for p in (project / "src").rglob("*.py")}
    assert sources <= set(names), sorted(sources - set(names))
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
         str(wheel)],
        check=True,
    )  # fmt: skip
    code = ("import sys, ebmlab.cli; print(ebmlab.__file__); "
            "sys.argv[1:] = ['info']; ebmlab.cli.run()")
    result = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(target)!r}); {code}"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    first, *rest = result.stdout.splitlines()
    assert first.startswith(str(target)), first  # the installed copy, not the sources
    assert any(line.startswith("ebmlab ") for line in rest) and "recipes: " in result.stdout


def test_oldest_pins_sit_on_the_declared_floors():
    """``make test-oldest`` pins each runtime dependency but torch (and pandas, of the
    tests) to a release of its floor in pyproject.toml: raising a floor without moving
    the pin, or adding a dependency without one, fails here."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floors = {}
    for requirement in project["dependencies"] + project["optional-dependencies"]["dev"]:
        name, floor = re.fullmatch(r"([A-Za-z0-9_-]+)>=([0-9.]+)(?:,.*)?", requirement).groups()
        floors[name.lower()] = floor
    pins = dict(pin.lower().split("==") for pin in _make_variable("OLDEST"))
    runtime = {re.match(r"[A-Za-z0-9_-]+", r).group().lower() for r in project["dependencies"]}
    assert set(pins) >= runtime - {"torch"}, sorted(runtime - {"torch"} - set(pins))
    for name, version in pins.items():
        floor = floors[name]
        assert version == floor or version.startswith(floor + "."), (name, version, floor)


def test_the_fast_path_pass_collects_every_fast_path_test():
    """``make test`` runs the ``fastpath``-marked tests twice, collecting only the files
    its FASTPATH variable names: a file that gains the mark without joining the list
    would run once only, and a listed file that loses it is collected for nothing."""
    marked = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "tests").rglob("test_*.py")
        if re.search(r"mark\.fastpath\b", path.read_text())
    }
    assert set(_make_variable("FASTPATH")) == marked


def _make_variable(name: str) -> list[str]:
    """The words of a ``NAME := ...`` line of the Makefile (continuation lines joined)."""
    makefile = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    line = next(x for x in makefile.splitlines() if x.startswith(f"{name} :="))
    return line.split(":=")[1].split()
