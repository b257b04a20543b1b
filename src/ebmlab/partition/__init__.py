"""Partition functions: log Z estimates that carry their uncertainty."""

from ebmlab.partition.ais import (
    ais,
    raise_,
    rbm_ais,
    rbm_exact_samples,
    salakhutdinov_schedule,
)
from ebmlab.partition.elimination import (
    elimination_order,
    pairwise_log_partition,
    pairwise_marginals,
)
from ebmlab.partition.estimate import LogZEstimate
from ebmlab.partition.exact import (
    binary_states,
    boltzmann_log_partition,
    enumerate_log_partition,
    exact_log_partition,
    rbm_log_partition,
)
from ebmlab.partition.plefka import (
    plefka_free_energy,
    plefka_log_partition,
    plefka_magnetisations,
)
from ebmlab.partition.policy import enumeration_bits, log_partition
from ebmlab.partition.quadrature import grid_points, quadrature_log_partition, quadrature_sample
from ebmlab.partition.smc import box_smc, smc, smc_sample
from ebmlab.partition.variational import (
    bethe_log_partition,
    perturb_and_map_log_partition,
    perturbed_map,
    trw_log_partition,
)

__all__ = [
    "LogZEstimate",
    "ais",
    "bethe_log_partition",
    "binary_states",
    "boltzmann_log_partition",
    "box_smc",
    "elimination_order",
    "enumerate_log_partition",
    "enumeration_bits",
    "exact_log_partition",
    "grid_points",
    "log_partition",
    "pairwise_log_partition",
    "pairwise_marginals",
    "perturb_and_map_log_partition",
    "perturbed_map",
    "plefka_free_energy",
    "plefka_log_partition",
    "plefka_magnetisations",
    "quadrature_log_partition",
    "quadrature_sample",
    "raise_",
    "rbm_ais",
    "rbm_exact_samples",
    "rbm_log_partition",
    "salakhutdinov_schedule",
    "smc",
    "smc_sample",
    "trw_log_partition",
]
