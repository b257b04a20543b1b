"""Sample quality at image scale, in a feature space: Fréchet distance, kernel distance,
precision and recall.

The numbers compare feature vectors of model samples with those of held-out data. By
default the features are the trained classifier's penultimate layer
(:func:`penultimate_features`), which needs nothing beyond the run. Papers report the
same statistics in the pool features of Inception-v3 (FID, Heusel et al. 2017; KID,
Bińkowski et al. 2018); figures in another feature space rank models the same way but
are not comparable with those papers' numbers. :mod:`ebmlab.evaluation.inception` gives
that network from the FID tools' weights file.

- :func:`frechet_distance`: |mu_a - mu_b|^2 + Tr(S_a + S_b - 2 (S_a S_b)^{1/2}) between the
  Gaussians fitted to the two sets (Heusel et al. 2017, eq. 6), with a bootstrap
  standard error.
- :func:`kernel_distance`: the unbiased MMD^2 with the cubic polynomial kernel
  k(a, b) = (a.b / d + 1)^3, averaged over disjoint random subsets, whose spread gives
  the standard error (Bińkowski et al. 2018, section 4).
- :func:`precision_recall`: the share of samples inside the data manifold and of data
  inside the samples' manifold, each manifold being the union of balls reaching every
  point's k-th nearest neighbour (Kynkäänniemi et al. 2019, eqs. 1-3), with binomial
  standard errors.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.devices import widen
from ebmlab.energies.base import in_chunks


def penultimate_features(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The inputs of ``model``'s last linear layer for ``x`` (the classifier's penultimate
    features), computed in chunks without gradients."""
    linear = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linear:
        raise ArgumentError("model has no linear layer whose inputs could serve as features")
    captured: list[torch.Tensor] = []
    hook = linear[-1].register_forward_hook(lambda m, inputs, out: captured.append(inputs[0]))
    try:
        with torch.no_grad():
            in_chunks(lambda part: model(part), x)
    finally:
        hook.remove()
    return widen(torch.cat(captured))


def _gaussian_fd(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The Fréchet distance of the Gaussians fitted to ``a`` and ``b`` (N, D), with
    Tr (S_a S_b)^{1/2} computed in the smallest space that holds it. Write S_a = R^T R
    and S_b = C^T C with C the centred rows of ``b`` over sqrt(n_b - 1); the
    eigenvalues of S_a S_b are those of R S_b R^T = (R C^T)(R C^T)^T. R is the centred
    rows of ``a`` when it has no more rows than columns (``a`` is the smaller set), else
    the symmetric root of S_a: with 500 samples of 2048 Inception features the
    eigenproblem is 500 x 500 rather than 2048 x 2048."""
    if len(b) < len(a):
        a, b = b, a
    mu = a.mean(0) - b.mean(0)
    ca = (a - a.mean(0)) / math.sqrt(len(a) - 1)
    cb = (b - b.mean(0)) / math.sqrt(len(b) - 1)
    if len(a) <= a.shape[1]:
        root = ca
    else:
        vals, vecs = torch.linalg.eigh(ca.T @ ca)
        root = (vecs * vals.clamp_min(0).sqrt()) @ vecs.T
    if len(b) <= b.shape[1]:
        product = root @ cb.T
        inner = product @ product.T
    else:
        inner = root @ (cb.T @ cb) @ root.T
    cross = torch.linalg.eigvalsh(inner).clamp_min(0).sqrt().sum()
    return mu @ mu + ca.square().sum() + cb.square().sum() - 2 * cross


def _features(name: str, x: torch.Tensor) -> torch.Tensor:
    _checks.tensor(name, x, min_ndim=2)
    if len(x) < 2:
        raise ArgumentError(f"{name} needs at least two rows, got {len(x)}")
    if not torch.isfinite(x).all():
        raise ArgumentError(f"{name} contains NaN or infinite values")
    return widen(x.flatten(1))


def frechet_distance(
    a: torch.Tensor, b: torch.Tensor, bootstrap: int = 10, seed: int = 0
) -> tuple[float, float]:
    """Fréchet distance between feature sets ``a`` and ``b`` (N, D), and its bootstrap
    standard error (``bootstrap`` resamples of both sets).

    Args:
        seed: seed of the randomness (int).
    """
    a, b = _features("a", a), _features("b", b)
    _checks.positive_int("bootstrap", bootstrap)
    value = float(_gaussian_fd(a, b))
    gen = torch.Generator(a.device).manual_seed(seed)
    draws = [
        _gaussian_fd(
            a[torch.randint(len(a), (len(a),), generator=gen, device=a.device)],
            b[torch.randint(len(b), (len(b),), generator=gen, device=b.device)],
        )
        for _ in range(bootstrap)
    ]
    return value, float(torch.stack(draws).std()) if bootstrap > 1 else 0.0


def kernel_distance(
    a: torch.Tensor, b: torch.Tensor, subsets: int = 10, subset_size: int = 1000, seed: int = 0
) -> tuple[float, float]:
    """KID: the unbiased polynomial-kernel MMD^2 between ``a`` and ``b``, averaged over
    ``subsets`` disjoint random subsets of each (up to ``subset_size`` rows, fewer when
    the sets are small), and its standard error from the subsets' spread.

    Args:
        seed: seed of the randomness (int).
    """
    a, b = _features("a", a), _features("b", b)
    _checks.positive_int("subsets", subsets)
    m = min(subset_size, len(a) // subsets, len(b) // subsets)
    if m < 2:
        raise ArgumentError(f"{subsets} subsets need at least {2 * subsets} rows in each set")
    d = a.shape[1]
    gen = torch.Generator(a.device).manual_seed(seed)
    pa = torch.randperm(len(a), generator=gen, device=a.device)[: subsets * m].view(subsets, m)
    pb = torch.randperm(len(b), generator=gen, device=b.device)[: subsets * m].view(subsets, m)
    values = []
    for ia, ib in zip(pa, pb, strict=True):
        x, y = a[ia], b[ib]
        kxx, kyy, kxy = ((p @ q.T / d + 1) ** 3 for p, q in ((x, x), (y, y), (x, y)))
        off = m * (m - 1)
        values.append(
            (kxx.sum() - kxx.diagonal().sum()) / off
            + (kyy.sum() - kyy.diagonal().sum()) / off
            - 2 * kxy.mean()
        )
    v = torch.stack(values)
    return float(v.mean()), float(v.std() / math.sqrt(subsets)) if subsets > 1 else 0.0


NEIGHBOUR_CHUNK = 1024  # rows of a distance matrix at once: 50 000 centres take 400 MB


def _inside(points: torch.Tensor, centres: torch.Tensor, k: int) -> torch.Tensor:
    """Whether each point lies in a ball around some centre with radius the distance from
    that centre to its k-th nearest other centre; distances a chunk of rows at a time."""
    radii = torch.cat([torch.cdist(part, centres).kthvalue(k + 1, dim=1).values  # +1: itself
                       for part in centres.split(NEIGHBOUR_CHUNK)])  # fmt: skip
    return torch.cat([(torch.cdist(part, centres) <= radii).any(1)
                      for part in points.split(NEIGHBOUR_CHUNK)])  # fmt: skip


def precision_recall(samples: torch.Tensor, data: torch.Tensor, k: int = 3) -> dict[str, Any]:
    """Improved precision and recall of ``samples`` against ``data`` (k-NN manifolds,
    Kynkäänniemi et al. 2019), each with its binomial standard error."""
    s, x = _features("samples", samples), _features("data", data)
    _checks.positive_int("k", k)
    if k >= min(len(s), len(x)):
        raise ArgumentError(f"k must be below both set sizes, got k={k} for {len(s)} and {len(x)}")
    precision = float(widen(_inside(s, x, k)).mean())
    recall = float(widen(_inside(x, s, k)).mean())
    return {
        "precision": precision,
        "precision_stderr": math.sqrt(precision * (1 - precision) / len(s)),
        "recall": recall,
        "recall_stderr": math.sqrt(recall * (1 - recall) / len(x)),
    }


def sample_quality(
    features_samples: torch.Tensor, features_data: torch.Tensor, k: int = 3
) -> dict[str, Any]:
    """FD, KID, precision and recall of sample features against data features.

    Args:
        features_samples: features of model samples (N, F).
        features_data: features of data (M, F).
        k: the k of the k-nearest-neighbour balls of precision and recall.
    """
    fd, fd_se = frechet_distance(features_samples, features_data)
    subsets = max(2, min(10, len(features_samples) // 2, len(features_data) // 2))
    kid, kid_se = kernel_distance(features_samples, features_data, subsets)
    return {
        "frechet_distance": fd,
        "frechet_distance_stderr": fd_se,
        "kid": kid,
        "kid_stderr": kid_se,
        **precision_recall(features_samples, features_data, k),
    }
