"""The paper's contribution, independent of the backbone: a backbone F is self-iterated to a
fixed point (solver.py, without gradient), then differentiated with phantom gradients
(phantom.py); the input enters every layer through one shared injection (injection.py).
"""

from implicit_megatron.implicit.core import ImplicitCore, SolverSettings
from implicit_megatron.implicit.injection import Injection
from implicit_megatron.implicit.solver import SolverStats, relative_residual, solve

__all__ = ["ImplicitCore", "Injection", "SolverSettings", "SolverStats", "relative_residual", "solve"]
