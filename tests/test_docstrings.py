"""Every public class, function and method of the API reference has a docstring (an
override may inherit its base's), so that help() and the documentation site say what
each does."""

import dataclasses
import importlib
import inspect
import re

PACKAGES = [
    "ebmlab.energies",
    "ebmlab.samplers",
    "ebmlab.losses",
    "ebmlab.learning",
    "ebmlab.partition",
    "ebmlab.inference",
    "ebmlab.evaluation",
    "ebmlab.data",
    "ebmlab.training",
    "ebmlab.sklearn",
    "ebmlab.conformance",
    "ebmlab.devices",
    "ebmlab.hardware",
    "ebmlab.testing",
    "ebmlab.plotting",
]
INHERITED_FROM_TORCH = {"forward"}  # nn.Module.forward: documented by the class


def _public(package: str):
    module = importlib.import_module(package)
    for name in getattr(module, "__all__", [n for n in dir(module) if not n.startswith("_")]):
        obj = getattr(module, name)
        if (inspect.isclass(obj) or inspect.isfunction(obj)) and obj.__module__.startswith(
            "ebmlab"
        ):
            yield f"{package}.{name}", obj


def test_every_public_object_has_a_docstring():
    missing = []
    for package in PACKAGES:
        for name, obj in _public(package):
            if not (obj.__doc__ or "").strip():
                missing.append(name)
            if not inspect.isclass(obj):
                continue
            for member, value in vars(obj).items():
                if member.startswith("_") or member in INHERITED_FROM_TORCH:
                    continue
                if inspect.isfunction(value) and not inspect.getdoc(getattr(obj, member)):
                    missing.append(f"{name}.{member}")
    assert not missing, f"{len(missing)} without a docstring: {missing}"


def test_every_name_a_package_exports_exists():
    for package in PACKAGES:
        module = importlib.import_module(package)
        absent = [n for n in getattr(module, "__all__", []) if not hasattr(module, n)]
        assert not absent, (package, absent)


def _undescribed(fn, doc: str) -> list[str]:
    """Parameters of ``fn`` that ``doc`` never names."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    return [
        p.name
        for p in parameters
        if p.name not in ("self", "cls")
        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        and not re.search(rf"(?<![\w]){re.escape(p.name)}(?![\w])", doc)
    ]


def test_every_parameter_of_the_api_is_described():
    """Each parameter of a public function, method or constructor is named in its
    docstring (a constructor's in the class docstring), so no argument is left for the
    reader to guess."""
    missing = []
    for package in PACKAGES:
        for name, obj in _public(package):
            if not inspect.isclass(obj):
                missing += [f"{name}({p})" for p in _undescribed(obj, obj.__doc__ or "")]
                continue
            init = vars(obj).get("__init__")
            doc = (obj.__doc__ or "") + ((init.__doc__ or "") if init else "")
            if init or dataclasses.is_dataclass(obj):
                missing += [f"{name}({p})" for p in _undescribed(obj.__init__, doc)]
            for member, value in vars(obj).items():
                if member.startswith("_") or member in INHERITED_FROM_TORCH:
                    continue
                if inspect.isfunction(value) or isinstance(value, (classmethod, staticmethod)):
                    method = getattr(obj, member)
                    undescribed = _undescribed(method, inspect.getdoc(method) or "")
                    missing += [f"{name}.{member}({p})" for p in undescribed]
    assert not missing, f"{len(missing)} parameters undescribed: {missing}"


def test_every_package_has_a_page_in_the_api_reference():
    """The API reference renders each package whose objects the tests above require to
    be documented, so each of them appears there."""
    from pathlib import Path

    pages = Path(__file__).parents[1] / "docs" / "api"
    rendered = {
        line.removeprefix(":::").strip()
        for page in pages.glob("*.md")
        for line in page.read_text().splitlines()
        if line.startswith(":::")
    }
    assert not set(PACKAGES) - rendered, sorted(set(PACKAGES) - rendered)
