"""The paper's contribution, independent of the backbone: a backbone F is self-iterated to a
fixed point (solver.py, without gradient), then differentiated with phantom gradients
(phantom.py); the input enters every layer through one shared injection (injection.py).
"""

from implicit_megatron.config import SolverSettings
from implicit_megatron.implicit.core import ImplicitCore
from implicit_megatron.implicit.injection import Injection
from implicit_megatron.implicit.iteration import SolverStats, relative_residual
from implicit_megatron.implicit.solver import solve

__all__ = ["ImplicitCore", "Injection", "SolverSettings", "SolverStats", "relative_residual", "solve"]
