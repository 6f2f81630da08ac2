"""An implicit Mamba2's training step with the fused kernels = with the PyTorch path: the loss, the
solver's passes and residuals, and every gradient, for the curriculum's two phases."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from support.tools import load_tool

CASES = load_tool("kernel_cases")
# float32, different orders of summation repeated over the passes: ~1e-6 measured on each (a residual is
# a difference of near iterates, the loosest); passes are counts and must be equal
TOLERANCE = {"loss": 1e-5, "residuals": 1e-4, "gradient": 1e-4}
SIZES = dataclasses.replace(CASES.CPU, batch=1)  # a pass costs the interpreter ~0.5 s at one row of 8 tokens


@pytest.mark.parametrize(("mode", "length"), [("(4+1)", 12), ("(24+4)", 8)])
def test_an_implicit_training_step_is_the_same_fused(fused, mode, length):
    comparisons = CASES.compare_training_step(mode, SIZES, "cpu", torch.float32, length)
    passes = next(got.item() for name, got, _ in comparisons if name == "passes")
    assert passes == 4 if mode == "(4+1)" else 4 < passes < 24  # the free phase stopped on its tolerance
    for name, got, expected in comparisons:
        if "passes" in name:
            assert got.item() == expected.item(), (name, got.item(), expected.item())
        else:
            tolerance = TOLERANCE.get(name, TOLERANCE["gradient"])
            assert CASES.rel_err(got, expected) < tolerance, (name, CASES.rel_err(got, expected))
