"""Weight normalisation, w = g * v / ||v|| per output row, with weights that can be computed once.

The parameters carry the names of torch's `torch.nn.utils.parametrizations.weight_norm`
(`<layer>.parametrizations.weight.original0` is g, `.original1` is v), so checkpoints, imports and
exports read the same tensors. Two things differ from torch's parametrisation, on purpose:

- Every weight-normalised Linear shares one class (`WeightNormLinear`; Conv1d likewise), where
  torch makes a class per layer. torch.compile guards on a module's class, so with torch's
  classes every layer of a stack compiles again and the recompile limit is hit within one pass.
- `layer.weight` reads a value handed in from outside when there is one (`reading`), else it
  computes g * v / ||v||. The implicit core normalises every weight once per forward and has all
  passes read those tensors, without torch's global parametrisation cache (which compiled code
  guards on per layer); CUDA graphs read static buffers the same way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, cast

import torch
from torch import nn


def normalise(g: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """g * v / ||v||, the norm over every dimension but the first (torch's weight_norm with dim=0)."""
    return torch._weight_norm(v, g, 0)


class WeightNormParameters(nn.Module):
    """g (`original0`, shape (out, 1, ...)) and v (`original1`, the weight's shape) of one layer.
    Calling it computes the weight; under ZeRO-3 that call is what gathers g and v."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.original0 = nn.Parameter(_row_norms(weight))
        self.original1 = nn.Parameter(weight.detach().clone())

    def forward(self) -> torch.Tensor:
        return normalise(self.original0, self.original1)


def _row_norms(weight: torch.Tensor) -> torch.Tensor:
    """g such that g * v / ||v|| = v for v = weight (torch's weight_norm right inverse)."""
    return torch.norm_except_dim(weight.detach(), 2, 0)


if TYPE_CHECKING:
    class _Parametrizations(nn.ModuleDict):
        weight: WeightNormParameters


class _WeightNormed:
    """Mixed into Linear and Conv1d: `weight` is g * v / ||v||, or the value `reading` hands in."""

    parametrizations: _Parametrizations  # set by apply_weight_norm

    @property
    def weight(self) -> torch.Tensor:
        value = self.__dict__.get("_weight_value")
        return value if value is not None else self.parametrizations.weight()

    def set_weight(self, weight: torch.Tensor) -> None:
        """g and v such that the layer computes `weight` (v = weight, g = its row norms)."""
        with torch.no_grad():
            originals = self.parametrizations.weight
            originals.original0.copy_(_row_norms(weight))
            originals.original1.copy_(weight)


class WeightNormLinear(_WeightNormed, nn.Linear):  # type: ignore[override]  # weight: a property, not a Parameter
    pass


class WeightNormConv1d(_WeightNormed, nn.Conv1d):  # type: ignore[override]  # weight: a property, not a Parameter
    pass


WEIGHT_NORMED = {nn.Linear: WeightNormLinear, nn.Conv1d: WeightNormConv1d}
changes = 0  # bumped whenever weight norm is applied or removed: lets callers cache `weight_normed`


def apply_weight_norm(module: nn.Module) -> None:
    """Weight-normalise every Linear and Conv1d in `module` (in place; the function is unchanged)."""
    global changes
    changes += 1
    for layer in list(module.modules()):
        if type(layer) in WEIGHT_NORMED:
            weight = cast(nn.Parameter, layer._parameters.pop("weight"))  # Linear's and Conv1d's: never None
            layer.parametrizations = nn.ModuleDict({"weight": WeightNormParameters(weight)})
            layer.__class__ = WEIGHT_NORMED[type(layer)]


def remove_weight_norm(module: nn.Module) -> None:
    """Fold g and v back into plain weights (for export): the function is unchanged."""
    global changes
    changes += 1
    for layer in list(module.modules()):
        if isinstance(layer, _WeightNormed):
            weight = layer.parametrizations.weight().detach()
            del layer.parametrizations
            layer.__dict__.pop("_weight_value", None)
            layer.__class__ = next(base for base, normed in WEIGHT_NORMED.items() if isinstance(layer, normed))
            plain: nn.Module = layer  # a plain Linear or Conv1d again
            plain.weight = nn.Parameter(weight)


def weight_normed(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, layer) of every weight-normalised layer in `module`, in module order."""
    return [(name, cast(nn.Module, layer)) for name, layer in module.named_modules()
            if isinstance(layer, _WeightNormed)]


def compute(layers: Sequence[nn.Module]) -> list[torch.Tensor]:
    """Each layer's weight from its g and v (with gradient where grad mode is on)."""
    return [cast(_WeightNormed, layer).parametrizations.weight() for layer in layers]


@contextlib.contextmanager
def reading(layers: Sequence[nn.Module], values: Sequence[torch.Tensor]) -> Iterator[None]:
    """Within the context, `layer.weight` is the given tensor for each layer (nesting restores the
    outer values on exit); outside, every read computes g * v / ||v|| from the current g and v."""
    old = [layer.__dict__.get("_weight_value") for layer in layers]
    for layer, value in zip(layers, values, strict=True):
        layer.__dict__["_weight_value"] = value
    try:
        yield
    finally:
        for layer, previous in zip(layers, old, strict=True):
            layer.__dict__["_weight_value"] = previous
