"""The packages import each other in one direction only: each layer uses the layers
below it and never those above (docs/architecture.md, "Import layers")."""

import ast
import collections
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "src" / "ebmlab"
LAYERS = [
    {"_checks"},
    {"devices", "plotting", "testing", "convergence", "threads"},
    {"hardware", "data"},
    {"energies"},
    {"samplers", "inference"},
    {"partition", "transport"},
    {"losses"},
    {"learning", "evaluation", "conformance"},
    {"training", "sklearn", "mcmc_command"},
    {"cli"},
    {"__main__"},
]


def _imports() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = collections.defaultdict(set)
    for path in ROOT.rglob("*.py"):
        package = path.relative_to(ROOT).parts[0].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
                if node.module == "ebmlab":
                    names += [f"ebmlab.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] == "ebmlab" and len(parts) > 1 and parts[1] != package:
                    graph[package].add(parts[1])
    return graph


def test_every_package_has_a_layer():
    packages = {p.relative_to(ROOT).parts[0].removesuffix(".py") for p in ROOT.rglob("*.py")}
    placed = set().union(*LAYERS)
    assert packages - {"__init__"} <= placed, packages - placed


def test_imports_go_downwards_only():
    level = {name: i for i, layer in enumerate(LAYERS) for name in layer}
    upward = {
        (package, used)
        for package, uses in _imports().items()
        for used in uses
        if used in level and level[used] >= level[package] and used != "__init__"
    }
    assert not upward, f"imports against the layering: {sorted(upward)}"
