"""Device conformance: run code as if its tensors lived on an accelerator, on a CPU.

Code that is right on the CPU can still fail on a GPU: a random draw made without
``device=`` lands on the CPU and meets device tensors, a CPU-only kernel (oneDNN) is
handed device tensors, ``.numpy()`` is called on a device tensor, or a sampler step
waits for the device (``.item()``, ``bool(t)``, boolean-mask indexing, ``.tolist()``).
:func:`simulated_device` finds each of these without a GPU.

Inside it, :func:`to_device` wraps tensors (and a module's parameters and buffers) so
that they report the ``meta`` device while their values stay on the CPU. A dispatch
mode sees every operation: operations on wrapped tensors run on the CPU values and
return wrapped results, factory functions called with ``device=`` that device make
wrapped tensors, and ``torch.Generator(device=...)`` gives a CPU generator that
reports the simulated device. Everything computes as usual, so results can be
checked too. A :class:`DeviceViolationError` is raised where a real device would fail or
stall:

- an operation mixes wrapped tensors with CPU tensors of one or more dimensions
  (zero-dimensional CPU tensors are allowed, as CUDA allows them);
- a oneDNN / quantized CPU kernel receives a wrapped tensor;
- ``.numpy()`` is called on a wrapped tensor;
- inside :meth:`SimulatedDevice.no_sync` (a sampler step, say), an operation makes
  the host wait for the device: reading a value (``.item()``, ``float(t)``,
  ``bool(t)``, ``.tolist()``), an output whose size depends on values
  (``nonzero``, boolean-mask indexing, ``masked_select``, ``unique``), or a copy to
  the CPU;
- with ``float64=False``, which poses as Apple's GPU (MPS, whose kernels have no
  double precision), a float64 tensor reaches the device. The simulated device is then
  listed in :data:`ebmlab.devices.NO_FLOAT64`, so code that asks
  :func:`~ebmlab.devices.wide_dtype` takes the branch it takes on a Mac.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ebmlab import devices

DEVICE = torch.device("meta")
_WIDE = (torch.float64, torch.complex128)  # dtypes a device without float64 lacks
_CPU = torch.device("cpu")
_CPU_ONLY_NAMESPACES = ("mkldnn", "onednn", "quantized", "mkl")
_aten = torch.ops.aten
# explicit copies between the CPU and the device (allowed; a copy to the CPU is a
# synchronisation, see _to_cpu)
_TRANSFERS = {
    _aten._to_copy.default, _aten.to.device, _aten.to.dtype_layout, _aten.copy_.default,
    _aten.copy.default, _aten.lift_fresh.default, _aten.lift_fresh_copy.default,
}  # fmt: skip
# operations whose output the host must read before it can go on
_SYNCING = {
    _aten._local_scalar_dense.default,
    _aten.nonzero.default,
    _aten.masked_select.default,
    _aten.equal.default,
    _aten.is_nonzero.default,
    _aten.repeat_interleave.Tensor,
    _aten._unique2.default,
    _aten.unique_dim.default,
    _aten.unique_consecutive.default,
}


_ACTIVE: list[SimulatedDevice] = []  # the simulations entered, innermost last


class DeviceViolationError(AssertionError):
    """Code did something that fails or stalls on a real accelerator."""


class _OnDevice(torch.Tensor):
    """A CPU tensor that reports the simulated device."""

    cpu_value: torch.Tensor

    @staticmethod
    def __new__(cls, value: torch.Tensor, requires_grad: bool = False) -> _OnDevice:
        wrapped = torch.Tensor._make_wrapper_subclass(
            cls,
            value.shape,
            strides=value.stride(),
            storage_offset=value.storage_offset(),
            dtype=value.dtype,
            device=DEVICE,
            requires_grad=requires_grad,
        )
        wrapped.cpu_value = value
        return wrapped

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        return f"OnDevice({self.cpu_value!r})"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.numpy:
            raise DeviceViolationError(".numpy() of a device tensor: call .cpu() first")
        if func is torch.Tensor.tolist:
            _ACTIVE[-1].read_back("Tensor.tolist")
            return args[0].cpu_value.tolist()
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise DeviceViolationError(
            f"{func} ran on a simulated device tensor outside simulated_device()"
        )


class _GeneratorMeta(type(torch.Generator)):
    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, _REAL_GENERATOR)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, _REAL_GENERATOR)


_REAL_GENERATOR = torch.Generator


class _Generator(torch.Generator, metaclass=_GeneratorMeta):
    """``torch.Generator`` inside the simulation: one for the simulated device is a CPU
    generator that reports that device."""

    def __new__(cls, device: torch.device | str = "cpu") -> _Generator:
        simulated = torch.device(device).type == DEVICE.type
        gen = super().__new__(cls, _CPU if simulated else device)
        gen._simulated = simulated
        return gen

    @property
    def device(self) -> torch.device:
        return DEVICE if self._simulated else super().device


def _is_device_request(kwargs: dict[str, Any]) -> bool:
    device = kwargs.get("device")
    return device is not None and torch.device(device).type == DEVICE.type


class SimulatedDevice(TorchDispatchMode):
    """The dispatch mode behind :func:`simulated_device`; counts what it checked.

    Args:
        float64: whether the simulated device has double precision.
    """

    def __init__(self, float64: bool = True) -> None:
        super().__init__()
        self.float64 = float64
        self.strict = 0
        self.ops = 0
        self.host_syncs = 0  # outside no_sync too
        self._what = "this code"

    @contextlib.contextmanager
    def no_sync(self, what: str = "this code") -> Iterator[None]:
        """Forbid host synchronisation inside (e.g. around one sampler step).

        Args:
            what: a few words naming the operation, for the error message.
        """
        self.strict += 1
        self._what = what
        try:
            yield
        finally:
            self.strict -= 1

    def read_back(self, what: object) -> None:
        """Count a host synchronisation; inside no_sync, it is a violation.

        Args:
            what: a few words naming the operation, for the error message.
        """
        self.host_syncs += 1
        if self.strict:
            raise DeviceViolationError(f"host synchronisation in {self._what}: {what}")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        self.ops += 1
        leaves = _leaves((args, kwargs))
        on_device = [t for t in leaves if isinstance(t, _OnDevice)]
        factory = _is_device_request(kwargs)
        to_host = _to_cpu(func, kwargs)
        if on_device or factory:
            self._check(func, leaves, kwargs)
        if factory:
            kwargs["device"] = _CPU
        owners = {id(t.cpu_value): t for t in on_device}
        unwrapped_args, unwrapped_kwargs = _tree_map(_unwrap, (args, kwargs))
        out = func(*unwrapped_args, **unwrapped_kwargs)
        if not (on_device or factory) or to_host:
            return out
        if not self.float64:
            _no_float64(func, [*on_device, *_leaves(out)])

        def rewrap(t: Any) -> Any:
            if not isinstance(t, torch.Tensor):
                return t
            owner = owners.get(id(t))
            return _OnDevice(t) if owner is None else owner

        return _tree_map(rewrap, out)

    def _check(self, func, leaves: list[Any], kwargs: dict[str, Any]) -> None:
        namespace = func.namespace
        if namespace in _CPU_ONLY_NAMESPACES or "mkldnn" in func.__name__:
            raise DeviceViolationError(f"the CPU-only kernel {func} was given device tensors")
        transfer = func in _TRANSFERS
        host = [] if transfer else [
            t for t in leaves
            if isinstance(t, torch.Tensor) and not isinstance(t, _OnDevice) and t.ndim > 0
        ]  # fmt: skip
        if host:
            raise DeviceViolationError(
                f"{func} mixes device tensors with a CPU tensor of shape {tuple(host[0].shape)}"
                " (made without device=?)"
            )
        if func in _SYNCING or _bool_index(func, leaves) or _to_cpu(func, kwargs):
            self.read_back(func)


def _no_float64(what: object, tensors: list[Any]) -> None:
    wide = [t for t in tensors if isinstance(t, torch.Tensor) and t.dtype in _WIDE]
    if wide:
        raise DeviceViolationError(
            f"{what} put a {wide[0].dtype} tensor on a device without double precision"
            " (MPS): use ebmlab.devices.wide_dtype(device) for sums, or the CPU"
        )


class _HostValues(TorchFunctionMode):
    """``torch.tensor`` / ``torch.as_tensor`` of host values with ``device=`` the
    simulated device: made on the CPU, then copied over (these build their value below
    the dispatch modes, where the simulation could not see it)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.tensor, torch.as_tensor) and _is_device_request(kwargs):
            rest = {k: v for k, v in kwargs.items() if k != "device"}
            return func(*args, **rest).to(DEVICE)
        return func(*args, **kwargs)


def _leaves(tree: Any) -> list[Any]:
    """The leaves of an operator's arguments or results: nested plain tuples, lists and
    dicts, as ``torch.utils._pytree.tree_flatten`` gives them, at a tenth of its cost per
    call (it runs twice for each operation of a simulated run)."""
    kind = type(tree)
    if kind is tuple or kind is list:
        return [leaf for item in tree for leaf in _leaves(item)]
    if kind is dict:
        return [leaf for item in tree.values() for leaf in _leaves(item)]
    if isinstance(tree, tuple | list | dict):  # a named tuple, say: pytree knows its kind
        return _pytree.tree_leaves(tree)
    return [tree]


def _tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    """``fn`` applied to each leaf of ``tree``, its containers rebuilt (as
    ``torch.utils._pytree.tree_map``, for the containers :func:`_leaves` walks)."""
    kind = type(tree)
    if kind is tuple or kind is list:
        return kind(_tree_map(fn, item) for item in tree)
    if kind is dict:
        return {key: _tree_map(fn, item) for key, item in tree.items()}
    if isinstance(tree, tuple | list | dict):
        return _pytree.tree_map(fn, tree)
    return fn(tree)


def _unwrap(t: Any) -> Any:
    return t.cpu_value if isinstance(t, _OnDevice) else t


def _to_cpu(func, kwargs: dict[str, Any]) -> bool:
    """A copy from the device to the CPU (``.cpu()``, ``.to("cpu")``)."""
    device = kwargs.get("device")
    return (
        func in (_aten._to_copy.default, _aten.to.device, _aten.to.dtype_layout)
        and device is not None
        and torch.device(device).type == "cpu"
    )


def _bool_index(func, leaves: list[Any]) -> bool:
    """Indexing with a boolean mask, whose result's size depends on the mask's values."""
    return func in (_aten.index.Tensor, _aten.index_put_.default, _aten.index_put.default) and any(
        isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in leaves
    )


def to_device(value: Any) -> Any:
    """``value`` on the simulated device: a tensor, or a module (its parameters and
    buffers, in place), or a tuple / list / dict of them."""
    if isinstance(value, nn.Module):
        for module in value.modules():
            for name, p in list(module._parameters.items()):
                if p is not None and not isinstance(p, _OnDevice):
                    module._parameters[name] = nn.Parameter(
                        _OnDevice(p.detach()), requires_grad=p.requires_grad
                    )
            for name, b in list(module._buffers.items()):
                if b is not None and not isinstance(b, _OnDevice):
                    module._buffers[name] = _OnDevice(b)
        return value
    if isinstance(value, torch.Tensor):
        if isinstance(value, _OnDevice):
            return value
        if _ACTIVE and not _ACTIVE[-1].float64:
            _no_float64("to_device", [value])
        return _OnDevice(value.detach())
    if isinstance(value, (tuple, list)):
        return type(value)(to_device(v) for v in value)
    if isinstance(value, dict):
        return {k: to_device(v) for k, v in value.items()}
    return value


def cpu_value(t: torch.Tensor) -> torch.Tensor:
    """The CPU values behind a simulated device tensor (a plain tensor passes).

    Args:
        t: a tensor on the simulated device, or a plain tensor.
    """
    return t.cpu_value if isinstance(t, _OnDevice) else t


def on_device(t: Any) -> bool:
    """Whether ``t`` is a simulated device tensor."""
    return isinstance(t, _OnDevice)


@contextlib.contextmanager
def simulated_device(float64: bool = True) -> Iterator[SimulatedDevice]:
    """Run the body with a simulated accelerator (see the module docstring).

    Args:
        float64: whether the device has double precision; ``False`` poses as Apple's
            GPU (MPS).
    """
    mode = SimulatedDevice(float64)
    declared = not float64 and DEVICE.type not in devices.NO_FLOAT64
    if declared:
        devices.NO_FLOAT64.add(DEVICE.type)
    torch.Generator = _Generator
    # Module.to / .double() swap wrapped parameters whole, values included (assigning
    # ``param.data`` would change only the wrapper's metadata)
    swapping = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    _ACTIVE.append(mode)
    try:
        with _HostValues(), mode:
            yield mode
    finally:
        if declared:
            devices.NO_FLOAT64.discard(DEVICE.type)
        _ACTIVE.pop()
        torch.__future__.set_swap_module_params_on_conversion(swapping)
        torch.Generator = _REAL_GENERATOR if not _ACTIVE else _Generator
