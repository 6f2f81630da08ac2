"""DeepSpeed and megatron-core imported without what they import for features we never use.

DeepSpeed's autotuner imports MLflow at import time, only to log tuning experiments, and megatron-
core's timers and inference contexts import W&B: 2-4 s of every process's start on 2 CPU cores,
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


def import_megatron_datasets() -> None:
    """Import megatron.core.datasets once, without W&B (call before importing from it)."""
    if "megatron.core.datasets" not in sys.modules:
        with hidden("wandb"):
            import megatron.core.datasets  # noqa: F401
