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
:class:`GaussianBernoulliRBM` is the same estimator for real-valued (standardised)
features, and :class:`DBN` stacks Bernoulli RBMs greedily.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted, check_non_negative, validate_data

from ebmlab.energies import DiagonalGaussian, boltzmann
from ebmlab.partition import (
    LogZEstimate,
    ais,
    exact_log_partition,
    rbm_ais,
    rbm_log_partition,
)
from ebmlab.samplers import HMC
from ebmlab.training.rbm import ContrastiveDivergence

_DTYPES = {"float32": torch.float32, "float64": torch.float64}
ENUMERATE_UP_TO = 20
_NUMPY = {"float32": np.float32, "float64": np.float64}


class _RBMEstimator(TransformerMixin, BaseEstimator):
    """Training and scoring shared by the RBM estimators; subclasses build the energy
    (:meth:`_build`), validate inputs (:meth:`_check_X`) and give log Z."""

    def __init__(
        self,
        n_components: int = 256,
        *,
        learning_rate: float = 0.1,
        batch_size: int = 10,
        n_iter: int = 10,
        verbose: int = 0,
        random_state=None,
        k: int = 1,
        persistent: bool = True,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        lr_decay: bool = False,
        dtype: str = "float32",
        matmul_dtype: str | None = None,
    ) -> None:
        self.n_components = n_components
        self.learning_rate = learning_rate
        self.batch_size = batch_size
        self.n_iter = n_iter
        self.verbose = verbose
        self.random_state = random_state
        self.k = k
        self.persistent = persistent
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.lr_decay = lr_decay
        self.dtype = dtype
        self.matmul_dtype = matmul_dtype

    def _check_params(self) -> None:
        for name in ("n_components", "batch_size", "n_iter", "k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("learning_rate",):
            if not np.isfinite(getattr(self, name)) or getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a finite number > 0, got {getattr(self, name)!r}")
        for name in ("momentum", "weight_decay"):
            value = getattr(self, name)
            if not np.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {list(_DTYPES)}, got {self.dtype!r}")
        if self.matmul_dtype not in (None, "bfloat16"):
            raise ValueError(f"matmul_dtype must be None or 'bfloat16', got {self.matmul_dtype!r}")

    def _init_model(self, data: torch.Tensor) -> None:
        rng = check_random_state(self.random_state)
        self._generator = torch.Generator().manual_seed(int(rng.randint(2**31 - 1)))
        self.rbm_ = self._build(data).to(_DTYPES[self.dtype])
        self._cd = ContrastiveDivergence(
            self.rbm_,
            self.k,
            persistent=self.persistent,
            matmul_dtype=None if self.matmul_dtype is None else torch.bfloat16,
        )
        self._optimizer = torch.optim.SGD(
            self.rbm_.parameters(),
            lr=self.learning_rate,
            momentum=self.momentum,
            weight_decay=self.weight_decay,
        )

    def _sync_attributes(self) -> None:
        rbm = self.rbm_
        self.components_ = rbm.W.detach().T.numpy().astype(np.float64)
        self.intercept_hidden_ = rbm.c.detach().numpy().astype(np.float64)
        self.intercept_visible_ = rbm.b.detach().numpy().astype(np.float64)
        chains = self._cd.chains
        if chains is not None:
            self.h_samples_ = rbm.sample_hidden(chains, self._generator).numpy().astype(np.float64)

    def _step(self, batch: torch.Tensor) -> None:
        self._cd.accumulate(batch, self._generator)
        self._optimizer.step()

    # ---------------------------------------------------------------- public API
    def fit(self, X, y=None) -> _RBMEstimator:
        """Train for ``n_iter`` epochs of mini-batches over X (n_samples, n_features)."""
        self._check_params()
        data = self._check_X(X, reset=True)
        self._init_model(data)
        n = data.shape[0]
        for epoch in range(self.n_iter):
            if self.lr_decay:
                for group in self._optimizer.param_groups:
                    group["lr"] = self.learning_rate * (1 - epoch / self.n_iter)
            perm = torch.randperm(n, generator=self._generator)
            for idx in perm.split(self.batch_size):
                self._step(data[idx])
            if self.verbose:
                print(f"[{type(self).__name__}] iteration {epoch + 1}/{self.n_iter}")
        self._sync_attributes()
        return self

    def partial_fit(self, X, y=None) -> _RBMEstimator:
        """One update on the mini-batch X (initialises the model on first call)."""
        first = not hasattr(self, "rbm_")
        if first:
            self._check_params()
        data = self._check_X(X, reset=first)
        if first:
            self._init_model(data)
        self._step(data)
        self._sync_attributes()
        return self

    def transform(self, X) -> np.ndarray:
        """Hidden activation probabilities p(h = 1 | v) (eq. 6.38), (n_samples, n_components)."""
        check_is_fitted(self)
        data = self._check_X(X, reset=False)
        with torch.no_grad():
            return self.rbm_.hidden_probs(data).numpy().astype(np.float64)

    def gibbs(self, v) -> np.ndarray:
        """One block-Gibbs step v -> h -> v; returns the new visible sample."""
        check_is_fitted(self)
        data = self._check_X(v, reset=False)
        return self.rbm_.gibbs(data, 1, self._generator).numpy().astype(np.float64)

    def score_samples(self, X) -> np.ndarray:
        """Log-likelihood log p(v) = -F(v) - log Z of each row, with log Z from
        :meth:`log_partition` (exact for small models, AIS otherwise)."""
        check_is_fitted(self)
        data = self._check_X(X, reset=False)
        model = copy.deepcopy(self.rbm_).double()  # a row's score does not depend on its batch
        with torch.no_grad():
            free = model.free_energy(data.double())
        return (-free - self.log_partition().log_z).numpy()


class BernoulliRBM(_RBMEstimator):
    """Bernoulli RBM trained by (persistent) contrastive divergence.

    Args mirror scikit-learn's: ``n_components`` hidden units, ``learning_rate``,
    ``batch_size``, ``n_iter`` epochs, ``verbose``, ``random_state``; and further
    ``k`` (Gibbs steps), ``persistent`` (PCD, scikit-learn's algorithm; False for CD-k),
    ``momentum``, ``weight_decay``, ``lr_decay`` (learning rate falling linearly to zero
    over the ``n_iter`` epochs, which settles the parameters), ``dtype``
    (``"float32"`` or ``"float64"``) and ``matmul_dtype`` (``"bfloat16"`` runs the
    updates' matrix products in bfloat16 under autocast, several times faster on CPUs
    with AMX; the parameters stay in ``dtype``).
    Inputs are values in [0, 1] (binary data, or probabilities as for grey levels);
    negative values are refused.
    """

    def _check_X(self, X, reset: bool) -> torch.Tensor:
        X = validate_data(self, X, reset=reset, dtype=(np.float64, np.float32))
        check_non_negative(X, "BernoulliRBM (expects values in [0, 1])")
        return torch.from_numpy(np.ascontiguousarray(X, dtype=_NUMPY[self.dtype]))

    def _build(self, data: torch.Tensor) -> boltzmann.BernoulliRBM:
        """Small random weights; visible biases at the log-odds of the data means (Hinton's
        practical guide, section 8), so the model starts from the independent-pixel fit."""
        gen = self._generator
        rbm = boltzmann.BernoulliRBM(data.shape[1], self.n_components, init_std=0.0)
        with torch.no_grad():
            rbm.W.normal_(0.0, 0.01, generator=gen)
            self._base_biases = torch.logit(data.double().mean(0).clamp(1e-3, 1 - 1e-3))
            rbm.b.copy_(self._base_biases)
        return rbm

    def log_partition(self) -> LogZEstimate:
        """log Z: exact by enumeration over the smaller layer when min(D, M) <= 20, else
        annealed importance sampling from the training data's base rates (1000
        temperatures, 100 chains; the estimate carries its standard error)."""
        check_is_fitted(self)
        if min(self.rbm_.n_visible, self.n_components) <= ENUMERATE_UP_TO:
            return rbm_log_partition(self.rbm_)
        return rbm_ais(self.rbm_, base_biases=self._base_biases, generator=self._generator)

    def pseudo_likelihood(self, X) -> np.ndarray:
        """sum_i log p(v_i | v_-i) of binarised rows (Besag 1975), exact over all sites."""
        check_is_fitted(self)
        data = (self._check_X(X, reset=False) > 0.5).to(self.rbm_.W.dtype)
        with torch.no_grad():
            f = self.rbm_.free_energy(data)
            total = torch.zeros(data.shape[0], dtype=torch.float64)
            for i in range(data.shape[1]):
                flipped = data.clone()
                flipped[:, i] = 1 - flipped[:, i]
                total += torch.nn.functional.logsigmoid(self.rbm_.free_energy(flipped) - f).double()
        return total.numpy()

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.positive_only = True
        return tags


class GaussianBernoulliRBM(_RBMEstimator):
    """Gaussian-Bernoulli RBM for real-valued features, trained by (persistent) CD.

    The arguments are :class:`BernoulliRBM`'s plus ``sigma`` (the visible units' standard
    deviation, 1 for standardised features) and ``learn_sigma`` (learn one sigma per
    feature). Visible biases start at the feature means. ``score_samples`` is the exact
    log-density when ``n_components <= 20`` (the hidden states are enumerated and the
    visible units integrated analytically); beyond, log Z comes from annealed importance
    sampling from the model without weights, N(b, diag(sigma^2)), with HMC transitions.
    """

    def __init__(
        self,
        n_components: int = 256,
        *,
        learning_rate: float = 0.01,
        batch_size: int = 10,
        n_iter: int = 10,
        verbose: int = 0,
        random_state=None,
        k: int = 1,
        persistent: bool = True,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        lr_decay: bool = False,
        dtype: str = "float32",
        matmul_dtype: str | None = None,
        sigma: float = 1.0,
        learn_sigma: bool = False,
    ) -> None:
        super().__init__(
            n_components, learning_rate=learning_rate, batch_size=batch_size, n_iter=n_iter,
            verbose=verbose, random_state=random_state, k=k, persistent=persistent,
            momentum=momentum, weight_decay=weight_decay, lr_decay=lr_decay, dtype=dtype,
            matmul_dtype=matmul_dtype,
        )  # fmt: skip
        self.sigma = sigma
        self.learn_sigma = learn_sigma

    def _check_X(self, X, reset: bool) -> torch.Tensor:
        X = validate_data(self, X, reset=reset, dtype=(np.float64, np.float32))
        return torch.from_numpy(np.ascontiguousarray(X, dtype=_NUMPY[self.dtype]))

    def _build(self, data: torch.Tensor) -> boltzmann.GaussianBernoulliRBM:
        if not (np.isfinite(self.sigma) and self.sigma > 0):
            raise ValueError(f"sigma must be a finite number > 0, got {self.sigma!r}")
        rbm = boltzmann.GaussianBernoulliRBM(
            data.shape[1], self.n_components, sigma=self.sigma, learn_sigma=self.learn_sigma
        )
        with torch.no_grad():
            rbm.W.normal_(0.0, 0.01, generator=self._generator)
            rbm.b.copy_(data.mean(0))
        return rbm

    def log_partition(self) -> LogZEstimate:
        """log Z: exact when ``n_components <= 20``; else AIS (1000 temperatures, 100
        chains) from the model without weights, N(b, diag(sigma^2)), with HMC transitions."""
        check_is_fitted(self)
        if self.n_components <= ENUMERATE_UP_TO:
            return exact_log_partition(self.rbm_)
        mean, std = self.rbm_.b.detach().clone(), self.rbm_.sigma.detach()
        kernel = HMC(0.2, 10, inv_mass=std.float() ** 2)
        return ais(self.rbm_, DiagonalGaussian(mean, std), kernel, generator=self._generator)


class DBN(TransformerMixin, BaseEstimator):
    """Deep belief network by greedy layer-wise training of RBMs (Hinton, Osindero & Teh 2006).

    Each :class:`BernoulliRBM` in turn is fitted to the hidden probabilities of the one
    below (seed 002, 'Deep Boltzmann Machines': each pair of consecutive layers is an
    RBM trained with the lower layer treated as observed). ``transform`` propagates
    p(h | v) up the stack; ``sample`` runs block Gibbs in the top RBM and propagates
    the result down through the directed layers.
    """

    def __init__(
        self,
        hidden_layers: tuple[int, ...] = (256, 64),
        *,
        learning_rate: float = 0.1,
        batch_size: int = 10,
        n_iter: int = 10,
        k: int = 1,
        persistent: bool = True,
        momentum: float = 0.5,
        random_state=None,
    ) -> None:
        self.hidden_layers = hidden_layers
        self.learning_rate = learning_rate
        self.batch_size = batch_size
        self.n_iter = n_iter
        self.k = k
        self.persistent = persistent
        self.momentum = momentum
        self.random_state = random_state

    def fit(self, X, y=None) -> DBN:
        if not self.hidden_layers:
            raise ValueError("hidden_layers must name at least one layer size")
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
            ).fit(data)
            self.rbms_.append(rbm)
            data = rbm.transform(data)
        return self

    def transform(self, X) -> np.ndarray:
        """Top-layer hidden probabilities."""
        check_is_fitted(self)
        data = validate_data(self, X, reset=False, dtype=(np.float64, np.float32))
        for rbm in self.rbms_:
            data = rbm.transform(data)
        return data

    def sample(self, n_samples: int, n_gibbs: int = 200, random_state=None) -> np.ndarray:
        """Visible samples: Gibbs chains in the top RBM, then top-down p(v | h) propagation."""
        check_is_fitted(self)
        gen = torch.Generator().manual_seed(
            int(check_random_state(random_state).randint(2**31 - 1))
        )
        top = self.rbms_[-1].rbm_
        start = (torch.rand(n_samples, top.n_visible, generator=gen) < 0.5).to(top.W.dtype)
        h = top.gibbs(start, n_gibbs, gen)
        with torch.no_grad():
            for rbm in reversed(self.rbms_[:-1]):
                h = rbm.rbm_.sample_visible(h, gen)
        return h.numpy().astype(np.float64)
