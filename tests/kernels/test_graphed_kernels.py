"""The implicit model's passes captured into (emulated) CUDA graphs and replayed: the replay runs
mamba_ssm's real kernels, forward and backward, and the training step equals the eager one."""

from __future__ import annotations

import dataclasses

import torch
from support.cuda_graph_emulation import emulated
from support.tools import load_tool

from implicit_megatron.implicit import SolverSettings

CASES = load_tool("kernel_cases")
SIZES = dataclasses.replace(CASES.CPU, batch=1)
TOLERANCE = {"loss": 1e-5, "residuals": 1e-4, "gradient": 1e-4}  # as tests/kernels/test_training_kernels.py


def test_replayed_passes_run_the_real_kernels_forward_and_backward(fused):
    model = CASES.implicit_model("(4+1)", SIZES, "cpu", torch.float32)
    model.core.settings = SolverSettings(max_iter=2, phantom_steps=1, damping=0.8)  # each replay costs seconds
    ids = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(0))
    seq_idx = CASES.documents(1, 8, "cpu")
    with CASES.pytorch_path():
        expected = CASES.training_step(model, ids, seq_idx)
    with emulated():
        model.core.cuda_graphs = "on"
        for _ in range(3):  # the first forward of a shape runs eagerly, the second captures, the third replays
            got = CASES.training_step(model, ids, seq_idx)
        assert {key[0] for key in model.core.graphs.cache} == {"solve", "grad"}
    for name, value in expected.items():
        if "passes" in name:
            assert got[name].item() == value.item(), name
        else:
            tolerance = TOLERANCE.get(name, TOLERANCE["gradient"])
            assert CASES.rel_err(got[name], value) < tolerance, (name, CASES.rel_err(got[name], value))
