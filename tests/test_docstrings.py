"""Every public class, function and method of the API reference has a docstring (an
override may inherit its base's), so that help() and the documentation site say what
each does."""

import importlib
import inspect

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
