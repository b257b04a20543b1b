"""Transport between noise and data: couplings, interpolation paths and ODE integration.

The pieces of flow matching (Lipman et al. 2023; Liu et al. 2023; Tong et al. 2024) and
of the flow-based training of energies (Energy Matching, Balcerak et al. 2025): pair a
noise batch with a data batch (:func:`independent_pairs`, :func:`ot_pairs`), move each
pair along a path (:func:`linear_interpolant`), and carry points along a learned field
(:func:`odeint`). The objective itself is
:func:`ebmlab.losses.flow_matching_loss`.
"""

from ebmlab.transport.couplings import Pairs, independent_pairs, ot_pairs, sinkhorn_log_plan
from ebmlab.transport.ode import odeint
from ebmlab.transport.paths import linear_interpolant

__all__ = [
    "Pairs",
    "independent_pairs",
    "linear_interpolant",
    "odeint",
    "ot_pairs",
    "sinkhorn_log_plan",
]
