"""DeepSpeed's accelerator, named before DeepSpeed is imported.

Where none is named, DeepSpeed guesses it at import and warns that it fell back to the CPU, on every
rank and in every tool that reads a checkpoint. Naming the CPU where torch sees no GPU
(DS_ACCELERATOR, DeepSpeed's documented way) says the same at info level. Every place that imports
DeepSpeed does so through `lean_imports.import_deepspeed`, which calls `name_accelerator` first.
"""

from __future__ import annotations

import os


def name_accelerator() -> None:
    import torch

    if "DS_ACCELERATOR" not in os.environ and not torch.cuda.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"
