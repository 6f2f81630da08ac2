"""Quiet the libraries a launch starts, so that its output says each thing once: what they would
print on every rank is settled here, where it arises; our own warnings come from rank 0 only.

- DeepSpeed guesses its accelerator where none is named and warns on every rank that it fell back
  to the CPU; naming the CPU (DS_ACCELERATOR, only where torch sees no GPU) is the documented way to
  say it, and a named accelerator is logged at info level.
- DeepSpeed's ZeRO calls torch.distributed collectives that torch 2.13 deprecates (a FutureWarning
  per rank per first call); nothing a user can act on. Only those messages are filtered.
- DeepSpeed warns "MPU is not provided" per rank when it loads a universal checkpoint; this project
  has no tensor parallelism, so a tensor-parallel size of 1 is the right one.
"""

from __future__ import annotations

import logging
import warnings

from implicit_megatron.utils.deepspeed_env import name_accelerator

DEPRECATED_COLLECTIVES = r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated"
NO_MPU = "MPU is not provided"


class _DropMessage(logging.Filter):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def settle(rank: int) -> None:
    """Call before DeepSpeed is imported."""
    name_accelerator()
    warnings.filterwarnings("ignore", message=DEPRECATED_COLLECTIVES, category=FutureWarning)
    logging.getLogger("DeepSpeed").addFilter(_DropMessage(NO_MPU))
    ours = logging.getLogger("implicit_megatron")
    if rank != 0:
        ours.setLevel(logging.ERROR)  # errors still come from every rank: they may differ
