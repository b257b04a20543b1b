"""ebmlab: energy-based models on PyTorch.

An energy E assigns a scalar to each configuration; lower is more likely,
p(x) = exp(-E(x)) / Z. The subpackages follow the four ingredients of an EBM
(LeCun et al. 2006): ``energies``, ``inference``/``samplers``, ``losses`` and
``training``, plus ``partition`` (log Z), ``evaluation`` and ``data``.
"""

__version__ = "0.1.0"
