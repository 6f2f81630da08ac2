"""tools/node/gpu_check.py: documented, refuses a machine without a GPU in one line, and its checks run
on the CPU emulation of CUDA graphs (the speed table and the fused kernels need a GPU)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from support.cuda_graph_emulation import emulated
from support.processes import ROOT
from support.tools import load_tool


def gpu_check_tool():
    return load_tool("gpu_check")


@pytest.mark.processes
def test_help_and_a_machine_without_a_gpu():
    run = [sys.executable, "tools/node/gpu_check.py"]
    shown = subprocess.run([*run, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0
    for word in ("kernels", "graphs", "nccl", "memory", "speed table", "Exits 0"):
        assert word in shown.stdout, word
    refused = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=120,
                             env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert refused.returncode == 2
    assert refused.stdout.strip().splitlines() == [
        "gpu_check: no GPU on this machine (torch.cuda.is_available() is False); nothing to check"]


@pytest.mark.slow  # over 10 s on 2 cores: the full tier runs it
def test_the_graph_and_collective_checks_pass_on_the_emulation():
    tool = gpu_check_tool()
    with emulated():
        lines = list(tool.graph_lines("tiny/llama-implicit", torch.device("cpu"), torch.float64, 2, 16,
                                      "model.vocab_size=101"))
    assert [line.figure.split(":")[0] for line in lines] == [
        mode if mode == "explicit" else f"{mode} with weight norm" for mode in tool.MODES]
    assert all(line.ok and "3 steps with updated weights" in line.figure for line in lines), "\n".join(map(str, lines))
    try:
        line = tool.collective_line(torch.device("cpu"))
    finally:
        dist.destroy_process_group()
    assert line.ok and str(line).startswith("gloo     ok    1 rank,")
