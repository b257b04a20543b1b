"""The wheel holds the whole package and its command: built from the sources, installed
on its own (no editable install, no source tree on the path), it runs ``ebmlab info``."""

import shutil
import subprocess
import sys
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
        assert "ebmlab = ebmlab.cli:main" in archive.read(entry_points).decode()
    sources = {p.relative_to(project / "src").as_posix() for p in (project / "src").rglob("*.py")}
    assert sources <= set(names), sorted(sources - set(names))
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
         str(wheel)],
        check=True,
    )  # fmt: skip
    code = "import sys, ebmlab.cli; print(ebmlab.__file__); sys.exit(ebmlab.cli.main(['info']))"
    result = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(target)!r}); {code}"],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    first, *rest = result.stdout.splitlines()
    assert first.startswith(str(target)), first  # the installed copy, not the sources
    assert any(line.startswith("ebmlab ") for line in rest) and "recipes: " in result.stdout
