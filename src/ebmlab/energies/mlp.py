"""Feed-forward networks as energies, with hand-fused input gradients for samplers."""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from ebmlab import _checks, hardware
from ebmlab._checks import ArgumentError
from ebmlab.energies.base import EnergyModel

LEAKY_SLOPE = 0.2  # of the leaky ReLU (JEM's choice)
ACTIVATIONS = {
    "silu": nn.SiLU,
    "elu": nn.ELU,
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "softplus": nn.Softplus,
    "leaky_relu": lambda: nn.LeakyReLU(LEAKY_SLOPE),  # JEM's WideResNet
}


def _elu(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ELU and its derivative e = exp(min(z, 0)): ELU(z) = max(z, e - 1), since e - 1 is
    0 for z > 0 and exp(z) - 1 >= z otherwise. Four vectorised passes (``F.elu``'s
    expm1 is not vectorised on CPUs), and the backward pass reuses e."""
    e = torch.clamp_max(z, 0.0).exp_()
    return torch.maximum(z, e - 1.0), e


def _silu_and_derivative(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SiLU h = z s (s = sigmoid(z), Elfwing et al. 2018) and its derivative
    s + h (1 - s), both from one exponential. On a CPU the exponential costs as much as
    four memory passes, and ``silu_backward`` would compute it again: five passes with one
    exponential instead of two with two are the faster trade there. ``z`` is the product's
    fresh output and is overwritten."""
    s = torch.sigmoid(z)
    h = z.mul_(s)
    return h, torch.addcmul(s, h, s, value=-1.0).add_(h)


def _times_derivative(g: torch.Tensor, derivative: torch.Tensor) -> torch.Tensor:
    return derivative.mul_(g)


# the activations of the fused pass (same values as ACTIVATIONS), each returning
# (act(z), what its derivative needs)
_FORWARD: dict[str, Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]] = {
    "silu": lambda z: (F.silu(z), z),
    "elu": _elu,
    "relu": lambda z: (a := F.relu(z), a),
    "tanh": lambda z: (a := torch.tanh(z), a),
    "softplus": lambda z: (F.softplus(z), z),
    "leaky_relu": lambda z: (F.leaky_relu(z, LEAKY_SLOPE), z),
}

# d act(z) / dz applied to an incoming gradient g, given what the forward kept, with
# PyTorch's fused backward kernels (ELU's derivative is kept whole: used once, in place)
_BACKWARD: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "silu": lambda g, z: torch.ops.aten.silu_backward(g, z),
    "elu": _times_derivative,
    "relu": lambda g, a: torch.ops.aten.threshold_backward(g, a, 0.0),
    "tanh": lambda g, a: torch.ops.aten.tanh_backward(g, a),
    "softplus": lambda g, z: torch.ops.aten.softplus_backward(g, z, 1.0, 20.0),
    "leaky_relu": lambda g, z: torch.ops.aten.leaky_relu_backward(g, z, LEAKY_SLOPE, False),
}

# on a CPU, where an exponential is dear and a pass over cached memory cheap, SiLU keeps its
# derivative too; a GPU keeps the two kernels above (its element-wise passes cost launches)
_CPU_PASSES = {"silu": (_silu_and_derivative, _times_derivative)}

# maps the network output (B, K) to (energy (B,), d energy / d output), the latter of
# shape (B, K) or broadcastable to it (a constant gradient need not be materialised)
Head = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


# On a CPU the fused pass splits a batch into blocks of at least MIN_BLOCK_ROWS rows
# whose widest activation takes about half a core's L2 cache (the fastest block for
# batches of 1k-8k rows and widths 64-512 on cores with 2 MB), so that a block's
# activations stay in cache between the element-wise passes.
MIN_BLOCK_ROWS = 128

# oneDNN can keep a weight matrix in its own blocked layout, so that a product need not
# reorder it on every call (bfloat16 products of small batches get a third faster), and
# adds the bias inside the product. ``hardware.packed_min_rows`` says from how many rows
# each product is faster that way on this machine; where it says never (other devices,
# CPUs without the kernels), the products are plain ``addmm``/``matmul`` with the same
# results.


def block_rows(x: torch.Tensor, widest: int) -> int | None:
    """Rows per block of the fused pass for ``x``, or None for one pass (not a CPU)."""
    if not hardware.cache_blocking(x.device):
        return None
    return max(MIN_BLOCK_ROWS, hardware.l2_cache_bytes() // 2 // (widest * x.element_size()))


class _FusedLayer:
    """One linear layer prepared for the hand-fused pass in one dtype:
    ``forward(h) = h W^T + b`` and ``input_grad(g) = g W`` (the product's two uses),
    each on oneDNN-packed weights (W, W^T) for blocks of as many rows as
    ``hardware.packed_min_rows`` asks, else on W in place. A layer with one output
    back-propagates by a broadcast product, which also takes a gradient shared by all
    rows, (1, 1), without materialising it."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, dtype: torch.dtype) -> None:
        w, self.bias = weight.detach().to(dtype), bias.detach().to(dtype)
        self.single_output = len(w) == 1
        self.w_forward, self.w = w.t(), w
        pack = torch.ops.mkldnn._reorder_linear_weight
        self.forward_rows = self.backward_rows = None
        self.w_packed = self.w_t_packed = None
        if not self.single_output:
            self.forward_rows = hardware.packed_min_rows(w.device, dtype)
            self.backward_rows = hardware.packed_min_rows(w.device, dtype, backward=True)
            if self.forward_rows is not None:
                self.w_packed = pack(w)
            if self.backward_rows is not None:
                self.w_t_packed = pack(w.t().contiguous())

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.w_packed is not None and len(h) >= self.forward_rows:
            return torch.ops.mkldnn._linear_pointwise(h, self.w_packed, self.bias, "none", [], "")
        return torch.addmm(self.bias, h, self.w_forward)

    def input_grad(self, g: torch.Tensor) -> torch.Tensor:
        if self.single_output:
            return g * self.w
        if self.w_t_packed is not None and len(g) >= self.backward_rows:
            return torch.ops.mkldnn._linear_pointwise(g, self.w_t_packed, None, "none", [], "")
        return g @ self.w


class FeedForward(nn.Module):
    """Linear layers of widths ``sizes`` with ``activation`` between them.

    ``value_and_input_grad(x, head)`` runs the forward pass and back-propagates
    d energy / d output to the input by hand with fused activation backwards: no
    autograd graph is built (a sampler needs no parameter gradients), which is
    15-25% faster than autograd for wide layers and much faster for small batches.
    ``spectral_norm`` wraps each layer in spectral normalisation (bounded Lipschitz
    constant); such layers use autograd for input gradients.
    """

    def __init__(self, sizes: Sequence[int], activation: str = "silu", spectral_norm: bool = False):
        super().__init__()
        _checks.one_of("activation", activation, list(ACTIVATIONS))
        if len(sizes) < 2:
            raise ArgumentError(
                f"sizes must list at least an input and an output width, got {sizes}"
            )
        for width in sizes:
            _checks.positive_int("layer width", width)
        self.activation = activation
        self.spectral_norm = spectral_norm
        self._widest = max(sizes)  # sets the fused pass's block of rows
        # the prepared layers by dtype, valid for the parameters and versions in the key
        self._fused_cache: dict[torch.dtype, list[_FusedLayer]] = {}
        self._cache_key: tuple[tuple[torch.Tensor, ...], tuple[int, ...]] | None = None
        self._grads_seen = False  # a backward pass reached the parameters since then
        self._watched: list[torch.Tensor] = []  # parameters whose hook is registered
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(itertools.pairwise(sizes)):
            lin = nn.Linear(a, b)
            layers.append(nn.utils.parametrizations.spectral_norm(lin) if spectral_norm else lin)
            if i < len(sizes) - 2:
                layers.append(ACTIVATIONS[activation]())
        self.net = nn.Sequential(*layers)
        self._linears = tuple(layers[::2])  # whose parameters the fused pass reads
        if not spectral_norm:  # spectral-norm layers take autograd, with no cached copies
            self._watch(self._fused_params())

    def __getstate__(self) -> dict:
        """Copies (``copy.deepcopy``, pickling) leave the prepared layers and hooks behind
        (oneDNN's packed weights cannot be copied) ..."""
        fresh = {"_fused_cache": {}, "_cache_key": None, "_grads_seen": False, "_watched": []}
        return {**self.__dict__, **fresh}

    def __setstate__(self, state: dict) -> None:
        """... and hook their own parameters."""
        super().__setstate__(state)
        if not self.spectral_norm:
            self._watch(self._fused_params())

    def _fused_params(self) -> tuple[torch.Tensor, ...]:
        return tuple(t for lin in self._linears for t in (lin.weight, lin.bias))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1))

    def _fused_layers(self, dtype: torch.dtype) -> list[_FusedLayer]:
        """Every layer prepared for :meth:`value_and_input_grad` in ``dtype``, cached so
        that a sampler's steps between two updates share one copy.

        The copy is remade when the parameters are replaced or their version counters
        move (in-place edits, ``load_state_dict``, most optimizers), and after any
        backward pass has accumulated a gradient into them: PyTorch's fused optimizers
        (``fused=True``) update in place without advancing the counters, and every
        optimizer step follows such a backward pass. The hooks that notice it are the
        parameters' own (``register_post_accumulate_grad_hook``), nothing process-wide.
        While gradients stay on the parameters (``zero_grad(set_to_none=False)``) the
        copy is remade on every call. (Edits through ``.data`` bypass version counters:
        make them under ``torch.no_grad()`` instead.)"""
        params = self._fused_params()
        versions = tuple(t._version for t in params)
        key = self._cache_key
        if (
            self._grads_seen
            or key is None
            or key[1] != versions
            or any(old is not new for old, new in zip(key[0], params, strict=True))
        ):
            self._fused_cache.clear()
            self._watch(params)
            self._grads_seen = any(t.grad is not None for t in params)
            self._cache_key = (params, versions)
        layers = self._fused_cache.get(dtype)
        if layers is None:
            layers = self._fused_cache[dtype] = [
                _FusedLayer(w, b, dtype) for w, b in zip(params[::2], params[1::2], strict=True)
            ]
        return layers

    def _watch(self, params: tuple[torch.Tensor, ...]) -> None:
        """Hook the parameters not yet hooked, so a gradient reaching them marks the cache
        (parameters frozen at the moment, as during sampling, are hooked at a later
        rebuild)."""
        owner = weakref.ref(self)

        def mark(_: torch.Tensor) -> None:
            module = owner()
            if module is not None:
                module._grads_seen = True

        for t in params:
            if t.requires_grad and not any(t is w for w in self._watched):
                t.register_post_accumulate_grad_hook(mark)
                self._watched.append(t)

    def value_and_input_grad(
        self, x: torch.Tensor, head: Head, dtype: torch.dtype | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(energy, d energy / d x) for energy = head(network(x)), both detached, in x's dtype.

        ``dtype`` (e.g. ``torch.bfloat16``) runs the layers (products and activations) in
        that precision, as autocast would; the head stays in x's dtype.
        On a CPU, large batches go through in blocks of rows whose activations fit in a
        core's cache (:func:`block_rows`): the element-wise passes then read cached memory,
        which makes the whole pass up to 15% faster.
        """
        if self.spectral_norm or torch.compiler.is_compiling():
            # autograd for spectral norm's reparametrised weights, and under
            # torch.compile, which fuses the layers itself and cannot trace the fused
            # pass's weight caches (host state)
            with torch.enable_grad(), hardware.autocast(x.device, dtype):
                xg = x.detach().requires_grad_(True)
                e, _ = head(self(xg))
                (g,) = torch.autograd.grad(e.sum(), xg)
            return e.detach().to(x.dtype), g.to(x.dtype)
        dtype = hardware.reduced_precision(x.device, dtype) or x.dtype
        layers = self._fused_layers(dtype)
        flat = x.flatten(1).to(dtype)
        rows = block_rows(flat, self._widest)
        with torch.no_grad():
            if rows is None or len(flat) <= rows:
                e, g = self._fused_pass(flat, layers, head, x.dtype)
            else:
                parts = [self._fused_pass(b, layers, head, x.dtype) for b in flat.split(rows)]
                e, g = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        return e, g.reshape(x.shape).to(x.dtype)

    def _fused_pass(
        self, h: torch.Tensor, layers: list[_FusedLayer], head: Head, head_dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The forward pass, then d energy / d input back through every layer by hand."""
        act, backward = _FORWARD[self.activation], _BACKWARD[self.activation]
        if h.device.type == "cpu":
            act, backward = _CPU_PASSES.get(self.activation, (act, backward))
        rows, saved = len(h), []
        for layer in layers[:-1]:
            h, kept = act(layer.forward(h))
            saved.append(kept)
        out = layers[-1].forward(h)
        e, g = head(out.to(head_dtype))
        g = layers[-1].input_grad(g.to(out.dtype))
        for layer, kept in zip(reversed(layers[:-1]), reversed(saved), strict=True):
            g = layer.input_grad(backward(g, kept))
        return e, g.expand(rows, -1)


def _scalar_head(out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return out[:, 0], out.new_ones(1, 1)


class MLPEnergy(EnergyModel):
    """E(x) = MLP(x) with smooth activations (SiLU by default, so Langevin gradients are smooth).

    Args:
        dim: D, the input dimension.
        hidden: hidden widths.
        activation: the nonlinearity (``"silu"``, ``"softplus"``, ``"tanh"``, ...).
        spectral_norm: spectrally normalise every layer (Miyato et al. 2018).
    """

    def __init__(
        self,
        dim: int,
        hidden: Sequence[int] = (128, 128),
        activation: str = "silu",
        spectral_norm: bool = False,
    ) -> None:
        super().__init__()
        self.dim = _checks.positive_int("dim", dim)
        self.net = FeedForward([dim, *hidden, 1], activation, spectral_norm)

    def energy(self, x: torch.Tensor) -> torch.Tensor:
        _checks.rows_of("x", x, self.dim)
        return self.net(x).squeeze(-1)

    def energy_and_grad(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _checks.rows_of("x", x, self.dim)
        return self.net.value_and_input_grad(x, _scalar_head, self.grad_dtype)


class NoiseConditionalEnergy(EnergyModel):
    """E(x, t): one MLP for the energies of a data set blurred to noise levels
    t = 0, ..., n_levels - 1, the level given to the network one-hot next to x (the
    family diffusion recovery likelihood learns, Gao et al. 2021). ``energy(x)`` is
    level 0, the data's own energy, so samplers, quadrature and evaluation use it as
    any other energy; ``at_level(t)`` gives the energy of level t.

    Args:
        dim: D, the input dimension.
        hidden: hidden widths.
        activation: the nonlinearity.
    """

    def __init__(
        self,
        dim: int,
        n_levels: int,
        hidden: Sequence[int] = (128, 128),
        activation: str = "silu",
    ) -> None:
        super().__init__()
        self.dim = _checks.positive_int("dim", dim)
        self.n_levels = _checks.positive_int("n_levels", n_levels)
        self.net = FeedForward([dim + n_levels, *hidden, 1], activation)

    def energy_at(self, x: torch.Tensor, level: torch.Tensor) -> torch.Tensor:
        """E(x_i, level_i) for a batch ``x`` (B, dim) and integer levels (B,).

        Args:
            level: each row's noise level, (B,) integers in [0, n_levels).
        """
        code = F.one_hot(level.long(), self.n_levels).to(x.dtype)
        return self.net(torch.cat([x, code], 1)).squeeze(-1)

    def at_level(self, level: int) -> Callable[[torch.Tensor], torch.Tensor]:
        """The energy of noise level ``level`` as a callable x -> (B,)."""
        _checks.one_of("level", level, range(self.n_levels))

        def energy(x: torch.Tensor) -> torch.Tensor:
            return self.energy_at(x, torch.full((x.shape[0],), level, device=x.device))

        return energy

    def energy(self, x: torch.Tensor) -> torch.Tensor:
        return self.at_level(0)(x)
