"""One policy for log Z: :func:`log_partition` picks the estimator for a model.

``method="auto"`` enumerates when the model's exact sum has at most
``2^ENUMERATION_LIMIT`` terms (about a second on a CPU) and otherwise anneals (AIS,
Neal 2001; for RBMs from the data's base rates, Salakhutdinov & Murray 2008). The
recipes, the scikit-learn estimators and ``ebmlab logz`` all call it, so a model's log Z
is computed the same way wherever it is asked for.
"""

from __future__ import annotations

import torch

from ebmlab import _checks
from ebmlab._checks import ArgumentError
from ebmlab.energies.analytic import AnalyticEnergy
from ebmlab.energies.base import EnergyLike
from ebmlab.energies.boltzmann import (
    ENUMERATION_LIMIT,
    BernoulliRBM,
    BoltzmannMachine,
    CategoricalRBM,
    ClassificationRBM,
    DeepBoltzmannMachine,
    GaussianBernoulliRBM,
    SubspaceRBM,
)
from ebmlab.energies.conv_rbm import ConvolutionalRBM
from ebmlab.energies.spike_slab import SpikeSlabRBM
from ebmlab.partition.ais import ais, raise_, rbm_ais
from ebmlab.partition.elimination import elimination_order
from ebmlab.partition.estimate import LogZEstimate
from ebmlab.partition.exact import exact_log_partition, label_sum_log_partition
from ebmlab.partition.plefka import plefka_log_partition
from ebmlab.partition.variational import (
    bethe_log_partition,
    pairwise_potentials,
    perturb_and_map_log_partition,
    trw_log_partition,
)
from ebmlab.samplers.hmc import HMC

METHODS = ("auto", "exact", "ais", "raise", "bethe", "trw", "pam", "mean_field", "tap", "tap3")
# methods on the graph of a Boltzmann machine or Bernoulli RBM (a DBM through as_rbm)
GRAPH_METHODS = ("bethe", "trw", "pam", "mean_field", "tap", "tap3")
PLEFKA_ORDERS = {"mean_field": 1, "tap": 2, "tap3": 3}


def enumeration_bits(model: EnergyLike) -> int | None:
    """log2 of the largest sum exact log Z of ``model`` computes: the terms enumeration
    adds up, or for a Boltzmann machine with sparse couplings the width of variable
    elimination if smaller; 0 for a closed form, None where neither applies."""
    if isinstance(model, AnalyticEnergy):
        return 0
    if isinstance(model, ConvolutionalRBM):
        bits = min(model.n_visible, model.n_hidden)
        return model.n_hidden if model.visible == "gaussian" else bits
    if isinstance(model, GaussianBernoulliRBM | CategoricalRBM | SpikeSlabRBM):
        return model.n_hidden
    if isinstance(model, SubspaceRBM):
        return min(model.n_visible, model.n_gates * model.n_subspace)
    if isinstance(model, BernoulliRBM | ClassificationRBM):
        return min(model.n_visible, model.n_hidden)
    if isinstance(model, BoltzmannMachine):
        _, _, edges = pairwise_potentials(model, drop_zero=True)
        return min(model.n_visible, elimination_order(model.n_visible, edges)[1])
    if isinstance(model, DeepBoltzmannMachine):
        return model.n_hidden1
    return None


def log_partition(
    model: EnergyLike,
    method: str = "auto",
    *,
    data: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
    samples: torch.Tensor | None = None,
    base_biases: torch.Tensor | None = None,
    n_chains: int = 100,
    n_temperatures: int = 1000,
    generator: torch.Generator | int | None = None,
) -> LogZEstimate:
    """log Z of ``model`` by ``method``, always as a :class:`LogZEstimate`.

    Args:
        model: an ebmlab energy with a known structure: the Boltzmann family (Bernoulli,
            Gaussian, spike-and-slab, categorical, subspace, classification and
            convolutional RBMs, the last through its dense view, Boltzmann machines,
            DBMs) or an analytic density.
        method: ``exact`` (enumeration, elimination or closed form), ``ais``, ``raise``
            (reverse AIS, Burda et al. 2015), ``bethe``, ``trw`` (an upper bound),
            ``pam`` (perturb-and-MAP upper bound), ``mean_field`` (a lower bound),
            ``tap`` or ``tap3`` (Plefka expansions to second and third order), or
            ``auto``: exact when the enumeration has at most 2^``ENUMERATION_LIMIT``
            terms, else AIS.
        data: training rows (N, D); AIS and RAISE start from their base rates.
        labels: the classes of ``data`` (N,), for a classification RBM's AIS, which
            anneals each label's RBM from that label's rows.
        samples: model samples for RAISE to start from (e.g. persistent chains).
        base_biases: visible biases of the base model, in place of ``data``'s.
        n_chains: AIS / RAISE chains.
        n_temperatures: AIS / RAISE temperatures.
        generator: randomness of the stochastic methods.

    Returns:
        The estimate, with its standard error or bounds where the method gives them.
    """
    _checks.one_of("method", method, METHODS)
    name = type(model).__name__
    if isinstance(model, ConvolutionalRBM):
        model = model.as_rbm()
    if method == "auto":
        bits = enumeration_bits(model)
        if bits is None:
            raise ArgumentError(
                f"no automatic log Z for {name}: use exact_log_partition with bounds, "
                "or ais/smc with a base density and a kernel"
            )
        method = "exact" if bits <= ENUMERATION_LIMIT else "ais"
    if method == "exact":
        return exact_log_partition(model)
    anneal = {"n_chains": n_chains, "n_temperatures": n_temperatures, "generator": generator}
    if method == "ais" and isinstance(model, GaussianBernoulliRBM | SpikeSlabRBM):
        return _gaussian_base_ais(model, **anneal)
    if method == "ais" and isinstance(model, ClassificationRBM):
        return _classification_rbm_ais(model, data, labels, **anneal)
    binary = isinstance(model, BernoulliRBM) and not isinstance(model, CategoricalRBM)
    if (binary or isinstance(model, DeepBoltzmannMachine)) and method in ("ais", "raise"):
        estimator = rbm_ais if method == "ais" else raise_
        extra = {} if method == "ais" else {"samples": samples}
        return estimator(model, data=data, base_biases=base_biases, **extra, **anneal)
    graph = model.as_rbm() if isinstance(model, DeepBoltzmannMachine) else model
    binary_graph = binary or graph is not model or isinstance(model, BoltzmannMachine)
    if method in GRAPH_METHODS and binary_graph:
        if method == "pam":
            return perturb_and_map_log_partition(graph, generator=generator)
        if method in PLEFKA_ORDERS:
            return plefka_log_partition(graph, PLEFKA_ORDERS[method])
        return bethe_log_partition(graph) if method == "bethe" else trw_log_partition(graph)
    raise ArgumentError(
        f"method {method!r} does not apply to {name}: it supports Bernoulli RBMs, DBNs and "
        "DBMs only (ais also Gaussian, spike-and-slab and classification RBMs); use "
        "exact or auto"
    )


def _gaussian_base_ais(model, **anneal) -> LogZEstimate:
    """AIS for real-valued visible units from the model's Gaussian base density (its
    ``base_density``), with HMC transitions whose mass matches the base's scales."""
    base = model.base_density()
    kernel = HMC(0.2, 10, inv_mass=base.std.float() ** 2)
    return ais(model, base, kernel, **anneal)


def _classification_rbm_ais(
    model, data: torch.Tensor | None, labels: torch.Tensor | None, **anneal
) -> LogZEstimate:
    """The sum over labels of AIS estimates of each label's RBM, each annealed from the
    base rates of that label's rows."""
    if data is None or labels is None:
        raise ArgumentError("AIS of a classification RBM needs data and their labels")

    def by_ais(rbm, y: int) -> LogZEstimate:
        return rbm_ais(rbm, data=data[labels == y], **anneal)

    return label_sum_log_partition(model, by_ais)
