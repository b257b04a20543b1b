"""Partition functions: log Z estimates that carry their uncertainty."""

from ebmlab.partition.estimate import LogZEstimate
from ebmlab.partition.quadrature import grid_points, quadrature_log_partition

__all__ = ["LogZEstimate", "grid_points", "quadrature_log_partition"]
