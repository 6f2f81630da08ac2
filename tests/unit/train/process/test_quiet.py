"""What the libraries would print on every rank is settled at its source, and nothing else is hidden."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support.processes import ROOT, child_env

pytestmark = pytest.mark.processes  # every test here starts a process

SCRIPT = r"""
import logging, os, sys, warnings
from implicit_megatron.train.process import quiet
quiet.settle(int(sys.argv[1]))
print("DS_ACCELERATOR", os.environ.get("DS_ACCELERATOR"))
import torch.distributed as dist
with warnings.catch_warnings(record=True) as caught:
    warnings.warn("`torch.distributed.all_gather_into_tensor` is deprecated. Please use ...", FutureWarning)
    warnings.warn("`torch.distributed.reduce_scatter_tensor` is deprecated. Please use ...", FutureWarning)
    warnings.warn("something else is deprecated", FutureWarning)
print("warnings", [str(w.message) for w in caught])
from deepspeed.utils import logger
logger.warning("MPU is not provided, setting tp size to 1 in checkpoint loading.")
logger.warning("another DeepSpeed warning")
logging.getLogger("implicit_megatron.implicit.core").warning("ours")
"""


def settle(rank: int, **env: str) -> subprocess.CompletedProcess:
    """stdout and stderr together: DeepSpeed logs to stdout."""
    return subprocess.run([sys.executable, "-c", SCRIPT, str(rank)], cwd=ROOT, env=child_env(**env),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120, check=True)


def test_rank_0_keeps_every_other_warning_and_says_its_own():
    out = settle(0)
    assert "DS_ACCELERATOR cpu" in out.stdout  # no GPU here: named, so DeepSpeed does not warn that it guessed
    assert "warnings ['something else is deprecated']" in out.stdout
    assert "MPU is not provided" not in out.stdout and "another DeepSpeed warning" in out.stdout
    assert "Setting accelerator to CPU" not in out.stdout
    assert "ours" in out.stdout


def test_other_ranks_leave_our_warnings_to_rank_0_and_an_accelerator_named_stays():
    out = settle(1, DS_ACCELERATOR="cuda")
    assert "DS_ACCELERATOR cuda" in out.stdout
    assert "ours" not in out.stdout and "another DeepSpeed warning" in out.stdout
