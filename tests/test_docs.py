"""The README's tour and the tutorials run as written: each page's Python blocks in
order, in one namespace per page."""

import contextlib
import io
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
WITH_CODE = [p for p in PAGES if "```python" in p.read_text()]


@pytest.mark.parametrize("page", WITH_CODE, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run_in_order(page: Path, tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)
    namespace: dict = {"__name__": "__docs__"}
    cwd = os.getcwd()
    os.chdir(tmp_path)  # pages that write files write them here
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            for block in blocks:
                exec(compile(block, str(page), "exec"), namespace)
    finally:
        os.chdir(cwd)


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
