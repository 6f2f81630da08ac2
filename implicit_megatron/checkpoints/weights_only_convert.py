"""DeepSpeed's conversion to a universal checkpoint, with every file it reads loaded weights-only.

    python -m implicit_megatron.checkpoints.weights_only_convert [ds_to_universal's arguments]

deepspeed.checkpoint.ds_to_universal reads each checkpoint file with torch.load(weights_only=False),
the full unpickler, which runs whatever code a crafted file holds. Here torch.load is replaced,
before the converter is imported, by the weights-only load with the allow-list of safe_load (the
types DeepSpeed's files hold); a file that needs more is refused by name. The replacement is made
when this module is imported, so the converter's worker processes have it too (forked, or started
afresh, which imports this module again).
"""

from __future__ import annotations

import runpy
import sys

import torch

from implicit_megatron.checkpoints import safe_load
from implicit_megatron.utils.lean_imports import import_deepspeed

import_deepspeed()
torch.load = safe_load.guarded_load

if __name__ == "__main__":
    sys.argv[0] = "ds_to_universal"
    runpy.run_module("deepspeed.checkpoint.ds_to_universal", run_name="__main__", alter_sys=True)
