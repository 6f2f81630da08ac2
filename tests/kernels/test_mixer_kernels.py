"""The Mamba2 mixer's fused paths through mamba_ssm's real kernels = its PyTorch path (float32, CPU)."""

from __future__ import annotations

import pytest
import torch
from support.tools import load_tool

CASES = load_tool("kernel_cases")
# float32 on both sides, different orders of summation: outputs agree to ~2e-7 of their largest
# value, gradients (sums over the sequence and the batch) to ~5e-5 at worst (D, dt_bias)
TOLERANCE = {"output": 2e-5, "gradient": 2e-4}


def _tolerance(name: str) -> float:
    return TOLERANCE["output" if name == "output" else "gradient"]


@pytest.mark.parametrize("case", CASES.MIXER_CASES, ids=lambda case: case.name)
def test_the_fused_mixer_forward_and_backward_equal_the_pytorch_path(fused, case):
    for name, got, expected in CASES.compare_mixer(case, CASES.CPU, "cpu", torch.float32):
        assert CASES.rel_err(got, expected) < _tolerance(name), (name, CASES.rel_err(got, expected))
