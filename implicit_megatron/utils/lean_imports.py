"""DeepSpeed and megatron-core imported without what they import for features we never use.

DeepSpeed's autotuner imports MLflow at import time, only to log tuning experiments, megatron-core's
timers and inference contexts import W&B, and its fused kernels are compiled (torch.compile imports
Dynamo and Inductor) when the package is imported: 2-4 s of every process's start on 2 CPU cores,
paid by each rank, each tool and each preprocessing run. They are imported with those modules
hidden (`sys.modules[name] = None` makes `import name` raise ImportError, and their `try: import`
turns the feature off); our own tracker imports MLflow or W&B itself, later, where a run uses them.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from implicit_megatron.utils.deepspeed_env import name_accelerator


@contextlib.contextmanager
def hidden(*names: str) -> Iterator[None]:
    """Within the block, `import name` of a module not imported yet raises ImportError."""
    hide = [name for name in names if name not in sys.modules]
    for name in hide:
        sys.modules[name] = None  # type: ignore[assignment]  # the documented way to refuse an import
    try:
        yield
    finally:
        for name in hide:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


def import_deepspeed() -> None:
    """Import DeepSpeed once, its accelerator named and without MLflow: call it before any `import
    deepspeed` or `from deepspeed... import`."""
    name_accelerator()
    if "deepspeed" not in sys.modules:
        with hidden("mlflow"):
            import deepspeed  # noqa: F401


@contextlib.contextmanager
def compile_deferred() -> Iterator[None]:
    """Within the block, `torch.compile(fn)` (and `@torch.compile(...)`) returns `fn` itself.

    megatron-core's package `__init__` decorates its fused kernels (bias-GeLU, SwiGLU, ...) with
    `torch.compile` at import time, which imports TorchDynamo and Inductor: 1-2 s of CPU in every
    process that reads shards, for kernels we never call (only the indexed datasets are used)."""
    import torch

    compile_ = torch.compile

    def undecorated(model=None, **_options):
        return model if model is not None else (lambda fn: fn)

    torch.compile = undecorated
    try:
        yield
    finally:
        torch.compile = compile_


def import_megatron_datasets() -> None:
    """Import megatron.core.datasets once, without W&B and without compiling megatron-core's fused
    kernels (call before importing from it)."""
    if "megatron.core.datasets" not in sys.modules:
        with hidden("wandb"), compile_deferred():
            import megatron.core.datasets  # noqa: F401
