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


ENGINE = r"""
import logging, os, sys
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
from implicit_megatron import build_model, load_config
from implicit_megatron.train.engine import build_engine
from implicit_megatron.train.process import quiet
quiet.settle(0)
logging.basicConfig(level=logging.DEBUG if sys.argv[2] == "debug" else logging.INFO, format="%(name)s: %(message)s")
cfg = load_config("configs/tiny/llama-explicit.yaml", ["distributed.precision=bf16", "distributed.zero_stage=1",
                                                       "train.global_batch_size=2", "train.micro_batch_size=2"])
engine = build_engine(cfg, build_model(cfg))
print("optimizer", type(engine.optimizer).__name__)
"""


@pytest.mark.parametrize("level", ["info", "debug"])
def test_a_bf16_zero1_engine_starts_without_deepspeeds_memory_report(level):
    """BF16_Optimizer printed 3 lines per parameter group and 6 more (18 for our two groups) at every start."""
    from implicit_megatron.utils.ports import free_port

    out = subprocess.run([sys.executable, "-c", ENGINE, str(free_port()), level], cwd=ROOT, env=child_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=180)
    assert out.returncode == 0 and "optimizer BF16_Optimizer" in out.stdout, out.stdout[-3000:]
    assert "CPU Virtual Memory" not in out.stdout and "MA 0." not in out.stdout, out.stdout
    report = "implicit_megatron.deepspeed: DeepSpeed memory, "
    said = [line for line in out.stdout.splitlines() if line.startswith(report)]
    assert len(said) == (6 if level == "debug" else 0), out.stdout  # begin, end, before and after each group
    assert level == "info" or said[0].startswith(report + "begin bf16_optimizer:")
