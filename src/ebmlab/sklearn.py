"""scikit-learn estimators backed by ebmlab's RBM and its closed-form CD updates.

:class:`BernoulliRBM` is a drop-in replacement for
``sklearn.neural_network.BernoulliRBM``: the same constructor arguments and fitted
attributes (``components_`` (M x D), ``intercept_hidden_``, ``intercept_visible_``,
``h_samples_``), ``fit``/``partial_fit`` returning ``self``, ``transform`` (hidden
probabilities) and ``gibbs``. It trains in float32 with persistent CD by default,
and ``score_samples`` returns the log-likelihood log p(v) rather than a
pseudo-likelihood (which stays available as :meth:`BernoulliRBM.pseudo_likelihood`):
the partition function is exact (enumeration over the smaller layer) for small
models and estimated by annealed importance sampling otherwise.
:class:`GaussianBernoulliRBM` and :class:`SpikeSlabRBM` are the same estimator for
real-valued (standardised) features and :class:`ConvolutionalRBM` for images;
:class:`ClassificationRBM` is a classifier that models p(x, y) with an exact p(y | x),
:class:`DBN` stacks Bernoulli RBMs greedily, and :class:`GatedRBM` turns pairs of images
into features of the transformation between them.

Each estimator declares its scikit-learn parameters as dataclass fields (``eq`` and
``repr`` left to scikit-learn): the generated ``__init__`` stores every argument as
given, as ``get_params`` and ``clone`` require, and a subclass declares only the
parameters it adds or whose default it changes.
"""

from __future__ import annotations

import copy
import functools
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import KW_ONLY, dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
import torch
from scipy import sparse
from sklearn.base import (
    BaseEstimator,
    ClassifierMixin,
    ClassNamePrefixFeaturesOutMixin,
    TransformerMixin,
)
from sklearn.utils import check_random_state
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, check_non_negative, validate_data

from ebmlab._checks import ArgumentError
from ebmlab.devices import resolve_device, wide_dtype, widen
from ebmlab.energies import boltzmann, conv_rbm, gated, spike_slab
from ebmlab.learning.rbm import ContrastiveDivergence
from ebmlab.losses import classification_rbm_loss, conditional_cd_loss
from ebmlab.partition import LogZEstimate, log_partition

_DTYPES = {"float32": torch.float32, "float64": torch.float64}
_NUMPY = {"float32": np.float32, "float64": np.float64}


def _check_numbers(
    est: BaseEstimator,
    integers: tuple[str, ...],
    positive: tuple[str, ...],
    non_negative: tuple[str, ...],
) -> None:
    """Refuse hyperparameters out of range, naming the parameter and the range, and an
    unknown ``dtype``."""
    for name in integers:
        value = getattr(est, name)
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
            raise ArgumentError(f"{name} must be an integer >= 1, got {value!r}")
    for name in positive:
        value = getattr(est, name)
        if not np.isfinite(value) or value <= 0:
            raise ArgumentError(f"{name} must be a finite number > 0, got {value!r}")
    for name in non_negative:
        value = getattr(est, name)
        if not np.isfinite(value) or value < 0:
            raise ArgumentError(f"{name} must be a finite number >= 0, got {value!r}")
    if est.dtype not in _DTYPES:
        raise ArgumentError(f"dtype must be one of {list(_DTYPES)}, got {est.dtype!r}")


def _to_tensor(est: BaseEstimator, X: np.ndarray, unit_interval: bool) -> torch.Tensor:
    """A validated array as a tensor in the estimator's ``dtype``; ``unit_interval``
    refuses negative values (binary units read values in [0, 1])."""
    if unit_interval:
        check_non_negative(X, f"{type(est).__name__} (expects values in [0, 1])")
    device = resolve_device(est.device)
    if _DTYPES[est.dtype] == torch.float64 != wide_dtype(device):
        raise ArgumentError(
            f"dtype 'float64' is not available on {device}, which has no double precision: "
            "use dtype='float32'"
        )
    tensor = torch.from_numpy(np.ascontiguousarray(X, dtype=_NUMPY[est.dtype]))
    return tensor.to(device)


# the most bytes of a sparse input densified at once (for transform, scores, Gibbs steps)
SPARSE_CHUNK_BYTES = 32 << 20


class _SparseRows:
    """The rows of a scipy sparse matrix, reaching the model a mini-batch or a chunk of
    rows at a time: the whole matrix is never densified (a fit or a transform needs the
    sparse input and one chunk of at most ``SPARSE_CHUNK_BYTES`` dense). Mini-batches of
    a fit arrive dense (the negative phase is dense anyway); chunks arrive as torch
    sparse CSR tensors where the model's products take them (``sparse``), so that
    ``transform`` and the scores cost what the nonzeros cost. It answers what a fit asks
    of a dense tensor: ``shape``, ``device``, ``index_select`` and the column means."""

    def __init__(self, X: Any, est: BaseEstimator) -> None:
        # checked once here, so that the mini-batches of a fit are only converted
        check_non_negative(X, f"{type(est).__name__} (expects values in [0, 1])")
        self.X, self.est = X.tocsr(), est
        self.shape = self.X.shape
        self.device = resolve_device(est.device)

    def index_select(self, dim: int, index: torch.Tensor) -> torch.Tensor:
        return _to_tensor(self.est, self.X[index.cpu().numpy()].toarray(), unit_interval=False)

    def mean(self, dim: int) -> torch.Tensor:
        means = np.asarray(self.X.mean(axis=dim)).ravel()
        return _to_tensor(self.est, means, unit_interval=False)

    def chunks(self, sparse: bool = False) -> Iterator[torch.Tensor]:
        """The rows in chunks: dense, or as sparse CSR tensors with ``sparse`` where the
        device has sparse products (CPU, CUDA)."""
        sparse = sparse and self.device.type in ("cpu", "cuda")
        step = max(1, SPARSE_CHUNK_BYTES // (self.X.dtype.itemsize * self.shape[1]))
        for start in range(0, self.shape[0], step):
            stop = min(start + step, self.shape[0])
            if sparse:
                yield self._csr(self.X[start:stop])
            else:
                yield self.index_select(0, torch.arange(start, stop))

    def _csr(self, rows: Any) -> torch.Tensor:
        values = torch.from_numpy(rows.data.astype(_NUMPY[self.est.dtype], copy=False))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta")
            csr = torch.sparse_csr_tensor(
                torch.from_numpy(rows.indptr), torch.from_numpy(rows.indices), values,
                size=rows.shape, check_invariants=False,
            )  # fmt: skip
        return csr.to(self.device)


def _map_rows(
    data: torch.Tensor | _SparseRows,
    fn: Callable[[torch.Tensor], torch.Tensor],
    sparse: bool = False,
) -> torch.Tensor:
    """``fn`` of the rows (rows -> one result per row): at once for a tensor, a chunk at
    a time, concatenated, for sparse input (chunks as sparse tensors with ``sparse``,
    for an ``fn`` whose products take them)."""
    if isinstance(data, _SparseRows):
        return torch.cat([fn(rows) for rows in data.chunks(sparse)])
    return fn(data)


def _all_rows(data: torch.Tensor | _SparseRows) -> torch.Tensor:
    """Every row as one dense tensor (a mini-batch of ``partial_fit``)."""
    if isinstance(data, _SparseRows):
        return data.index_select(0, torch.arange(data.shape[0]))
    return data


def _epochs(
    est: BaseEstimator,
    n: int,
    generator: torch.Generator,
    progress: Callable[[], str] | None = None,
) -> Iterator[tuple[int, tuple[torch.Tensor, ...]]]:
    """``n_iter`` epochs of a fit: each epoch's number and its mini-batches of row indices
    (a fresh permutation of ``n`` rows, drawn on the generator's device); with
    ``verbose`` a line after each epoch in scikit-learn's format, ``[Name] Iteration 1,
    <progress()>, time = 0.12s``."""
    for epoch in range(est.n_iter):
        start = time.perf_counter()
        perm = torch.randperm(n, generator=generator, device=generator.device)
        yield epoch, perm.split(est.batch_size)
        if est.verbose:
            measure = f", {progress()}" if progress is not None else ""
            print(f"[{type(est).__name__}] Iteration {epoch + 1}{measure}, "
                  f"time = {time.perf_counter() - start:.2f}s")  # fmt: skip


def _numpy(t: torch.Tensor, dtype: npt.DTypeLike = np.float64) -> np.ndarray:
    """A NumPy copy of ``t`` in ``dtype`` (float64 by default), from whatever device it
    is on."""
    return t.detach().cpu().numpy().astype(dtype, copy=False)


@dataclass(eq=False, repr=False)
class _RBMEstimator(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Training and scoring shared by the RBM estimators; subclasses build the energy
    (:meth:`_build`), validate inputs (:meth:`_check_X`) and give log Z.

    As scikit-learn's transformers, they answer in the input's precision (float32 in,
    float32 out; other inputs in float64), name their outputs
    (``get_feature_names_out``: ``bernoullirbm0``, ...; ``set_output`` for pandas) and
    record ``n_features_in_`` and ``feature_names_in_``."""

    n_components: int = 256
    _: KW_ONLY
    learning_rate: float = 0.1
    batch_size: int = 10
    n_iter: int = 10
    verbose: int = 0
    random_state: int | np.random.RandomState | None = None
    k: int = 1
    persistent: bool = True
    n_chains: int | None = None
    momentum: float = 0.0
    weight_decay: float = 0.0
    lr_decay: bool = False
    dtype: str = "float32"
    device: str = "cpu"

    wide_transform: ClassVar[bool] = False  # transform in double precision

    # parameters of the estimators whose model supports them
    centering = False
    matmul_dtype = None
    # whether scipy sparse input is taken (kept sparse, see _SparseRows), and whether the
    # model's transform, free energy and Gibbs step take it as sparse CSR tensors
    accepts_sparse: ClassVar[bool] = False
    sparse_products: ClassVar[bool] = False

    def _check_params(self) -> None:
        _check_numbers(self, ("n_components", "batch_size", "n_iter", "k"), ("learning_rate",),
                       ("momentum", "weight_decay"))  # fmt: skip
        if self.matmul_dtype not in (None, "bfloat16"):
            raise ArgumentError(
                f"matmul_dtype must be None or 'bfloat16', got {self.matmul_dtype!r}"
            )

    def _init_model(self, data: torch.Tensor) -> None:
        rng = check_random_state(self.random_state)
        self._generator = torch.Generator(data.device).manual_seed(int(rng.randint(2**31 - 1)))
        self.rbm_ = self._build(data).to(data.device, _DTYPES[self.dtype])
        self._cd = ContrastiveDivergence(
            self.rbm_,
            self.k,
            persistent=self.persistent,
            n_chains=self.n_chains,
            matmul_dtype=None if self.matmul_dtype is None else torch.bfloat16,
            centering=self.centering,
        )
        self._optimizer = torch.optim.SGD(
            self.rbm_.parameters(),
            lr=self.learning_rate,
            momentum=self.momentum,
            weight_decay=self.weight_decay,
        )

    def _sync_attributes(self) -> None:
        rbm = self.rbm_
        self.components_ = _numpy(self._components())
        self.intercept_hidden_ = _numpy(rbm.c)
        self.intercept_visible_ = _numpy(rbm.b)
        chains = self._cd.chains
        if chains is not None:
            self.h_samples_ = _numpy(rbm.sample_hidden(chains, self._generator))

    def _components(self) -> torch.Tensor:
        """The fitted weights as ``components_``: one row per hidden unit (M x D)."""
        return self.rbm_.W.T

    @property
    def _n_features_out(self) -> int:
        """The width of ``transform``'s output: the hidden units (for
        ``get_feature_names_out``)."""
        return self.rbm_.n_hidden

    def _fit_measure(self, data: torch.Tensor) -> Callable[[], str] | None:
        """What a verbose fit reports after each epoch, besides the time (None: nothing)."""
        return None

    def _validated(
        self, X: npt.ArrayLike, reset: bool
    ) -> tuple[torch.Tensor | _SparseRows, np.dtype]:
        """(the rows as a tensor, or kept sparse where the estimator accepts scipy sparse
        input; the dtype answers take: float32 for float32 input, else float64)."""
        accept = ("csr", "csc") if self.accepts_sparse else False
        X = validate_data(self, X, reset=reset, dtype=(np.float64, np.float32),
                          accept_sparse=accept)  # fmt: skip
        rows = _SparseRows(X, self) if sparse.issparse(X) else self._to_tensor(X)
        return rows, X.dtype

    def _step(self, batch: torch.Tensor) -> None:
        self._cd.accumulate(batch, self._generator)
        self._optimizer.step()

    # ---------------------------------------------------------------- public API
    def fit(self, X: npt.ArrayLike, y: object = None) -> _RBMEstimator:
        """Train for ``n_iter`` epochs of mini-batches over X (n_samples, n_features)."""
        self._check_params()
        data = self._check_X(X, reset=True)
        self._init_model(data)
        measure = self._fit_measure(data) if self.verbose else None
        for epoch, batches in _epochs(self, data.shape[0], self._generator, measure):
            if self.lr_decay:
                for group in self._optimizer.param_groups:
                    group["lr"] = self.learning_rate * (1 - epoch / self.n_iter)
            for idx in batches:
                self._step(data.index_select(0, idx))
        self._sync_attributes()
        return self

    def partial_fit(self, X: npt.ArrayLike, y: object = None) -> _RBMEstimator:
        """One update on the mini-batch X (initialises the model on first call)."""
        first = not hasattr(self, "rbm_")
        if first:
            self._check_params()
        data = self._check_X(X, reset=first)
        if first:
            self._init_model(data)
        self._step(_all_rows(data))
        self._sync_attributes()
        return self

    def _check_X(self, X: npt.ArrayLike, reset: bool) -> torch.Tensor:
        return self._validated(X, reset)[0]

    def transform(self, X: npt.ArrayLike) -> np.ndarray:
        """Hidden activation probabilities p(h = 1 | v) (eq. 6.38), (n_samples, n_components),
        in the input's precision."""
        check_is_fitted(self)
        data, dtype = self._validated(X, reset=False)
        if self.wide_transform:  # a row's features then do not depend on its batch
            return _numpy(self._map_wide(data, "hidden_probs"), dtype)
        with torch.no_grad():
            return _numpy(_map_rows(data, self.rbm_.hidden_probs, self.sparse_products), dtype)

    def _map_wide(self, data: torch.Tensor, method: str) -> torch.Tensor:
        """The model's ``method`` of every row, computed by a double-precision copy of
        the model (float32 on a device without float64), so that a row's result does
        not depend on the batch it comes in."""
        wide = wide_dtype(data.device)
        fn = getattr(copy.deepcopy(self.rbm_).to(wide), method)
        with torch.no_grad():
            return _map_rows(data, lambda rows: fn(rows.to(wide)), self.sparse_products)

    def gibbs(self, v: npt.ArrayLike) -> np.ndarray:
        """One block-Gibbs step v -> h -> v; returns the new visible sample, in the
        input's precision.

        Args:
            v: visible rows (n_samples, n_features).
        """
        check_is_fitted(self)
        data, dtype = self._validated(v, reset=False)
        step = functools.partial(self.rbm_.gibbs, k=1, generator=self._generator)
        return _numpy(_map_rows(data, step, self.sparse_products), dtype)

    def score_samples(self, X: npt.ArrayLike) -> np.ndarray:
        """Log-likelihood log p(v) = -F(v) - log Z of each row, with log Z from
        :meth:`log_partition` (exact for small models, AIS otherwise), in the input's
        precision."""
        check_is_fitted(self)
        data, dtype = self._validated(X, reset=False)
        free = self._map_wide(data, "free_energy")
        return _numpy(-free - self.log_partition().log_z, dtype)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        tags.input_tags.sparse = self.accepts_sparse
        return tags


def _cached_log_z(estimator: Any, estimate: Callable[[], LogZEstimate]) -> LogZEstimate:
    """``estimate()``, made once per state of the fitted model (its parameters' shapes
    and sums, which survive pickling and cloning): an annealed log Z is random, and
    ``score_samples`` must give a row the same score whatever else it is scored with."""
    with torch.no_grad():
        key = tuple((tuple(p.shape), float(p.double().sum())) for p in estimator.rbm_.parameters())
    cached = getattr(estimator, "_log_z_cache", None)
    if cached is None or cached[0] != key:
        cached = estimator._log_z_cache = (key, estimate())
    return cached[1]


class _BinaryRBMEstimator(_RBMEstimator):
    """The RBM estimators over values in [0, 1], whose log Z anneals from the training
    data's base rates."""

    # scipy sparse rows (CSR, CSC, ...), as scikit-learn's BernoulliRBM takes them
    accepts_sparse = True

    def _to_tensor(self, X: np.ndarray) -> torch.Tensor:
        return _to_tensor(self, X, unit_interval=True)

    def _fit_measure(self, data: torch.Tensor) -> Callable[[], str]:
        """scikit-learn's verbose measure: the mean pseudo-likelihood of the training rows,
        each scored at one random site (D log sigmoid(F(v with v_i flipped) - F(v)))."""

        def one_site(chunk: torch.Tensor) -> torch.Tensor:
            rows = (chunk > 0.5).to(self.rbm_.W.dtype)
            every = torch.arange(len(rows), device=rows.device)
            site = torch.randint(rows.shape[1], (len(rows),), generator=self._generator,
                                 device=rows.device)  # fmt: skip
            flipped = rows.clone()
            flipped[every, site] = 1 - rows[every, site]
            gap = self.rbm_.free_energy(flipped) - self.rbm_.free_energy(rows)
            return rows.shape[1] * torch.nn.functional.logsigmoid(widen(gap))

        def measure() -> str:
            with torch.no_grad():
                value = _map_rows(data, one_site).mean()
            return f"pseudo-likelihood = {float(value):.2f}"

        return measure

    def log_partition(self) -> LogZEstimate:
        """log Z by :func:`ebmlab.partition.log_partition`: exact by enumeration over the
        smaller layer when it has at most ``ENUMERATION_LIMIT`` units, else annealed
        importance sampling from the training data's base rates (1000 temperatures, 100
        chains; the estimate carries its standard error)."""
        check_is_fitted(self)
        return _cached_log_z(self, lambda: log_partition(
            self.rbm_, base_biases=self._base_biases, generator=self._generator))  # fmt: skip

    def pseudo_likelihood(self, X: npt.ArrayLike) -> np.ndarray:
        """sum_i log p(v_i | v_-i) of binarised rows (Besag 1975), exact over all sites.

        Args:
            X: rows (n_samples, n_features) in [0, 1].
        """
        check_is_fitted(self)

        def every_site(chunk: torch.Tensor) -> torch.Tensor:
            rows = (chunk > 0.5).to(self.rbm_.W.dtype)
            f = self.rbm_.free_energy(rows)
            total = torch.zeros(len(rows), dtype=wide_dtype(rows.device), device=rows.device)
            for i in range(rows.shape[1]):
                flipped = rows.clone()
                flipped[:, i] = 1 - flipped[:, i]
                total += widen(torch.nn.functional.logsigmoid(self.rbm_.free_energy(flipped) - f))
            return total

        with torch.no_grad():
            return _numpy(_map_rows(self._check_X(X, reset=False), every_site))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.positive_only = True
        return tags


@dataclass(eq=False, repr=False)
class BernoulliRBM(_BinaryRBMEstimator):
    """Bernoulli RBM trained by (persistent) contrastive divergence.

    Args mirror scikit-learn's: ``n_components`` hidden units, ``learning_rate``,
    ``batch_size``, ``n_iter`` epochs, ``verbose``, ``random_state``; and further
    ``k`` (Gibbs steps), ``persistent`` (PCD, scikit-learn's algorithm; False for CD-k),
    ``n_chains`` (persistent chains; default one per batch row), ``momentum``,
    ``weight_decay``, ``lr_decay`` (learning rate falling linearly to zero over the
    ``n_iter`` epochs, which settles the parameters), ``dtype`` (``"float32"`` or
    ``"float64"``), ``matmul_dtype`` (``"bfloat16"`` runs the updates' matrix products
    in bfloat16, several times faster on CPUs with AMX; the parameters stay in
    ``dtype``) and ``centering`` (the centred-RBM update of
    :class:`~ebmlab.learning.rbm.ContrastiveDivergence`), and ``device`` (``"cpu"``,
    ``"cuda"``, ``"cuda:N"``, ``"mps"`` or ``"auto"``: where the model trains; fitted
    attributes and outputs are NumPy arrays wherever it trains).
    Inputs are values in [0, 1] (binary data, or probabilities as for grey levels);
    negative values are refused.

    The defaults are scikit-learn's. For likelihood, ``k=1, n_chains=100,
    centering=True, momentum=0.9, learning_rate=0.05, lr_decay=True`` is recommended.
    """

    _: KW_ONLY
    matmul_dtype: str | None = None
    centering: bool = False

    sparse_products = True

    def _build(self, data: torch.Tensor) -> boltzmann.BernoulliRBM:
        """Small random weights; visible biases at the log-odds of the data means (Hinton's
        practical guide, section 8), so the model starts from the independent-pixel fit."""
        gen = self._generator
        rbm = boltzmann.BernoulliRBM(data.shape[1], self.n_components, init_std=0.0)
        with torch.no_grad():
            rbm.W.normal_(0.0, 0.01, generator=gen)
            self._base_biases = boltzmann.base_rate_logits(data)
            rbm.b.copy_(self._base_biases)
        return rbm


@dataclass(eq=False, repr=False)
class ConvolutionalRBM(_BinaryRBMEstimator):
    """Convolutional RBM (Lee et al. 2009) as a feature extractor for images in [0, 1],
    trained by (persistent) CD through its free energy.

    The arguments are :class:`BernoulliRBM`'s (without ``centering`` and
    ``matmul_dtype``), with ``n_components`` filters of ``filter_size`` pixels square
    (by default 5, or the image's shorter side when it is smaller) over images of
    ``image_shape`` ((C, H, W) or (H, W); by default a square grey image, or a
    1-pixel-high row when the number of features is not a square, so that the defaults
    fit rows of any length) and one visible bias per pixel. ``transform`` gives the
    feature maps p(h = 1 | v), flattened (n_samples, K H' W'); ``components_`` holds the
    filters (K, C r r); ``score_samples`` scores through the model's dense view (exact
    or AIS). ``learning_rate``,
    ``batch_size``, ``n_iter``, ``verbose``, ``random_state``, ``k``, ``persistent``,
    ``n_chains``, ``momentum``, ``weight_decay``, ``lr_decay``, ``dtype`` and ``device``
    are as in :class:`BernoulliRBM`.
    """

    n_components: int = 8
    _: KW_ONLY
    filter_size: int | None = None
    image_shape: tuple[int, ...] | None = None
    learning_rate: float = 0.05

    # convolutions block the batch in ways that round a row by where it sits: the
    # features are computed in double precision, so each row's are its own
    wide_transform: ClassVar[bool] = True

    def _shape(self, n_features: int) -> tuple[int, ...]:
        if self.image_shape is not None:
            return tuple(self.image_shape)
        side = round(n_features**0.5)
        return (side, side) if side * side == n_features else (1, n_features)

    def _build(self, data: torch.Tensor) -> conv_rbm.ConvolutionalRBM:
        """Filters N(0, 0.1^2); visible biases at the log-odds of the pixel means."""
        shape = self._shape(data.shape[1])
        if int(np.prod(shape)) != data.shape[1]:
            raise ArgumentError(
                f"image_shape {shape} holds {int(np.prod(shape))} pixels, but X has "
                f"{data.shape[1]} features"
            )
        filter_size = min(5, *shape[-2:]) if self.filter_size is None else self.filter_size
        rbm = conv_rbm.ConvolutionalRBM(
            shape, self.n_components, filter_size, visible_bias="pixel", init_std=0.0
        )
        with torch.no_grad():
            rbm.W.normal_(0.0, 0.1, generator=self._generator)
            self._base_biases = boltzmann.base_rate_logits(data)
            rbm.b.copy_(self._base_biases.view(rbm.b.shape))
        return rbm

    def _components(self) -> torch.Tensor:
        """The filters, one row per filter (K x C r r)."""
        return self.rbm_.filter_images()


@dataclass(eq=False, repr=False)
class _RealRBMEstimator(_RBMEstimator):
    """An RBM estimator over real-valued (standardised) features, scored with log Z from
    :func:`ebmlab.partition.log_partition`; its default learning rate is a tenth of the
    binary RBM's."""

    _: KW_ONLY
    learning_rate: float = 0.01
    matmul_dtype: str | None = None

    def _to_tensor(self, X: np.ndarray) -> torch.Tensor:
        return _to_tensor(self, X, unit_interval=False)

    def log_partition(self) -> LogZEstimate:
        """log Z by :func:`ebmlab.partition.log_partition`: exact when the hidden layer
        can be enumerated (the visible layer integrated in closed form); else AIS
        (1000 temperatures, 100 chains) from the model's Gaussian base density with HMC
        transitions."""
        check_is_fitted(self)
        return _cached_log_z(self, lambda: log_partition(self.rbm_, generator=self._generator))


@dataclass(eq=False, repr=False)
class GaussianBernoulliRBM(_RealRBMEstimator):
    """Gaussian-Bernoulli RBM for real-valued features, trained by (persistent) CD.

    The arguments are :class:`BernoulliRBM`'s plus ``sigma`` (the visible units' standard
    deviation, 1 for standardised features) and ``learn_sigma`` (learn one sigma per
    feature). Visible biases start at the feature means. ``score_samples`` is the exact
    log-density when ``n_components <= ENUMERATION_LIMIT`` (the hidden states are enumerated and the
    visible units integrated analytically); beyond, log Z comes from annealed importance
    sampling from the model without weights, N(b, diag(sigma^2)), with HMC transitions.
    ``learning_rate``, ``batch_size``, ``n_iter``, ``verbose``, ``random_state``,
    ``k``, ``persistent``, ``n_chains``, ``momentum``, ``weight_decay``, ``lr_decay``,
    ``dtype``, ``matmul_dtype`` and ``device`` are as in :class:`BernoulliRBM`.
    """

    _: KW_ONLY
    sigma: float = 1.0
    learn_sigma: bool = False

    # on AVX2 CPUs the float32 product kernel rounds the last rows of a batch apart from
    # the others (one unit in the last place at a few features): the features are
    # computed in double precision, so each row's are its own
    wide_transform: ClassVar[bool] = True

    def _build(self, data: torch.Tensor) -> boltzmann.GaussianBernoulliRBM:
        if not (np.isfinite(self.sigma) and self.sigma > 0):
            raise ArgumentError(f"sigma must be a finite number > 0, got {self.sigma!r}")
        rbm = boltzmann.GaussianBernoulliRBM(
            data.shape[1], self.n_components, sigma=self.sigma, learn_sigma=self.learn_sigma
        )
        with torch.no_grad():
            rbm.W.normal_(0.0, 0.01, generator=self._generator)
            rbm.b.copy_(data.mean(0))
        return rbm


@dataclass(eq=False, repr=False)
class SpikeSlabRBM(_RealRBMEstimator):
    """Spike-and-slab RBM (µ-ssRBM, Courville et al. 2011) for real-valued features, a
    feature extractor trained by (persistent) CD through its free energy.

    ``n_components`` is the number of spike-and-slab pairs; ``learning_rate`` (a tenth
    of :class:`BernoulliRBM`'s by default), ``batch_size``, ``n_iter``, ``verbose``,
    ``random_state``, ``k``, ``persistent``, ``n_chains``, ``momentum``,
    ``weight_decay``, ``lr_decay``, ``dtype``, ``matmul_dtype`` and ``device`` are as in
    :class:`BernoulliRBM`. Visible offsets start at the feature means, weights at
    N(0, 0.1^2), free precisions at 1 (standardised features). ``transform`` gives the
    spike probabilities p(h = 1 | v); ``score_samples`` is the exact log-density when
    ``n_components <= ENUMERATION_LIMIT`` (the spikes enumerated, slabs and visibles
    integrated), else with log Z from AIS.
    """

    def _build(self, data: torch.Tensor) -> spike_slab.SpikeSlabRBM:
        rbm = spike_slab.SpikeSlabRBM(data.shape[1], self.n_components)
        with torch.no_grad():
            rbm.W.normal_(0.0, 0.1, generator=self._generator)
            rbm.b.copy_(data.mean(0))
        return rbm


@dataclass(eq=False, repr=False)
class ClassificationRBM(ClassifierMixin, TransformerMixin, BaseEstimator):
    """Classification RBM (Larochelle & Bengio 2008): an RBM over inputs and a one-hot
    label whose p(y | x) is exact, softmax_y(-F(x, y)).

    Args:
        n_components: hidden units.
        objective: ``"discriminative"`` (minimise -log p(y | x)), ``"generative"``
            (contrastive divergence on -log p(x, y)) or ``"hybrid"`` (the first plus
            ``alpha`` times the second, the regulariser of the paper).
        alpha: weight of the generative term in the hybrid objective.
        learning_rate: Adam's step size.
        batch_size: mini-batch size.
        n_iter: epochs.
        k: Gibbs steps of the generative term's negatives.
        weight_decay: L2 penalty.
        verbose: progress output, as for :class:`BernoulliRBM`.
        random_state: seed or generator, as for :class:`BernoulliRBM`.
        dtype: parameter precision, as for :class:`BernoulliRBM`.
        device: where the model trains, as for :class:`BernoulliRBM`.

    Inputs are values in [0, 1]. ``score_samples`` is log p(x) = log sum_y p(x, y),
    with log Z exact when min(n_features, n_components) <= ``ENUMERATION_LIMIT`` and
    otherwise a sum over labels of AIS estimates, each annealed from that label's base
    rates.
    """

    n_components: int = 100
    _: KW_ONLY
    objective: str = "hybrid"
    alpha: float = 0.01
    learning_rate: float = 0.01
    batch_size: int = 10
    n_iter: int = 10
    k: int = 1
    weight_decay: float = 0.0
    verbose: int = 0
    random_state: int | np.random.RandomState | None = None
    dtype: str = "float32"
    device: str = "cpu"

    def _check_X(self, X: npt.ArrayLike, reset: bool) -> torch.Tensor:
        X = validate_data(self, X, reset=reset, dtype=(np.float64, np.float32))
        return _to_tensor(self, X, unit_interval=True)

    def _check_Xy(
        self, X: npt.ArrayLike, y: npt.ArrayLike, reset: bool, classes: npt.ArrayLike | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        X, y = validate_data(self, X, y, reset=reset, dtype=(np.float64, np.float32))
        data = _to_tensor(self, X, unit_interval=True)
        check_classification_targets(y)
        if reset:
            self.classes_ = np.unique(y if classes is None else classes)
            if len(self.classes_) < 2:
                raise ArgumentError("ClassificationRBM needs y with 2 or more classes, got 1 class")
        if not np.isin(y, self.classes_).all():
            raise ArgumentError(f"y has labels outside the known classes {self.classes_}")
        labels = torch.from_numpy(np.searchsorted(self.classes_, y).astype(np.int64))
        labels = labels.to(data.device)
        return data, labels

    def _init_model(self, X: torch.Tensor) -> None:
        _check_numbers(self, ("n_components", "batch_size", "n_iter", "k"),
                       ("learning_rate",), ("alpha", "weight_decay"))  # fmt: skip
        if self.objective not in ("discriminative", "generative", "hybrid"):
            raise ArgumentError(
                "objective must be 'discriminative', 'generative' or 'hybrid', "
                f"got {self.objective!r}"
            )
        rng = check_random_state(self.random_state)
        self._generator = torch.Generator(X.device).manual_seed(int(rng.randint(2**31 - 1)))
        model = boltzmann.ClassificationRBM(
            X.shape[1], self.n_components, len(self.classes_), init_std=0.0
        )
        model = model.to(X.device, _DTYPES[self.dtype])
        with torch.no_grad():
            for weights in (model.W, model.U):  # symmetry between labels breaks sooner
                weights.normal_(0.0, 0.1, generator=self._generator)
            model.b.copy_(boltzmann.base_rate_logits(X))
        self.model_ = model
        self._optimizer = torch.optim.Adam(
            self.model_.parameters(), lr=self.learning_rate, weight_decay=self.weight_decay
        )

    def _step(self, X: torch.Tensor, y: torch.Tensor) -> None:
        loss = classification_rbm_loss(
            self.model_, X, y, mode=self.objective, alpha=self.alpha, k=self.k,
            generator=self._generator,
        )  # fmt: skip
        self._optimizer.zero_grad()
        loss.backward()
        self._optimizer.step()

    def _sync_attributes(self) -> None:
        m = self.model_
        self.components_ = _numpy(m.W.T)
        self.class_components_ = _numpy(m.U)
        self.intercept_hidden_ = _numpy(m.c)
        self.intercept_visible_ = _numpy(m.b)
        self.intercept_class_ = _numpy(m.d)

    def fit(self, X: npt.ArrayLike, y: npt.ArrayLike) -> ClassificationRBM:
        """Train for ``n_iter`` epochs of mini-batches over (X, y)."""
        X, labels = self._check_Xy(X, y, reset=True)
        self._init_model(X)
        self._train_X, self._train_y = X, labels  # each label's base rates, for AIS
        for _, batches in _epochs(self, len(X), self._generator):
            for idx in batches:
                self._step(X[idx], labels[idx])
        self._sync_attributes()
        return self

    def partial_fit(
        self, X: npt.ArrayLike, y: npt.ArrayLike, classes: npt.ArrayLike | None = None
    ) -> ClassificationRBM:
        """One update on (X, y); ``classes`` (every label) is required on the first call."""
        if hasattr(self, "model_"):
            X, labels = self._check_Xy(X, y, reset=False)
        else:
            if classes is None:
                raise ArgumentError("classes must be given on the first call to partial_fit")
            X, labels = self._check_Xy(X, y, reset=True, classes=classes)
            self._init_model(X)
            self._train_X, self._train_y = X, labels
        self._step(X, labels)
        self._sync_attributes()
        return self

    def _widened(self, X: npt.ArrayLike) -> tuple[boltzmann.ClassificationRBM, torch.Tensor]:
        """A float64 copy (float32 on a device without it) of the model and the checked
        inputs: a row's result does not depend on the batch it comes in."""
        check_is_fitted(self)
        x = widen(self._check_X(X, reset=False))
        return copy.deepcopy(self.model_).to(x.dtype), x

    def predict_log_proba(self, X: npt.ArrayLike) -> np.ndarray:
        """Exact log p(y | x) (n_samples, n_classes), columns in the order of ``classes_``.

        Args:
            X: rows (n_samples, n_features).
        """
        model, x = self._widened(X)
        with torch.no_grad():
            return _numpy(torch.log_softmax(model.class_scores(x), 1))

    def predict_proba(self, X: npt.ArrayLike) -> np.ndarray:
        """Exact p(y | x) (n_samples, n_classes), columns in the order of ``classes_``.

        Args:
            X: rows (n_samples, n_features).
        """
        return np.exp(self.predict_log_proba(X))

    def predict(self, X: npt.ArrayLike) -> np.ndarray:
        """The most probable label of each row of ``X``, in the classes seen by ``fit``."""
        best = self.predict_log_proba(X).argmax(1)
        return self.classes_[best]

    def transform(self, X: npt.ArrayLike) -> np.ndarray:
        """Hidden activation probabilities averaged over the label posterior,
        sum_y p(y | x) p(h = 1 | x, y), (n_samples, n_components).

        Args:
            X: rows (n_samples, n_features).
        """
        m, x = self._widened(X)
        with torch.no_grad():
            p_y = m.predict_proba(x)
            p_h = torch.sigmoid((x @ m.W + m.c)[:, None, :] + m.U[None])  # (n, K, M)
            return _numpy((p_y[:, :, None] * p_h).sum(1))

    def log_partition(self) -> LogZEstimate:
        """log Z of p(x, y) by :func:`ebmlab.partition.log_partition`: exact when the
        smaller layer can be enumerated, else the sum over labels of AIS estimates (1000
        temperatures, 100 chains each) started from the base rates of that label's
        training inputs."""
        check_is_fitted(self)
        return log_partition(
            self.model_, data=self._train_X, labels=self._train_y, generator=self._generator
        )

    def score_samples(self, X: npt.ArrayLike) -> np.ndarray:
        """log p(x) = log sum_y exp(-F(x, y)) - log Z of each row.

        Args:
            X: rows (n_samples, n_features).
        """
        model, x = self._widened(X)
        with torch.no_grad():
            energy = model.energy(x)
        return _numpy(-energy - self.log_partition().log_z)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.positive_only = True
        return tags


@dataclass(eq=False, repr=False)
class DBN(TransformerMixin, BaseEstimator):
    """Deep belief network by greedy layer-wise training of RBMs (Hinton, Osindero & Teh 2006).

    Each :class:`BernoulliRBM` in turn is fitted to the hidden probabilities of the one
    below (Tomczak 2024, 'Deep Boltzmann Machines': each pair of consecutive layers is an
    RBM trained with the lower layer treated as observed). ``transform`` propagates
    p(h | v) up the stack; ``sample`` runs block Gibbs in the top RBM and propagates
    the result down through the directed layers.

    Args:
        hidden_layers: the hidden layers' widths, bottom first.
        learning_rate: as in :class:`BernoulliRBM`.
        batch_size: as in :class:`BernoulliRBM`.
        random_state: as in :class:`BernoulliRBM`.
        n_iter: training epochs per layer.
        k: Gibbs steps per update (CD-k).
        persistent: persistent chains (PCD) instead of chains restarted at the data.
        momentum: momentum of the parameter updates.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"`` or ``"auto"``: where the
            layers train.
    """

    hidden_layers: tuple[int, ...] = (256, 64)
    _: KW_ONLY
    learning_rate: float = 0.1
    batch_size: int = 10
    n_iter: int = 10
    k: int = 1
    persistent: bool = True
    momentum: float = 0.5
    random_state: int | np.random.RandomState | None = None
    device: str = "cpu"

    def fit(self, X: npt.ArrayLike, y: object = None) -> DBN:
        """Train the stack greedily, one RBM per layer on the layer below's hidden probabilities.

        Args:
            X: rows (n_samples, n_features) in [0, 1].
            y: ignored.
        """
        if not self.hidden_layers:
            raise ArgumentError("hidden_layers must name at least one layer size")
        X = validate_data(self, X, reset=True, dtype=(np.float64, np.float32))
        check_non_negative(X, "DBN (expects values in [0, 1])")
        rng = check_random_state(self.random_state)
        self.rbms_ = []
        data = X
        for width in self.hidden_layers:
            rbm = BernoulliRBM(
                width,
                learning_rate=self.learning_rate,
                batch_size=self.batch_size,
                n_iter=self.n_iter,
                k=self.k,
                persistent=self.persistent,
                momentum=self.momentum,
                random_state=int(rng.randint(2**31 - 1)),
                device=self.device,
            ).fit(data)
            self.rbms_.append(rbm)
            data = rbm.transform(data)
        return self

    def transform(self, X: npt.ArrayLike) -> np.ndarray:
        """Top-layer hidden probabilities.

        Args:
            X: rows (n_samples, n_features) in [0, 1].
        """
        check_is_fitted(self)
        data = validate_data(self, X, reset=False, dtype=(np.float64, np.float32))
        for rbm in self.rbms_:
            data = rbm.transform(data)
        return data

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.positive_only = True  # its bottom RBM reads values in [0, 1]
        return tags

    def sample(
        self,
        n_samples: int,
        n_gibbs: int = 200,
        random_state: int | np.random.RandomState | None = None,
    ) -> np.ndarray:
        """Visible samples: Gibbs chains in the top RBM, then top-down p(v | h) propagation.

        Args:
            n_samples: the number of samples.
            n_gibbs: Gibbs steps in the top RBM.
            random_state: seed (int), ``numpy.random.RandomState`` or ``None``, as in
                scikit-learn.
        """
        check_is_fitted(self)
        top = self.rbms_[-1].rbm_
        gen = torch.Generator(top.W.device).manual_seed(
            int(check_random_state(random_state).randint(2**31 - 1))
        )
        u = torch.rand(n_samples, top.n_visible, generator=gen, device=top.W.device)
        start = (u < 0.5).to(top.W.dtype)
        h = top.gibbs(start, n_gibbs, gen)
        with torch.no_grad():
            for rbm in reversed(self.rbms_[:-1]):
                h = rbm.rbm_.sample_visible(h, gen)
        return _numpy(h)


@dataclass(eq=False, repr=False)
class GatedRBM(TransformerMixin, BaseEstimator):
    """Factored gated RBM on pairs (Memisevic & Hinton 2010): a transformer whose
    features say how one image follows from another.

    Each row of X is a pair: the input x (its first ``n_input`` values; default half the
    row) and then the output y, with values in [0, 1]. :meth:`fit` trains p(y | x) by
    CD-k with Adam; :meth:`transform` gives the mapping units' probabilities p(h | x, y),
    so a ``Pipeline`` of this and a classifier learns to name transformations (shifts,
    rotations) from few labels; :meth:`analogy` applies each pair's transformation to
    new inputs; :meth:`score_samples` is the exact log p(y | x), for up to
    ``ENUMERATION_LIMIT`` mapping units.

    Args: ``n_components`` mapping units, ``n_factors``, ``n_input``, ``learning_rate``
    (Adam's), ``batch_size``, ``n_iter`` epochs, ``k`` Gibbs steps, ``init_std`` of the
    filters, ``random_state``, ``verbose``, ``dtype`` and ``device`` as for
    :class:`BernoulliRBM`. The fitted energy is ``model_``
    (:class:`ebmlab.energies.GatedRBM`).
    """

    n_components: int = 64
    _: KW_ONLY
    n_factors: int = 200
    n_input: int | None = None
    learning_rate: float = 0.01
    batch_size: int = 100
    n_iter: int = 10
    k: int = 1
    init_std: float = 0.3
    random_state: int | np.random.RandomState | None = None
    verbose: int = 0
    dtype: str = "float32"
    device: str = "cpu"

    def _pairs(self, X: npt.ArrayLike, reset: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Validated rows split into (outputs y, inputs x), as tensors."""
        X = validate_data(self, X, reset=reset, dtype=(np.float64, np.float32))
        data = _to_tensor(self, X, unit_interval=True)
        if reset and data.shape[1] < 2:
            raise ArgumentError(
                f"GatedRBM reads rows that hold an input and an output, so at least 2 "
                f"features; got n_features = {data.shape[1]}"
            )
        if reset:
            n_input = data.shape[1] // 2 if self.n_input is None else self.n_input
            if (
                isinstance(n_input, bool)
                or not isinstance(n_input, int | np.integer)
                or not (1 <= n_input < data.shape[1])
            ):
                raise ArgumentError(
                    f"n_input must split each row of {data.shape[1]} values into an input "
                    f"and an output (1 <= n_input < {data.shape[1]}), got {n_input!r}"
                )
            self.n_input_ = int(n_input)
        return data[:, self.n_input_ :], data[:, : self.n_input_]

    def fit(self, X: npt.ArrayLike, y: object = None) -> GatedRBM:
        """Train p(output | input) on the pairs X for ``n_iter`` epochs of CD-k.

        Args:
            y: ignored.
        """
        _check_numbers(self, ("n_components", "n_factors", "batch_size", "n_iter", "k"),
                       ("learning_rate",), ("init_std",))  # fmt: skip
        outputs, inputs = self._pairs(X, reset=True)
        rng = check_random_state(self.random_state)
        gen = torch.Generator(outputs.device).manual_seed(int(rng.randint(2**31 - 1)))
        model = gated.GatedRBM(inputs.shape[1], outputs.shape[1], self.n_components,
                               self.n_factors)  # fmt: skip
        self.model_ = model.to(outputs.device, _DTYPES[self.dtype])
        with torch.no_grad():  # the filters drawn from this estimator's own stream
            for filters in (self.model_.U, self.model_.V, self.model_.W):
                filters.normal_(0.0, self.init_std, generator=gen)
        self.model_.fit_biases(outputs, inputs)
        optimizer = torch.optim.Adam(self.model_.parameters(), lr=self.learning_rate)
        for _, batches in _epochs(self, len(outputs), gen):
            for idx in batches:
                optimizer.zero_grad()
                conditional_cd_loss(self.model_, outputs[idx], inputs[idx], k=self.k,
                                    generator=gen).backward()  # fmt: skip
                optimizer.step()
        self.model_.requires_grad_(False)
        return self

    def transform(self, X: npt.ArrayLike) -> np.ndarray:
        """Mapping-unit probabilities p(h = 1 | x, y) of each pair, (n_samples, n_components).

        Args:
            X: pairs [x | y] (n_samples, n_input + n_output).
        """
        check_is_fitted(self)
        outputs, inputs = self._pairs(X, reset=False)
        return _numpy(self.model_.hidden_probs(outputs, inputs))

    def analogy(self, X: npt.ArrayLike, new_inputs: npt.ArrayLike) -> np.ndarray:
        """p(y* = 1 | h, x*): each pair's transformation (h = p(h | x, y)) applied to the
        new input in the same row of ``new_inputs`` (n_samples, n_input).

        Args:
            X: pairs [x | y] (n_samples, n_input + n_output).
        """
        check_is_fitted(self)
        outputs, inputs = self._pairs(X, reset=False)
        new = np.asarray(new_inputs, dtype=_NUMPY[self.dtype])
        if new.shape != (len(outputs), self.n_input_) or not np.isfinite(new).all():
            raise ArgumentError(
                f"new_inputs must be finite ({len(outputs)}, {self.n_input_}), one input per "
                f"pair, got shape {new.shape}"
            )
        new_x = torch.from_numpy(new).to(outputs.device)
        return _numpy(self.model_.analogy(outputs, inputs, new_x))

    def score_samples(self, X: npt.ArrayLike) -> np.ndarray:
        """Exact log p(y | x) of each pair, the mapping units enumerated (their number
        must be at most ``ENUMERATION_LIMIT``).

        Args:
            X: pairs [x | y] (n_samples, n_input + n_output).
        """
        check_is_fitted(self)
        outputs, inputs = self._pairs(X, reset=False)
        if self.n_components > boltzmann.ENUMERATION_LIMIT:
            raise ArgumentError(
                f"score_samples enumerates the mapping units: n_components must be at most "
                f"{boltzmann.ENUMERATION_LIMIT}, got {self.n_components}"
            )
        outputs, inputs = widen(outputs), widen(inputs)
        model = copy.deepcopy(self.model_).to(outputs.dtype)
        return _numpy(model.log_likelihood(outputs, inputs))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.positive_only = True
        return tags
