"""The README's tour and the tutorials run as written: a tutorial's Python blocks in
order, in one namespace per page; each of the README's blocks on its own, as a reader
pastes it, printing the numbers its text states."""

import contextlib
import io
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
WITH_CODE = [p for p in PAGES if "```python" in p.read_text()]
TUTORIALS = [p for p in WITH_CODE if p.name != "README.md"]


def run_blocks(page: Path, where: Path, fresh: bool) -> list[str]:
    """Run a page's Python blocks in order (each in a new namespace with ``fresh``) in
    the folder ``where``; returns what each printed."""
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
    namespace: dict = {"__name__": "__docs__"}
    printed = []
    cwd = os.getcwd()
    os.chdir(where)  # pages that write files write them here
    try:
        for block in blocks:
            if fresh:
                namespace = {"__name__": "__docs__"}
            with contextlib.redirect_stdout(io.StringIO()) as out:
                exec(compile(block, str(page), "exec"), namespace)
            printed.append(out.getvalue())
    finally:
        os.chdir(cwd)
    return printed


@pytest.mark.parametrize("page", TUTORIALS, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run_in_order(page: Path, tmp_path: Path) -> None:
    run_blocks(page, tmp_path, fresh=False)


def test_each_readme_block_runs_alone_and_prints_what_the_text_says(tmp_path: Path) -> None:
    readme = ROOT / "README.md"
    text = readme.read_text()
    tour, samplers = run_blocks(readme, tmp_path, fresh=True)
    nll, true = map(float, re.search(r"test NLL (\S+) nats, true density (\S+)", tour).groups())
    bound = float(re.search(r"within (\S+) nats of the true one", text).group(1))
    stated = re.search(r"\((\S+) against (\S+)\)", text).groups()
    assert 0 < nll - true < bound and abs(nll - float(stated[0])) < 0.05, tour
    assert abs(true - float(stated[1])) < 0.01
    rhat = float(re.search(r"R-hat max (\S+)", samplers).group(1))
    assert rhat <= 1.01 and "R-hat max below 1.01" in text, samplers


def test_links_of_the_readme_lead_to_files() -> None:
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if not t.startswith(("http://", "https://"))]
    assert local, "the README links to its documentation pages"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"README links to missing files: {missing}"


def test_concept_map_is_drawn(tmp_path: Path) -> None:
    import runpy

    out = tmp_path / "map.png"
    runpy.run_path(str(ROOT / "docs" / "figures" / "concept_map.py"), run_name="concept_map")[
        "draw"
    ](out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_the_evaluation_keys_check_catches_an_undocumented_key(assert_keys_documented):
    assert_keys_documented({"checkpoint": "last", "samples": {"after_500_more_steps": {}}})
    with pytest.raises(AssertionError, match="no_such_key"):
        assert_keys_documented({"samples": {"no_such_key": 1.0}})
